"""The GGUF loader's byte-order conversion run on a big-endian CPU (s390x under qemu).

Two halves, one per machine (`make test-cross`, scripts/test_cross.sh):

    python scripts/s390x_byteorder.py expect GGUF OUT.json        # x86_64, the project's venv
    scripts/s390x_env.sh run scripts/s390x_byteorder.py check GGUF OUT.json   # s390x, no torch

``expect`` reads every tensor of GGUF with core's loader (:class:`core.loader.gguf_index.GGUFIndex`)
and writes its directory (type, shape, offset, size), the SHA-256 of its float32 values as x86
dequantizes them (serialized little-endian), and the SHA-256 of the bytes core's loader hands a
big-endian platform (``byte_order="big"``).

``check`` runs on the s390x Python: it reads each tensor's little-endian bytes from the file,
converts them with the SDK's :func:`plugins.byteorder.to_host_order` (its numpy path), and
dequantizes the result with ``gguf.quants``, which reads the float16/float32 fields in the
host's (big-endian) order. The values must be x86's bit for bit and the bytes core's loader's;
the file's bytes dequantized without the conversion must differ (once per format: the check
can fail). Then the s390x kernel library of plugin_s390x (cross-built) multiplies a Q8_0 and a
Q4_1 weight of the model, as converted, with two random vectors, on each kernel variant the emulated CPU reports
(and on the z15 one by name where QEMU runs its instructions without reporting them); each
result must match numpy's product with the dequantized weight. Prints one line per result.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

#: the weights the native kernels multiply: one per block format with an s390x kernel
KERNEL_TENSORS = ("token_embd.weight", "blk.0.ffn_down.weight")


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, dtype="<f4").tobytes()).hexdigest()


def expect(gguf_path: Path, out: Path) -> None:
    """x86 side: the tensor directory, x86's values and core's big-endian bytes, as JSON."""
    from core.loader.gguf_index import GGUFIndex

    index = GGUFIndex.open(gguf_path)
    tensors = {}
    for name, info in index.tensors.items():
        tensors[name] = {
            "qtype": info.qtype,
            "shape": list(info.shape),
            "offset": info.offset,
            "num_bytes": info.num_bytes,
            "values_sha256": _digest(index.dequantized(name).numpy()),
            "big_endian_bytes_sha256": hashlib.sha256(index.raw(name, byte_order="big").numpy().tobytes()).hexdigest(),
        }
    out.write_text(json.dumps({"tensors": tensors}))
    print(f"x86_64: {len(tensors)} tensors of {gguf_path.name} dequantized")


def check(gguf_path: Path, expected_json: Path) -> bool:
    """s390x side: convert, dequantize and multiply; True when everything matches x86."""
    import gguf
    from plugins.byteorder import to_host_order

    assert sys.byteorder == "big", f"the check must run on a big-endian CPU, not a {sys.byteorder}-endian one"
    expected = json.loads(expected_json.read_text())["tensors"]
    data = np.memmap(gguf_path, dtype=np.uint8, mode="r")
    ok, counts, converted = True, {}, {}
    for name, info in expected.items():
        rows = int(np.prod(info["shape"][:-1])) if len(info["shape"]) > 1 else 1
        raw = np.array(data[info["offset"] : info["offset"] + info["num_bytes"]]).reshape(rows, -1)
        qtype = gguf.GGMLQuantizationType[info["qtype"]]
        host = to_host_order(raw, info["qtype"], "big")
        values = gguf.quants.dequantize(host, qtype)
        good = (
            _digest(values) == info["values_sha256"]
            and hashlib.sha256(host.tobytes()).hexdigest() == info["big_endian_bytes_sha256"]
        )
        if info["qtype"] not in counts:  # once per format: without the conversion the values differ
            with np.errstate(all="ignore"):  # the file's bytes read big-endian: scales may be NaN
                good &= _digest(gguf.quants.dequantize(raw, qtype)) != info["values_sha256"]
        if not good:
            print(f"FAIL {name} ({info['qtype']}): values or bytes differ from x86's")
            ok = False
        counts[info["qtype"]] = counts.get(info["qtype"], 0) + good
        if name in KERNEL_TENSORS:
            converted[name] = (info["qtype"], host, values.reshape(info["shape"]))
    summary = ", ".join(f"{n} {q}" for q, n in sorted(counts.items()))
    print(f"s390x big-endian: {summary} tensors converted by plugins.byteorder equal x86's values")
    return _check_kernels(converted) and ok and len(converted) == len(KERNEL_TENSORS)


def _check_kernels(converted: dict[str, tuple[str, np.ndarray, np.ndarray]]) -> bool:
    """Each kernel variant the CPU runs multiplies the converted weights like numpy does."""
    from plugin_s390x.platform import ISA_TABLE
    from plugins.cpu_native.library import _SIGNATURES, DTYPE_F32, Q4_1, Q8_0, NativeLib

    codes = {"Q8_0": Q8_0, "Q4_1": Q4_1}
    best = NativeLib(ISA_TABLE)
    variants = [isa for isa in ("z15", "z14", "scalar") if all(f in best.features for f in ISA_TABLE.requirements[isa])]
    print(f"s390x CPU features {best.features or 'none'}: kernel variants {', '.join(variants)}")
    linears = {isa: NativeLib(ISA_TABLE, isa).linear for isa in variants}
    if "z15" not in variants and "vxe" in best.features:
        # QEMU's linux-user (7.2) executes the z15 vector enhancements 2 but leaves them out
        # of the hardware capabilities it reports: its variant runs only when called by name
        linears["z15 (called by name)"] = fn = best.cdll.ck_z15_linear
        fn.restype, fn.argtypes = _SIGNATURES["linear"]
    ok = True
    rng = np.random.default_rng(0)
    for isa, linear in linears.items():
        for name, (qtype, blocks, weight) in converted.items():
            n, k = weight.shape
            x = rng.standard_normal((2, k)).astype(np.float32)
            out = np.zeros((2, n), dtype=np.float32)
            status = linear(codes[qtype], blocks.ctypes.data, None, n, k, DTYPE_F32, x.ctypes.data, k, 2,
                            out.ctypes.data, None, DTYPE_F32, 2)  # fmt: skip
            reference = x.astype(np.float64) @ weight.astype(np.float64).T
            error = float(np.abs(out - reference).max() / np.abs(reference).max())
            good = status == 0 and error < 1e-4
            ok &= good
            print(
                f"s390x kernel {isa} linear {qtype} {name} [{n}x{k}]: {'ok' if good else 'FAIL'}, max error {error:.1e}"
            )
    return ok


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("expect", "check"):
        sys.exit("usage: s390x_byteorder.py expect|check GGUF JSON")
    if sys.argv[1] == "expect":
        expect(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(0 if check(Path(sys.argv[2]), Path(sys.argv[3])) else 1)
