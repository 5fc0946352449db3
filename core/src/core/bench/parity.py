"""Greedy parity of a loaded model with a reference's logits (tests and benchmarks).

The rule, for weights that are quantized the same way but computed in another order:
equal greedy tokens, or at the first difference each side's token is in the other's top 5.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from core.models.standalone import StandaloneRunner


@dataclass(frozen=True)
class Parity:
    """How a greedy run compares: ``equal`` of ``num_prompts`` sequences match token for token;
    ``first_differences`` the ``(prompt, step)`` of the others' first differing token."""

    num_prompts: int
    equal: int
    first_differences: list[tuple[int, int]]

    def describe(self) -> str:
        """E.g. ``3/3 equal`` or ``2/3 equal (first difference: prompt 1 at step 9, within top 5)``."""
        text = f"{self.equal}/{self.num_prompts} equal"
        if self.first_differences:
            places = ", ".join(f"prompt {p} at step {s}" for p, s in self.first_differences)
            text += f" (first difference: {places}, within top 5)"
        return text


def greedy_parity(
    model: torch.nn.Module,
    reference_logits: Callable[[list[int]], torch.Tensor],
    prompts: list[list[int]],
    num_steps: int,
    block_size: int = 16,
) -> Parity:
    """Decode ``prompts`` greedily with ``model`` (a loaded model, all prompts in one batch) and
    check each step against ``reference_logits(tokens)``: the next-token logits after ``tokens``.

    :raises AssertionError: when a first difference breaks the top-5 rule (names the place).
    """
    runner = StandaloneRunner(model, len(prompts), max(map(len, prompts)) + num_steps, block_size)
    ours, our_logits = runner.greedy(prompts, num_steps)
    differences = []
    for i, prompt in enumerate(prompts):
        sequence = list(prompt)
        for step in range(num_steps):
            reference = reference_logits(sequence).float()
            theirs, mine = int(reference.argmax()), ours[i][step]
            if theirs != mine:
                top_theirs = reference.topk(5).indices.tolist()
                top_mine = our_logits[step][i].topk(5).indices.tolist()
                assert mine in top_theirs and theirs in top_mine, (
                    f"prompt {i} step {step}: ours {mine} (reference top 5 {top_theirs}), "
                    f"reference {theirs} (our top 5 {top_mine})"
                )
                differences.append((i, step))
                break
            sequence.append(theirs)
    return Parity(len(prompts), len(prompts) - len(differences), differences)


def hf_next_logits(hf_model: torch.nn.Module) -> Callable[[list[int]], torch.Tensor]:
    """``reference_logits`` of :func:`greedy_parity` from a transformers causal LM."""

    def logits(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf_model(torch.tensor([tokens])).logits[0, -1]

    return logits


def hf_greedy(hf_model: torch.nn.Module, prompt: list[int], max_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy continuation of ``prompt`` (EOS not special) and each step's
    log-softmax over the vocabulary: the reference of the engine-level parity tests."""
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out.sequences[0, len(prompt) :].tolist(), [torch.log_softmax(s[0].float(), -1) for s in out.scores]
