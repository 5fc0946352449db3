"""Tool calling without a model: parsers, the constraint of tool_choice, rendering and streaming."""

from __future__ import annotations

import json

import jsonschema
import pytest
from core.server.chat_tools import ToolMode, ToolStream
from core.server.errors import APIError
from core.tools import constrained_calls, get_tool_parser, template_messages, tool_constraint, tool_functions

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
FUNCTIONS = tool_functions([WEATHER, TIME])


@pytest.mark.parametrize(
    ("parser", "text", "content", "calls"),
    [
        ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         "Let me check.", [("get_weather", {"city": "Paris"})]),
        ("hermes", '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n<tool_call>{"name": "get_weather", '
         '"arguments": {"city": "Oslo"}}</tool_call>', None, [("get_time", {}), ("get_weather", {"city": "Oslo"})]),
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Rome"}}', None,
         [("get_weather", {"city": "Rome"})]),
        ("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_time", "parameters": {}}',
         None, [("get_time", {}), ("get_time", {})]),
        ("mistral", 'Sure [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lima"}}]', "Sure",
         [("get_weather", {"city": "Lima"})]),
        ("pythonic", '[get_weather(city="Paris", unit="c"), get_time()]', None,
         [("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {})]),
        ("hermes", "No tools needed: 4.", "No tools needed: 4.", []),
        ("hermes", "<tool_call>{not json</tool_call>", "<tool_call>{not json</tool_call>", []),
        ("pythonic", "[1, 2]", "[1, 2]", []),
    ],
    ids=["hermes", "hermes x2", "llama3_json", "llama3_json python_tag x2", "mistral", "pythonic",
         "plain text", "malformed stays content", "a list that is not calls"],
)  # fmt: skip
def test_parsers_read_their_models_calls(parser, text, content, calls):
    got_content, got_calls = get_tool_parser(parser).extract(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls


def test_unknown_parser_names_the_installed_ones():
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral, pythonic"):
        get_tool_parser("nope")


def test_content_before_a_marker_streams_and_a_partial_marker_is_held_back():
    hermes = get_tool_parser("hermes")
    assert hermes.content_end("Hello <tool") == len("Hello ")
    assert hermes.content_end("Hello <tool_call>{") == len("Hello ")
    assert hermes.content_end("Hello there") == len("Hello there")
    pythonic = get_tool_parser("pythonic")
    assert pythonic.content_end("  ") == 0 and pythonic.content_end("[get_") == 0
    assert pythonic.content_end("Sure") == 4


def test_required_and_named_constraints_admit_only_valid_calls():
    required = tool_constraint(FUNCTIONS, "required").json
    good = [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]
    jsonschema.validate(good, required)
    for bad in ([], [{"name": "get_weather", "parameters": {}}], [{"name": "launch", "parameters": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, required)
    assert [(c.name, c.arguments) for c in constrained_calls(json.dumps(good), "required")] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", "{}"),
    ]
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert tool_constraint(FUNCTIONS, named).json == WEATHER["function"]["parameters"]
    assert constrained_calls('{"city":"Oslo"}', named)[0].arguments == '{"city":"Oslo"}'
    with pytest.raises(ValueError, match="launch"):
        tool_constraint(FUNCTIONS, {"type": "function", "function": {"name": "launch"}})


def test_tool_mode_refusals_are_400s():
    with pytest.raises(APIError, match="--enable-auto-tool-choice"):
        ToolMode.of([WEATHER], None, None)  # auto is the default with tools
    with pytest.raises(APIError, match="needs tools"):
        ToolMode.of(None, "required", None)
    with pytest.raises(APIError, match="tools\\[0\\]"):
        ToolMode.of([{"type": "function", "function": {"parameters": {}}}], "required", None)
    assert ToolMode.of([WEATHER], "none", None).constraint is None


def test_streamed_named_call_sends_id_and_name_first_then_argument_fragments():
    mode = ToolMode.of([WEATHER], {"type": "function", "function": {"name": "get_weather"}}, None)
    stream = ToolStream(mode)
    deltas = [stream.advance(t, None) for t in ('{"ci', '{"city":"Pa', '{"city":"Paris"}')]
    deltas.append(stream.advance('{"city":"Paris"}', "stop"))
    first = deltas[0][1]
    assert first[0]["id"].startswith("call_") and first[0]["function"] == {"name": "get_weather", "arguments": ""}
    fragments = "".join(call["function"]["arguments"] for _, calls, _ in deltas for call in calls)
    assert json.loads(fragments) == {"city": "Paris"} and deltas[-1][2] == "tool_calls"
    assert all(content == "" for content, _, _ in deltas)


def test_streamed_auto_answer_sends_its_content_then_the_calls():
    mode = ToolMode.of([WEATHER], "auto", get_tool_parser("hermes"))
    stream = ToolStream(mode)
    texts = [
        "Let me",
        "Let me check. <tool",
        'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}',
    ]
    deltas = [stream.advance(t, None) for t in texts] + [stream.advance(texts[-1] + "</tool_call>", "stop")]
    assert "".join(content for content, _, _ in deltas) == "Let me check. "
    (header, arguments) = deltas[-1][1]
    assert header["function"]["name"] == "get_weather" and json.loads(arguments["function"]["arguments"]) == {
        "city": "Rome"
    }
    assert deltas[-1][2] == "tool_calls" and all(not calls for _, calls, _ in deltas[:-1])


SMOL_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
QWEN_LIKE = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.tool_calls }}{% endfor %}"
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"},
]  # fmt: skip


def test_a_template_without_tools_still_gets_the_whole_conversation():
    out = template_messages(CONVERSATION, SMOL_TEMPLATE, FUNCTIONS)
    assert out[0]["role"] == "system" and "get_weather" in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    assert out[3] == {"role": "user", "content": "<tool_response>\n18 C, sunny\n</tool_response>"}


def test_a_template_with_tools_gets_calls_with_object_arguments():
    out = template_messages(CONVERSATION, QWEN_LIKE, FUNCTIONS)
    assert [m["role"] for m in out] == ["user", "assistant", "tool"]
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert out[2]["tool_call_id"] == "call_1"
