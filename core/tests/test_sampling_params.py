"""SamplingParams: vLLM defaults, normalisation and validation messages."""

import pytest
from core.sampling_params import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs) == (16, 0, None, None)
    assert p.seed is None and p.logit_bias is None and not p.ignore_eos
    assert p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.include_stop_str_in_output
    assert p.stop == [] and p.stop_token_ids == []
    assert not p.is_greedy and not p.has_penalties and not p.is_top_k_enabled


def test_stop_normalised_to_list():
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]
    assert SamplingParams(stop=("a", "bc")).stop == ["a", "bc"]


@pytest.mark.parametrize(
    "kwargs, greedy",
    [
        ({"temperature": 0.0}, True),
        ({"top_k": 1}, True),
        ({"temperature": 1e-7}, True),
        ({"temperature": 0.7}, False),
        ({"top_k": 2, "temperature": 0.5}, False),
    ],
)
def test_is_greedy(kwargs, greedy):
    assert SamplingParams(**kwargs).is_greedy is greedy


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("temperature", -0.1, ">= 0"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_k", -2, "[-1, inf]"),
        ("min_p", 1.5, "[0.0, 1.0]"),
        ("n", 0, "[1, inf]"),
        ("max_tokens", 0, "[1, inf]"),
        ("min_tokens", -1, "[0, inf]"),
        ("presence_penalty", 2.5, "[-2.0, 2.0]"),
        ("frequency_penalty", -3, "[-2.0, 2.0]"),
        ("repetition_penalty", 0.0, "> 0"),
        ("logprobs", 21, "[0, 20]"),
        ("prompt_logprobs", -1, "[0, 20]"),
        ("temperature", float("nan"), "number"),
        ("n", 1.5, "integer"),
        ("top_k", True, "integer"),
    ],
)
def test_invalid_values_name_field_value_and_range(field, value, fragment):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert field in message and fragment in message and str(value) in message


def test_min_tokens_above_max_tokens_rejected():
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens \(4\), got 5"):
        SamplingParams(max_tokens=4, min_tokens=5)
    assert SamplingParams(max_tokens=None, min_tokens=50).min_tokens == 50


def test_stop_and_logit_bias_validation():
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=["ok", ""])
    with pytest.raises(ValueError, match=r"logit_bias\[3\]"):
        SamplingParams(logit_bias={3: 101.0})
    with pytest.raises(ValueError, match="logit_bias keys"):
        SamplingParams(logit_bias={-1: 1.0})
    assert SamplingParams(logit_bias={"7": 2}).logit_bias == {7: 2.0}


def test_stop_ids_for_respects_ignore_eos():
    p = SamplingParams(stop_token_ids=[5, 9])
    assert p.stop_ids_for([2, 9]) == [5, 9, 2]
    assert SamplingParams(stop_token_ids=[5], ignore_eos=True).stop_ids_for([2]) == [5]


def test_clone_revalidates():
    p = SamplingParams(max_tokens=None)
    assert p.clone(max_tokens=100).max_tokens == 100
    with pytest.raises(ValueError, match="max_tokens"):
        p.clone(max_tokens=0)
