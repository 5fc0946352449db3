"""Grammar backends: compile a :class:`StructuredOutputsParams` once, then one matcher a sequence.

Two libraries do the work, behind the same two calls (:meth:`compile`, :meth:`matcher`):
llguidance (``guidance``, the default and a dependency of core, with no dependencies of its own)
and xgrammar (``pip install xgrammar``; it brings Triton, about 1 GB; it adds structural tags). A bad schema, regex or
grammar, or a JSON-schema keyword the backend would not enforce, raises ``ValueError``
with the backend's message (the server's 400).
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any, Protocol

import torch
from plugins.config import STRUCTURED_OUTPUTS_BACKENDS as BACKENDS

from core.structured.params import StructuredOutputsParams


class Matcher(Protocol):
    """One sequence's place in its grammar."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32, bit ``t % 32`` of word ``t // 32``)."""

    def accept(self, token_id: int) -> bool:
        """Advance by a sampled token; False when the grammar does not allow it."""

    def is_terminated(self) -> bool:
        """Whether the grammar has ended (its stop token was accepted)."""

    #: whether :meth:`validate` and :meth:`rollback` work now (speculative decoding needs them)
    can_rollback: bool

    def validate(self, token_ids: list[int]) -> int:
        """How many leading ``token_ids`` the grammar allows from here, without advancing."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""


class Backend(Protocol):
    """(optional) ``fill_bitmask_rows(rows, bitmask)``: fill the rows of its own matchers at once,
    return the ``(matcher, row)`` pairs left (see :meth:`GuidanceBackend.fill_bitmask_rows`)."""

    name: str

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar of ``spec`` (thread-safe; ``ValueError`` when it is not valid)."""

    def matcher(self, grammar: Any) -> Matcher:
        """A fresh matcher at the start of ``grammar``."""


def choose_backend(name: str) -> str:
    """``auto`` is llguidance: it enforces every JSON-schema keyword it accepts (xgrammar drops a
    string's length bounds beside ``pattern`` or ``format``) and fills a 32-row mask mid-answer
    in under a millisecond where xgrammar took 30 ms (``bench/structured_outputs.py``)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown structured outputs backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return "guidance" if name == "auto" else name


def make_backend(name: str, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> Backend:
    """The backend ``name`` (see :func:`choose_backend`) for this tokenizer and the model's ``vocab_size``."""
    name = choose_backend(name)
    if name == "xgrammar":
        if importlib.util.find_spec("xgrammar") is None:
            raise ValueError("--structured-outputs-backend xgrammar needs xgrammar: pip install xgrammar")
        return XGrammarBackend(tokenizer, vocab_size, eos_token_ids)
    return GuidanceBackend(tokenizer, vocab_size, eos_token_ids)


def _choice_lark(choices: tuple[str, ...]) -> str:
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class _Matcher:
    """A library's matcher behind :class:`Matcher`'s calls (bound once: they run every step);
    ``native``: the library's own matcher, for a backend that fills many rows in one call."""

    can_rollback = True

    def __init__(
        self, fill: Any, accept: Any, is_terminated: Any, validate: Any, rollback: Any, native: Any = None
    ) -> None:
        self.fill_bitmask = fill
        self.accept = accept
        self.is_terminated = is_terminated
        self.validate = validate
        self.rollback = rollback
        self.native = native


# -- llguidance ------------------------------------------------------------------------------
class GuidanceBackend:
    """llguidance: JSON schema, regex, choice, Lark and GBNF grammars.

    A compiled grammar is a matcher at its start that is never advanced; each sequence's
    matcher is a copy of it. Copies share the grammar's lexer, whose states llguidance
    builds as answers first reach them: a schema seen before starts warm (its 32-row masks
    filled ~25% faster), and a copy costs tens of microseconds where a matcher built from the
    grammar's text cost ~0.5 ms.
    """

    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        import llguidance
        import llguidance.hf

        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids))
        # one thread: the fill overlaps the model's forward, which has the other CPUs (LLMEngine.step)
        self._executor = llguidance.LLExecutor(num_threads=1)

    def compile(self, spec: StructuredOutputsParams) -> Any:
        from llguidance import LLMatcher
        from llguidance.gbnf_to_lark import any_to_lark

        kind = spec.kind
        try:
            if kind in ("json", "json_object"):
                schema = spec.json if kind == "json" else {"type": "object"}
                grammar = LLMatcher.grammar_from_json_schema(
                    json.dumps(schema), defaults={"whitespace_flexible": False}
                )
            elif kind == "regex":
                grammar = LLMatcher.grammar_from_regex(spec.regex)
            elif kind == "choice":
                grammar = LLMatcher.grammar_from_lark(_choice_lark(spec.choice))
            elif kind == "grammar":
                grammar = LLMatcher.grammar_from_lark(any_to_lark(spec.grammar))  # GBNF or Lark
            else:
                raise ValueError("structural_tag needs --structured-outputs-backend xgrammar")
        except ValueError:
            raise
        except Exception as exc:  # the library's own parse errors
            raise ValueError(f"structured_outputs.{kind}: {exc}") from None
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self._tokenizer)
        if is_error:
            raise ValueError(f"structured_outputs.{kind}: {messages[0] if messages else 'invalid'}")
        start = LLMatcher(self._tokenizer, grammar)
        if start.is_error():
            raise ValueError(f"structured_outputs.{kind}: {start.get_error()}")
        return start

    def matcher(self, grammar: Any) -> Matcher:
        from llguidance.torch import fill_next_token_bitmask

        matcher = grammar.deep_copy()
        return _Matcher(
            lambda bitmask, row: fill_next_token_bitmask(matcher, bitmask, row),
            matcher.consume_token,
            matcher.is_stopped,
            matcher.validate_tokens,
            matcher.rollback,
            native=matcher,
        )

    def fill_bitmask_rows(self, rows: list[tuple[Matcher, int]], bitmask: torch.Tensor) -> list[tuple[Matcher, int]]:
        """Fill ``bitmask``'s rows of this backend's matchers in one call that releases the GIL;
        return the ``(matcher, row)`` pairs left to fill one by one (other matchers)."""
        from llguidance.torch import fill_next_token_bitmask_par

        native = [(m.native, row) for m, row in rows if getattr(m, "native", None) is not None]
        if native:
            fill_next_token_bitmask_par(self._executor, native, bitmask)
        return [(m, row) for m, row in rows if getattr(m, "native", None) is None]


# -- xgrammar --------------------------------------------------------------------------------
#: JSON-schema keywords xgrammar reads without enforcing them: refused by name
_XGRAMMAR_UNENFORCED = frozenset({"not", "if", "then", "else", "dependentSchemas", "$dynamicRef", "$recursiveRef"})
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = (
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "additionalItems",
)


def check_xgrammar_schema(schema: Any, path: str = "#") -> None:
    """``ValueError`` naming the first keyword of ``schema`` xgrammar would silently not enforce."""
    if not isinstance(schema, dict):
        return
    for key in _XGRAMMAR_UNENFORCED & schema.keys():
        raise ValueError(f"JSON schema keyword {key!r} at {path} is not enforced by the xgrammar backend")
    if len(schema.get("allOf", ())) > 1:
        raise ValueError(f"JSON schema keyword 'allOf' with several schemas at {path} is not enforced by xgrammar")
    if schema.get("format") == "regex":
        raise ValueError(f"JSON schema 'format': 'regex' at {path} is not enforced by the xgrammar backend")
    bounded = [k for k in ("minLength", "maxLength") if k in schema]
    shaped = [k for k in ("pattern", "format") if k in schema]
    if bounded and shaped:
        raise ValueError(
            f"JSON schema {bounded[0]!r} beside {shaped[0]!r} at {path} is not enforced by the xgrammar backend "
            "(the guidance backend enforces both)"
        )
    for key in _SCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            check_xgrammar_schema(sub, f"{path}/{key}/{name}")
    for key in _SCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or ()):
            check_xgrammar_schema(sub, f"{path}/{key}/{i}")
    for key in _SCHEMA_VALUES:
        check_xgrammar_schema(schema.get(key), f"{path}/{key}")


class XGrammarBackend:
    """xgrammar: JSON schema, regex, choice, GBNF/EBNF grammars and structural tags."""

    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids)
        )
        self._compiler = xgrammar.GrammarCompiler(info, cache_enabled=True)

    def compile(self, spec: StructuredOutputsParams) -> Any:
        kind, compiler = spec.kind, self._compiler
        try:
            if kind in ("json", "json_object"):  # the builtin JSON grammar would take any value, not an object
                schema = spec.json if kind == "json" else {"type": "object"}
                check_xgrammar_schema(schema)
                return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(spec.regex)
            if kind == "choice":
                return compiler.compile_grammar(
                    "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
                )
            if kind == "grammar":
                if "::=" not in spec.grammar:
                    raise ValueError(
                        "xgrammar reads GBNF/EBNF grammars (root ::= ...); Lark needs the guidance backend"
                    )
                return compiler.compile_grammar(spec.grammar)
            tag = spec.structural_tag
            if isinstance(tag, dict) and "structures" in tag:  # vLLM's form: begin/schema/end items and triggers
                import xgrammar

                items = [
                    xgrammar.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                    for s in tag["structures"]
                ]
                return compiler.compile_structural_tag(items, tag["triggers"])
            return compiler.compile_structural_tag(json.dumps(tag))  # xgrammar's own form (with "format")
        except ValueError:
            raise
        except Exception as exc:  # the library's own parse errors (RuntimeError, KeyError in a malformed tag)
            raise ValueError(f"structured_outputs.{kind}: {exc}") from None

    def matcher(self, grammar: Any) -> Matcher:
        import xgrammar

        matcher = xgrammar.GrammarMatcher(grammar)

        def validate(token_ids: list[int]) -> int:  # xgrammar has no dry run: accept, then roll back
            n = 0
            while n < len(token_ids) and matcher.accept_token(token_ids[n]):
                n += 1
            if n:
                matcher.rollback(n)
            return n

        return _Matcher(
            matcher.fill_next_token_bitmask, matcher.accept_token, matcher.is_terminated, validate, matcher.rollback
        )
