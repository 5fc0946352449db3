"""What a request asks its output to follow: :class:`StructuredOutputsParams` (vLLM's names)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

#: the constraint kinds, in the order the fields are checked
KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Constrain a request's output; exactly one kind is set.

    :param json: a JSON schema (a dict, or its JSON text): the output is one JSON value that
        validates against it, written compactly (no runs of whitespace for a small model to
        loop on).
    :param regex: the output matches this regular expression in full.
    :param choice: the output is exactly one of these strings.
    :param grammar: a context-free grammar: GBNF/EBNF (``root ::= ...``) or Lark (``start: ...``).
    :param json_object: any JSON object (OpenAI's ``response_format: {"type": "json_object"}``).
    :param structural_tag: vLLM's structural tag (a dict or its JSON text): free text with
        JSON-schema-constrained segments between begin and end tags.
    """

    json: dict | str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict | str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice) or not self.choice:
                raise ValueError(f"structured_outputs.choice must be a non-empty list of strings, got {self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))
        kinds = [name for name in KINDS if getattr(self, name) not in (None, False)]
        if len(kinds) != 1:
            raise ValueError(
                f"structured_outputs takes exactly one of {', '.join(KINDS)}; got "
                + (", ".join(kinds) if kinds else "none")
            )
        for name in ("json", "structural_tag"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    object.__setattr__(self, name, json.loads(value))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"structured_outputs.{name} is not valid JSON: {exc}") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise ValueError(f"structured_outputs.json must be a JSON schema (an object), got {self.json!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")

    @property
    def kind(self) -> str:
        """Which constraint is set: one of :data:`KINDS`."""
        return next(name for name in KINDS if getattr(self, name) not in (None, False))

    @property
    def key(self) -> str:
        """A canonical text of the constraint: equal constraints share a compiled grammar."""
        return json.dumps([self.kind, getattr(self, self.kind)], sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> StructuredOutputsParams:
        """From a request's ``structured_outputs`` object; unknown fields are refused by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(
                f"structured_outputs has unknown field(s) {', '.join(unknown)}; it takes {', '.join(KINDS)}"
            )
        return cls(**{k: v for k, v in raw.items() if v is not None})
