"""Declared env config: both spellings, defaults, and errors that name the variable."""

import pytest
from plugins import EnvConfigError, EnvVar
from plugins.env import parse_int_list, read_env

SIZES = EnvVar("GRAPH_SIZES", parse_int_list, (1, 2, 4), "capture sizes")
SPACE = EnvVar("CPU_KVCACHE_SPACE", float, 0.0, "GiB")
FLAG = EnvVar("SKIP_WARMUP", bool, False, "skip warm-up")


def test_default_when_unset():
    assert read_env((SIZES, SPACE, FLAG), {}) == {
        "GRAPH_SIZES": (1, 2, 4),
        "CPU_KVCACHE_SPACE": 0.0,
        "SKIP_WARMUP": False,
    }


def test_core_spelling_wins_over_vllm():
    env = {"CORE_CPU_KVCACHE_SPACE": "8", "VLLM_CPU_KVCACHE_SPACE": "40"}
    assert SPACE.read(env) == 8.0
    assert SPACE.read({"VLLM_CPU_KVCACHE_SPACE": "40"}) == 40.0


@pytest.mark.parametrize("text,value", [("true", True), ("1", True), ("OFF", False), ("no", False)])
def test_bool_spellings(text, value):
    assert FLAG.read({"CORE_SKIP_WARMUP": text}) is value


@pytest.mark.parametrize(
    "var,env,expected",
    [
        (SPACE, {"CORE_CPU_KVCACHE_SPACE": "lots"}, "CORE_CPU_KVCACHE_SPACE='lots' is not a valid float"),
        (SIZES, {"VLLM_GRAPH_SIZES": "1,x"}, "VLLM_GRAPH_SIZES='1,x'"),
        (FLAG, {"CORE_SKIP_WARMUP": "maybe"}, "CORE_SKIP_WARMUP='maybe'"),
    ],
)
def test_bad_value_names_variable(var, env, expected):
    with pytest.raises(EnvConfigError) as info:
        var.read(env)
    assert expected in str(info.value)


def test_choices_are_enforced():
    mode = EnvVar("MODE", str, "a", "mode", choices=("a", "b"))
    assert mode.read({"CORE_MODE": "b"}) == "b"
    with pytest.raises(EnvConfigError, match="CORE_MODE='c' is not one of: a, b"):
        mode.read({"CORE_MODE": "c"})
