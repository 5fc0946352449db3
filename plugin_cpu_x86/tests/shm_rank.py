"""One rank of test_shm_communicator's two-process checks (a script: the tests start two).

``python shm_rank.py CASE RANK ADDRESS OUT [MODEL_DIR]`` runs CASE on rank RANK of 2 and
saves what it saw to OUT (``torch.save``); the test compares the two ranks' files.
"""

from __future__ import annotations

import sys
import threading
import time

import torch
from plugin_cpu_x86.platform import CpuX86Platform
from plugins.cpu_native import shm
from plugins.cpu_native.shm import SharedMemoryCommunicator

WORLD = 2


def _inputs(rank: int) -> list[torch.Tensor]:
    """Tensors of every kind the collectives take: several pieces of a small slot, one token's
    hidden state, bfloat16, and integers (gathered as bytes, summed over gloo)."""
    gen = torch.Generator().manual_seed(100 + rank)
    return [
        torch.randn(3, 577, generator=gen),
        torch.randn(1, 576, generator=gen),
        torch.randn(2, 300, generator=gen).bfloat16(),
        torch.randint(-1000, 1000, (2, 50), generator=gen),
    ]


def collectives(rank: int, address: str, separate_hosts: bool) -> dict:
    """Sums and gathers through a 256-byte slot (many pieces, both parities); with
    ``separate_hosts`` each rank names another host, so the ranks must fall back to gloo."""
    if separate_hosts:
        shm.host_id = lambda: (f"host{rank}", "")
    comm = SharedMemoryCommunicator(CpuX86Platform().kernels.lib, rank, WORLD, address, slot_bytes=256)
    try:
        xs = _inputs(rank)
        sums = [comm.all_reduce(x.clone()) for x in xs]
        gathers = [comm.all_gather(x, dim=-1) for x in xs] + [comm.all_gather(xs[0], dim=0)]
        view = xs[0].t().contiguous().t()  # xs[0]'s values in a layout that is not contiguous
        comm.all_reduce(view)
        return {"shared": comm.is_shared, "native": comm.native_all_reduce is not None, "inputs": xs,
                "sums": sums, "gathers": gathers, "view": view}  # fmt: skip
    finally:
        comm.close()


def timeout(rank: int, address: str) -> dict:
    """Rank 1 never joins the all-reduce: rank 0's must raise naming it."""
    comm = SharedMemoryCommunicator(CpuX86Platform().kernels.lib, rank, WORLD, address, timeout_s=3.0)
    try:
        if rank == 1:
            time.sleep(6)
            return {}
        start = time.monotonic()
        try:
            comm.all_reduce(torch.ones(8))
        except RuntimeError as exc:
            return {"error": str(exc), "waited_s": time.monotonic() - start}
        return {"error": None}
    finally:
        comm.close()


def abort(rank: int, address: str) -> dict:
    """Rank 1 arrives late; a thread of rank 0 aborts the buffer while rank 0 waits for it (a peer
    died): rank 0's all-reduce raises at once, rank 1's first completes (rank 0's part was there),
    its second raises without waiting for the timeout."""
    comm = SharedMemoryCommunicator(CpuX86Platform().kernels.lib, rank, WORLD, address, timeout_s=30.0)
    errors = []
    try:
        if rank == 0:
            threading.Timer(0.5, comm.abort).start()
        else:
            time.sleep(1.5)
        start = time.monotonic()
        for _ in range(rank + 1):
            try:
                comm.all_reduce(torch.ones(8))
            except RuntimeError as exc:
                errors.append(str(exc))
        return {"errors": errors, "waited_s": time.monotonic() - start}
    finally:
        comm.close()


def fused(rank: int, address: str, model_dir: str) -> dict:
    """This rank's shard of a tiny model: the fused decoder (all-reduces in its layer loop)
    against the eager forward (all-reduces from Python) over prefill and decode steps."""
    from core.loader.loader import load_model
    from plugins.attention import AttentionMetadata
    from plugins.cpu_native.runner import FusedDecoder
    from plugins.runner import ModelInputs

    platform = CpuX86Platform()
    comm = platform.make_communicator(rank, WORLD, address)
    try:
        model = load_model(model_dir, kernels=platform.kernels, dtype=torch.float32, device=torch.device("cpu"),
                           skip_tokenizer_init=True, comm=comm).model  # fmt: skip
        shape = (16, 4, model.num_kv_heads, model.head_size)
        eager_caches, fused_caches = ([(torch.zeros(shape), torch.zeros(shape)) for _ in model.layers] for _ in "ef")
        decoder = FusedDecoder(model.describe(fused_caches), platform.kernels)  # NotFusable without a native all-reduce
        tables, seq_lens, results = [[3, 0, 7], [1, 2, 4]], [0, 0], []
        # ids from both ranks' halves of the vocabulary (256 ids: rank 0 holds 0-127)
        for new in ([[5, 200, 2], [130, 7, 255, 1, 64]], [[4], [250]], [[129], [3]], [[77], [190]]):
            totals = [n + len(t) for t, n in zip(new, seq_lens, strict=True)]
            positions = [p for t, n in zip(new, seq_lens, strict=True) for p in range(n, n + len(t))]
            meta = AttentionMetadata.build([len(t) for t in new], totals, tables, 4, torch.device("cpu"))
            ids = torch.tensor([t for toks in new for t in toks])
            with torch.inference_mode():
                expected = model(ids, torch.tensor(positions), eager_caches, meta)
                actual = decoder(ModelInputs(ids, torch.tensor(positions), meta))
            results.append((expected, actual))
            seq_lens = totals
        return {"shared": comm.is_shared, "steps": results}
    finally:
        comm.close()


def main() -> None:
    case, rank, address, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    if case == "fused":
        result = fused(rank, address, sys.argv[5])
    elif case == "timeout":
        result = timeout(rank, address)
    elif case == "abort":
        result = abort(rank, address)
    else:
        result = collectives(rank, address, separate_hosts=case == "hosts")
    torch.save(result, out)


if __name__ == "__main__":
    main()
