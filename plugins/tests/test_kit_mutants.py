"""The kit proves itself: kernel sets (and memory profilers, runners) with one classic bug each fail
its checks, the reference passes.

Each mutant is a :class:`plugins.kernels.Kernels` subclass with one op broken the way plugin
authors break it. One in-process pytest run holds a conformance class per mutant (float32, only
the checks of the broken op) and the unbroken kernels on the same checks; every mutant must fail
with a message that names the kernel, the input class and the error.
"""

import re
import textwrap

import pytest

# name: (the checks of the broken op, as a pytest -k expression of test names (class names hold words too); the kernel its messages name; the methods)
MUTANTS = {
    "RmsEpsOutsideRoot": (
        "test_rms_norm",
        "rms_norm",
        """
        def rms_norm(self, x, weight, eps):
            xf = x.float()
            return (xf * (torch.rsqrt(xf.pow(2).mean(-1, keepdim=True)) + eps) * weight.float()).to(x.dtype)
        """,
    ),
    "DroppedResidual": (
        "test_rms_norm",
        "fused_add_rms_norm",
        """
        def fused_add_rms_norm(self, x, residual, weight, eps):
            return self.rms_norm(x, weight, eps), (x.float() + residual.float()).to(x.dtype)
        """,
    ),
    "TransposedWeight": (
        "test_linear",
        "linear",
        """
        def linear(self, x, weight, bias=None):
            return F.linear(x, weight.T, bias)
        """,
    ),
    "GateUpSwapped": (
        "test_silu or test_gated",
        "silu_and_mul",
        """
        def silu_and_mul(self, x):
            up, gate = x.float().chunk(2, dim=-1)
            return (F.silu(gate) * up).to(x.dtype)
        """,
    ),
    "CausalMaskOffByOne": ("test_paged_attention", "paged_attention", "FUTURE_KEYS = 1"),
    "WrongSoftmaxScale": (
        "test_paged_attention",
        "paged_attention",
        """
        def paged_attention(self, q, k_cache, v_cache, meta, scale, sliding_window=None, kv_scale=None):
            return super().paged_attention(q, k_cache, v_cache, meta, q.shape[-1] ** -0.5, sliding_window, kv_scale)
        """,
    ),
    "MissingRotaryOffset": (
        "test_rotary",
        "rotary_embedding",
        """
        def rotary_embedding(self, positions, q, k, cos_sin_cache):
            return super().rotary_embedding(positions - positions.min(), q, k, cos_sin_cache)
        """,
    ),
    "KvSlotOneLate": (
        "test_write_kv_cache",
        "write_kv_cache",
        """
        def write_kv_cache(self, k, v, k_cache, v_cache, slot_mapping, kv_scale=None):
            late = torch.where(slot_mapping >= 0, slot_mapping + 1, slot_mapping)
            super().write_kv_cache(k, v, k_cache, v_cache, late, kv_scale)
        """,
    ),
    "BitmaskBitOrderReversed": (
        "test_apply_token_bitmask",
        "apply_token_bitmask",
        """
        def apply_token_bitmask(self, logits, bitmask, rows):
            bits = torch.arange(32, dtype=torch.int64)
            words = (((bitmask.long() & 0xFFFFFFFF).unsqueeze(-1) >> bits) & 1) << (31 - bits)
            words = words.sum(-1)
            super().apply_token_bitmask(logits, torch.where(words >= 2**31, words - 2**32, words).int(), rows)
        """,
    ),
    "LoraShrinkAlwaysSlot0": (
        "test_lora",
        "lora_shrink",
        """
        def lora_shrink(self, x, lora_a, mapping):
            out = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device)
            for _, rows in mapping.groups:
                out.index_copy_(0, rows, x.index_select(0, rows).float() @ lora_a[0].float().T)
            return out
        """,
    ),
    "LoraExpandIgnoresOffset": (
        "test_lora",
        "lora_expand",
        """
        def lora_expand(self, y, h, lora_b, mapping, offset=0):
            super().lora_expand(y, h, lora_b, mapping, 0)
        """,
    ),
    "CausalEncoderAttention": (
        "test_encoder",
        "encoder_attention",
        """
        def encoder_attention(self, q, k, v, query_start_loc, seq_lens, scale):
            out, start, group = torch.empty_like(q), 0, q.shape[1] // k.shape[1]
            for n in seq_lens:
                query, keys, values = (t[start : start + n].float().transpose(0, 1) for t in (q, k, v))
                keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
                attended = F.scaled_dot_product_attention(query, keys, values, is_causal=True, scale=scale)
                out[start : start + n] = attended.transpose(0, 1).to(q.dtype)
                start += n
            return out
        """,
    ),
    # a kernel that takes short multi-token rows for decode rows: each query sees its whole row
    "SpeculativeRowsSeeTheirDrafts": (
        "test_speculative",
        "paged_attention",
        """
        def future_keys(self, query_len):
            return query_len if 1 < query_len <= 8 else 0
        """,
    ),
    "MoeGateUpSwapped": (
        "test_fused_moe",
        "fused_moe",
        """
        def fused_moe(self, x, experts, topk_weights, topk_ids):
            gate, up = experts.gate_up.chunk(2, dim=1)
            swapped = type(experts)(torch.cat([up, gate], dim=1), experts.down, experts.num_experts)
            return super().fused_moe(x, swapped, topk_weights, topk_ids)
        """,
    ),
    "MoeRoutingWeightsIgnored": (
        "test_fused_moe",
        "fused_moe",
        """
        def fused_moe(self, x, experts, topk_weights, topk_ids):
            return super().fused_moe(x, experts, torch.ones_like(topk_weights), topk_ids)
        """,
    ),
}

# paged attention written out, so that a mutant can let each query see FUTURE_KEYS keys past its own
# position (future_keys of its row's query length); with 0 (the control, WrittenOut) it must pass the kit
WRITTEN_OUT = """
class WrittenOutKernels(Kernels):
    FUTURE_KEYS = 0

    def future_keys(self, query_len):
        return self.FUTURE_KEYS

    def paged_attention(self, q, k_cache, v_cache, meta, scale, sliding_window=None, kv_scale=None):
        out, start, group = torch.empty_like(q), 0, q.shape[1] // k_cache.shape[2]
        for i, (q_len, s_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host)):
            blocks = meta.block_tables[i, : -(-s_len // k_cache.shape[1])].long()
            keys, values = (c[blocks].flatten(0, 1)[:s_len].float().repeat_interleave(group, 1).transpose(0, 1)
                            for c in (k_cache, v_cache))
            scores = q[start : start + q_len].float().transpose(0, 1) @ keys.transpose(1, 2) * scale
            q_pos, k_pos = torch.arange(s_len - q_len, s_len).unsqueeze(1), torch.arange(s_len).unsqueeze(0)
            hidden = k_pos > q_pos + self.future_keys(q_len)
            if sliding_window is not None:
                hidden |= k_pos <= q_pos - sliding_window
            probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
            out[start : start + q_len] = (probs @ values).transpose(0, 1).to(q.dtype)
            start += q_len
        return out


"""
#: mutants of the written-out paged attention rather than of the reference kernels
WRITTEN_OUT_MUTANTS = {"CausalMaskOffByOne", "SpeculativeRowsSeeTheirDrafts"}


# memory profilers: a fixed budget too small for one max_model_len sequence, one that ignores --kv-cache-memory
PROFILERS = """
class SmallBudget(MemoryProfiler):
    def kv_cache_budget(self, config, peak_activation_bytes):
        return 256 << 20, "a fixed 256 MiB"


class IgnoresRequest(MemoryProfiler):
    def kv_cache_budget(self, config, peak_activation_bytes):
        return 2 << 30, "a fixed 2 GiB"


"""
PROFILER_MUTANTS = {"SmallBudget": "max_model_len=8192", "IgnoresRequest": "--kv-cache-memory asked"}

# runners: one that takes a row of more than 8 tokens for a fresh prompt (its cached prefix unseen,
# its new keys written over the prefix's blocks): only a prefix-cache hit shows it (a speculative
# row of drafts is shorter, a prompt has no prefix)
RUNNERS = """
class PrefixBlind(Runner):
    def forward(self, inputs):
        meta = inputs.attn_metadata
        seq_lens = [q if q > 8 else s for q, s in zip(meta.query_lens_host, meta.seq_lens_host)]
        tables = meta.block_tables.tolist()
        blind = AttentionMetadata.build(meta.query_lens_host, seq_lens, tables, self.kv_caches[0][0].shape[1])
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, blind)


"""
RUNNER_MUTANTS = {"PrefixBlind": "a prefix-cache hit beside three decodes"}


def uses_source(name, maker="make_memory_profiler"):
    """A reference platform ``Uses{name}`` whose ``maker`` returns ``name(self)``, and its conformance class."""
    return (
        f"class Uses{name}(ReferencePlatform):\n    name = {name.lower()!r}\n\n"
        f"    def {maker}(self):\n        return {name}(self)\n\n\n"
        f"class TestUses{name}(PlatformConformance):\n    platform = Uses{name}\n\n\n"
    )


def platform_source(name, methods, base="Kernels"):
    """A float32 reference platform ``name`` whose kernels are ``{name}Kernels(base)`` with ``methods``."""
    body = textwrap.indent(textwrap.dedent(methods).strip() or "pass", "    ")
    return (
        f"class {name}Kernels({base}):\n{body}\n\n\n"
        f"class {name}(ReferencePlatform):\n    name = {name.lower()!r}\n    supported_dtypes = ('float32',)\n"
        "    supported_kv_cache_dtypes = ()\n\n"
        f"    def make_kernels(self):\n        return {name}Kernels()\n\n\n"
        f"class Test{name}(PlatformConformance):\n    platform = {name}\n\n\n"
    )


class Reports:
    """A pytest plugin that keeps each test's call-phase outcome and failure text."""

    def __init__(self):
        self.outcomes = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.outcomes.setdefault(report.nodeid, (report.outcome, report.longreprtext))


@pytest.fixture(scope="module")
def kit_results(tmp_path_factory):
    """Run the kit's checks of each broken op on its mutant and on the unbroken kernels (one run)."""
    root = tmp_path_factory.mktemp("mutants")
    source = (
        "import torch\nimport torch.nn.functional as F\nfrom plugins.attention import AttentionMetadata\n"
        "from plugins.kernels import Kernels\nfrom plugins.memory import MemoryProfiler\n"
        "from plugins.reference import ReferencePlatform\nfrom plugins.runner import Runner\n"
        "from plugins.testing import PlatformConformance\n\n\n"
        + WRITTEN_OUT
        + PROFILERS
        + RUNNERS
        + "".join(map(uses_source, PROFILER_MUTANTS))
        + "".join(uses_source(name, "make_runner") for name in RUNNER_MUTANTS)
        + platform_source("Reference", "")
        + platform_source("WrittenOut", "", base="WrittenOutKernels")
        + "".join(
            platform_source(name, methods, base="WrittenOutKernels" if name in WRITTEN_OUT_MUTANTS else "Kernels")
            for name, (_, _, methods) in MUTANTS.items()
        )
    )
    (root / "test_mutants.py").write_text(source)
    (root / "pytest.ini").write_text("[pytest]\n")
    checks = " or ".join(sorted({f"({k})" for k, _, _ in MUTANTS.values()}))
    selection = " or ".join(
        [
            f"(TestReference and ({checks} or test_memory or test_speculative or three_steps))",
            "(TestWrittenOut and paged_attention)",
        ]
        + [f"(TestUses{name} and test_memory)" for name in PROFILER_MUTANTS]
        + [f"(TestUses{name} and (test_speculative or three_steps))" for name in RUNNER_MUTANTS]
        + [f"(Test{name} and ({k}))" for name, (k, _, _) in MUTANTS.items()]
    )
    reports = Reports()
    args = ["-q", "-p", "no:cacheprovider", "--import-mode=importlib", "--capture=sys", "-c", str(root / "pytest.ini")]
    code = pytest.main([*args, "--rootdir", str(root), "-k", selection, str(root / "test_mutants.py")], [reports])
    assert code in (0, 1), f"the kit's run did not complete: exit code {code}"
    return reports.outcomes


def outcomes_of(results, cls):
    return {nodeid: outcome for nodeid, outcome in results.items() if f"::{cls}::" in nodeid}


def test_the_reference_passes_the_checks_the_mutants_fail(kit_results):
    for cls in ("TestReference", "TestWrittenOut"):
        ran = outcomes_of(kit_results, cls)
        failed = {nodeid: text for nodeid, (outcome, text) in ran.items() if outcome != "passed"}
        assert ran and not failed, f"{cls}: {len(failed)} of {len(ran)} checks failed:\n" + "\n".join(failed.values())


@pytest.mark.parametrize("name", list(MUTANTS))
def test_the_kit_fails_the_mutant_naming_kernel_input_and_error(kit_results, name):
    _, kernel, _ = MUTANTS[name]
    ran = outcomes_of(kit_results, f"Test{name}")
    failures = [text for outcome, text in ran.values() if outcome == "failed"]
    assert ran and failures, f"the kit passed the mutant {name} on all {len(ran)} checks of {kernel}"
    # "<kernel> on <input class> (<dtype>)" then the error: a mismatch, an exception, or what differs
    named = re.compile(rf"{kernel}\b[^\n]* on [^\n]+(not close|raised \w+|differ)")
    explained = [text for text in failures if named.search(text)]
    assert explained, f"{name}: no failure names {kernel}, the input class and the error:\n{failures[0][-1500:]}"


@pytest.mark.parametrize("name", list(PROFILER_MUTANTS))
def test_the_kit_fails_a_memory_profiler_that_cannot_serve_the_defaults(kit_results, name):
    ran = outcomes_of(kit_results, f"TestUses{name}")
    failures = [text for outcome, text in ran.values() if outcome == "failed"]
    assert any(PROFILER_MUTANTS[name] in text for text in failures), f"{name}: {len(failures)} of {len(ran)} failed"


@pytest.mark.parametrize("name", list(RUNNER_MUTANTS))
def test_the_kit_fails_a_runner_only_on_the_step_it_breaks(kit_results, name):
    """The three-step check fails the runner naming the step; the speculative-step check passes it."""
    ran = outcomes_of(kit_results, f"TestUses{name}")
    outcome, text = next(result for nodeid, result in ran.items() if "three_steps" in nodeid)
    assert outcome == "failed" and RUNNER_MUTANTS[name] in text and "not close" in text, text[-1500:]
    assert all(result[0] == "passed" for nodeid, result in ran.items() if "speculative" in nodeid), ran
