"""``--kv-cache-dtype`` in the engine: the KV capacity per byte, and the error for a
dtype the platform does not declare (greedy parity: tests/test_engine_parity.py)."""

import pytest
import torch
import transformers
from plugins import Platform
from plugins.kv_cache import KVCacheLayout
from plugins.memory import MemoryProfiler
from plugins.reference import ReferencePlatform, tiny_model_config

from core import LLM


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(tiny_model_config()).save_pretrained(directory)
    return directory


def _engine(directory, device, **kwargs):
    return LLM(model=str(directory), device=device, skip_tokenizer_init=True, max_model_len=128, **kwargs)


@pytest.mark.parametrize("dtype,factor", [("float32", 4), ("bfloat16", 2)])
def test_one_byte_cache_holds_more_tokens_in_the_same_bytes(tiny_llama, dtype, factor):
    directory = tiny_llama
    budget = 1 << 16  # 64 KiB; a token holds 2 layers x (K, V) x 2 kv heads x 16 dims = 128 values

    def capacity(kv_cache_dtype):
        llm = _engine(directory, ReferencePlatform(), dtype=dtype, kv_cache_dtype=kv_cache_dtype, kv_cache_bytes=budget)
        assert llm.engine.config.kv_cache_dtype == {"auto": dtype, "fp8": "fp8_e4m3"}[kv_cache_dtype]
        stats = llm.engine.stats()
        return stats["num_total_blocks"] * stats["block_size"]

    assert capacity("auto") == budget // (128 * torch.finfo(getattr(torch, dtype)).bits // 8)
    assert capacity("fp8") == factor * capacity("auto") == budget // 128


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "float16"])
def test_16bit_cache_under_float32_holds_twice_the_tokens(tiny_llama, kv_cache_dtype):
    def capacity(kv_cache_dtype):
        llm = _engine(
            tiny_llama, ReferencePlatform(), dtype="float32", kv_cache_dtype=kv_cache_dtype, kv_cache_bytes=1 << 16
        )
        stats = llm.engine.stats()
        return llm.engine.config.kv_cache_dtype, stats["num_total_blocks"] * stats["block_size"]

    want = (kv_cache_dtype, (1 << 16) // 256)
    assert capacity(kv_cache_dtype) == want and want[1] == 2 * capacity("auto")[1]


def test_unsupported_kv_cache_dtype_names_the_platform(tiny_llama):
    class NoFp8(Platform):
        name = "nofp8"
        device_type = "cpu"
        priority = 0

        def unavailable_reason(self):
            return None

    with pytest.raises(ValueError, match="kv_cache_dtype 'fp8_e5m2' is not supported on nofp8; supported: auto"):
        _engine(tiny_llama, NoFp8(), kv_cache_dtype="fp8_e5m2")


def test_a_platform_kv_layout_is_what_the_engine_allocates_and_counts(tiny_llama):
    """A platform's own layout (one-byte codes with scale rows, as plugin_openvino's u8): the caches
    have its shapes and dtype, and the budget holds as many blocks as its bytes allow."""

    class NoProfilePass(MemoryProfiler):
        needs_profile_run = False  # the eager profile pass cannot read such caches

    class ScaleRows(ReferencePlatform):
        name = "scalerows"

        def kv_cache_layout(self, config, num_kv_heads, head_size):
            b = config.block_size
            return KVCacheLayout((num_kv_heads, b + 8, head_size), (num_kv_heads, b, head_size + 8), torch.uint8)

        def make_memory_profiler(self):
            return NoProfilePass(self)

    llm = _engine(tiny_llama, ScaleRows(), dtype="float32", kv_cache_bytes=1 << 16)
    block_bytes = 2 * (2 * 24 * 16 + 2 * 16 * 24)  # layers x (K + V): 2 KV heads of 16, blocks of 16
    num_blocks = (1 << 16) // block_bytes
    assert llm.engine.stats()["num_total_blocks"] == num_blocks
    k_cache, v_cache = llm.engine.executor.runner.kv_caches[0]
    assert (k_cache.shape, v_cache.shape) == ((num_blocks, 2, 24, 16), (num_blocks, 2, 16, 24))
    assert k_cache.dtype == v_cache.dtype == torch.uint8
    llm.shutdown()
