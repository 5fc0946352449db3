"""Tool calling: the constraint ``tool_choice`` puts on an answer, the parsers that read a model's
calls back, and the conversation as a chat template can render it.

The server's chat handler calls :func:`tool_constraint` (``required`` and named choices: valid
arguments by construction), :func:`template_messages` before rendering, and, for
``tool_choice: auto``, the :class:`ToolParser` that ``--tool-call-parser`` names.
"""

from core.tools.choice import constrained_calls, named_choice, tool_constraint, tool_functions
from core.tools.messages import template_messages
from core.tools.parsers import ToolCall, ToolParser, get_tool_parser, tool_parser_names

__all__ = [
    "ToolCall",
    "ToolParser",
    "constrained_calls",
    "get_tool_parser",
    "named_choice",
    "template_messages",
    "tool_constraint",
    "tool_functions",
    "tool_parser_names",
]
