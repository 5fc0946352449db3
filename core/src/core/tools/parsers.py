"""Tool-call parsers: a model's own way of writing tool calls, read back into OpenAI's ``tool_calls``.

A parser is found by name in the entry-point group ``core.tool_parsers`` (``core serve
--tool-call-parser NAME``), so ``pip install`` adds one: register a :class:`ToolParser`
subclass under ``[project.entry-points."core.tool_parsers"]``. Core ships ``hermes``
(``<tool_call>{...}</tool_call>``: Qwen 2.5/3, Hermes), ``llama3_json`` (a JSON object,
optionally after ``<|python_tag|>``), ``mistral`` (``[TOOL_CALLS][{...}]``) and ``pythonic``
(``[get_weather(city="Paris")]``: Llama 3.2/4).
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

GROUP = "core.tool_parsers"


@dataclass
class ToolCall:
    """One call, as OpenAI's ``tool_calls`` items carry it (``arguments``: JSON text)."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class ToolParser:
    """Reads the tool calls out of a model's whole answer.

    Subclasses set :attr:`start` (the text where calls begin; empty when a call is the whole
    answer, recognised by its first character) and implement :meth:`parse_calls`.
    """

    #: where the calls begin in the answer
    start: ClassVar[str] = ""
    #: for parsers without a start marker: the first characters of an answer that is calls
    opening: ClassVar[tuple[str, ...]] = ()

    def call_offset(self, text: str) -> int | None:
        """Where the calls begin in ``text``, or None when it has none (yet)."""
        if self.start:
            index = text.find(self.start)
            return index if index >= 0 else None
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith(self.opening) else None

    def content_end(self, text: str) -> int:
        """How much of a partial answer is surely content (safe to stream): up to the calls'
        start, holding back a tail that could still become it."""
        offset = self.call_offset(text)
        if offset is not None:
            return offset
        if not self.start:
            return 0 if not text.strip() else len(text)  # a call would be the first thing written
        for keep in range(min(len(self.start) - 1, len(text)), 0, -1):
            if self.start.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """``(content, calls)`` of a whole answer; no calls when they do not parse (the text stays content)."""
        offset = self.call_offset(text)
        if offset is None:
            return text, []
        try:
            calls = self.parse_calls(text[offset:])
        except (ValueError, SyntaxError, TypeError, KeyError, AttributeError):
            return text, []
        content = text[:offset].strip()
        return (content or None), calls

    def parse_calls(self, text: str) -> list[ToolCall]:
        """The calls of ``text`` (from the calls' start on); raise ``ValueError`` when they do not parse."""
        raise NotImplementedError


def _call(obj: Any, args_key: str = "arguments") -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError(f"not a tool call: {obj!r}")
    arguments = obj.get(args_key, obj.get("parameters", obj.get("arguments", {})))
    return ToolCall(obj["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


class HermesParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block a call."""

    start = "<tool_call>"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

    def parse_calls(self, text: str) -> list[ToolCall]:
        return [_call(json.loads(body)) for body in self._block.findall(text)]


class Llama3JsonParser(ToolParser):
    """``{"name": ..., "parameters": {...}}`` (several separated by ``;``), optionally after ``<|python_tag|>``."""

    opening = ("{", "<|python_tag|>")

    def parse_calls(self, text: str) -> list[ToolCall]:
        text = text.strip().removeprefix("<|python_tag|>")
        decoder, calls, index = json.JSONDecoder(), [], 0
        while index < len(text):
            obj, index = decoder.raw_decode(text, index)
            calls.append(_call(obj, "parameters"))
            index = len(text) - len(text[index:].lstrip(" \n;"))
        return calls


class MistralParser(ToolParser):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``."""

    start = "[TOOL_CALLS]"

    def parse_calls(self, text: str) -> list[ToolCall]:
        items = json.loads(text.removeprefix(self.start).strip())
        return [_call(item) for item in (items if isinstance(items, list) else [items])]


class PythonicParser(ToolParser):
    """``[get_weather(city="Paris"), get_time()]``: Python call syntax with literal arguments."""

    opening = ("[",)

    def parse_calls(self, text: str) -> list[ToolCall]:
        tree = ast.parse(text.strip(), mode="eval").body
        if not isinstance(tree, ast.List):
            raise ValueError("pythonic tool calls are a list of calls")
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                raise ValueError("each pythonic tool call is name(keyword=literal, ...)")
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
            calls.append(ToolCall(node.func.id, json.dumps(arguments)))
        return calls


def tool_parser_names() -> list[str]:
    """The installed parsers' names."""
    return sorted(ep.name for ep in entry_points(group=GROUP))


def get_tool_parser(name: str) -> ToolParser:
    """The parser registered as ``name`` in :data:`GROUP`; ``ValueError`` naming the installed ones."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        raise ValueError(f"unknown tool call parser {name!r}; installed: {', '.join(tool_parser_names()) or 'none'}")
    parser = found[0].load()
    if not (isinstance(parser, type) and issubclass(parser, ToolParser)):
        raise ValueError(f"tool call parser {name!r} ({found[0].value}) is not a core.tools.ToolParser subclass")
    return parser()
