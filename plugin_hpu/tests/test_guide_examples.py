"""Every worked example of vLLM's Gaudi guide, with the guide's numbers quoted.

Source: ../shared/reference/vllm-install-all-hardware.zh.md, "Intel Gaudi" ->
"性能调优" (performance tuning): bucketing, warm-up, HPU-graph capture, variables.
Two of its logs disagree with its own text, and the tests say where:
- decode's second dimension is printed as ``seq`` (an older vLLM) where the variable
  table has ``DECODE_BLOCK_BUCKET_*``: the numbers and the lookup are the same;
- the capture log prints ``VLLM_GRAPH_PROMPT_RATIO=0.3`` but splits 15.85 GiB into
  7.923 + 7.923 GiB, i.e. a ratio of 0.5 (the text's "0.3: both phases get the
  same memory" is the same slip); the log's capture sequence only comes out at 0.5.
"""

import pytest
from plugin_hpu.bucketing import (
    BucketRange,
    HpuBuckets,
    capture_order,
    decode_buckets,
    default_ranges,
    prompt_buckets,
    warmup_order,
)
from plugin_hpu.graph_memory import capture_graphs, describe_split, format_bytes, plan_memory, split_graph_memory
from plugin_hpu.platform import HpuMemoryProfiler, HpuPlatform
from plugins.buckets import ramp_up_range
from plugins.memory import GiB, MiB
from plugins.reference import engine_config

# "Generated 24 prompt buckets: [...]" and "Generated 48 decode buckets: [...]", as printed
# fmt: off
GUIDE_PROMPT = [(1, 128), (1, 256), (1, 384), (1, 512), (1, 640), (1, 768), (1, 896), (1, 1024), (2, 128), (2, 256), (2, 384), (2, 512), (2, 640), (2, 768), (2, 896), (2, 1024), (4, 128), (4, 256), (4, 384), (4, 512), (4, 640), (4, 768), (4, 896), (4, 1024)]
GUIDE_DECODE = [
    (1, 128),
    (1, 256),
    (1, 384),
    (1, 512),
    (1, 640),
    (1, 768),
    (1, 896),
    (1, 1024),
    (1, 1152),
    (1, 1280),
    (1, 1408),
    (1, 1536),
    (1, 1664),
    (1, 1792),
    (1, 1920),
    (1, 2048),
    (2, 128),
    (2, 256),
    (2, 384),
    (2, 512),
    (2, 640),
    (2, 768),
    (2, 896),
    (2, 1024),
    (2, 1152),
    (2, 1280),
    (2, 1408),
    (2, 1536),
    (2, 1664),
    (2, 1792),
    (2, 1920),
    (2, 2048),
    (4, 128),
    (4, 256),
    (4, 384),
    (4, 512),
    (4, 640),
    (4, 768),
    (4, 896),
    (4, 1024),
    (4, 1152),
    (4, 1280),
    (4, 1408),
    (4, 1536),
    (4, 1664),
    (4, 1792),
    (4, 1920),
    (4, 2048),
]
# fmt: on
GUIDE_PROMPT_CONFIG = "Prompt bucket config (min, step, max_warmup) bs:[1, 32, 4], seq:[128, 128, 1024]"


def guide_buckets() -> HpuBuckets:
    """The guide's configuration: prompt bs:[1, 32, 4] seq:[128, 128, 1024], decode bs:[1, 128, 4] x [128, 128, 2048]."""
    env = {
        "PROMPT_BS_BUCKET_MAX": 4,
        "DECODE_BS_BUCKET_STEP": 128,
        "DECODE_BS_BUCKET_MAX": 4,
        "DECODE_BLOCK_BUCKET_MAX": 2048,
    }
    return HpuBuckets.build(env, max_num_seqs=32, block_size=128, max_model_len=1024)


def test_ramp_up_examples():
    # min = 2, step = 32, max = 64 => ramp_up = (2, 4, 8, 16), stable = (32, 64)
    assert BucketRange(2, 32, 64).values() == [2, 4, 8, 16, 32, 64]
    assert ramp_up_range(2, 32, 31) == [2, 4, 8, 16] and ramp_up_range(32, 32, 64) == [32, 64]
    # min = 128, step = 128, max = 512 => ramp_up = (), stable = (128, 256, 384, 512)
    assert BucketRange(128, 128, 512).values() == [128, 256, 384, 512]


def test_generated_bucket_lists_and_log_lines():
    buckets = guide_buckets()
    assert buckets.prompt == GUIDE_PROMPT and len(GUIDE_PROMPT) == 24
    assert buckets.decode == GUIDE_DECODE and len(GUIDE_DECODE) == 48
    lines = buckets.describe().splitlines()
    assert lines[0] == GUIDE_PROMPT_CONFIG
    assert lines[1] == "Generated 24 prompt buckets: " + str(GUIDE_PROMPT)
    assert lines[2] == "Decode bucket config (min, step, max_warmup) bs:[1, 128, 4], block:[128, 128, 2048]"
    assert lines[3] == "Generated 48 decode buckets: " + str(GUIDE_DECODE)


def test_padding_example():
    # 3 sequences, longest 412 tokens -> prefill bucket (4, 512); decode stays (4, 512)
    # until a request finishes -> (2, 512), or the context passes 512 tokens -> (4, 640)
    buckets = guide_buckets()
    assert buckets.prompt_bucket(3, 412) == (4, 512)
    assert buckets.decode_bucket(3, 412) == (4, 512)
    assert buckets.decode_bucket(2, 412) == (2, 512)
    assert buckets.decode_bucket(3, 513) == (4, 640)
    # "a request over the largest bucket in any dimension is processed without padding"
    assert buckets.prompt_bucket(5, 100) is None and buckets.prompt_bucket(1, 1025) is None


def test_warmup_order_log():
    # [Warmup][Prompt][1/24] 4x1024, [2/24] 4x896, [3/24] 4x768 ... [24/24] 1x128
    prompt = warmup_order(GUIDE_PROMPT)
    assert prompt[:3] == [(4, 1024), (4, 896), (4, 768)] and prompt[23] == (1, 128)
    # [Warmup][Decode][1/48] 4x2048, [2/48] 4x1920, [3/48] 4x1792 ... [47/48] 2x128, [48/48] 1x128
    decode = warmup_order(GUIDE_DECODE)
    assert decode[:3] == [(4, 2048), (4, 1920), (4, 1792)] and decode[46:] == [(2, 128), (1, 128)]


def test_strategy_orders():
    # max_bs: batch size descending, then sequence length ascending
    example = [(64, 128), (64, 256), (32, 128), (32, 256), (1, 128), (1, 256)]
    assert capture_order(sorted(example), "max_bs") == example
    # min_tokens: batch_size * sequence_length ascending; the log's [12/24] .. [15/24]
    order = capture_order(GUIDE_PROMPT, "min_tokens")
    assert order[0] == (1, 128) and order[10] == (1, 896)
    assert order[11:15] == [(4, 256), (2, 512), (1, 1024), (2, 640)]
    # decode's default (max_bs): [Graph/Decode][1/48] 4x128 ... [48/48] 1x2048
    decode = capture_order(GUIDE_DECODE, "max_bs")
    assert decode[0] == (4, 128) and decode[47] == (1, 2048)


def test_memory_split_log_line():
    plan = plan_memory(int(79.16 * GiB), 0.5, 0.4)
    assert plan.describe(0.5, 0.4) == (
        "Free device memory: 79.16 GiB, 39.58 GiB usable (gpu_memory_utilization=0.5), "
        "15.83 GiB reserved for HPUGraphs (VLLM_GRAPH_RESERVED_MEM=0.4), 23.75 GiB reserved for KV cache"
    )


class LoggedDevice:
    """The guide's Gaudi as its log shows it: free memory and what each graph took."""

    def __init__(self, free: int, costs: dict) -> None:
        self.free, self.costs, self.calls = free, costs, []

    def free_memory(self) -> int:
        return self.free

    def capture(self, bucket, is_prompt):
        self.calls.append(("Prompt" if is_prompt else "Decode", bucket, self.free))
        used = self.costs[(bucket, is_prompt)]
        self.free -= used
        return used


def test_kv_blocks_of_the_logged_run():
    # "# HPU blocks: 1519" and "Initializing cache engine took 23.73 GiB": the 14.97 GiB of
    # bf16 weights are Llama-3-8B's (8.03 B parameters): 32 layers, 8 KV heads of 128, block 128
    class LoggedGaudi:  # torch.hpu's memory API as the log reads it: 79.16 GiB free after the profile run
        @staticmethod
        def mem_get_info() -> tuple[int, int]:
            return int(79.16 * GiB), 96 * GiB

    profiler = HpuMemoryProfiler(HpuPlatform(), device=LoggedGaudi())
    profiler.platform.env = HpuPlatform().read_env({"VLLM_GRAPH_RESERVED_MEM": "0.4"})
    config = engine_config(gpu_memory_utilization=0.5, enforce_eager=False)
    plan = profiler.plan_kv_cache(config, block_bytes=2 * 32 * 128 * 8 * 128 * 2)
    assert plan.num_blocks == 1519
    assert format_bytes(plan.num_blocks * plan.block_bytes) == "23.73 GiB"
    assert format_bytes(int(79.16 * GiB) - plan.num_blocks * plan.block_bytes) == "55.43 GiB"  # warm-up's free_mem


def test_graph_capture_log():
    free_after_profile, free_at_capture, ratio = int(79.16 * GiB), int(55.426 * GiB), 0.5  # see the module doc
    margin = plan_memory(free_after_profile, 0.5, 0.4).margin_bytes
    total, prompt_share, decode_share = split_graph_memory(free_at_capture, margin, ratio)
    assert describe_split(total, free_at_capture, prompt_share, decode_share, ratio) == (
        "Using 15.85 GiB/55.43 GiB of free device memory for HPUGraphs, 7.923 GiB for prompt and "
        "7.923 GiB for decode (VLLM_GRAPH_PROMPT_RATIO=0.5)"
    )
    prompt_order, decode_order = capture_order(GUIDE_PROMPT, "min_tokens"), capture_order(GUIDE_DECODE, "max_bs")
    # what each graph took, from the log's free_mem readings: graphs 1-10 55.43 -> 48.77 GiB
    # (shared by tokens), 11: -> 47.51, the 48 decode graphs 161.9 MiB, 12-14 -> 45.91,
    # 44.48, 43.03 GiB, and 15 the rest of "used_mem:14.03 GiB"
    first_ten = prompt_order[:10]
    tokens = sum(b * s for b, s in first_ten)
    costs = {((b, s), True): int(b * s * 6.66 * GiB / tokens) for b, s in first_ten}
    for bucket, gib in zip(prompt_order[10:15], (1.26, 1.44, 1.43, 1.45, 1.79), strict=True):
        costs[(bucket, True)] = int(gib * GiB)
    costs |= {((b, s), True): int(b * s * 1.4 * MiB) for b, s in prompt_order[15:]}
    costs |= {(b, False): int(161.9 * MiB) // 48 for b in decode_order}
    device = LoggedDevice(free_at_capture, costs)
    prompt, decode = capture_graphs(prompt_order, decode_order, total, ratio, device.capture)
    lines = [
        f"[Warmup][Graph/{phase}][{order.index(bucket) + 1}/{len(order)}] batch_size:{bucket[0]} "
        f"seq_len:{bucket[1]} free_mem:{format_bytes(free)}"
        for phase, bucket, free in device.calls
        for order in [prompt_order if phase == "Prompt" else decode_order]
    ]
    assert len(lines) == 15 + 48
    assert lines[0] == "[Warmup][Graph/Prompt][1/24] batch_size:1 seq_len:128 free_mem:55.43 GiB"
    assert lines[10] == "[Warmup][Graph/Prompt][11/24] batch_size:1 seq_len:896 free_mem:48.77 GiB"
    assert lines[11] == "[Warmup][Graph/Decode][1/48] batch_size:4 seq_len:128 free_mem:47.51 GiB"
    assert lines[58:] == [
        "[Warmup][Graph/Decode][48/48] batch_size:1 seq_len:2048 free_mem:47.35 GiB",
        "[Warmup][Graph/Prompt][12/24] batch_size:4 seq_len:256 free_mem:47.35 GiB",
        "[Warmup][Graph/Prompt][13/24] batch_size:2 seq_len:512 free_mem:45.91 GiB",
        "[Warmup][Graph/Prompt][14/24] batch_size:1 seq_len:1024 free_mem:44.48 GiB",
        "[Warmup][Graph/Prompt][15/24] batch_size:2 seq_len:640 free_mem:43.03 GiB",
    ]
    assert prompt.describe("Prompt", 24) == (
        "Graph/Prompt captured:15 (62.5%) used_mem:14.03 GiB buckets:[(1, 128), (1, 256), (1, 384), (1, 512), (1, 640), (1, 768), (1, 896), (1, 1024), (2, 128), (2, 256), (2, 384), (2, 512), (2, 640), (4, 128), (4, 256)]"
    )
    assert (
        decode.describe("Decode", 48) == f"Graph/Decode captured:48 (100.0%) used_mem:161.9 MiB buckets:{GUIDE_DECODE}"
    )
    # "Warmup finished in 49 secs, allocated 14.19 GiB of device memory"
    assert format_bytes(prompt.used_bytes + decode.used_bytes) == "14.19 GiB"
    assert [p for p, _ in prompt.log] == list(range(1, 16))


def test_documented_defaults_and_ratios():
    # gpu_memory_utilization: "100 GiB device, 50 GiB free after loading and profiling:
    # 90% of 50 GiB usable, 5 GiB margin"; VLLM_GRAPH_RESERVED_MEM=0.1: 10% graphs, 90% KV
    plan = plan_memory(50 * GiB, 0.9, 0.1)
    assert plan.usable_bytes == 45 * GiB and plan.margin_bytes == 5 * GiB
    assert plan.graph_bytes == int(4.5 * GiB) and plan.kv_cache_bytes == int(40.5 * GiB)
    # VLLM_GRAPH_PROMPT_RATIO=0.2: 20% of the graph memory for prefill, 80% for decode
    assert split_graph_memory(10 * GiB, 0, 0.2) == (10 * GiB, 2 * GiB, 8 * GiB)
    # the variable table's defaults, for the recommended Llama 7B set-up: batch 256, context 2048, block 128
    assert default_ranges(max_num_seqs=256, block_size=128, max_model_len=2048) == {
        "PROMPT_BS": (1, 32, 64),  # 1, min(max_num_seqs, 32), min(max_num_seqs, 64)
        "PROMPT_SEQ": (128, 128, 2048),  # block_size, block_size, max_model_len
        "DECODE_BS": (1, 32, 256),  # 1, min(max_num_seqs, 32), max_num_seqs
        "DECODE_BLOCK": (128, 128, 4096),  # block_size, block_size, max(128, 256 * 2048 / 128)
    }
    env = HpuPlatform().read_env({})
    assert (env["GRAPH_RESERVED_MEM"], env["GRAPH_PROMPT_RATIO"], env["SKIP_WARMUP"]) == (0.1, 0.3, False)
    assert (env["GRAPH_PROMPT_STRATEGY"], env["GRAPH_DECODE_STRATEGY"]) == ("min_tokens", "max_bs")


def test_vllm_spellings_drive_the_buckets():
    env = HpuPlatform().read_env({"VLLM_PROMPT_BS_BUCKET_MAX": "4", "VLLM_DECODE_BS_BUCKET_STEP": "128",
                                  "VLLM_DECODE_BS_BUCKET_MAX": "4", "VLLM_DECODE_BLOCK_BUCKET_MAX": "2048"})  # fmt: skip
    built = HpuBuckets.build(env, max_num_seqs=32, block_size=128, max_model_len=1024)
    assert built.prompt == GUIDE_PROMPT and built.decode == GUIDE_DECODE
    assert prompt_buckets(BucketRange(1, 32, 4), BucketRange(128, 128, 1024)) == GUIDE_PROMPT
    assert decode_buckets(BucketRange(1, 128, 4), BucketRange(128, 128, 2048)) == GUIDE_DECODE


@pytest.mark.parametrize(
    "size, text", [(0, "0 B"), (-252 * 1024, "-252 KiB"), (504 * MiB, "504 MiB"), (int(1.238 * MiB), "1.238 MiB")]
)
def test_format_bytes_as_logged(size, text):
    assert format_bytes(size) == text
