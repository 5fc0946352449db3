"""``tool_choice``: which constraint it puts on the answer, and the calls read from a constrained answer.

``required`` constrains the answer to a JSON array of one or more ``{"name", "parameters"}``
objects, each name one of the tools and its parameters valid against that tool's schema;
a named choice constrains it to the named tool's parameters. Either way the arguments are
valid by construction, with no parser.
"""

from __future__ import annotations

import json
from typing import Any

from core.structured import StructuredOutputsParams
from core.tools.parsers import ToolCall

#: a tool without a ``parameters`` schema takes an object
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def tool_functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{name: function}`` of OpenAI ``tools`` (``[{"type": "function", "function": {...}}]``); ValueError when malformed."""
    functions: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise ValueError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}"
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string")
        if not isinstance(function.get("parameters", {}), dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema (an object)")
        functions[name] = function
    return functions


def named_choice(tool_choice: Any) -> str | None:
    """The function a ``{"type": "function", "function": {"name": ...}}`` choice names, else None."""
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise ValueError(
                "tool_choice must be none, auto, required or {'type': 'function', 'function': {'name': ...}}"
            )
        return name
    return None


def tool_constraint(
    functions: dict[str, dict[str, Any]], tool_choice: Any, parallel: bool = True
) -> StructuredOutputsParams | None:
    """The constraint ``tool_choice`` puts on the answer: for ``required`` and a named tool; else None.

    :param parallel: whether ``required`` may make several calls (OpenAI's ``parallel_tool_calls``).
    """
    name = named_choice(tool_choice)
    if name is not None:
        if name not in functions:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(functions)})")
        return StructuredOutputsParams(json=functions[name].get("parameters") or EMPTY_PARAMETERS)
    if tool_choice != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": fn_name}, "parameters": fn.get("parameters") or EMPTY_PARAMETERS},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for fn_name, fn in functions.items()
    ]
    array = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return StructuredOutputsParams(json=array if parallel else {**array, "maxItems": 1})


def constrained_calls(text: str, tool_choice: Any) -> list[ToolCall]:
    """The calls of an answer made under :func:`tool_constraint`'s constraint."""
    name = named_choice(tool_choice)
    if name is not None:
        return [ToolCall(name, text)]
    return [ToolCall(item["name"], json.dumps(item["parameters"])) for item in json.loads(text)]
