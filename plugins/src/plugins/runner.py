"""Execution strategies: how a platform runs the model's forward pass.

The default :class:`Runner` runs eagerly. :meth:`Runner.prepare` binds the model and
KV caches, :meth:`Runner.execute` runs a step on them, :meth:`Runner.profile` is the
memory profiler's pass. Graph-capturing or shape-bucketing platforms subclass it:
:meth:`Runner.padded_num_seqs` picks the captured/compiled size a batch is padded to,
:func:`pad_inputs` pads, and the padding rows are cut from the output by
:meth:`Runner.execute`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any

import torch
from plugins.attention import AttentionMetadata
from plugins.config import EngineConfigView
from plugins.lora import LoRAMapping


@dataclass
class ModelInputs:
    """One step's inputs of the model forward, flattened as in :mod:`plugins.attention`.

    ``lora``: which rows run with which LoRA adapter, None when none does. The model's linears
    already hold it (core sets it for the step): a runner that replays a graph or runs its own
    forward pass without the model's linears runs a step that has one eagerly instead.

    ``intermediate``: on a pipeline stage after the first, the previous stage's hidden states
    and residual side by side, ``[T, 2 * hidden_size]`` in the compute dtype (the stage's model
    takes them instead of embedding ``input_ids``); None on the first stage and when the model
    is not split into stages. A stage before the last returns its own, of the same shape.
    """

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    attn_metadata: AttentionMetadata
    lora: LoRAMapping | None = None
    intermediate: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def pad_inputs(inputs: ModelInputs, num_seqs: int) -> ModelInputs:
    """Pad a decode-only batch to ``num_seqs`` sequences of one token each.

    Padding tokens have id 0, position 0 and slot -1 (never written), no LoRA adapter and zero
    ``intermediate`` rows; padding sequences have ``seq_len`` 0 and an all-zero block table, so attention over them
    is defined (zeros) and reads nothing it should not.
    """
    meta = inputs.attn_metadata
    extra = num_seqs - meta.num_seqs
    if extra < 0:
        raise ValueError(f"cannot pad {meta.num_seqs} sequences down to {num_seqs}")
    if extra == 0:
        return inputs
    if not meta.is_decode_only:
        raise ValueError("pad_inputs pads decode-only batches (one token per sequence)")
    device = inputs.input_ids.device
    zeros = torch.zeros(extra, dtype=torch.int64, device=device)
    table_pad = torch.zeros(extra, meta.block_tables.shape[1], dtype=meta.block_tables.dtype, device=device)
    end = sum(meta.query_lens_host)  # the host's numbers: no device read
    padded = replace(
        meta,
        query_start_loc=torch.cat(
            [meta.query_start_loc, torch.arange(end + 1, end + extra + 1, dtype=torch.int32, device=device)]
        ),
        seq_lens=torch.cat([meta.seq_lens, zeros.to(torch.int32)]),
        block_tables=torch.cat([meta.block_tables, table_pad]),
        slot_mapping=torch.cat([meta.slot_mapping, zeros - 1]),
        query_lens_host=meta.query_lens_host + [1] * extra,
        seq_lens_host=meta.seq_lens_host + [0] * extra,
    )
    intermediate = inputs.intermediate
    if intermediate is not None:
        intermediate = torch.cat([intermediate, intermediate.new_zeros(extra, intermediate.shape[1])])
    return ModelInputs(
        torch.cat([inputs.input_ids, zeros]), torch.cat([inputs.positions, zeros]), padded, inputs.lora, intermediate
    )


def call_model(model: torch.nn.Module, kv_caches: list[Any], inputs: ModelInputs) -> torch.Tensor:
    """``model(input_ids, positions, kv_caches, attn_metadata)``, with ``inputs.intermediate``
    as a fifth argument on a pipeline stage after the first."""
    args = (inputs.input_ids, inputs.positions, kv_caches, inputs.attn_metadata)
    return model(*args) if inputs.intermediate is None else model(*args, inputs.intermediate)


class Runner:
    """Eager execution: call the model as it is. Override to capture or compile.

    A runner is stateful: :meth:`prepare` binds the engine's model and KV caches (once,
    after the KV cache is allocated) and :meth:`execute` runs each step on what is
    bound. The model is called as ``model(input_ids, positions, kv_caches,
    attn_metadata)`` (:func:`call_model`: plus ``intermediate`` on a pipeline stage after the
    first) and returns hidden states ``[T, hidden_size]`` (``[T, 2 * hidden_size]`` on a stage
    before the last: :class:`ModelInputs`). A runner that runs
    the forward pass its own way reads the model through ``model.describe(kv_caches)``
    (a :class:`plugins.model.ModelDescription`), never through the model's classes.
    """

    def __init__(self, platform: Any) -> None:
        self.platform = platform
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[Any] = []

    def profile(self, model: torch.nn.Module, kv_caches: list[Any], inputs: ModelInputs) -> torch.Tensor:
        """The memory profiler's forward pass at the largest batch, before :meth:`prepare`.

        Binds nothing. Default: eager. (optional) override when the device's peak memory
        differs under the runner's own execution.
        """
        return call_model(model, kv_caches, inputs)

    def prepare(self, model: torch.nn.Module, kv_caches: list[Any], config: EngineConfigView) -> None:
        """Bind the model and the KV caches every later :meth:`execute` runs on.

        Called once, after the KV cache is allocated, with the engine's resolved settings.
        Subclasses call ``super().prepare(...)`` first, then warm up, compile or capture.
        """
        self.model = model
        self.kv_caches = kv_caches

    def io_device(self) -> torch.device:
        """Where core builds :class:`ModelInputs` and receives logits (so sampling runs there).

        The platform's device by default; a runner that pads its inputs on the host and
        hands logits back to it (XLA) returns the CPU.
        """
        return self.platform.torch_device()

    def stage(self, host: torch.Tensor) -> torch.Tensor:
        """A step's inputs, packed in one host tensor, on :meth:`io_device` (core calls it once a step).

        Default: ``host.to(io_device())`` (no copy when that is the CPU). (optional) override to
        copy without synchronising the host: a GPU runner pins ``host`` and copies asynchronously.
        """
        return host.to(self.io_device())

    def grad_mode(self) -> contextlib.AbstractContextManager:
        """The autograd mode core runs :meth:`profile`, :meth:`execute` and
        :meth:`compute_logits` in: ``torch.inference_mode()`` by default. A runner whose
        tensors cannot be inference tensors (XLA's lazy tensors) returns ``torch.no_grad()``."""
        return torch.inference_mode()

    def compute_logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """float32 logits ``[len(rows), vocab]`` of the bound model for rows ``rows`` of
        :meth:`execute`'s result, on :meth:`io_device`. Override to run them at padded shapes."""
        if rows and rows == list(range(rows[0], rows[0] + len(rows))):  # decode: every row, no index to copy
            return self.model.compute_logits(hidden[rows[0] : rows[0] + len(rows)])
        index = self.stage(torch.tensor(rows, dtype=torch.long))
        return self.model.compute_logits(hidden.index_select(0, index))

    def padded_num_seqs(self, inputs: ModelInputs) -> int | None:
        """(optional) override: the batch size to pad a batch to, or None to run as is."""
        return None

    def execute(self, inputs: ModelInputs) -> torch.Tensor:
        """Run one forward pass on the bound model and caches; hidden states of the real (unpadded) tokens.

        :raises RuntimeError: before :meth:`prepare`.
        """
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.execute() called before prepare()")
        num_tokens = inputs.num_tokens
        target = self.padded_num_seqs(inputs)
        if target is not None and target != inputs.attn_metadata.num_seqs:
            inputs = pad_inputs(inputs, target)
        hidden = self.forward(inputs)
        return hidden[:num_tokens]

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        """The forward pass on (possibly padded) inputs. Override to replay graphs."""
        return call_model(self.model, self.kv_caches, inputs)
