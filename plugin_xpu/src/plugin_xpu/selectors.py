"""Which Intel GPUs an XPU process sees, from Intel's selector variables (pure functions).

Two layers filter the GPUs before torch starts the runtime:

- ``ONEAPI_DEVICE_SELECTOR`` (the SYCL runtime): ``;``-separated terms
  ``[!]backend:devices``, backend ``level_zero``, ``opencl``, ``cuda``, ``hip``,
  ``native_cpu`` or ``*``, devices ``,``-separated ``*``, ``gpu``, ``cpu``, ``fpga``,
  ``N``, ``N.M`` or ``N.*``; a ``!`` term removes what it names, and with only ``!``
  terms ``*:*`` is implied. torch.xpu runs on Level Zero GPUs, so a selector that leaves
  none of them leaves torch no device. Ray sets it for each worker it gives a GPU.
- ``ZE_AFFINITY_MASK`` (the Level Zero loader): ``,``-separated ``N`` (a device) or
  ``N.M`` (a sub-device, a tile of a Data Center GPU Max); unset or empty: all.

The engine's own spelling, ``XPU_VISIBLE_DEVICES`` (``CORE_``/``VLLM_``), is exported as
``ZE_AFFINITY_MASK`` (like ``ROCM_VISIBLE_DEVICES`` for HIP).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

BACKENDS = ("level_zero", "opencl", "cuda", "hip", "native_cpu", "*")
_DEVICE = re.compile(r"^(\*|gpu|cpu|fpga|\d+(\.(\d+|\*))?|\*\.\*)$")
_AFFINITY = re.compile(r"^\d+(\.\d+)?$")


def parse_selector(text: str) -> list[tuple[bool, str, list[str]]]:
    """``ONEAPI_DEVICE_SELECTOR`` as ``[(exclude, backend, devices)]``.

    :raises ValueError: naming the variable and the term that is not ``[!]backend:devices``.
    """
    terms = []
    for term in (t.strip() for t in text.split(";")):
        if not term:
            continue
        exclude = term.startswith("!")
        backend, sep, devices = term.removeprefix("!").partition(":")
        entries = [d.strip().lower() for d in devices.split(",")]
        backend = backend.strip().lower()
        if not sep or backend not in BACKENDS or not all(_DEVICE.match(d) for d in entries):
            raise ValueError(
                f"ONEAPI_DEVICE_SELECTOR={text!r}: {term!r} is not [!]backend:devices "
                f"(backend one of {', '.join(BACKENDS)}; devices *, gpu, cpu, fpga, N, N.M or N.*)"
            )
        terms.append((exclude, backend, entries))
    if not terms:
        raise ValueError(f"ONEAPI_DEVICE_SELECTOR={text!r} names no device: unset it to see every device")
    return terms


def _names_all_gpus(backend: str, devices: list[str]) -> bool:
    return backend in ("level_zero", "*") and any(d in ("*", "gpu", "*.*") for d in devices)


def _names_gpus(backend: str, devices: list[str]) -> bool:
    return backend in ("level_zero", "*") and any(d != "cpu" and d != "fpga" for d in devices)


def selector_hides_gpus(text: str) -> bool:
    """Whether ``ONEAPI_DEVICE_SELECTOR=text`` leaves no Level Zero GPU (torch.xpu sees none).

    :raises ValueError: on a malformed selector (see :func:`parse_selector`).
    """
    terms = parse_selector(text)
    if any(exclude and _names_all_gpus(backend, devices) for exclude, backend, devices in terms):
        return True
    positive = [(backend, devices) for exclude, backend, devices in terms if not exclude]
    return bool(positive) and not any(_names_gpus(backend, devices) for backend, devices in positive)


def parse_affinity_mask(text: str, name: str = "ZE_AFFINITY_MASK") -> list[str]:
    """A ``ZE_AFFINITY_MASK``-style list: ``N`` or ``N.M`` entries, none twice (empty: all devices).

    :raises ValueError: naming the variable and the bad entry.
    """
    entries = [part.strip() for part in text.split(",") if part.strip()]
    for entry in entries:
        if not _AFFINITY.match(entry):
            raise ValueError(f"{name}={text!r}: {entry!r} is not a device index N or a sub-device N.M")
    if len(set(entries)) != len(entries):
        raise ValueError(f"{name}={text!r} lists a device twice")
    return entries


def selector_reason(environ: Mapping[str, str]) -> str | None:
    """Why the selector variables leave torch.xpu no usable GPU (malformed or hiding all), or None."""
    try:
        if "ZE_AFFINITY_MASK" in environ:
            parse_affinity_mask(environ["ZE_AFFINITY_MASK"])
        selector = environ.get("ONEAPI_DEVICE_SELECTOR")
        if selector is not None and selector_hides_gpus(selector):
            return f"ONEAPI_DEVICE_SELECTOR={selector!r} leaves no Level Zero GPU (torch.xpu runs on level_zero:gpu)"
    except ValueError as exc:
        return str(exc)
    return None


def device_env(requested: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to export before the XPU runtime starts: ``XPU_VISIBLE_DEVICES`` as
    ``ZE_AFFINITY_MASK``.

    :param requested: the engine's ``XPU_VISIBLE_DEVICES`` (None: unset, nothing exported).
    :raises ValueError: on a malformed list, or a ``ZE_AFFINITY_MASK`` already set to another one.
    """
    if requested is None:
        return {}
    parse_affinity_mask(requested, "XPU_VISIBLE_DEVICES")
    mask = environ.get("ZE_AFFINITY_MASK")
    if mask is not None and mask != requested:
        raise ValueError(f"XPU_VISIBLE_DEVICES={requested!r} conflicts with ZE_AFFINITY_MASK={mask!r}: set one")
    return {"ZE_AFFINITY_MASK": requested}
