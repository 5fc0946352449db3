"""Quantized Hugging Face checkpoints: their ``quantization_config`` checked, their linears gathered.

``config.json``'s ``quantization_config`` names the format (as vLLM reads it):
compressed-tensors (llm-compressor's ``int-quantized`` W8A8, ``pack-quantized`` W4A16/W8A16
and ``float-quantized`` FP8 W8A8/W8A16), AutoGPTQ (``gptq``) or AutoAWQ (``awq``, GEMM
packing). Every scheme this
engine runs is checked here before a weight is read; anything else is refused by name.
The tensors of each quantized linear are gathered into one :class:`plugins.int_quant.IntWeight`
under the linear's ``.weight`` name, kept as stored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from plugins.errors import UnsupportedFeature
from plugins.int_quant import FP8, INT_FORMATS, IntWeight, from_awq, from_compressed, from_gptq

#: the tensors of one quantized linear, by suffix
_PART = re.compile(
    r"(.+)\.(weight_packed|weight_scale|weight_zero_point|weight_shape|weight_g_idx|input_scale"
    r"|qweight|qzeros|scales|g_idx)"
)
#: the dtypes of a quantized linear stored as ``.weight`` (int-quantized, float-quantized)
_STORED_WEIGHT_DTYPES = (torch.int8, FP8)
_W8A8_ACTIVATIONS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
_FP8_WEIGHTS = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
#: llm-compressor's FP8_DYNAMIC and FP8 schemes' input activations, by ``IntWeight.activations``
_FP8_ACTIVATIONS = {
    "fp8_per_token": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True},
    "fp8_static": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False},
}


@dataclass(frozen=True)
class CheckpointQuantization:
    """A checkpoint's linear quantization, validated: ``method`` one of :data:`INT_FORMATS`."""

    method: str
    bits: int
    group_size: int | None  # None: one group per row (channel strategy)
    packed: bool  # compressed-tensors pack-quantized (else int-quantized); GPTQ/AWQ: True
    activations: str | None  # one of plugins.int_quant.ACTIVATIONS: "int8_per_token" for W8A8
    fp8: bool = False  # float8 E4M3 weights (float-quantized), a scale per tensor or channel

    def describe(self) -> str:
        """E.g. ``compressed-tensors W4A16 group 32``, ``compressed-tensors FP8 W8A8 fp8_static``."""
        acts = "A8" if self.activations else "A16"
        if self.fp8:
            return f"{self.method} FP8 W8{acts}{f' {self.activations}' if self.activations else ''}"
        grouping = "channel" if self.group_size is None else f"group {self.group_size}"
        return f"{self.method} W{self.bits}{acts} {grouping}"


def checkpoint_quantization(config: Any, requested: str | None) -> CheckpointQuantization | None:
    """The validated quantization of a checkpoint whose transformers config is ``config``.

    :param requested: ``--quantization``: None (take the checkpoint's), or a method that
        must match it.
    :raises UnsupportedFeature: for a format or scheme this engine does not run (named).
    :raises ValueError: when ``requested`` contradicts the checkpoint.
    """
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        if requested in INT_FORMATS:
            raise ValueError(f"quantization {requested!r} requested, but the checkpoint has no quantization_config")
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    method = qc.get("quant_method")
    if requested is not None and requested != method:
        raise ValueError(f"quantization {requested!r} requested, but the checkpoint is quantized with {method!r}")
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "gptq":
        return _gptq(qc)
    if method == "awq":
        return _awq(qc)
    raise UnsupportedFeature(
        f"checkpoint quantization method {method!r} is not supported; supported: {', '.join(sorted(INT_FORMATS))}"
    )


def _compressed_tensors(qc: dict[str, Any]) -> CheckpointQuantization:
    for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if qc.get(key):
            raise UnsupportedFeature(f"compressed-tensors {key} is not supported: {qc[key]}")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise UnsupportedFeature(f"compressed-tensors: exactly one config group is supported, got {sorted(groups)}")
    group = next(iter(groups.values()))
    fmt = group.get("format") or qc.get("format")
    weights, inputs = group.get("weights") or {}, group.get("input_activations")
    if group.get("output_activations"):
        raise UnsupportedFeature("compressed-tensors output activation quantization is not supported")
    if fmt in ("float-quantized", "naive-quantized") and weights.get("type") == "float":
        return _compressed_fp8(weights, inputs)
    if fmt not in ("int-quantized", "pack-quantized"):
        raise UnsupportedFeature(
            f"compressed-tensors format {fmt!r} with {weights.get('type')} weights is not supported; supported: "
            "int-quantized, pack-quantized, float-quantized or naive-quantized with float (FP8) weights"
        )
    bits, strategy = weights.get("num_bits"), weights.get("strategy")
    if weights.get("type") != "int" or bits not in (4, 8) or weights.get("dynamic"):
        raise UnsupportedFeature(f"compressed-tensors weights {weights} are not supported; supported: static int4/int8")
    if strategy not in ("channel", "group") or weights.get("actorder") not in (None, "group", "weight", "static"):
        raise UnsupportedFeature(f"compressed-tensors weight strategy {strategy!r} is not supported: channel, group")
    if fmt == "int-quantized" and bits != 8:
        raise UnsupportedFeature(f"compressed-tensors int-quantized with {bits}-bit weights is not supported")
    if inputs is not None:
        found = {k: inputs.get(k) for k in _W8A8_ACTIVATIONS}
        if found != _W8A8_ACTIVATIONS or bits != 8:
            raise UnsupportedFeature(
                f"compressed-tensors input activations {found} with {bits}-bit weights are not supported; "
                f"supported: none, or {_W8A8_ACTIVATIONS} with 8-bit weights"
            )
    group_size = weights.get("group_size") if strategy == "group" else None
    activations = "int8_per_token" if inputs is not None else None
    return CheckpointQuantization("compressed-tensors", bits, group_size, fmt == "pack-quantized", activations)


def _compressed_fp8(weights: dict[str, Any], inputs: dict[str, Any] | None) -> CheckpointQuantization:
    strategy = weights.get("strategy")
    if strategy == "block":
        raise UnsupportedFeature(
            f"compressed-tensors FP8 block-wise weight scales (strategy 'block', block_structure "
            f"{weights.get('block_structure')}) are not supported; supported: a scale per tensor or channel"
        )
    if {k: weights.get(k) for k in _FP8_WEIGHTS} != _FP8_WEIGHTS or strategy not in ("tensor", "channel"):
        raise UnsupportedFeature(
            f"compressed-tensors float weights {weights} are not supported; supported: {_FP8_WEIGHTS} "
            "with strategy tensor or channel"
        )
    activations = None
    if inputs is not None:
        found = [name for name, args in _FP8_ACTIVATIONS.items() if {k: inputs.get(k) for k in args} == args]
        if not found:
            raise UnsupportedFeature(
                f"compressed-tensors FP8 input activations {inputs} are not supported; supported: none, "
                f"dynamic per token {_FP8_ACTIVATIONS['fp8_per_token']} or static per tensor "
                f"{_FP8_ACTIVATIONS['fp8_static']}"
            )
        activations = found[0]
    return CheckpointQuantization("compressed-tensors", 8, None, False, activations, fp8=True)


def _gptq(qc: dict[str, Any]) -> CheckpointQuantization:
    bits = qc.get("bits")
    if bits not in (4, 8):
        raise UnsupportedFeature(f"GPTQ with {bits}-bit weights is not supported; supported: 4, 8")
    checkpoint_format = qc.get("checkpoint_format", "gptq")
    if checkpoint_format != "gptq":
        raise UnsupportedFeature(f"GPTQ checkpoint_format {checkpoint_format!r} is not supported; supported: gptq")
    group_size = qc.get("group_size", -1)
    return CheckpointQuantization("gptq", bits, None if group_size == -1 else group_size, True, None)


def _awq(qc: dict[str, Any]) -> CheckpointQuantization:
    version, bits = str(qc.get("version", "gemm")).lower(), qc.get("bits", qc.get("w_bit"))
    if version != "gemm" or bits != 4 or not qc.get("zero_point", True):
        raise UnsupportedFeature(
            f"AWQ version {version!r} with {bits}-bit weights (zero_point={qc.get('zero_point')}) is not supported; "
            "supported: gemm, 4-bit, zero points"
        )
    return CheckpointQuantization("awq", 4, qc.get("group_size", qc.get("q_group_size")), True, None)


def is_quantized_part(name: str, tensor_dtype: torch.dtype) -> bool:
    """Whether a checkpoint tensor belongs to a quantized linear (to be read as stored)."""
    return _quantized_part(name, tensor_dtype) is not None


def _quantized_part(name: str, tensor_dtype: torch.dtype) -> tuple[str, str] | None:
    """``(linear prefix, part)`` of a quantized linear's tensor, or None for a dense one."""
    if name.endswith(".weight") and tensor_dtype in _STORED_WEIGHT_DTYPES:
        return name[: -len(".weight")], "weight"
    match = _PART.fullmatch(name)
    return None if match is None else (match[1], match[2])


def gather_quantized(
    weights: Iterable[tuple[str, torch.Tensor]], scheme: CheckpointQuantization, device: torch.device
) -> Iterator[tuple[str, torch.Tensor | IntWeight]]:
    """Pass dense tensors through; yield each quantized linear once, as ``(prefix.weight, IntWeight)``,
    after every tensor has been read (its parts may lie in different shards)."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        part = _quantized_part(name, tensor.dtype)
        if part is None:
            yield name, tensor
        else:
            parts.setdefault(part[0], {})[part[1]] = tensor
    for prefix, found in parts.items():
        try:
            weight = _int_weight(found, scheme)
        except KeyError as missing:
            raise ValueError(f"quantized linear {prefix!r} lacks its {missing.args[0]!r} tensor") from None
        if (weight.codes.dtype == FP8) != scheme.fp8:
            raise ValueError(
                f"quantized linear {prefix!r} stores {weight.codes.dtype} codes, not those of {scheme.describe()}"
            )
        yield f"{prefix}.weight", weight.to(device)


def _int_weight(found: dict[str, torch.Tensor], scheme: CheckpointQuantization) -> IntWeight:
    if scheme.method == "gptq":
        g = -1 if scheme.group_size is None else scheme.group_size
        return from_gptq(found["qweight"], found["qzeros"], found["scales"], found.get("g_idx"), scheme.bits, g)
    if scheme.method == "awq":
        return from_awq(found["qweight"], found["qzeros"], found["scales"], scheme.group_size)
    return from_compressed(found, scheme.bits, scheme.group_size, scheme.packed, scheme.activations)
