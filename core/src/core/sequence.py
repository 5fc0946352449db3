"""The state of one generated sequence: the object that travels through the engine.

A request with ``n > 1`` becomes ``n`` sequences sharing one ``request_id``. The
scheduler owns the lifecycle (``status``, ``num_computed_tokens``), the block manager
owns ``block_table`` and ``block_hashes``, the engine appends sampled tokens.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.lora import LoRARequest


class ContextLengthError(ValueError):
    """A request that cannot fit the model's context; ``param`` names the request field to change."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_length(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """The request's ``max_tokens`` (None: all the context leaves), once the prompt and it fit.

    The one length check of a request, used by the server's front end, the engine and the
    scheduler (which passes ``max_tokens=0``: the prompt alone must fit).

    :raises ContextLengthError: an empty prompt, or more than ``max_model_len`` tokens
        (a prompt that leaves no room for one output token when ``max_tokens`` is None).
    """
    if num_prompt_tokens == 0:
        raise ContextLengthError("the prompt is empty: it must hold at least one token", "prompt")
    wanted = num_prompt_tokens + (1 if max_tokens is None else max_tokens)
    if wanted > max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens (max_model_len). However, you "
            f"requested {wanted} tokens ({num_prompt_tokens} in the prompt, {max_tokens or 0} for the completion). "
            "Please reduce the prompt or max_tokens.",
            "max_tokens" if num_prompt_tokens < max_model_len else "prompt",
        )
    return max_model_len - num_prompt_tokens if max_tokens is None else max_tokens


class SequenceStatus(enum.Enum):
    """Where a sequence is in its lifecycle; the ``FINISHED_*`` members say why it ended."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"  # EOS, a stop token id or a stop string
    FINISHED_LENGTH = "length"  # max_tokens, max_model_len or the whole KV cache reached
    FINISHED_ABORTED = "abort"  # the client went away or the request was cancelled

    @property
    def is_finished(self) -> bool:
        """True for the ``FINISHED_*`` members."""
        return self in FINISHED

    @property
    def finish_reason(self) -> str | None:
        """OpenAI/vLLM ``finish_reason`` (``"stop"``, ``"length"``, ``"abort"``), None while live."""
        return self.value if self.is_finished else None


#: the ``FINISHED_*`` members (a set lookup: ``name`` is a descriptor call on every enum access,
#: and a sequence's status is read several times per sequence per step)
FINISHED = frozenset(s for s in SequenceStatus if s.name.startswith("FINISHED_"))


@dataclass(eq=False)
class Sequence:
    """One sequence being generated: its tokens, progress and KV blocks.

    ``eq=False``: sequences compare by identity, so list removal never confuses two
    sequences that happen to hold the same tokens.

    :param seq_id: unique over the engine's lifetime.
    :param request_id: the request this sequence answers (shared by its ``n`` siblings).
    :param prompt_token_ids: the prompt; must not be empty.
    :param params: the request's sampling parameters (opaque to the scheduler).
    :param arrival_time: when the request arrived (seconds); orders equal priorities.
    :param priority: lower values are scheduled first.
    :param skip_prefix_cache: never read the prefix cache (its own blocks are still
        cached for others); for requests that need every prompt position computed,
        such as prompt logprobs.
    :param lora: the request's LoRA adapter (:class:`core.lora.LoRARequest`), None for the base model.
    """

    seq_id: int
    request_id: str
    prompt_token_ids: list[int]
    params: Any
    arrival_time: float
    priority: int = 0
    skip_prefix_cache: bool = False
    lora: LoRARequest | None = None
    token_ids: list[int] = field(init=False)  # prompt + output
    output_token_ids: list[int] = field(init=False, default_factory=list)
    num_computed_tokens: int = field(init=False, default=0)  # tokens whose KV is in the cache
    num_cached_tokens: int = field(init=False, default=0)  # of those, found in the prefix cache
    block_table: list[int] = field(init=False, default_factory=list)
    # leading entries of block_table given back to the pool: outside every layer's attention
    # window (BlockManager.free_before); the entries stay, attention never uses their keys
    num_freed_blocks: int = field(init=False, default=0)
    # content hashes of the full blocks of token_ids, filled lazily by the block manager;
    # tokens are only ever appended, so they stay valid across preemptions
    block_hashes: list[bytes] = field(init=False, default_factory=list)
    status: SequenceStatus = field(init=False, default=SequenceStatus.WAITING)
    num_preemptions: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"Request {self.request_id!r}: the prompt has no tokens")
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Number of prompt tokens."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Number of generated tokens so far."""
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.token_ids)

    @property
    def is_finished(self) -> bool:
        """True once the sequence has a ``FINISHED_*`` status."""
        return self.status in FINISHED

    @property
    def finish_reason(self) -> str | None:
        """``"stop"``, ``"length"`` or ``"abort"`` once finished, else None."""
        return self.status.finish_reason

    def append_token(self, token_id: int) -> None:
        """Append one generated token."""
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)
