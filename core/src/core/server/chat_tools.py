"""A chat request's tools as the handler sees them: the constraint, the parser, and each choice's
text split into content and OpenAI ``tool_calls`` (whole, or as stream deltas: a call's id and
name first, its argument fragments after)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.server.errors import bad_request
from core.structured import StructuredOutputsParams
from core.tools import ToolCall, ToolParser, constrained_calls, named_choice, tool_constraint, tool_functions


@dataclass
class ToolMode:
    """What ``tools`` and ``tool_choice`` make of a request's answer."""

    functions: dict[str, dict[str, Any]] | None = None
    choice: Any = "none"
    constraint: StructuredOutputsParams | None = None
    parser: ToolParser | None = None
    named: str | None = None  # the function a named choice calls (its arguments are the whole answer)

    @classmethod
    def of(
        cls, tools: list[dict[str, Any]] | None, tool_choice: Any, parser: ToolParser | None, parallel: bool = True
    ) -> ToolMode:
        """From the request's fields (``parallel``: ``parallel_tool_calls``) and the server's
        ``--tool-call-parser`` (None unless auto tool choice is on)."""
        try:
            functions = tool_functions(tools) if tools else None
            named = named_choice(tool_choice)
        except ValueError as exc:
            raise bad_request(str(exc), "tools" if "tools" in str(exc) else "tool_choice") from None
        choice = tool_choice if tool_choice is not None else ("auto" if functions else "none")
        if functions is None:
            if named is not None or choice == "required":
                raise bad_request(f"tool_choice {choice!r} needs tools", "tool_choice")
            return cls(choice="none")
        if choice == "auto" and parser is None:
            raise bad_request(
                'tool_choice "auto" needs a server started with --enable-auto-tool-choice --tool-call-parser NAME '
                '(or send tool_choice "required", "none" or a named function)',
                "tool_choice",
            )
        try:
            constraint = tool_constraint(functions, choice, parallel)
        except ValueError as exc:
            raise bad_request(str(exc), "tool_choice") from None
        return cls(functions, choice, constraint, parser if choice == "auto" else None, named)

    def split(self, text: str, finish_reason: str | None) -> tuple[str | None, list[ToolCall], str | None]:
        """``(content, calls, finish_reason)`` of a whole answer; ``tool_calls`` when it made calls."""
        if self.constraint is not None and finish_reason == "stop":
            return None, constrained_calls(text, self.choice), "tool_calls"
        if self.parser is not None:
            content, calls = self.parser.extract(text)
            if calls:
                return content, calls, "tool_calls"
        return text, [], finish_reason


@dataclass
class ToolStream:
    """One streamed choice: which part of its text has gone out, as content or as call arguments."""

    mode: ToolMode
    num_content: int = 0  # characters of the answer sent as content
    num_arguments: int = 0  # characters sent as the named call's arguments
    call_id: str = field(default_factory=lambda: ToolCall("", "").id)

    def advance(self, text: str, finish_reason: str | None) -> tuple[str, list[dict[str, Any]], str | None]:
        """``(content delta, tool_calls deltas, finish_reason)`` for the answer so far."""
        mode = self.mode
        named = mode.named
        if named is not None:  # the whole answer is the arguments: stream them as they come
            calls = []
            if self.num_arguments == 0 and text:
                calls.append(self._header(0, self.call_id, named))
            if len(text) > self.num_arguments:
                calls.append({"index": 0, "function": {"arguments": text[self.num_arguments :]}})
                self.num_arguments = len(text)
            return "", calls, ("tool_calls" if finish_reason == "stop" else finish_reason)
        if finish_reason is None:
            end = len(text)
            if mode.constraint is not None:
                end = 0  # a required call is read whole at the end
            elif mode.parser is not None:
                end = mode.parser.content_end(text)
            return self._content(text, end), [], None
        content, calls, finish_reason = mode.split(text, finish_reason)
        delta = self._content(text, len(text)) if not calls else ""
        deltas = []
        for i, call in enumerate(calls):
            deltas.append(self._header(i, call.id, call.name))
            deltas.append({"index": i, "function": {"arguments": call.arguments}})
        return delta, deltas, finish_reason

    def _content(self, text: str, end: int) -> str:
        delta = text[self.num_content : end] if end > self.num_content else ""
        self.num_content = max(self.num_content, end)
        return delta

    @staticmethod
    def _header(index: int, call_id: str, name: str) -> dict[str, Any]:
        return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
