"""The kit's check of a platform's own forward pass over the steps a serving engine mixes.

A runner that runs the model its own way (a fused native decoder, a compiled graph) must give
the eager torch path's logits whatever a step holds. The kernel checks feed each kernel caches
of 16-token blocks; this check runs the engine's path on the platform (its settings, its KV
cache layout, its runner) for a tiny random Llama, at the block size the platform resolves, over
three steps:

1. prefill of three prompts (the first fills two blocks and part of a third);
2. a prefix-cache hit beside decodes: a fourth sequence whose first two blocks are the first
   prompt's (its nine new tokens start past them), beside one new token for each of the others;
3. a decode of all four.

Each step's logits are compared with the reference platform's (the SDK's torch kernels, eager) at
the same block size and on the same block tables, both fed the reference's greedy tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
from plugins.reference import ReferencePlatform, tiny_model_config
from plugins.testing.base import ConformanceBase

#: logits must lie within this share of the reference's largest logit, per compute dtype
LOGITS_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
#: each step's sequences, in row order (sequence 3 is the prefix-cache hit), and what it holds
THREE_STEPS = (
    ((0, 1, 2), "prefill of three prompts"),
    ((0, 3, 1, 2), "a prefix-cache hit beside three decodes"),
    ((0, 1, 2, 3), "decode of four sequences"),
)


class RunnerStepChecks(ConformanceBase):
    """The platform's runner over prefill, a prefix-cache hit beside decodes, and decode, against eager."""

    def test_runner_three_steps_equal_eager(self, device_plat, tmp_path) -> None:
        pytest.importorskip("core", reason="install `core` to run the runner's three-step check")
        import torch
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        LlamaForCausalLM(tiny_model_config()).save_pretrained(tmp_path)
        dtype = "float32" if "float32" in device_plat.supported_dtypes else device_plat.supported_dtypes[0]
        platform = _StepWorker(device_plat, str(tmp_path), dtype)
        b = platform.block_size
        reference = _StepWorker(ReferencePlatform(), str(tmp_path), dtype, b)
        gen = torch.Generator().manual_seed(7)
        vocab = tiny_model_config().vocab_size
        tokens = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (2 * b + 5, 7, b + 1, 9)]
        tokens[3] = tokens[0][: 2 * b] + tokens[3]  # the first prompt's two full blocks, then nine new tokens
        computed = [0, 0, 0, 2 * b]  # tokens whose keys and values are in the cache
        # scattered block ids, highest first; the fourth sequence's first two blocks are the first's
        final = [len(t) + len(THREE_STEPS) - 1 for t in tokens[:3]] + [len(tokens[3]) + 1]
        own = [-(-n // b) for n in final]
        own[3] -= 2
        free = iter(range(sum(own) + 2, 0, -1))
        tables = [[next(free) for _ in range(n)] for n in own]
        tables[3] = tables[0][:2] + tables[3]
        for step, (live, what) in enumerate(THREE_STEPS, start=1):
            rows = [(computed[i], tokens[i][computed[i] :], tables[i]) for i in live]
            want = reference.run(rows)
            got = platform.run(rows)
            atol = LOGITS_TOLERANCE[dtype] * float(want.abs().max())
            where = (
                f"runner forward of {device_plat.name} on step {step} ({what}; block size {b}): logits not close "
                f"to the eager reference's (greedy tokens {got.argmax(-1).tolist()}, reference "
                f"{want.argmax(-1).tolist()})"
            )
            torch.testing.assert_close(got, want, atol=atol, rtol=0, msg=lambda m, where=where: f"{where}: {m}")
            for i, token in zip(live, want.argmax(-1).tolist(), strict=True):
                computed[i] = len(tokens[i])
                tokens[i].append(token)


class _StepWorker:
    """One engine worker of ``platform`` on the model at ``model`` (its own settings, KV cache
    and runner), run one hand-built step at a time."""

    def __init__(self, platform: Any, model: str, dtype: str, block_size: int | None = None) -> None:
        from core.config import EngineConfig
        from core.distributed.worker import Worker
        from core.resolve import resolve_engine

        settings = dict(model=model, device=platform, dtype=dtype, kv_cache_bytes=4 << 20)
        if block_size is None:
            block_size = resolve_engine(EngineConfig(**settings, max_model_len=256)).config.block_size
        # the steps' rows take at most 3 blocks and 13 tokens a step and 2 blocks and 12 a sequence: a
        # budget of that size keeps the start-up profile run (a forward of the budget) as small as the
        # steps (at a GPU platform's default of 8192 tokens it took minutes under Triton's interpreter)
        room = 4 * block_size + 16
        settings.update(block_size=block_size, max_model_len=room, max_num_seqs=4, max_num_batched_tokens=room)
        resolved = resolve_engine(EngineConfig(**settings))
        self.block_size = resolved.config.block_size
        self.worker = Worker(resolved.platform, resolved.config, resolved.model, load_tokenizer=False)
        self.worker.allocate_kv_cache(self.worker.plan_kv_cache().num_blocks)

    def run(self, rows: list[tuple[int, list[int], list[int]]]) -> Any:
        """float32 logits of the last token of each row ``(first position, tokens, block table)``."""
        from core.model_runner import StepBatch

        ids = [t for _, tokens, _ in rows for t in tokens]
        positions = [start + j for start, tokens, _ in rows for j in range(len(tokens))]
        query_lens = [len(tokens) for _, tokens, _ in rows]
        ends = [sum(query_lens[: i + 1]) - 1 for i in range(len(rows))]
        batch = StepBatch(
            ids, positions, query_lens, [start + len(tokens) for start, tokens, _ in rows],
            [table for _, _, table in rows], ends, list(range(len(rows))), {},
        )  # fmt: skip
        return self.worker.execute(batch).sample_logits.float().cpu()
