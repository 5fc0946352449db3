"""Neuron's compiled shapes, the padding to them, and the compile-cache settings, without a device.

Sources: NxD Inference's feature guide ("Bucketing") and vLLM user guide (its default
NeuronConfig: ``batch_size=max_num_seqs``, ``ctx_batch_size=1``,
``max_context_length=seq_len=max_model_len``, ``enable_bucketing=True``,
``padding_side="right"``; ``NEURON_COMPILED_ARTIFACTS``; ``VLLM_NEURON_FRAMEWORK``), and
the Neuron docs' "Neuron Persistent Cache" (default ``/var/tmp/neuron-compile-cache``,
``--cache_dir`` over ``NEURON_COMPILE_CACHE_URL``, ``s3://``, ``--no_cache``).
"""

import importlib.util
import os

import pytest
import torch
from plugin_neuron.buckets import NeuronShapes
from plugin_neuron.compile_cache import (
    DEFAULT_CACHE_DIR,
    CompileCache,
    cache_dir_flag,
    compile_key,
    compiled_artifacts_dir,
    exports,
    resolve_compile_cache,
)
from plugin_neuron.platform import NeuronPlatform, choose_framework
from plugin_neuron.runner import NeuronRunner, pad_prompt, sequence_inputs
from plugins import EnvConfigError
from plugins.attention import AttentionMetadata
from plugins.kernels import Kernels
from plugins.reference import engine_config
from plugins.runner import ModelInputs, Runner

NEURON_VARS = ("NEURON_CC_FLAGS", "NEURON_COMPILE_CACHE_URL", "CORE_NEURON_COMPILE_CACHE_URL",
               "NEURON_CONTEXT_LENGTH_BUCKETS", "NEURON_TOKEN_GEN_BUCKETS", "NEURON_COMPILED_ARTIFACTS")  # fmt: skip


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in NEURON_VARS:
        monkeypatch.delenv(name, raising=False)


def test_compiled_shapes_of_vllms_default_config():
    shapes = NeuronPlatform().shapes(engine_config(max_model_len=2048, max_num_seqs=8))
    assert shapes == NeuronShapes([128, 256, 512, 1024, 2048], [128, 256, 512, 1024, 2048], 8)
    assert shapes.context_shape(412) == (1, 512)  # one prompt at a time, right-padded
    assert shapes.token_gen_shape([130, 7, 513]) == (8, 1024)  # the longest sequence picks the bucket
    assert len(shapes.graphs()) == 10 and shapes.graphs()[5] == ("token_gen", 8, 128)
    with pytest.raises(ValueError, match="9 sequences exceed the compiled batch size 8"):
        shapes.token_gen_shape([1] * 9)


def test_vllm_example_buckets_under_the_bare_names(monkeypatch):
    # vLLM's Neuron example sets the bare names: "128,512,1024,2048"
    monkeypatch.setenv("NEURON_CONTEXT_LENGTH_BUCKETS", "128,512,1024,2048")
    monkeypatch.setenv("NEURON_TOKEN_GEN_BUCKETS", "128,512,1024,2048")
    shapes = NeuronPlatform().shapes(engine_config(max_model_len=2048, max_num_seqs=4))
    assert shapes.context == shapes.token_gen == [128, 512, 1024, 2048]
    assert shapes.context_shape(129) == (1, 512)
    monkeypatch.setenv("CORE_NEURON_TOKEN_GEN_BUCKETS", "256,2048")  # the CORE_ spelling wins
    assert NeuronPlatform().shapes(engine_config(max_model_len=2048)).token_gen == [256, 2048]
    monkeypatch.setenv("NEURON_CONTEXT_LENGTH_BUCKETS", "128,x")
    with pytest.raises(EnvConfigError, match="NEURON_CONTEXT_LENGTH_BUCKETS='128,x' is not valid"):
        NeuronPlatform().shapes(engine_config(max_model_len=2048))


class TinyModel:
    """Embedding -> K/V write -> paged attention, the attention a compiled graph runs."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.embed, self.kernels, self.calls = torch.randn(64, 96, generator=gen), Kernels(), []

    def __call__(self, input_ids, positions, kv_caches, meta):
        self.calls.append((meta.num_seqs, input_ids.shape[0], tuple(meta.block_tables.shape)))
        q, k, v = (self.embed[input_ids] + positions[:, None]).view(-1, 3, 2, 16).unbind(1)
        self.kernels.write_kv_cache(k, v, *kv_caches[0], meta.slot_mapping)
        return self.kernels.paged_attention(q.contiguous(), *kv_caches[0], meta, 0.25).flatten(1)


def caches():
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(48, 16, 2, 16, generator=gen), torch.randn(48, 16, 2, 16, generator=gen))]


def runners(monkeypatch):
    monkeypatch.setenv("NEURON_CONTEXT_LENGTH_BUCKETS", "32,64")
    monkeypatch.setenv("NEURON_TOKEN_GEN_BUCKETS", "32,64")
    config, model = engine_config(max_model_len=64, max_num_seqs=4, block_size=16), TinyModel()
    neuron, eager = NeuronRunner(NeuronPlatform()), Runner(NeuronPlatform())
    neuron_caches, eager_caches = caches(), caches()
    neuron.prepare(model, neuron_caches, config)
    eager.prepare(model, eager_caches, config)
    return neuron, eager, model, neuron_caches, eager_caches


def test_padded_prompts_and_decodes_equal_eager(monkeypatch):
    neuron, eager, model, neuron_caches, eager_caches = runners(monkeypatch)
    prompts = AttentionMetadata.build([20, 40], [20, 40], [[1, 2], [3, 4, 5]], 16)
    inputs = ModelInputs(torch.arange(60) % 64, torch.cat([torch.arange(20), torch.arange(40)]), prompts)
    torch.testing.assert_close(neuron.execute(inputs), eager.execute(inputs))
    assert model.calls[:2] == [(1, 32, (1, 2)), (1, 64, (1, 4))]  # each prompt alone at its bucket: 32, 64
    torch.testing.assert_close(neuron_caches[0][0], eager_caches[0][0])  # padding wrote nothing
    decode = ModelInputs(torch.tensor([5, 6]), torch.tensor([20, 40]), AttentionMetadata.build([1, 1], [21, 41], [[1, 2], [3, 4, 5]], 16))  # fmt: skip
    torch.testing.assert_close(neuron.execute(decode), eager.execute(decode))
    assert model.calls[3] == (4, 4, (4, 4))  # (calls[2] is eager) batch 4, token-generation bucket 64 = 4 blocks of 16
    torch.testing.assert_close(neuron_caches[0][1], eager_caches[0][1])


def test_prompt_padding_layout():
    batch = AttentionMetadata.build([3, 4], [3, 4], [[2], [5]], 16)
    one = sequence_inputs(ModelInputs(torch.arange(7), torch.tensor([0, 1, 2, 0, 1, 2, 3]), batch), 1)
    assert one.input_ids.tolist() == [3, 4, 5, 6] and one.attn_metadata.block_tables.tolist() == [[5]]
    padded = pad_prompt(one, 40, 16)
    assert padded.input_ids.tolist() == [3, 4, 5, 6] + [0] * 36 and padded.positions.tolist() == list(range(40))
    meta = padded.attn_metadata
    assert meta.seq_lens_host == meta.query_lens_host == [40] and meta.query_start_loc.tolist() == [0, 40]
    assert meta.block_tables.tolist() == [[5, 0, 0]] and meta.slot_mapping[4:].eq(-1).all()
    with pytest.raises(ValueError, match="cannot pad a 4-token prompt down to 2"):
        pad_prompt(one, 2, 16)


def test_compile_cache_precedence():
    assert resolve_compile_cache({}, None) == CompileCache(DEFAULT_CACHE_DIR, "default")
    ours = resolve_compile_cache({}, "/data/cache")
    assert (ours.url, ours.source) == ("/data/cache", "CORE_NEURON_COMPILE_CACHE_URL")
    assert exports(ours) == {"NEURON_COMPILE_CACHE_URL": "/data/cache"}
    sdk = resolve_compile_cache({"NEURON_COMPILE_CACHE_URL": "s3://bucket/neuron"}, "/data/cache")
    assert (sdk.url, sdk.source, sdk.is_s3) == ("s3://bucket/neuron", "NEURON_COMPILE_CACHE_URL", True)
    assert sdk.shadowed == ["CORE_NEURON_COMPILE_CACHE_URL"] and exports(sdk) == {}
    # "--cache_dir is prioritized over NEURON_COMPILE_CACHE_URL if both are set"
    flags = {"NEURON_CC_FLAGS": "-O1 --cache_dir=/fast/cache", "NEURON_COMPILE_CACHE_URL": "/slow"}
    assert resolve_compile_cache(flags, None) == CompileCache("/fast/cache", "NEURON_CC_FLAGS --cache_dir", ["NEURON_COMPILE_CACHE_URL"])  # fmt: skip
    assert cache_dir_flag("--log_level=INFO --cache_dir /x") == "/x" and cache_dir_flag("-O1") is None
    off = resolve_compile_cache({"NEURON_CC_FLAGS": "--no_cache", "NEURON_COMPILE_CACHE_URL": "/c"}, None)
    assert off.url is None and off.shadowed == ["NEURON_COMPILE_CACHE_URL"]
    with pytest.raises(ValueError, match="NEURON_COMPILE_CACHE_URL='s3://' names no S3 bucket"):
        resolve_compile_cache({"NEURON_COMPILE_CACHE_URL": "s3://"}, None)
    with pytest.raises(
        ValueError, match="'http://cache': the Neuron compile cache is a local directory or an s3:// URL"
    ):
        resolve_compile_cache({}, "http://cache")


def test_platform_exports_its_cache_setting(monkeypatch):
    monkeypatch.setenv("CORE_NEURON_COMPILE_CACHE_URL", "/data/cache")
    plat = NeuronPlatform()
    assert plat.compile_cache().url == "/data/cache"
    monkeypatch.setenv("NEURON_CC_FLAGS", "--cache_dir=s3://b")
    assert NeuronPlatform().compile_cache().url == "s3://b"
    monkeypatch.setenv("NEURON_CC_FLAGS", "--cache_dir=ftp://b")
    with pytest.raises(ValueError, match="NEURON_CC_FLAGS --cache_dir='ftp://b'"):
        NeuronPlatform().check_config(engine_config(dtype="bfloat16"))


def test_compiled_artifacts_location(tmp_path, monkeypatch):
    model_dir = tmp_path / "Llama"
    model_dir.mkdir()
    key = compile_key({"batch": 4, "context": [128, 2048]})
    assert key == compile_key({"context": [128, 2048], "batch": 4}) != compile_key({"batch": 8, "context": [128, 2048]})
    # unset: "a neuron-compiled-artifacts subdirectory in the directory of your model checkpoint"
    assert compiled_artifacts_dir(str(model_dir), None, key) == str(model_dir / "neuron-compiled-artifacts" / key)
    gguf = model_dir / "model.gguf"
    gguf.write_bytes(b"")
    assert compiled_artifacts_dir(str(gguf), None, key) == str(model_dir / "neuron-compiled-artifacts" / key)
    assert compiled_artifacts_dir("org/hub-id", "/srv/compiled", key) == "/srv/compiled"
    with pytest.raises(ValueError, match="'org/hub-id' is not a local path: set NEURON_COMPILED_ARTIFACTS"):
        compiled_artifacts_dir("org/hub-id", None, key)
    monkeypatch.setenv("NEURON_COMPILED_ARTIFACTS", str(tmp_path / "pre"))  # vLLM's bare name
    assert NeuronPlatform().artifacts_dir(engine_config(model=str(model_dir))) == str(tmp_path / "pre")
    monkeypatch.delenv("NEURON_COMPILED_ARTIFACTS")
    two = {NeuronPlatform().artifacts_dir(engine_config(model=str(model_dir), max_num_seqs=n)) for n in (4, 8)}
    assert len(two) == 2 and all(os.path.dirname(p) == str(model_dir / "neuron-compiled-artifacts") for p in two)


def test_framework_choice():
    both = {"neuronx_distributed_inference", "transformers_neuronx"}
    # "If you have both libraries installed, and VLLM_NEURON_FRAMEWORK is not set, NxD Inference is used"
    assert choose_framework(None, both) == "neuronx-distributed-inference"
    assert choose_framework(None, {"transformers_neuronx"}) == "transformers-neuronx"
    assert choose_framework("transformers-neuronx", both) == "transformers-neuronx"
    with pytest.raises(
        ValueError, match="NEURON_FRAMEWORK=transformers-neuronx but transformers_neuronx is not installed"
    ):
        choose_framework("transformers-neuronx", {"neuronx_distributed_inference"})
    with pytest.raises(ValueError, match="neither Neuron framework is installed"):
        choose_framework(None, set())
    assert (
        NeuronPlatform().read_env({"VLLM_NEURON_FRAMEWORK": "transformers-neuronx"})["NEURON_FRAMEWORK"]
        == "transformers-neuronx"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("torch_neuronx") is None,
    reason="needs the AWS Neuron SDK (torch_neuronx) and a Neuron device",
)
def test_device_init(tmp_path):
    NeuronPlatform().init_device(engine_config(model=str(tmp_path), dtype="bfloat16"))
