"""Quantized checkpoints for tests and benchmarks, made with the ``compressed-tensors`` package.

Round-to-nearest quantization (min-max scales per tensor, channel or group; FP8 static
input scales from the inputs' range on calibration tokens) of a transformers model or a
single weight, compressed and decompressed by compressed-tensors itself, so
the engine's reading of the stored layouts is checked against the format's own code.
The legacy AutoGPTQ/AutoAWQ layouts are written from the same codes (:func:`to_gptq`,
:func:`to_awq`). Needs ``compressed-tensors`` (a test dependency), imported lazily.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from plugins.int_quant import AWQ_ORDER, IntWeight


def scheme(bits: int, symmetric: bool, group_size: int | None, int8_activations: bool = False) -> Any:
    """A compressed-tensors ``QuantizationScheme`` on every ``Linear``: ``bits``-bit integer weights,
    per channel (``group_size`` None) or per group; W8A8 adds dynamic per-token int8 activations."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(
        num_bits=bits,
        type="int",
        symmetric=symmetric,
        strategy="channel" if group_size is None else "group",
        group_size=group_size,
    )
    acts = None
    if int8_activations:
        acts = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
    return QuantizationScheme(targets=["Linear"], weights=weights, input_activations=acts)


def fp8_scheme(per_channel: bool, activations: str | None) -> Any:
    """A compressed-tensors ``QuantizationScheme`` on every ``Linear``: float8 E4M3 weights with a
    scale per tensor or channel; ``activations`` None (W8A16), ``"fp8_per_token"`` (dynamic, as
    llm-compressor's FP8_DYNAMIC) or ``"fp8_static"`` (a calibrated scale per tensor, as its FP8)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(num_bits=8, type="float", strategy="channel" if per_channel else "tensor")
    acts = None
    if activations is not None:
        dynamic = activations == "fp8_per_token"
        acts = QuantizationArgs(num_bits=8, type="float", strategy="token" if dynamic else "tensor", dynamic=dynamic)
    return QuantizationScheme(targets=["Linear"], weights=weights, input_activations=acts)


def quantize_rtn(
    model: torch.nn.Module,
    quant_scheme: Any,
    ignore: tuple[str, ...] = ("lm_head",),
    calibration: torch.Tensor | None = None,
) -> None:
    """Attach ``quant_scheme`` to ``model``'s linears (but ``ignore``) and set min-max scales and zero
    points; static input scales from each linear's input range when the float model runs on the
    ``calibration`` token ids (without them, they stay as compressed-tensors initialised them)."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    input_amax = {} if calibration is None else _input_amax(model, calibration)
    config = QuantizationConfig(config_groups={"group_0": quant_scheme}, ignore=list(ignore))
    apply_quantization_config(model, config)
    args = quant_scheme.weights
    for name, module in model.named_modules():
        if not hasattr(module, "weight_scale"):
            continue
        w = module.weight.data
        if args.strategy == "tensor":
            groups = w.reshape(1, 1, -1)
        else:
            groups = w.reshape(w.shape[0], -1, args.group_size or w.shape[1])
        scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
        if hasattr(module, "input_scale") and name in input_amax:
            amax = input_amax[name].reshape(1)
            scale, _ = calculate_qparams(-amax, amax, quant_scheme.input_activations)
            module.input_scale.data.copy_(scale.reshape(module.input_scale.shape))
        module.quantization_status = QuantizationStatus.FROZEN


def _input_amax(model: torch.nn.Module, token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """``max|input|`` of each ``Linear`` of the float ``model`` over a forward pass on ``token_ids``."""
    amax: dict[str, torch.Tensor] = {}

    def record(name: str, inputs: tuple[torch.Tensor, ...]) -> None:
        amax[name] = torch.maximum(amax.get(name, torch.tensor(0.0)), inputs[0].detach().abs().amax().float())

    hooks = [
        module.register_forward_pre_hook(lambda _, inputs, name=name: record(name, inputs))
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    ]
    try:
        with torch.no_grad():
            model(token_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return amax


def save_compressed(model: torch.nn.Module, directory: str | Path) -> None:
    """Save a :func:`quantize_rtn` model as a compressed-tensors checkpoint (weights compressed in place)."""
    from compressed_tensors.compressors import ModelCompressor

    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(directory)
    compressor.update_config(str(directory))


def save_word_tokenizer(directory: str | Path, vocab_size: int) -> None:
    """A word-level tokenizer over a tiny model's vocabulary (``w0`` ... ``w{vocab_size - 1}``;
    bos ``w1``, eos ``w2``) saved into ``directory``, for loaders and quantizers that want one."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="w1", eos_token="w2", unk_token="w0")
    fast.save_pretrained(directory)


def load_decompressed(directory: str | Path) -> torch.nn.Module:
    """transformers' model of a compressed-tensors checkpoint with its weights decompressed
    (``CompressedTensorsConfig(run_compressed=False)``), as the reference for parity.

    transformers (5.x) then runs plain ``Linear`` layers (and drops static ``input_scale``
    tensors): a W8A8 checkpoint's activations would stay in float. Its quantized linears get
    compressed-tensors' own fake quantization of their input back, from the checkpoint's
    ``input_activations``: per token, or with each linear's stored ``input_scale``.
    """
    import json

    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    config = CompressedTensorsConfig(run_compressed=False)
    model = AutoModelForCausalLM.from_pretrained(directory, quantization_config=config).eval()
    qc = json.loads((Path(directory) / "config.json").read_text())["quantization_config"]
    [group] = qc["config_groups"].values()
    if group.get("input_activations"):
        args = QuantizationArgs(**group["input_activations"])
        stored = (
            {}
            if args.dynamic
            else {k: v for f in Path(directory).glob("*.safetensors") for k, v in load_file(f).items()}
        )

        def quantize_input(scale: torch.Tensor | None, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
            x = inputs[0]
            if scale is None:
                scale, zero = calculate_qparams(x.amin(-1, keepdim=True), x.amax(-1, keepdim=True), args)
            else:
                zero = torch.zeros_like(scale)
            return (fake_quantize(x, scale, zero, args),)

        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] not in qc.get("ignore", []):
                scale = None if args.dynamic else stored[f"{name}.input_scale"]
                module.register_forward_pre_hook(lambda _, inputs, scale=scale: quantize_input(scale, inputs))
    return model


def compress_weight(weight: torch.Tensor, quant_scheme: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``weight [out, in]`` quantized by ``quant_scheme``: the tensors compressed-tensors stores for it,
    and compressed-tensors' decompression of them (float32)."""
    from compressed_tensors.compressors.base import compress_module, decompress_module

    holder = torch.nn.Sequential(torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False))
    holder[0].weight.data.copy_(weight)
    quantize_rtn(holder, quant_scheme, ignore=())
    compress_module(holder[0])
    stored = {name: t.detach().clone() for name, t in holder[0].state_dict().items()}
    decompress_module(holder[0])
    return stored, holder[0].weight.detach().float().clone()


def _pack_int32(fields: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Unsigned ``bits``-wide ``fields`` packed lowest first into int32 along ``dim`` (inverse of
    :func:`plugins.int_quant.unpack_int32`)."""
    per = 32 // bits
    moved = fields.to(torch.int64).movedim(dim, -1)
    grouped = moved.reshape(*moved.shape[:-1], -1, per)
    if order is not None:
        grouped = grouped[..., list(order)]
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    packed = (grouped << shifts).sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.movedim(-1, dim).contiguous()


def to_gptq(weight: IntWeight, group_order: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """AutoGPTQ's tensors (``qweight``, ``qzeros`` as ``zero - 1``, float16 ``scales``, ``g_idx``) of
    ``weight`` (no ``perm``). ``group_order`` (a permutation of the groups) stores group ``g`` as
    group ``group_order[g]``: the same weight under a ``g_idx`` out of order, as act-order writes it."""
    offset = 1 << (weight.bits - 1)
    zeros = torch.zeros_like(weight.scales, dtype=torch.int64) if weight.zeros is None else weight.zeros.long()
    scales = weight.scales
    g_idx = torch.arange(weight.cols) // weight.group_size
    if group_order is not None:
        g_idx = group_order[g_idx]
        inverse = torch.argsort(group_order)
        scales, zeros = scales[:, inverse], zeros[:, inverse]
    return {
        "qweight": _pack_int32((weight.codes.long() + offset).t(), weight.bits, 0),
        "qzeros": _pack_int32((zeros + offset - 1).t(), weight.bits, 1),
        "scales": scales.t().to(torch.float16).contiguous(),
        "g_idx": g_idx.to(torch.int32),
    }


def to_awq(weight: IntWeight) -> dict[str, torch.Tensor]:
    """AutoAWQ's GEMM tensors (``qweight``, ``qzeros``, float16 ``scales``) of a 4-bit ``weight``."""
    zeros = torch.zeros_like(weight.scales, dtype=torch.int64) if weight.zeros is None else weight.zeros.long()
    return {
        "qweight": _pack_int32((weight.codes.long() + 8).t(), 4, 1, AWQ_ORDER),
        "qzeros": _pack_int32((zeros + 8).t(), 4, 1, AWQ_ORDER),
        "scales": weight.scales.t().to(torch.float16).contiguous(),
    }
