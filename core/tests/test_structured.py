"""Structured outputs without a model: the request's constraint, the schema check, the compile cache."""

from __future__ import annotations

import pytest
from core.structured import StructuredOutputsParams
from core.structured.backends import check_xgrammar_schema, choose_backend
from core.structured.manager import StructuredOutputs


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({}, "exactly one of"),
        ({"regex": "a", "choice": ["b"]}, "got regex, choice"),
        ({"choice": []}, "non-empty list"),
        ({"choice": "ab"}, "non-empty list"),
        ({"json": "{not json"}, "not valid JSON"),
        ({"json": [1, 2]}, "JSON schema"),
        ({"regex": ""}, "non-empty string"),
    ],
)
def test_malformed_constraints_name_the_problem(fields, words):
    with pytest.raises(ValueError, match=words):
        StructuredOutputsParams(**fields)


def test_unknown_fields_are_refused_by_name():
    with pytest.raises(ValueError, match="regexp"):
        StructuredOutputsParams.from_dict({"regexp": "a"})


def test_equal_constraints_share_a_key():
    a = StructuredOutputsParams(json={"type": "object", "properties": {"x": {"type": "integer"}}})
    b = StructuredOutputsParams(json='{"properties": {"x": {"type": "integer"}}, "type": "object"}')
    assert a.key == b.key and a.kind == "json"
    assert StructuredOutputsParams(choice=["a", "b"]).key != StructuredOutputsParams(choice=["b", "a"]).key


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"not": {"type": "string"}}, "'not' at #"),
        ({"properties": {"a": {"if": {"type": "string"}, "then": {}}}}, "at #/properties/a"),
        ({"items": {"allOf": [{"type": "integer"}, {"minimum": 1}]}}, "allOf"),
        ({"$defs": {"d": {"type": "string", "format": "regex"}}}, "#/\\$defs/d"),
        ({"properties": {"p": {"type": "string", "pattern": "^a+$", "maxLength": 3}}}, "'maxLength' beside 'pattern'"),
        ({"items": {"type": "string", "format": "uri", "minLength": 3}}, "'minLength' beside 'format'"),
    ],
)
def test_keywords_xgrammar_would_ignore_are_refused_with_their_place(schema, words):
    with pytest.raises(ValueError, match=words):
        check_xgrammar_schema(schema)


def test_enforced_keywords_pass():
    check_xgrammar_schema({"type": "object", "allOf": [{"type": "object"}], "properties": {"a": {"enum": [1]}}})


def test_backend_choice():
    assert choose_backend("guidance") == "guidance"
    assert choose_backend("auto") == "guidance"
    with pytest.raises(ValueError, match="auto, xgrammar, guidance"):
        choose_backend("outlines")


class _CountingBackend:
    name = "counting"

    def __init__(self) -> None:
        self.compiles = 0

    def compile(self, spec):
        self.compiles += 1
        return spec.key

    def matcher(self, grammar):
        return grammar


def test_compiles_are_cached_and_the_bitmask_covers_constrained_rows_only():
    structured = StructuredOutputs("guidance", tokenizer=object(), vocab_size=100, eos_token_ids=[0])
    backend = structured._backend = _CountingBackend()
    spec = StructuredOutputsParams(regex="[0-9]+")
    assert structured.matcher(spec) == structured.matcher(StructuredOutputsParams(regex="[0-9]+"))
    assert backend.compiles == 1
    assert structured.bitmask([None, None]) is None

    class AllowAll:
        def fill_bitmask(self, bitmask, row):
            bitmask[row].fill_(-1)

    bitmask, rows = structured.bitmask([None, AllowAll(), None, AllowAll()])
    assert rows == [1, 3] and tuple(bitmask.shape) == (2, 4) and bool((bitmask == -1).all())


def test_a_backend_fills_its_own_rows_at_once_and_the_rest_row_by_row_on_the_worker():
    structured = StructuredOutputs("guidance", tokenizer=object(), vocab_size=100, eos_token_ids=[0])

    class Batched(_CountingBackend):
        def fill_bitmask_rows(self, rows, bitmask):
            for matcher, j in rows:
                if matcher == "batched":
                    bitmask[j].fill_(7)
            return [(m, j) for m, j in rows if m != "batched"]

    class AllowAll:
        def fill_bitmask(self, bitmask, row):
            bitmask[row].fill_(-1)

    structured._backend = Batched()
    assert structured.bitmask_soon([None, None]) is None
    bitmask, rows = structured.bitmask_soon([None, "batched", AllowAll()]).result()
    assert rows == [1, 2] and bool((bitmask[0] == 7).all()) and bool((bitmask[1] == -1).all())
    worker = structured._worker
    structured.shutdown()  # LLMEngine.shutdown's: the thread ends, a later step makes a new one
    assert structured._worker is None and worker._shutdown
    assert structured.bitmask_soon(["batched"]).result()[1] == [0]
    structured.shutdown()
