"""Padded sizes for backends that compile or capture one graph per input shape.

Gaudi buckets, Neuron length buckets, XLA paddings and CUDA-graph batch sizes are all
the same ladder: start at ``min``, double while below ``step`` (the *ramp-up*: little
padding for small batches), then every multiple of ``step``. vLLM's Gaudi guide::

    min=2, step=32, max=64     ->  ramp_up (2, 4, 8, 16) + stable (32, 64)
    min=128, step=128, max=512 ->  ramp_up () + stable (128, 256, 384, 512)

``step=None`` doubles forever (powers of two). A backend picks how the list ends:
``"within"`` keeps the rungs <= ``max`` (Gaudi), ``"max"`` adds ``max`` itself so
every size up to it has a bucket (Neuron, TPU sequences, CUDA graphs), ``"cover"``
adds the next rung instead (TPU tokens). A batch is then padded to the smallest
bucket >= its size (:func:`smallest_at_least`, :func:`pad_size`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

ENDS = ("within", "max", "cover")


def rungs(minimum: int, step: int | None) -> Iterator[int]:
    """The endless ladder: ``minimum`` doubling while below ``step``, then the
    multiples of ``step`` that are >= ``minimum``; only doubling when ``step`` is None."""
    if minimum < 1 or (step is not None and step < 1):
        raise ValueError(f"bucket min and step must be positive integers, got min={minimum} step={step}")
    value = minimum
    while step is None or value < step:
        yield value
        value *= 2
    first = max(step, -(-minimum // step) * step)
    yield from range(first, 1 << 62, step)


def ramp_up_range(minimum: int, step: int | None, maximum: int, end: str = "within") -> list[int]:
    """The ladder's sizes up to ``maximum``, ending as ``end`` says (see the module doc).

    :raises ValueError: on a non-positive bound or an unknown ``end``.
    """
    if end not in ENDS:
        raise ValueError(f"unknown end {end!r}; choose one of {', '.join(ENDS)}")
    if maximum < 1:
        raise ValueError(f"bucket max must be a positive integer, got {maximum}")
    sizes = []
    for size in rungs(minimum, step):
        if size > maximum:
            if end == "cover" and (not sizes or sizes[-1] < maximum):
                sizes.append(size)
            break
        sizes.append(size)
    if end == "max" and (not sizes or sizes[-1] < maximum):
        sizes.append(maximum)
    return sizes


def smallest_at_least(value: int, sizes: Sequence[int]) -> int | None:
    """The smallest of the ascending ``sizes`` that is >= ``value``, or None above them all."""
    index = bisect.bisect_left(sizes, value)
    return sizes[index] if index < len(sizes) else None


def pad_size(value: int, sizes: Sequence[int], what: str = "bucket") -> int:
    """Like :func:`smallest_at_least`, but a value over every size is an error.

    :raises ValueError: ``"<value> exceeds the largest <what> <size>"``.
    """
    size = smallest_at_least(value, sizes)
    if size is None:
        raise ValueError(f"{value} exceeds the largest {what} {sizes[-1]}")
    return size
