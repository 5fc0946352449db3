"""A tool-using conversation in the shape a chat template reads, whatever the template knows of tools.

Templates written for tools (Qwen's, Hermes', Llama 3.1's) get the tools as ``tools=`` and
assistant ``tool_calls`` with their arguments as objects, as transformers passes them. A
template that ignores tools (SmolLM2's) still serves the conversation: the tools are described
in a system message, an assistant's calls are written as ``<tool_call>`` blocks in its content
and a tool's result is a user turn in a ``<tool_response>`` block (the Hermes convention, which
the ``hermes`` parser reads back).
"""

from __future__ import annotations

import json
from typing import Any


def reads_tools(template: str) -> bool:
    """Whether ``template`` renders tool definitions and calls itself."""
    return "tools" in template and "tool_calls" in template


def tools_system_prompt(functions: dict[str, dict[str, Any]]) -> str:
    """A system message describing ``functions`` and how to call them (Hermes' convention)."""
    described = "\n".join(json.dumps({"type": "function", "function": fn}) for fn in functions.values())
    return (
        "You may call one or more functions to assist with the user query. The functions are:\n"
        f"<tools>\n{described}\n</tools>\n"
        "For each function call, return a JSON object with the function name and arguments within "
        '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def template_messages(
    messages: list[dict[str, Any]], template: str, functions: dict[str, dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """``messages`` (role, content, tool_calls, tool_call_id) as ``template`` can render them."""
    native = reads_tools(template)
    out: list[dict[str, Any]] = []
    if functions and not native:
        out.append({"role": "system", "content": tools_system_prompt(functions)})
    for message in messages:
        role, content, calls = message["role"], message.get("content") or "", message.get("tool_calls")
        if native:
            item = {"role": role, "content": content}
            if calls:
                item["tool_calls"] = [
                    {**call, "function": {**call["function"], "arguments": _arguments(call["function"]["arguments"])}}
                    for call in calls
                ]
            if message.get("tool_call_id") is not None:
                item["tool_call_id"] = message["tool_call_id"]
            out.append(item)
        elif calls:
            blocks = "\n".join(
                "<tool_call>\n"
                + json.dumps({"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])})
                + "\n</tool_call>"
                for c in calls
            )
            out.append({"role": role, "content": f"{content}\n{blocks}".strip()})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    return out
