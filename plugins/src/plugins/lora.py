"""LoRA over a mixed batch: which rows use which adapter, and the torch reference of the products.

Core keeps each adapted linear's adapters stacked in ``S`` slots: ``lora_a [S, R, in]`` and
``lora_b [S, out, R]`` (``R`` the largest rank, smaller ranks zero-padded; the adapter's scale
folded into ``B``). A step's rows each use one slot or none (a base-model row); the delta of
row ``t`` is ``B[s] @ (A[s] @ x[t])`` with ``s = slot of t``. It is computed in two products
(punica's *shrink* and *expand*), so a fused projection (q/k/v, gate/up) shrinks once over
its slices' stacked ``A`` and expands each slice into its own output columns.
``Kernels.lora_shrink`` / ``Kernels.lora_expand`` default to :func:`shrink` / :func:`expand`.
A runner that runs the model natively reads a linear's slots from its description
(:class:`LoRAWeights`, ``plugins.model.LinearWeights.lora``) and the step's rows from
``ModelInputs.lora``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoRAWeights:
    """One adapted linear's slots, as a native runner reads them (the tensors core updates in place
    when an adapter takes a slot, so pointers to them stay valid).

    :ivar a: ``[S, len(b) * rank, in]``: part ``i``'s ``A`` in rows ``i * rank`` to ``(i + 1) * rank``.
    :ivar b: part ``i``'s ``B`` ``[S, N_i, rank]`` (scale folded in); the parts are the linear's
        outputs in order (q, k, v of a fused qkv; gate, up; one part otherwise).
    :ivar rank: ``R``, the largest rank an adapter may have (smaller ones zero-padded).
    """

    a: torch.Tensor
    b: tuple[torch.Tensor, ...]
    rank: int


@dataclass(frozen=True)
class LoRAMapping:
    """Which adapter slot each row of one step's batch uses (built once a step).

    :ivar row_slots: int64 ``[T]`` on the device: row ``t``'s slot, ``-1`` for a base-model row.
    :ivar groups: ``(slot, rows)`` for each slot the step uses, ``rows`` the int64 indices of its
        rows on the device, sorted; base rows are in no group.
    :ivar num_rows: ``T``. A runner may pad the batch: rows at ``T`` and beyond are base rows.
    """

    row_slots: torch.Tensor
    groups: tuple[tuple[int, torch.Tensor], ...]
    num_rows: int

    @classmethod
    def build(cls, row_slots: list[int], device: torch.device | str = "cpu") -> LoRAMapping:
        """The mapping of ``row_slots`` (each row's slot, ``-1`` for none)."""
        slots = torch.tensor(row_slots, dtype=torch.long)
        groups = tuple(
            (slot, torch.nonzero(slots == slot).flatten().to(device)) for slot in sorted(set(row_slots) - {-1})
        )
        return cls(slots.to(device), groups, len(row_slots))


def shrink(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
    """``h[t] = lora_a[slot(t)] @ x[t]``: float32 ``[T', R]`` for ``x [T', in]`` (zeros on base rows).

    One matmul per slot used, over that slot's rows.
    """
    out = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device)
    for slot, rows in mapping.groups:
        out.index_copy_(0, rows, x.index_select(0, rows).float() @ lora_a[slot].float().T)
    return out


def expand(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, mapping: LoRAMapping, offset: int = 0) -> None:
    """``y[t, offset : offset + N] += lora_b[slot(t)] @ h[t]`` in place, for ``lora_b [S, N, R]``
    and ``h [T', R]``; base rows are untouched. The sum is float32, stored in ``y``'s dtype."""
    width = lora_b.shape[1]
    for slot, rows in mapping.groups:
        part = y[:, offset : offset + width]
        delta = h.index_select(0, rows) @ lora_b[slot].float().T
        part.index_copy_(0, rows, (part.index_select(0, rows).float() + delta).to(y.dtype))
