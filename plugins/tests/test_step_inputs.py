"""build_step: one step's inputs packed into one host buffer, moved by one ``stage`` call."""

import random

import pytest
import torch
from plugins.attention import AttentionMetadata, build_step


def _loop_slots(query_lens, seq_lens, tables, block_size):
    return [t[p // block_size] * block_size + p % block_size
            for q, s, t in zip(query_lens, seq_lens, tables, strict=True) for p in range(s - q, s)]  # fmt: skip


@pytest.mark.parametrize("seed", range(5))
def test_build_step_matches_a_loop_and_copies_once(seed):
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    seq_lens = [rng.randint(1, 70) for _ in range(rng.randint(1, 9))]
    query_lens = [rng.choice([1, rng.randint(1, s)]) for s in seq_lens]
    tables = [rng.sample(range(500), -(-s // block_size) + rng.randint(0, 2)) for s in seq_lens]
    num_tokens = sum(query_lens)
    ids = [rng.randrange(1000) for _ in range(num_tokens)]
    positions = [p for q, s in zip(query_lens, seq_lens) for p in range(s - q, s)]  # noqa: B905
    staged = []

    def stage(host):
        staged.append(host)
        return host.clone()  # a copy, as a device would make

    meta, (ids_t, pos_t) = build_step(query_lens, seq_lens, tables, block_size, [ids, positions], stage)
    assert len(staged) == 1 and staged[0].dtype == torch.uint8
    storage = staged[0].untyped_storage().data_ptr()
    for t in (meta.query_start_loc, meta.seq_lens, meta.block_tables, meta.slot_mapping, ids_t, pos_t):
        assert t.untyped_storage().data_ptr() != storage  # views of the staged copy, not the host buffer
    assert ids_t.tolist() == ids and pos_t.tolist() == positions and ids_t.dtype == torch.int64
    assert meta.slot_mapping.tolist() == _loop_slots(query_lens, seq_lens, tables, block_size)
    assert meta.query_start_loc.tolist() == [sum(query_lens[:i]) for i in range(len(query_lens) + 1)]
    assert meta.seq_lens.tolist() == seq_lens and meta.seq_lens.dtype == torch.int32
    width = max(map(len, tables))
    assert meta.block_tables.tolist() == [t + [0] * (width - len(t)) for t in tables]
    assert meta.query_lens_host == query_lens and meta.seq_lens_host == seq_lens


def test_build_names_what_is_wrong():
    with pytest.raises(ValueError, match=r"query_len 3 must be in \[1, seq_len=2\]"):
        AttentionMetadata.build([3], [2], [[0]], 4)
    with pytest.raises(ValueError, match="sequence 1: a block table of 1 blocks of 4 cannot hold 5 tokens"):
        AttentionMetadata.build([1, 1], [2, 5], [[0], [1]], 4)
    with pytest.raises(ValueError, match=r"token rows of \[2\] for a batch of 3 tokens"):
        build_step([3], [3], [[0]], 4, [[1, 2]], lambda host: host)


def test_empty_batch():
    meta = AttentionMetadata.build([], [], [], 16)
    assert meta.num_seqs == 0 and meta.num_tokens == 0 and meta.query_start_loc.tolist() == [0]
