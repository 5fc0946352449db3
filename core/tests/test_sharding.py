"""Tensor-parallel shard plans and per-rank reads of stored weights (no processes needed)."""

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from core.partition.sharding import ShardPlan, Slice, slice_dense, slice_gguf, split_range
from plugins.kernels import GGUFWeight


def config(heads=4, kv_heads=2, inter=128, vocab=257):
    return SimpleNamespace(
        vocab_size=vocab, intermediate_size=inter, num_attention_heads=heads, num_key_value_heads=kv_heads
    )


def test_ranks_cover_every_row_and_column_once():
    plans = [ShardPlan(config(), 16, r, 2) for r in range(2)]
    for name, full in (("q_proj", 64), ("k_proj", 32), ("gate_proj", 128)):
        parts = [p.slice_for(f"model.layers.0.self_attn.{name}.weight" if "proj" in name and name[0] in "qk"
                             else f"model.layers.0.mlp.{name}.weight") for p in plans]  # fmt: skip
        assert [(s.dim, s.start, s.stop) for s in parts] == [(0, 0, full // 2), (0, full // 2, full)]
    o = [p.slice_for("model.layers.0.self_attn.o_proj.weight") for p in plans]
    assert [(s.dim, s.start, s.stop) for s in o] == [(1, 0, 32), (1, 32, 64)]
    vocab = [p.slice_for("lm_head.weight") for p in plans]
    assert [(s.start, s.stop) for s in vocab] == [(0, 129), (129, 257)]  # uneven: the last rank is short
    assert plans[0].slice_for("model.layers.0.input_layernorm.weight") is None


def test_fewer_kv_heads_than_ranks_replicates_them():
    plans = [ShardPlan(config(heads=8, kv_heads=2), 8, r, 4) for r in range(4)]
    assert [p.num_kv_heads for p in plans] == [1] * 4
    starts = [p.slice_for("model.layers.0.self_attn.k_proj.weight").start for p in plans]
    assert starts == [0, 0, 8, 8]  # ranks 0-1 share KV head 0, ranks 2-3 KV head 1
    # each rank's query heads read the KV head they read unsplit: h // (heads / kv_heads)
    for r, p in enumerate(plans):
        q_heads = range(r * p.num_heads, (r + 1) * p.num_heads)
        assert {h // 4 for h in q_heads} == {starts[r] // 8}


def test_row_parallel_bias_is_added_once():
    zero = [ShardPlan(config(), 16, r, 2).slice_for("model.layers.0.mlp.down_proj.bias") for r in range(2)]
    assert zero[0] is None and zero[1].zero
    assert torch.equal(slice_dense(torch.ones(4), zero[1]), torch.zeros(4))


def test_kv_heads_that_do_not_divide_split_unevenly():
    """SmolLM2-135M: 9 query heads in 3 groups over 2 ranks -> 1 and 2 groups."""
    plans = [ShardPlan(config(heads=9, kv_heads=3, inter=1536, vocab=49152), 64, r, 2) for r in range(2)]
    assert [(p.num_heads, p.num_kv_heads) for p in plans] == [(3, 1), (6, 2)]
    q = [p.slice_for("model.layers.0.self_attn.q_proj.weight") for p in plans]
    assert [(s.start, s.stop) for s in q] == [(0, 192), (192, 576)]
    o = [p.slice_for("model.layers.0.self_attn.o_proj.weight") for p in plans]
    assert [(s.dim, s.start, s.stop) for s in o] == [(1, 0, 192), (1, 192, 576)]


@pytest.mark.parametrize(("heads", "kv_heads", "world_size"), [(4, 2, 2), (8, 2, 4), (4, 1, 2)])
def test_fused_projections_keep_each_parts_rows(heads, kv_heads, world_size):
    """Phi-3's stored qkv_proj / gate_up_proj: a rank reads what it would read of separate q, k, v
    (gate, up) tensors, in that order; KV heads replicated when fewer than the ranks."""
    cfg = config(heads=heads, kv_heads=kv_heads)
    q, k, v = torch.randn(heads * 16, 8), torch.randn(kv_heads * 16, 8), torch.randn(kv_heads * 16, 8)
    gate, up = torch.randn(128, 8), torch.randn(128, 8)
    for rank in range(world_size):
        plan = ShardPlan(cfg, 16, rank, world_size)

        def part(name, tensor, group="self_attn", plan=plan):
            return slice_dense(tensor, plan.slice_for(f"model.layers.0.{group}.{name}.weight"))

        want = torch.cat([part("q_proj", q), part("k_proj", k), part("v_proj", v)])
        assert want.shape[0] == (plan.num_heads + 2 * plan.num_kv_heads) * 16
        assert torch.equal(part("qkv_proj", torch.cat([q, k, v])), want)
        want = torch.cat([part("gate_proj", gate, "mlp"), part("up_proj", up, "mlp")])
        assert torch.equal(part("gate_up_proj", torch.cat([gate, up]), "mlp"), want)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"inter": 130}, "intermediate_size=130 is not divisible by tensor_parallel_size=4"),
        ({"heads": 6, "kv_heads": 3}, "3 KV heads with 2 query heads each cannot be shared evenly"),
        ({"heads": 6, "kv_heads": 4}, "num_attention_heads 6 is not a multiple of num_key_value_heads 4"),
    ],
)
def test_unsplittable_sizes_name_the_dimension(kw, message):
    with pytest.raises(ValueError, match=message):
        ShardPlan(config(**kw), 16, 0, 4)


def test_split_range_of_a_tiny_vocab_keeps_valid_entries_first():
    parts = [split_range(5, r, 4) for r in range(4)]
    assert parts == [(0, 2), (2, 4), (4, 5), (5, 5)]


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_gguf_slices_keep_the_stored_form_at_block_boundaries(qtype):
    kind = gguf.GGMLQuantizationType[qtype]
    values = np.random.default_rng(0).standard_normal((6, 128)).astype(np.float32)
    weight = GGUFWeight(qtype, torch.from_numpy(gguf.quants.quantize(values, kind)), 6, 128)
    full = gguf.quants.dequantize(weight.data.numpy(), kind)
    cols = slice_gguf(weight, Slice(1, 64, 128))
    assert (cols.rows, cols.cols) == (6, 64)
    np.testing.assert_array_equal(gguf.quants.dequantize(cols.data.numpy(), kind), full[:, 64:])
    rows = slice_gguf(weight, Slice(0, 2, 5))
    np.testing.assert_array_equal(gguf.quants.dequantize(rows.data.numpy(), kind), full[2:5])
    with pytest.raises(ValueError, match=f"{qtype} blocks hold 32 values"):
        slice_gguf(weight, Slice(1, 48, 128))


@pytest.mark.slow
def test_gguf_ranks_read_their_slices_of_the_default_model():
    """Each rank reads its slice (stored form where quantized) = the same slice of the full load."""
    from core.loader import default_model_path
    from core.loader.gguf_index import GGUFIndex
    from core.loader.gguf_model import gguf_config, gguf_weights

    index = GGUFIndex.open(default_model_path())
    cfg = gguf_config(index)
    wanted = ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
              "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight", "lm_head.weight",
              "model.embed_tokens.weight")  # fmt: skip

    def read(plan):
        return {
            n: w for n, w in gguf_weights(index, cfg, True, torch.float32, torch.device("cpu"), plan) if n in wanted
        }

    full = read(None)
    for rank in range(2):
        plan = ShardPlan(cfg, cfg.head_dim, rank, 2)
        for name, part in read(plan).items():
            whole, cut = full[name], plan.slice_for(name)
            if isinstance(whole, GGUFWeight):
                kind = gguf.GGMLQuantizationType[whole.qtype]
                whole = torch.from_numpy(gguf.quants.dequantize(whole.data.numpy(), kind))
                part = torch.from_numpy(gguf.quants.dequantize(part.data.numpy(), kind))
            expected = whole[cut.start : cut.stop] if cut.dim == 0 else whole[:, cut.start : cut.stop]
            assert torch.equal(part, expected), f"rank {rank} {name}"
