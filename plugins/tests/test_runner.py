"""The stateful runner contract: prepare binds, execute runs on what is bound, profile binds nothing."""

from __future__ import annotations

import pytest
import torch
from plugins.attention import AttentionMetadata
from plugins.runner import ModelInputs, Runner


class Recorder(torch.nn.Module):
    """Returns its input ids as hidden states and records the caches it was called with."""

    def __init__(self) -> None:
        super().__init__()
        self.caches: list = []

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        self.caches.append(kv_caches)
        return input_ids.float()[:, None].repeat(1, 4)


def inputs(num_tokens: int) -> ModelInputs:
    meta = AttentionMetadata.build([num_tokens], [num_tokens], [[0]], 16)
    return ModelInputs(torch.arange(num_tokens), torch.arange(num_tokens), meta)


def test_execute_runs_on_what_prepare_bound():
    runner, model, bound, other = Runner(None), Recorder(), [("k", "v")], [("k2", "v2")]
    with pytest.raises(RuntimeError, match="before prepare"):
        runner.execute(inputs(3))
    runner.profile(model, other, inputs(5))  # the profile pass binds nothing
    assert model.caches == [other] and runner.model is None
    runner.prepare(model, bound, None)
    assert torch.equal(runner.execute(inputs(3))[:, 0], torch.arange(3).float())
    assert model.caches[-1] is bound
