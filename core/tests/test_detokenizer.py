"""Incremental detokenization on real (locally trained) tokenizers; stop strings."""

from __future__ import annotations

import json
import random

import pytest
from core.detokenizer import IncrementalDetokenizer, StopChecker
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello there! Paris is the capital of France.",
    "机器学习很有趣",
    "東京は日本の首都です",
    "Ünïcödé façade café naïve",
] * 20
TEXTS = [
    "Hello world 😀 机器学习 and 🚀🚀 rockets",
    "东京 🇫🇷 flag, café, 👩‍👩‍👧 family",
    "plain ascii only, nothing else.",
    "  spaced   out\nnew line\ttab 😀",
]


@pytest.fixture(scope="module")
def byte_level() -> PreTrainedTokenizerFast:
    """GPT-2 / Llama-3 / SmolLM2 style: byte-level BPE (a small vocab splits characters)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def sentencepiece() -> PreTrainedTokenizerFast:
    """Llama-2 / Mistral style: '▁' word starts, byte fallback for unknown characters."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for byte in range(256):  # byte-fallback tokens, as sentencepiece models carry them
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(data))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", bos_token="<s>")


def decode(tokenizer, ids, skip_special_tokens=True) -> str:
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def stream(tokenizer, prompt_ids, output_ids, **kwargs) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, **kwargs)
    deltas = [detok.add(t) for t in output_ids]
    assert detok.output_text == "".join(deltas)
    assert detok.output_token_ids == list(output_ids)
    return deltas


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("prompt", ["", "Question: where?"])
def test_deltas_concatenate_to_full_decode(request, kind, text, prompt):
    tokenizer = request.getfixturevalue(kind)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    output_ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = stream(tokenizer, prompt_ids, output_ids)
    assert not any("\ufffd" in d for d in deltas)
    # the output is the text the prompt's continuation adds (with its leading space)
    full, prompt_text = decode(tokenizer, prompt_ids + output_ids), decode(tokenizer, prompt_ids)
    assert full.startswith(prompt_text)
    assert "".join(deltas) == full[len(prompt_text) :]
    if any(ord(ch) > 0x7F for ch in text):
        assert "" in deltas  # partial characters were really held back


def test_byte_level_output_equals_decode_of_output_ids(byte_level):
    ids = byte_level.encode(TEXTS[0], add_special_tokens=False)
    prompt = byte_level.encode("Say: 😀", add_special_tokens=False)
    assert "".join(stream(byte_level, prompt, ids)) == decode(byte_level, ids) == TEXTS[0]


def test_sentencepiece_keeps_leading_space_after_prompt(sentencepiece):
    prompt = sentencepiece.encode("The capital of France is", add_special_tokens=False)
    output = sentencepiece.encode("Paris", add_special_tokens=False)
    assert sentencepiece.convert_ids_to_tokens(output[0]).startswith("▁")
    deltas = stream(sentencepiece, prompt, output)
    assert "".join(deltas) == " Paris"
    assert "".join(stream(sentencepiece, [], output)) == "Paris"  # no context: like decode()


def test_special_tokens_skipped_or_kept(byte_level):
    ids = byte_level.encode("Hello", add_special_tokens=False) + [byte_level.eos_token_id]
    assert "".join(stream(byte_level, [], ids)) == "Hello"
    kept = stream(byte_level, [], ids, skip_special_tokens=False)
    assert "".join(kept) == "Hello<|endoftext|>"


def test_decodes_only_a_short_window_per_token(byte_level):
    seen: list[int] = []

    class Recording:
        def decode(self, ids, **kwargs):
            seen.append(len(ids))
            return byte_level.decode(ids, **kwargs)

    ids = byte_level.encode(" ".join(TEXTS) * 4, add_special_tokens=False)
    assert len(ids) > 300
    prompt = byte_level.encode(TEXTS[1], add_special_tokens=False)
    deltas = stream(Recording(), prompt, ids)
    assert "".join(deltas) == decode(byte_level, prompt + ids)[len(decode(byte_level, prompt)) :]
    assert max(seen) <= 12  # a window of a few tokens, never the whole sequence


def feed(checker: StopChecker, deltas: list[str]) -> tuple[str, str | None, list[str]]:
    """Run deltas through the checker as the engine does; return text, match, streamed parts."""
    text, streamed, shown = "", [], ""
    for n, delta in enumerate(deltas, start=1):
        text, matched = checker.check(text, delta, n)
        visible = text if matched else checker.visible(text)
        assert visible.startswith(shown)  # what was streamed is never taken back
        streamed.append(visible[len(shown) :])
        shown = visible
        if matched:
            return text, matched, streamed
    return text, None, streamed


def test_stop_string_split_across_tokens_is_cut_and_never_streamed():
    checker = StopChecker(["o wor"])
    text, matched, streamed = feed(checker, ["Hel", "lo ", "wo", "rld", "!!"])
    assert (text, matched) == ("Hell", "o wor")
    assert streamed == ["Hel", "l", "", ""]
    assert "".join(streamed) == "Hell"


def test_include_stop_str_in_output():
    text, matched, streamed = feed(StopChecker(["o wor"], include_stop_str_in_output=True), ["Hello", " wo", "rld"])
    assert (text, matched) == ("Hello wor", "o wor")
    assert "".join(streamed) == "Hello wor"


def test_false_start_is_released():
    text, matched, streamed = feed(StopChecker(["END"]), ["The E", "N", "d of it"])
    assert (text, matched) == ("The ENd of it", None)
    assert streamed == ["The ", "", "ENd of it"]


def test_earliest_stop_string_wins_and_is_reported():
    text, matched, _ = feed(StopChecker(["xyz", "b"]), ["a", "bcxyz"])
    assert (text, matched) == ("a", "b")
    assert StopChecker(["\n"]).visible("line\n") == "line\n"  # single-char stops hold nothing back


def test_stop_strings_ignored_before_min_tokens():
    text, matched, _ = feed(StopChecker(["!"], min_tokens=3), ["a!", "b!", "c!", "d"])
    assert (text, matched) == ("a!b!c", "!")


def test_empty_stop_string_rejected():
    with pytest.raises(ValueError, match="non-empty"):
        StopChecker(["ok", ""])


@pytest.mark.parametrize("seed", range(20))
def test_random_splits_match_reference(seed):
    rng = random.Random(seed)
    text = "".join(rng.choice("abcab 😀") for _ in range(60))
    stop = rng.choice(["ab", "bca", "a😀", "cc ", "😀😀"])
    cuts = sorted(rng.sample(range(1, len(text)), 15))
    deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    out, matched, streamed = feed(StopChecker([stop]), deltas)
    index = text.find(stop)
    assert out == (text if index == -1 else text[:index])
    assert matched == (None if index == -1 else stop)
    assert stop not in "".join(streamed)
    if matched:
        assert "".join(streamed) == out


def test_stop_string_with_detokenized_multibyte_tokens(byte_level):
    text = "机器学习很有趣 😀 done"
    ids = byte_level.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(byte_level, [])
    out, matched, streamed = feed(StopChecker(["有趣"]), [detok.add(t) for t in ids])
    assert (out, matched) == ("机器学习很", "有趣")
    assert "".join(streamed) == "机器学习很"
