"""Engine settings declared once (plugins.config.EngineSettings): the flags, the plugins' view
and the SDK's test config all come from the one declaration."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest
from core.cli import build_parser
from core.config import EngineConfig, add_engine_args, config_from_args, settings_from_args
from plugins import EngineConfigView, EnvConfigError
from plugins.config import EngineSettings, setting
from plugins.reference import engine_config


@dataclass(frozen=True)
class DraftView(EngineConfigView):
    """The view once two more settings are declared: a subclass stands in for the one edit
    that adds them to EngineSettings."""

    num_speculative_tokens: int = setting(0, "tokens a draft model proposes each step")
    speculative_method: str | None = setting(None, "how drafts are made", flags=("--spec", "-s"), choices=("ngram",))


def parser_for(settings: type[EngineSettings]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engine")
    add_engine_args(parser, settings)
    return parser


def action(parser: argparse.ArgumentParser, dest: str) -> argparse.Action:
    (found,) = [a for a in parser._actions if a.dest == dest]
    return found


def test_a_setting_declared_once_is_a_flag_and_a_field_of_the_frozen_view():
    parser = parser_for(DraftView)
    tokens = action(parser, "num_speculative_tokens")
    assert (tokens.option_strings, tokens.default, tokens.type) == (["--num-speculative-tokens"], 0, int)
    assert tokens.help == "tokens a draft model proposes each step"
    assert "--num-speculative-tokens NUM_SPECULATIVE_TOKENS" in parser.format_help()
    method = action(parser, "speculative_method")
    assert (method.option_strings, method.default, method.choices) == (["--spec", "-s"], None, ("ngram",))
    with pytest.raises(SystemExit):
        parser.parse_args(["-s", "eagle"])

    args = parser.parse_args(["m.gguf", "--num-speculative-tokens", "4", "-s", "ngram", "-tp", "2"])
    view = DraftView(**settings_from_args(args, DraftView))
    assert (view.num_speculative_tokens, view.speculative_method, view.world_size, view.model) == (
        4,
        "ngram",
        2,
        "m.gguf",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.num_speculative_tokens = 5
    assert DraftView().num_speculative_tokens == 0  # the declared default, without a command line
    assert "rank" not in vars(args)  # a view field that is not a setting has no flag


def test_a_setting_may_take_its_default_from_the_environment(monkeypatch):
    @dataclass(frozen=True)
    class Settings(EngineSettings):
        draft_device: str = setting("same", "where the draft model runs", env="DRAFT_DEVICE")

    assert parser_for(Settings).parse_args([]).draft_device == "same"
    monkeypatch.setenv("VLLM_DRAFT_DEVICE", "cpu")  # vLLM's spelling, as platforms' variables
    parser = parser_for(Settings)
    assert parser.parse_args([]).draft_device == "cpu" and "CORE_DRAFT_DEVICE" in action(parser, "draft_device").help
    assert parser.parse_args(["--draft-device", "gpu"]).draft_device == "gpu"  # the flag wins

    @dataclass(frozen=True)
    class Counted(EngineSettings):
        draft_layers: int = setting(1, "layers of the draft model", env="DRAFT_LAYERS")

    monkeypatch.setenv("CORE_DRAFT_LAYERS", "two")
    with pytest.raises(EnvConfigError, match="CORE_DRAFT_LAYERS='two' is not a valid int"):
        parser_for(Counted)


def test_every_declared_setting_reaches_serve_the_view_and_the_test_config():
    declared = {f.name: f.default for f in dataclasses.fields(EngineSettings)}
    for cls in (EngineConfig, EngineConfigView):
        assert {f.name: f.default for f in dataclasses.fields(cls)}.items() >= declared.items()
    assert config_from_args(build_parser().parse_args(["serve"])) == EngineConfig()
    small = dict(device="reference", dtype="float32", max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512)
    assert dataclasses.asdict(engine_config()) == {**declared, **small, "rank": 0, "local_rank": 0}
    assert engine_config(block_size=32).block_size == 32


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["m.gguf"], {"model": "m.gguf"}),
        (["--model", "m.gguf"], {"model": "m.gguf"}),
        (["--no-enable-prefix-caching"], {"enable_prefix_caching": False}),
        (["--enable-prefix-caching", "--no-enable-chunked-prefill"], {"enable_prefix_caching": True, "enable_chunked_prefill": False}),
        (["--enforce-eager", "-q", "int8"], {"enforce_eager": True, "quantization": "int8"}),
        (["--kv-cache-memory", "0.5"], {"kv_cache_bytes": 1 << 29}),
        (["--kv-cache-memory", "0"], {"kv_cache_bytes": None}),
        (["--dtype", "half", "--kv-cache-dtype", "fp8"], {"dtype": "half", "kv_cache_dtype": "fp8"}),
        (["-tp", "2", "-dp", "3"], {"tensor_parallel_size": 2, "data_parallel_size": 3}),
        (["--max-num-batched-tokens", "96", "--max-model-len", "100"], {"max_num_batched_tokens": 96, "max_model_len": 100}),
    ],
)  # fmt: skip
def test_vllm_flag_spellings(argv, expected):
    config = config_from_args(build_parser().parse_args(["serve", *argv]))
    assert {name: getattr(config, name) for name in expected} == expected
