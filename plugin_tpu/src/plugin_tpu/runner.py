"""Padded execution for XLA: every step runs at one of a fixed set of shapes.

XLA compiles one graph per input shape, and a compile while serving stalls every
request for seconds. So, like vLLM's TPU backend, the runner pads:

* the token count of a step to :func:`token_paddings` sizes: the forward graph
  (model + KV writes) depends on nothing else;
* the rows whose logits are needed to :func:`seq_paddings` sizes: the logits graph
  depends on (padded tokens, padded rows).

Inputs are padded on the host and moved with ``.to(device)`` (tensors created on the
XLA device would trace small graphs of their own); the padding rows are cut off the
results. :meth:`TpuRunner.prepare` compiles every shape before the engine is ready.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from plugins.attention import AttentionMetadata
from plugins.config import EngineConfigView
from plugins.runner import ModelInputs, Runner
from tqdm import tqdm

from plugin_tpu.kernels import XlaAttentionMetadata, token_layout
from plugin_tpu.padding import padded_size, seq_paddings, token_paddings

logger = logging.getLogger(__name__)


def compile_count() -> int:
    """Graphs XLA has compiled in this process (torch_xla's ``CompileTime`` metric)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def pad_to_host(inputs: ModelInputs, num_tokens: int, num_seqs: int, table_width: int) -> XlaAttentionMetadata:
    """The host-side metadata of ``inputs`` padded to ``num_tokens`` tokens and ``num_seqs`` sequences.

    Padding tokens: slot -1 (not written), one visible key of block 0. Padding
    sequences: length 0 and an all-zero block table.
    """
    meta = inputs.attn_metadata
    real, extra_seqs = inputs.num_tokens, num_seqs - meta.num_seqs
    if meta.block_tables.shape[1] > table_width:
        raise ValueError(f"a block table of {meta.block_tables.shape[1]} blocks exceeds max_model_len's {table_width}")
    token_tables, context_lens = token_layout(meta, num_tokens, table_width)
    tables = torch.zeros(num_seqs, table_width, dtype=torch.int32)
    tables[: meta.num_seqs] = token_tables[:real][meta.query_start_loc.cpu()[:-1].long()]
    slots = torch.full((num_tokens,), -1, dtype=torch.int64)
    slots[:real] = meta.slot_mapping.cpu()
    return XlaAttentionMetadata(
        query_start_loc=torch.cat([meta.query_start_loc.cpu(), torch.full((extra_seqs,), real, dtype=torch.int32)]),
        seq_lens=torch.cat([meta.seq_lens.cpu(), torch.zeros(extra_seqs, dtype=torch.int32)]),
        block_tables=tables,
        slot_mapping=slots,
        query_lens_host=meta.query_lens_host + [0] * extra_seqs,
        seq_lens_host=meta.seq_lens_host + [0] * extra_seqs,
        token_tables=token_tables,
        context_lens=context_lens,
    )


def _to(meta: XlaAttentionMetadata, device: torch.device) -> XlaAttentionMetadata:
    tensors = ("query_start_loc", "seq_lens", "block_tables", "slot_mapping", "token_tables", "context_lens")
    moved = {name: getattr(meta, name).to(device) for name in tensors}
    return XlaAttentionMetadata(query_lens_host=meta.query_lens_host, seq_lens_host=meta.seq_lens_host, **moved)


def _pad_ids(values: torch.Tensor, size: int) -> torch.Tensor:
    out = torch.zeros(size, dtype=torch.int64)
    out[: values.shape[0]] = values.cpu()
    return out


class TpuRunner(Runner):
    """Runs each step at padded shapes, all compiled by :meth:`prepare` (the warm-up)."""

    def __init__(self, platform: Any) -> None:
        super().__init__(platform)
        self.token_sizes: list[int] = []
        self.seq_sizes: list[int] = []
        self.table_width = 0
        self._hidden: torch.Tensor | None = None  # the last step's padded hidden states, on the device
        #: graphs compiled per warm-up shape ``(kind, tokens, sequences or rows)``
        self.warm_up_compiles: dict[tuple[str, int, int], int] = {}
        self._compiled: int | None = None  # compile count once warm: any rise after it is logged

    def io_device(self) -> torch.device:
        """Core builds inputs and samples on the host: padding happens there, not in a graph."""
        return torch.device("cpu")

    def grad_mode(self) -> torch.no_grad:
        """``torch.no_grad()``: torch_xla cannot use inference tensors ("Cannot set
        version_counter for inference tensor"), which ``torch.inference_mode()`` makes."""
        return torch.no_grad()

    def prepare(self, model: Any, kv_caches: list[Any], config: EngineConfigView) -> None:
        """Bind the model and caches, choose the padded sizes, compile every shape."""
        import torch_xla

        super().prepare(model, kv_caches, config)
        torch_xla.sync()  # what loading left pending (fused weights, the rope table) becomes device data
        self.table_width = -(-config.max_model_len // config.block_size)
        self.token_sizes = token_paddings(
            config.max_num_batched_tokens, padding_gap=self.platform.env["TPU_BUCKET_PADDING_GAP"]
        )
        self.seq_sizes = seq_paddings(config.max_num_seqs)
        self.warm_up()

    def logits_sizes(self, num_tokens: int) -> list[int]:
        """The padded row counts a step of ``num_tokens`` padded tokens can ask logits for."""
        most = min(num_tokens, self.seq_sizes[-1])
        return sorted({padded_size(n, self.seq_sizes) for n in range(1, most + 1)})

    def warm_up(self) -> None:
        """Run every forward shape and every logits shape once, before serving.

        The forward graph depends on the padded token count (and, with the Pallas
        kernel, which reads per-sequence tensors, on the padded sequence count too);
        the logits graph on the padded token and row counts.
        """
        per_seqs = self.platform.kernels.use_pallas
        shapes = []
        for tokens in self.token_sizes:
            sizes = self.logits_sizes(tokens)
            shapes += [("forward", tokens, seqs) for seqs in (sizes if per_seqs else sizes[:1])]
            shapes += [("logits", tokens, rows) for rows in sizes]
        self.warm_up_compiles, self._compiled = {}, None
        start = time.perf_counter()
        with self.grad_mode():
            for shape in tqdm(shapes, desc="XLA warm-up", unit="graph"):
                kind, tokens, size = shape
                before = compile_count()
                if kind == "forward":
                    self.execute(self._dummy_inputs(tokens, size))
                else:
                    self._logits([0] * size)
                self.warm_up_compiles[shape] = compile_count() - before
        logger.info(
            "XLA warm-up: %d graphs compiled in %.1f s for %d shapes (token sizes %s, sequence/row sizes %s)",
            sum(self.warm_up_compiles.values()),
            time.perf_counter() - start,
            len(shapes),
            self.token_sizes,
            self.seq_sizes,
        )
        self._compiled = compile_count()

    def _note_recompile(self, what: str) -> None:
        """Log a graph compiled after the warm-up (a stall for every request in flight)."""
        if self._compiled is not None and (count := compile_count()) > self._compiled:
            logger.warning("XLA compiled %d graph(s) while serving (%s)", count - self._compiled, what)
            self._compiled = count

    @staticmethod
    def _dummy_inputs(num_tokens: int, num_seqs: int) -> ModelInputs:
        """A batch of ``num_tokens`` tokens over ``min(num_seqs, num_tokens)`` sequences
        whose slots are all -1 (the KV cache is not written)."""
        n = min(num_seqs, num_tokens)
        lens = [1] * (n - 1) + [num_tokens - n + 1]
        meta = AttentionMetadata.build(lens, lens, [[0]] * n, block_size=1 << 30)
        meta.slot_mapping.fill_(-1)
        zeros = torch.zeros(num_tokens, dtype=torch.int64)
        return ModelInputs(zeros, zeros, meta)

    def execute(self, inputs: ModelInputs) -> torch.Tensor:
        """Pad, run the forward graph of the padded token count, return the real tokens' rows."""
        import torch_xla

        if self.model is None:
            raise RuntimeError("TpuRunner.execute() called before prepare()")
        num_tokens = padded_size(inputs.num_tokens, self.token_sizes)
        num_seqs = padded_size(inputs.attn_metadata.num_seqs, self.seq_sizes)
        device = self.platform.torch_device()
        meta = _to(pad_to_host(inputs, num_tokens, num_seqs, self.table_width), device)
        ids = _pad_ids(inputs.input_ids, num_tokens).to(device)
        positions = _pad_ids(inputs.positions, num_tokens).to(device)
        hidden = self.model(ids, positions, self.kv_caches, meta)
        torch_xla.sync()  # the forward graph ends here: KV writes and hidden states materialised
        self._hidden = hidden
        self._note_recompile(f"forward of {num_tokens} tokens")
        return hidden[: inputs.num_tokens]

    def compute_logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """float32 logits ``[len(rows), vocab]`` on the host for rows of the last
        :meth:`execute`'s result ``hidden``: computed from its padded hidden states, at
        padded row counts, so the graph's shape is one the warm-up compiled."""
        return self._logits(rows)

    def _logits(self, rows: list[int]) -> torch.Tensor:
        if self._hidden is None:
            raise RuntimeError("TpuRunner.compute_logits() called before execute()")
        pieces = []
        step = self.seq_sizes[-1]  # prompt logprobs may ask for more rows than sequences: in pieces
        for start in range(0, max(len(rows), 1), step):  # no rows: one padded piece, cut to none
            part = rows[start : start + step]
            size = padded_size(max(len(part), 1), self.seq_sizes)
            index = torch.tensor(part + [0] * (size - len(part)), dtype=torch.int64).to(self._hidden.device)
            pieces.append(self.model.compute_logits(self._hidden.index_select(0, index)).cpu()[: len(part)])
            self._note_recompile(f"logits of {size} rows")
        return torch.cat(pieces)
