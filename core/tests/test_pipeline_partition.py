"""Pipeline parallelism's bookkeeping: layers per stage, the weights a stage reads, micro-batches."""

import pytest
from core.distributed.executor import micro_batches
from core.partition.pipeline import PipelineStage, split_layers


@pytest.mark.parametrize(
    "num_layers,size,expected",
    [
        (30, 2, [(0, 15), (15, 30)]),
        (3, 2, [(0, 2), (2, 3)]),  # the extra layer goes before the last stage (it runs the LM head)
        (10, 4, [(0, 2), (2, 5), (5, 8), (8, 10)]),  # the leftovers: last-but-one first
        (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
        (5, 1, [(0, 5)]),
    ],
)
def test_split_layers(num_layers, size, expected):
    assert split_layers(num_layers, size) == expected


def test_more_stages_than_layers_is_refused():
    with pytest.raises(
        ValueError, match="pipeline_parallel_size=3 needs at least one layer per stage; the model has 2"
    ):
        split_layers(2, 3)


def test_a_stated_partition_replaces_the_even_split(monkeypatch):
    assert split_layers(30, 2, "20,10") == [(0, 20), (20, 30)]
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "1,2")  # vLLM's spelling, read when core's is unset
    assert PipelineStage.build(3, 1, 2) == PipelineStage(1, 2, 1, 3, 3)
    for bad in ("2,2", "3,0", "3", "a,b"):
        with pytest.raises(ValueError, match="expected 2 positive layer counts summing to 3"):
            split_layers(3, 2, bad)


def test_a_stage_holds_its_layers_and_its_ends():
    first, last = PipelineStage.build(3, 0, 2), PipelineStage.build(3, 1, 2)
    names = ["model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "model.layers.2.input_layernorm.weight",
             "model.norm.weight", "lm_head.weight"]  # fmt: skip
    assert [first.holds(n, False) for n in names] == [True, True, False, False, False]
    assert [last.holds(n, False) for n in names] == [False, False, True, True, True]
    assert last.holds("model.embed_tokens.weight", True)  # the tied LM head
    whole = PipelineStage.whole(3)
    assert all(whole.holds(n, False) for n in names)


class Item:
    def __init__(self, n):
        self.num_new_tokens = n


def test_micro_batches_keep_order_and_balance_tokens():
    items = [Item(1) for _ in range(32)]
    parts = micro_batches(items, 2)
    assert [len(p) for p in parts] == [16, 16] and [i for p in parts for i in p] == items
    prefill = [Item(100), Item(1), Item(1)]
    assert [len(p) for p in micro_batches(prefill, 2)] == [1, 2]
    assert micro_batches([items[0]], 2) == [[items[0]]]  # one sequence: one micro-batch
    assert [len(p) for p in micro_batches(items[:3], 4)] == [1, 1, 1]
