"""Which GPUs a ROCm process sees, from the visibility variables (pure functions).

Two layers filter the GPUs: ``ROCR_VISIBLE_DEVICES`` (the ROCm runtime: indices into
all GPUs, or ``GPU-<uuid>`` ids) and then ``HIP_VISIBLE_DEVICES`` (indices into what
ROCR left). HIP also reads ``CUDA_VISIBLE_DEVICES``; like vLLM, it must then equal
``HIP_VISIBLE_DEVICES``, or it is set to it, so torch and HIP agree.
"""

from __future__ import annotations

from collections.abc import Mapping


def parse_devices(text: str, name: str, allow_uuid: bool = False) -> list[str]:
    """A comma-separated device list: indices (and ``GPU-<uuid>`` where ``allow_uuid``).

    :raises ValueError: naming the variable and the bad entry.
    """
    entries = [part.strip() for part in text.split(",") if part.strip()]
    for entry in entries:
        if not entry.isdigit() and not (allow_uuid and entry.startswith("GPU-")):
            raise ValueError(
                f"{name}={text!r}: {entry!r} is not a device index" + (" or GPU-<uuid>" if allow_uuid else "")
            )
    if len(set(entries)) != len(entries):
        raise ValueError(f"{name}={text!r} lists a device twice")
    return entries


def device_env(requested: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to export before HIP starts.

    :param requested: ``ROCM_VISIBLE_DEVICES`` (the engine's spelling), exported as
        ``HIP_VISIBLE_DEVICES`` unless that is already set to something else.
    :raises ValueError: on malformed lists or HIP/CUDA lists that disagree.
    """
    hip = environ.get("HIP_VISIBLE_DEVICES")
    if requested is not None:
        parse_devices(requested, "ROCM_VISIBLE_DEVICES")
        if hip is not None and hip != requested:
            raise ValueError(f"ROCM_VISIBLE_DEVICES={requested!r} conflicts with HIP_VISIBLE_DEVICES={hip!r}: set one")
        hip = requested
    if hip is None:
        return {}
    parse_devices(hip, "HIP_VISIBLE_DEVICES")
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None and cuda != hip:
        raise ValueError(f"HIP_VISIBLE_DEVICES={hip!r} and CUDA_VISIBLE_DEVICES={cuda!r} differ: HIP reads both")
    return {"HIP_VISIBLE_DEVICES": hip, "CUDA_VISIBLE_DEVICES": hip}


def visible_count(num_gpus: int, environ: Mapping[str, str]) -> int:
    """How many of ``num_gpus`` GPUs the process sees after ROCR's then HIP's filter.

    :raises ValueError: when a list names a GPU that its layer does not have.
    """
    count = num_gpus
    for name, uuids in (("ROCR_VISIBLE_DEVICES", True), ("HIP_VISIBLE_DEVICES", False)):
        if environ.get(name) is None:
            continue
        entries = parse_devices(environ[name], name, allow_uuid=uuids)
        missing = [e for e in entries if e.isdigit() and int(e) >= count]
        if missing:
            raise ValueError(f"{name}={environ[name]!r} names GPU {missing[0]}, but only {count} are visible to it")
        count = len(entries)
    return count
