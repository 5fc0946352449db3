"""The native LoRA kernels (native/src/lora.cpp) against the SDK's torch default, on every ISA path.

Mixed batches of base rows and several slots: slots with a few rows (each output a dot over the
rank) and slots with many (B transposed once for all their rows), odd rows after the register
tiles' pairs, a fused projection's parts expanded into their own columns, padded rows past the
mapping, ranks and input sizes off the vector tiles, float32 and bfloat16.
"""

from __future__ import annotations

import pytest
import torch
from plugins.lora import LoRAMapping

CASES = {  # row_slots, padded rows, in features, parts, rank
    "one row": ([2], 0, 64, (96,), 8),
    "fused qkv": ([1, -1, 0, 1, 1, -1, 3, 1, 0], 2, 96, (64, 32, 32), 16),
    "batch, parallel": ([s % 4 - 1 for s in range(40)], 0, 512, (1024, 1000), 8),  # over lora.cpp's kParallelWork
    "rank 64": ([0, 0, 3], 1, 128, (130,), 64),
    # slots with kTransposeRows (16) rows or more: their B transposed once, outputs past the last block of 64
    "many rows": ([s % 3 - 1 for s in range(61)], 3, 64, (100, 36), 16),
    "rank 12, many rows": ([0] * 20 + [1] * 3 + [-1], 0, 40, (70,), 12),  # no register tiles (12, 40: not 8k)
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_shrink_expand_match_torch(kernels, ref, gen, rand, close, dtype, case):
    row_slots, padded, in_features, parts, rank = CASES[case]
    num_slots, num_rows = 4, len(row_slots) + padded
    x = rand((num_rows, in_features), dtype, gen)
    lora_a = rand((num_slots, len(parts) * rank, in_features), dtype, gen, in_features**-0.5)
    lora_b = [rand((num_slots, n, rank), dtype, gen, rank**-0.5) for n in parts]
    y = rand((num_rows, sum(parts)), dtype, gen)
    mapping = LoRAMapping.build(row_slots)
    calls = []
    for name in ("lora_shrink", "lora_expand"):  # count the native calls: a fallback to torch would pass too
        native = getattr(kernels.lib, name)
        setattr(kernels.lib, name, lambda *args, native=native, name=name: calls.append(name) or native(*args))

    h, want_h = kernels.lora_shrink(x, lora_a, mapping), ref.lora_shrink(x, lora_a, mapping)
    got, want = y.clone(), y.clone()
    for i, (b, offset) in enumerate(zip(lora_b, [sum(parts[:i]) for i in range(len(parts))], strict=True)):
        kernels.lora_expand(got, h[:, i * rank : (i + 1) * rank], b, mapping, offset)
        ref.lora_expand(want, want_h[:, i * rank : (i + 1) * rank], b, mapping, offset)

    assert calls == ["lora_shrink"] + ["lora_expand"] * len(parts)
    torch.testing.assert_close(h, want_h, atol=1e-4, rtol=1e-4)
    base = [t for t in range(num_rows) if t >= len(row_slots) or row_slots[t] < 0]
    assert torch.equal(got[base], y[base]) and not h[base].any(), "base and padded rows must stay untouched"
    close(got, want, f"lora_expand, {case}")
    assert (got != y).any(dim=1).sum() == len(row_slots) - row_slots.count(-1)


def test_unnative_inputs_fall_back_to_torch(kernels, ref, gen, rand):
    """A float16 batch and a rank above the native maximum take the torch default, with its result."""
    mapping = LoRAMapping.build([0, -1])
    x, lora_a = rand((2, 32), torch.float16, gen), rand((1, 8, 32), torch.float16, gen)
    torch.testing.assert_close(kernels.lora_shrink(x, lora_a, mapping), ref.lora_shrink(x, lora_a, mapping))
    rank = kernels.lib.lora_max_rank() + 1
    h, lora_b, y = rand((2, rank), torch.float32, gen), rand((1, 16, rank), torch.float32, gen, 0.1), torch.zeros(2, 16)
    want = y.clone()
    kernels.lora_expand(y, h, lora_b, mapping)
    ref.lora_expand(want, h, lora_b, mapping)
    assert torch.equal(y, want) and y[0].any()


def test_fused_decoder_runs_adapter_steps(tmp_path, monkeypatch):
    """Base rows and two peft adapters in one batch, every step one native call (the eager forward is
    never taken): each prompt's greedy tokens equal transformers + peft's."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from core.bench.parity import hf_greedy
    from plugin_cpu_x86.platform import CpuX86Platform
    from plugins.reference import tiny_model_config
    from plugins.runner import Runner

    from core import LLM, LoRARequest, SamplingParams

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(tiny_model_config()).eval()
    hf.save_pretrained(tmp_path / "model")
    prompts = [[5, 17, 200, 3], list(range(10, 47)), [9]]
    expected = {None: [hf_greedy(hf, p, 8)[0] for p in prompts]}
    adapters = {"all": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj",
                "gate_proj", "up_proj", "down_proj"]}, "qv": {"r": 4, "lora_alpha": 8, "use_rslora": True,
                "target_modules": ["q_proj", "v_proj"]}}  # fmt: skip
    for seed, (name, options) in enumerate(adapters.items(), 1):
        torch.manual_seed(seed)
        adapted = peft.get_peft_model(hf, peft.LoraConfig(init_lora_weights=False, **options)).eval()
        adapted.save_pretrained(tmp_path / name)
        expected[name] = [hf_greedy(adapted, p, 8)[0] for p in prompts]
        hf = adapted.unload()
    llm = LLM(model=str(tmp_path / "model"), device=CpuX86Platform(), dtype="float32", skip_tokenizer_init=True,
              enable_lora=True, max_loras=2, max_lora_rank=8)  # fmt: skip
    assert llm.engine.executor.runner.runner.fused is not None, "the model should run as one native call a step"

    def eager(self, inputs):
        raise AssertionError("a step ran the eager forward")

    monkeypatch.setattr(Runner, "forward", eager)
    names = [None, *adapters]
    requests = {name: LoRARequest(name, i + 1, str(tmp_path / name)) for i, name in enumerate(adapters)}
    outs = llm.generate(
        prompt_token_ids=[p for _ in names for p in prompts], use_tqdm=False,
        sampling_params=SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        lora_request=[requests.get(name) for name in names for _ in prompts],
    )  # fmt: skip
    assert [o.outputs[0].token_ids for o in outs] == [t for name in names for t in expected[name]]
    assert expected["all"] != expected[None] != expected["qv"], "the adapters must change the answers"
