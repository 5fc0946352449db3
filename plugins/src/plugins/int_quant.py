"""Integer- and FP8-quantized linear weights of Hugging Face checkpoints, and their torch reference.

The loader reads the layouts quantized checkpoints ship in (compressed-tensors'
``int-quantized``, ``pack-quantized`` and ``float-quantized`` (FP8), AutoGPTQ's and AutoAWQ's
``qweight``/``qzeros``/``scales``) into one form, :class:`IntWeight`: signed integer (or
float8 E4M3) codes with a scale (and a zero point) per output row and group of input
columns, as stored (no float weights). :meth:`IntWeight.reference_linear` (with
:func:`quantize_activations_per_token` and :func:`quantize_activations_fp8`) is the reference
every backend can run; backends with native kernels repack the integer codes instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: checkpoint formats whose linear weights arrive as :class:`IntWeight` (``quantization`` names)
INT_FORMATS = frozenset({"compressed-tensors", "gptq", "awq"})
#: AutoAWQ's GEMM packing: nibble ``i`` of an int32 holds column ``AWQ_ORDER[i]`` of its 8
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
#: the float8 format of FP8 checkpoints' weights and activations, and its largest finite value
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
#: ``IntWeight.activations``: the input's quantization before the product (None: float)
ACTIVATIONS = (None, "int8_per_token", "fp8_per_token", "fp8_static")


@dataclass(frozen=True)
class IntWeight:
    """A ``[rows, cols]`` linear weight ``w[n, k] = scales[n, g] * (codes[n, k] - zeros[n, g])``,
    ``g = k // group_size``.

    ``codes``: int8 ``[rows, cols]`` in ``[-2**(bits-1), 2**(bits-1))``, or :data:`FP8`
    (``bits`` 8, no zero points, one group per row); ``scales``: float32
    ``[rows, cols // group_size]``; ``zeros``: int8 like ``scales``, or None (symmetric).
    ``perm`` (act-order GPTQ): int64 ``[cols]``, column ``k`` of ``codes`` multiplies input
    feature ``perm[k]`` (the input is gathered by it first); None for the identity.
    ``activations`` (one of :data:`ACTIVATIONS`): None (float activations), ``"int8_per_token"``
    (W8A8: each input row rounded to int8 with its own dynamic symmetric scale before the
    product), ``"fp8_per_token"`` (FP8 W8A8 dynamic: the same to E4M3, scale ``max|row| / 448``)
    or ``"fp8_static"`` (each input rounded to E4M3 with the calibrated ``input_scale``, a
    float32 scalar tensor, None otherwise).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    bits: int
    group_size: int
    perm: torch.Tensor | None = None
    activations: str | None = None
    input_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rows, cols = self.codes.shape
        fp8_codes, fp8_acts = self.codes.dtype == FP8, self.activations in ("fp8_per_token", "fp8_static")
        if self.activations not in ACTIVATIONS or fp8_acts != fp8_codes and self.activations is not None:
            raise ValueError(f"activations {self.activations!r} with {self.codes.dtype} codes; valid: {ACTIVATIONS}")
        if (self.input_scale is not None) != (self.activations == "fp8_static"):
            raise ValueError(
                f"an input_scale goes with (and only with) 'fp8_static' activations, not {self.activations!r}"
            )
        if fp8_codes and (self.zeros is not None or self.group_size != cols or self.perm is not None):
            raise ValueError("FP8 codes take one scale per row: no zero points, groups or act-order")
        if cols % self.group_size or self.scales.shape != (rows, cols // self.group_size):
            raise ValueError(
                f"quantized weight [{rows}, {cols}] with group size {self.group_size} needs scales "
                f"[{rows}, {cols // self.group_size}], got {list(self.scales.shape)}"
            )
        if self.zeros is not None and self.zeros.shape != self.scales.shape:
            raise ValueError(f"zero points {list(self.zeros.shape)} do not match scales {list(self.scales.shape)}")

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    @property
    def cols(self) -> int:
        return self.codes.shape[1]

    def to(self, device: torch.device) -> IntWeight:
        """The same weight with its tensors on ``device``."""
        moved = {f: getattr(self, f) for f in ("codes", "scales", "zeros", "perm", "input_scale")}
        moved = {f: None if t is None else t.to(device) for f, t in moved.items()}
        return IntWeight(**moved, bits=self.bits, group_size=self.group_size, activations=self.activations)

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[rows, cols]`` weight, columns in input-feature order."""
        q = self.codes.float()
        if self.zeros is not None:
            q = q - self.zeros.float().repeat_interleave(self.group_size, dim=1)
        w = q * self.scales.float().repeat_interleave(self.group_size, dim=1)
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm] = w
        return out

    def reference_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ w.T + bias`` in float32 (activations rounded first for W8A8), in ``x``'s dtype."""
        xf = round_activations(x.float(), self.activations, self.input_scale)
        out = torch.nn.functional.linear(xf, self.dequantize(), None if bias is None else bias.float())
        return out.to(x.dtype)


def round_activations(x: torch.Tensor, activations: str | None, input_scale: torch.Tensor | None) -> torch.Tensor:
    """Float32 activations ``x`` rounded as a checkpoint's scheme says (:attr:`IntWeight.activations`:
    int8 per token, FP8 per token or with the static ``input_scale``), returned dequantized; as
    they are for weight-only schemes."""
    if activations == "int8_per_token":
        return quantize_activations_per_token(x)
    if activations is not None:
        return quantize_activations_fp8(x, input_scale)
    return x


def quantize_activations_per_token(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to int8 per row, returned dequantized: compressed-tensors' dynamic per-token
    symmetric scheme (scale ``max|row| / 127.5``, codes clamped to [-128, 127])."""
    scale = _row_scales(x, 127.5)
    return torch.round(x / scale).clamp_(-128, 127) * scale


def quantize_activations_fp8(x: torch.Tensor, input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (float32) rounded to float8 E4M3, returned dequantized, as compressed-tensors does it:
    scaled by ``input_scale`` (static) or per row by ``max|row| / 448`` (dynamic), saturated to
    +-448, rounded to nearest even by the cast. (vLLM's kernels also floor the dynamic scale at
    ``1 / (448 * 512)``: rows under ``1/512`` in magnitude are rounded more coarsely there.)"""
    scale = _row_scales(x, FP8_MAX) if input_scale is None else input_scale.float()
    return (x / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8).float() * scale


def _row_scales(x: torch.Tensor, top: float) -> torch.Tensor:
    """Symmetric per-row scales ``max|row| / top`` (never zero)."""
    return (x.abs().amax(dim=-1, keepdim=True) / top).clamp_min(torch.finfo(torch.float32).tiny)


def concat_int_weights(parts: list[IntWeight]) -> IntWeight:
    """Fuse ``parts`` along their rows (q/k/v, gate/up) when they share their quantization.

    Static FP8 input scales (the parts read the same input, so calibration gives them one
    scale) are fused to their largest, as vLLM does."""
    first = parts[0]
    same = all(
        p.bits == first.bits and p.group_size == first.group_size and p.activations == first.activations
        and p.codes.dtype == first.codes.dtype
        and (p.zeros is None) == (first.zeros is None) and p.cols == first.cols
        and ((p.perm is None and first.perm is None) or (p.perm is not None and first.perm is not None
                                                         and torch.equal(p.perm, first.perm)))
        for p in parts
    )  # fmt: skip
    if not same:
        kinds = [f"{p.bits}-bit group {p.group_size}{' act-order' if p.perm is not None else ''}" for p in parts]
        raise ValueError(f"cannot fuse quantized weights of different schemes into one linear: {kinds}")
    return IntWeight(
        codes=torch.cat([p.codes for p in parts]),
        scales=torch.cat([p.scales for p in parts]),
        zeros=None if first.zeros is None else torch.cat([p.zeros for p in parts]),
        bits=first.bits,
        group_size=first.group_size,
        perm=first.perm,
        activations=first.activations,
        input_scale=None if first.input_scale is None else torch.stack([p.input_scale for p in parts]).amax(),
    )


def unpack_int32(packed: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """The unsigned ``bits``-wide fields of int32 ``packed``, lowest first, laid out along ``dim``
    (``order[i]``: the position among its ``32 // bits`` of field ``i``, AWQ's interleave)."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    fields = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., per]
    if order is not None:
        fields = fields[..., torch.argsort(torch.tensor(order))]
    fields = fields.movedim(-1, dim + 1 if dim >= 0 else dim)
    shape = list(packed.shape)
    shape[dim] *= per
    return fields.reshape(shape).to(torch.int16)


def act_order(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """The input permutation that makes a GPTQ ``g_idx`` (group of each input feature) contiguous
    groups of ``group_size``: None when it already is; ValueError for any other grouping."""
    g_idx = g_idx.long()
    natural = torch.arange(g_idx.numel()) // group_size
    if torch.equal(g_idx, natural):
        return None
    perm = torch.argsort(g_idx, stable=True)
    if not torch.equal(g_idx[perm], natural):
        raise ValueError(f"g_idx does not assign {group_size} input features to each group")
    return perm


def from_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    bits: int,
    group_size: int,
) -> IntWeight:
    """AutoGPTQ's layout: ``qweight`` int32 ``[K*bits/32, N]`` (packed along the input),
    ``qzeros`` int32 ``[G, N*bits/32]`` holding ``zero - 1``, ``scales`` ``[G, N]``, ``g_idx`` ``[K]``."""
    offset = 1 << (bits - 1)
    codes = unpack_int32(qweight, bits, 0).t() - offset
    zeros = (unpack_int32(qzeros, bits, 1) + 1 - offset).t()
    cols = codes.shape[1]
    group_size = cols if group_size == -1 else group_size
    perm = None if g_idx is None else act_order(g_idx, group_size)
    if perm is not None:
        codes = codes[:, perm]
    return _int_weight(codes, scales.t(), zeros, bits, group_size, perm)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> IntWeight:
    """AutoAWQ's GEMM layout: ``qweight`` int32 ``[K, N/8]`` and ``qzeros`` ``[G, N/8]`` packed along
    the output in :data:`AWQ_ORDER`, ``scales`` ``[G, N]``; 4-bit, ``w = scale * (q - zero)``."""
    codes = unpack_int32(qweight, 4, 1, AWQ_ORDER).t() - 8
    zeros = unpack_int32(qzeros, 4, 1, AWQ_ORDER).t() - 8
    return _int_weight(codes, scales.t(), zeros, 4, group_size, None)


def from_compressed(
    tensors: dict[str, torch.Tensor], bits: int, group_size: int | None, packed: bool, activations: str | None
) -> IntWeight:
    """compressed-tensors' ``int-quantized`` (``weight`` int8), ``float-quantized`` (``weight``
    :data:`FP8`, ``weight_scale`` per tensor or row, ``input_scale`` for ``"fp8_static"``) or
    ``pack-quantized`` (``weight_packed`` int32 ``[N, K*bits/32]`` offset by ``2**(bits-1)``,
    ``weight_zero_point`` packed along the output) tensors of one linear: ``weight_scale``
    ``[N, G]``, ``weight_g_idx`` for act-order."""
    scales = tensors["weight_scale"]
    if packed:
        rows, cols = (int(v) for v in tensors["weight_shape"])
        codes = unpack_int32(tensors["weight_packed"], bits, 1)[:, :cols] - (1 << (bits - 1))
        zeros = tensors.get("weight_zero_point")
        if zeros is not None and zeros.dtype == torch.int32 and zeros.shape[0] != rows:
            zeros = unpack_int32(zeros, bits, 0)[:rows] - (1 << (bits - 1))
    else:
        codes, zeros = tensors["weight"], tensors.get("weight_zero_point")
    rows, cols = codes.shape
    group_size = cols if group_size is None else group_size
    g_idx = tensors.get("weight_g_idx")
    perm = None if g_idx is None else act_order(g_idx, group_size)
    if perm is not None:
        codes = codes[:, perm]
    if scales.numel() == 1:  # one scale for the whole tensor (FP8): each row's
        scales = scales.reshape(1, 1).expand(rows, 1)
    input_scale = tensors["input_scale"].float().reshape(()) if activations == "fp8_static" else None
    return _int_weight(codes, scales.reshape(rows, -1), zeros, bits, group_size, perm, activations, input_scale)


def _int_weight(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    bits: int,
    group_size: int,
    perm: torch.Tensor | None,
    activations: str | None = None,
    input_scale: torch.Tensor | None = None,
) -> IntWeight:
    """An :class:`IntWeight` with contiguous int8 (or FP8)/float32 tensors; all-zero zero points dropped."""
    if zeros is not None:
        zeros = zeros.reshape(scales.shape)
        zeros = None if not zeros.any() else zeros.to(torch.int8).contiguous()
    return IntWeight(
        (codes if codes.dtype == FP8 else codes.to(torch.int8)).contiguous(),
        scales.float().contiguous(),
        zeros,
        bits,
        group_size,
        perm,
        activations,
        input_scale,
    )
