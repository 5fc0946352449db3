"""What PyTorch's MPS backend allows, as pure functions of the facts (no Mac needed).

Watermarks (PyTorch's "MPS Environment Variables" page and ``MPSAllocator``): the
allocator caps its total allocations at ``PYTORCH_MPS_HIGH_WATERMARK_RATIO`` times
Metal's ``recommendedMaxWorkingSetSize`` (``torch.mps.recommended_max_memory()``), a
hard limit (default 1.7; at most 2.0; 0 = no limit). Above
``PYTORCH_MPS_LOW_WATERMARK_RATIO`` times the same size (default 1.4 on unified
memory, 1.0 on a discrete GPU; between 0 and the high ratio; 0 = off) it collects
garbage and commits command buffers more often, which is slow. Both are read once,
when MPS first allocates, and a bad value fails there: they are checked here first.

Dtypes: MPS has no float64 ("the MPS framework doesn't support float64"), and
bfloat16 needs macOS 14 or newer ("MPS BFloat16 is only supported on MacOS 14 or newer").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

HIGH_WATERMARK_DEFAULT = 1.7
HIGH_WATERMARK_UPPER_BOUND = 2.0
LOW_WATERMARK_DEFAULT_UNIFIED = 1.4
LOW_WATERMARK_DEFAULT_DISCRETE = 1.0
HIGH_VAR, LOW_VAR = "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_MPS_LOW_WATERMARK_RATIO"

MIN_MACOS = (12, 3)  # first macOS with the MPS backend
BF16_MACOS = (14, 0)
#: compute dtypes MPS runs, best first, with the macOS they need
DTYPE_MIN_MACOS = {"float16": MIN_MACOS, "float32": MIN_MACOS, "bfloat16": BF16_MACOS}


def show_version(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version)) or "unknown"


def dtype_unsupported_reason(dtype: str, mac_version: tuple[int, ...]) -> str | None:
    """Why MPS cannot compute in ``dtype`` on this macOS, or None when it can."""
    if dtype == "float64":
        return "MPS has no float64 (the MPS framework does not support it); use float32"
    needed = DTYPE_MIN_MACOS.get(dtype)
    if needed is None:
        return f"MPS does not run dtype {dtype!r}; choose one of {', '.join(DTYPE_MIN_MACOS)}"
    if mac_version < needed:
        return f"{dtype} on MPS needs macOS {show_version(needed)} or later, this is macOS {show_version(mac_version)}"
    return None


def supported_dtypes(mac_version: tuple[int, ...]) -> tuple[str, ...]:
    """The dtypes MPS runs on this macOS, best first (float16 is the ``auto`` dtype)."""
    return tuple(d for d in DTYPE_MIN_MACOS if dtype_unsupported_reason(d, mac_version) is None)


@dataclass(frozen=True)
class Watermarks:
    """The allocator's two ratios of ``recommendedMaxWorkingSetSize`` (0 = no limit)."""

    high: float
    low: float

    def limit(self, ratio: float, recommended: int) -> int | None:
        """Bytes a ratio allows, None when it is 0 (unlimited)."""
        return None if ratio == 0 else int(ratio * recommended)

    def cap(self, recommended: int) -> tuple[int, str]:
        """``(bytes, why)`` all MPS allocations should stay under: the recommended working
        set, lowered by either watermark that is below it (past the low one the allocator
        slows down, past the high one it fails)."""
        cap, why = recommended, "recommended working set"
        for name, ratio in (("high", self.high), ("low", self.low)):
            limit = self.limit(ratio, recommended)
            if limit is not None and limit < cap:
                cap, why = limit, f"{name} watermark {ratio} x recommended working set"
        return cap, why


def watermark_ratio(text: str) -> float:
    """Parse a watermark ratio as PyTorch accepts it: 0 (no limit) up to 2."""
    value = float(text)
    if not 0 <= value <= HIGH_WATERMARK_UPPER_BOUND:
        raise ValueError(f"expected a number between 0 (no limit) and {HIGH_WATERMARK_UPPER_BOUND}, got {value}")
    return value


def _ratio(environ: Mapping[str, str], name: str) -> float:
    try:
        return watermark_ratio(environ[name])
    except ValueError as exc:
        raise ValueError(f"{name}={environ[name]!r}: {exc}") from None


def resolve_watermarks(environ: Mapping[str, str], unified_memory: bool = True) -> Watermarks:
    """The watermarks PyTorch will use given ``environ``: its rules, checked before it reads them.

    :raises ValueError: a ratio out of range, or a low watermark above the high one
        (the bound is 2.0 when the high one is 0, i.e. unlimited).
    """
    high = HIGH_WATERMARK_DEFAULT
    if HIGH_VAR in environ:
        high = _ratio(environ, HIGH_VAR)
    bound = high or HIGH_WATERMARK_UPPER_BOUND
    low = LOW_WATERMARK_DEFAULT_UNIFIED if unified_memory else LOW_WATERMARK_DEFAULT_DISCRETE
    if LOW_VAR in environ:
        low = _ratio(environ, LOW_VAR)
    if low > bound:  # PyTorch checks the default low ratio too: a high one below 1.4 alone fails
        shown = environ.get(LOW_VAR, f"{low} (its default)")
        raise ValueError(f"{LOW_VAR}={shown} must not exceed {HIGH_VAR}={high}: set {LOW_VAR} to {high} or less")
    return Watermarks(high=high, low=low)


def unified_kv_budget(
    recommended: int, allocated: int, peak_activation_bytes: int, utilization: float, watermarks: Watermarks
) -> tuple[int, str]:
    """``(KV-cache bytes, how)``: ``utilization`` of the cap under the watermarks (see
    :meth:`Watermarks.cap`) minus what MPS holds already (the weights) and the profile
    pass's peak activations; never negative.

    :param recommended: ``torch.mps.recommended_max_memory()``.
    :param allocated: ``torch.mps.driver_allocated_memory()`` after loading the weights.
    """
    cap, why = watermarks.cap(recommended)
    budget = max(0, int(cap * utilization) - allocated - peak_activation_bytes)
    gib = 1 << 30
    return budget, (
        f"{utilization:.0%} of {cap / gib:.1f} GiB ({why}) minus {(allocated + peak_activation_bytes) / gib:.2f} GiB in use"
    )
