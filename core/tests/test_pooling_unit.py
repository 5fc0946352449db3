"""core.pooling's pieces on their own: poolers against a loop, Matryoshka cuts, sentence-transformers configs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from core.pooling.config import PoolerConfig, read_pooler_config
from core.pooling.params import PoolingParams
from core.pooling.pooler import check_dimensions, finish, pool


@pytest.mark.parametrize("pooling_type", ["mean", "cls", "last"])
def test_pool_matches_a_loop_over_sequences(pooling_type):
    lens = [3, 1, 7, 2]
    hidden = torch.randn(sum(lens), 8, generator=torch.Generator().manual_seed(0))
    expected, start = [], 0
    for n in lens:
        rows = hidden[start : start + n]
        expected.append({"mean": rows.mean(0), "cls": rows[0], "last": rows[-1]}[pooling_type])
        start += n
    torch.testing.assert_close(pool(hidden, lens, pooling_type), torch.stack(expected))


def test_matryoshka_dimensions_cut_then_normalize():
    config = PoolerConfig("mean", True, None, (4, 8))
    vector = torch.arange(1.0, 9.0)
    cut = finish(vector, PoolingParams(dimensions=4), config)
    torch.testing.assert_close(cut, torch.nn.functional.normalize(vector[:4], dim=0))
    raw = finish(vector, PoolingParams(normalize=False), config)
    torch.testing.assert_close(raw, vector)
    check_dimensions(PoolingParams(dimensions=8), config, hidden_size=8)
    with pytest.raises(ValueError, match="not one of this model's matryoshka sizes"):
        check_dimensions(PoolingParams(dimensions=5), config, hidden_size=8)
    with pytest.raises(ValueError, match="does not support matryoshka"):
        check_dimensions(PoolingParams(dimensions=4), PoolerConfig("mean", True), hidden_size=8)


def _folder(tmp_path, pooling: dict[str, bool] | None, normalize: bool = True, max_seq_length: int | None = 128):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    if pooling is not None:
        modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 8, **pooling}))
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    if max_seq_length is not None:
        (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return tmp_path


HF = SimpleNamespace(hidden_size=8)


@pytest.mark.parametrize(
    "mode,expected",
    [("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"), ("pooling_mode_lasttoken", "last")],
)
def test_sentence_transformers_pooling_modes(tmp_path, mode, expected):
    folder = _folder(tmp_path, {mode: True}, normalize=mode != "pooling_mode_cls_token")
    config = read_pooler_config(folder, HF, is_encoder=True)
    assert config == PoolerConfig(expected, mode != "pooling_mode_cls_token", 128, None)


def test_folders_without_sentence_transformers_config_and_unsupported_modes(tmp_path):
    assert read_pooler_config(tmp_path, HF, is_encoder=True) == PoolerConfig("cls", True)
    assert read_pooler_config(tmp_path, HF, is_encoder=False) == PoolerConfig("last", True)
    matryoshka = SimpleNamespace(hidden_size=8, matryoshka_dimensions=[2, 4, 8])
    assert read_pooler_config(tmp_path, matryoshka, is_encoder=True).matryoshka_dimensions == (2, 4, 8)
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        read_pooler_config(_folder(tmp_path, {"pooling_mode_max_tokens": True}), HF, is_encoder=True)
