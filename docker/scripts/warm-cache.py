"""Cache the default model's GGUF index and converted tokenizer while the image is built,
rather than at every container start (~15 s on two cores)."""

from core.loader.gguf_index import GGUFIndex
from core.loader.gguf_model import gguf_tokenizer
from core.loader.source import default_model_path

path = default_model_path()
gguf_tokenizer(path, GGUFIndex.open(path).metadata.get("tokenizer.chat_template"))
