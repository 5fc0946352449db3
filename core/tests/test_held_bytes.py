"""core.models.layers.held_bytes: the bytes a model's weights hold, as the loader reports them."""

import torch
from core.models.layers import held_bytes


def test_views_of_one_mapping_count_their_own_bytes():
    """Weights copied into one shared mapping (the CPU plugins' huge-page arena) are views of a
    storage far larger than they are: each counts its own bytes, not the mapping's."""
    mapping = torch.empty(1 << 20, dtype=torch.uint8)
    a, b = mapping[:4096].view(torch.float32), mapping[8192 : 8192 + 1000]
    assert held_bytes([a, b], set()) == 4096 + 1000


def test_tied_weights_count_once():
    w = torch.randn(8, 4)
    seen: set[int] = set()
    assert held_bytes({"embed": w, "lm_head": w, "bias": torch.zeros(8)}, seen) == 8 * 4 * 4 + 8 * 4
    assert held_bytes(w, seen) == 0
