"""The kit's communicator check fails a communicator that loses part of a large tensor, or of a received one.

A communicator with a buffer of its own passes a tensor larger than the buffer in pieces; one
that forgets the pieces after the first sums small tensors right. The check's 2.4 MB tensor
must catch it, naming the op, the rank, the dtype and the shape.
"""

from __future__ import annotations

import pytest
from plugins.distributed import Communicator, check_communicator
from plugins.reference import ReferencePlatform

PIECE = 1 << 16  # elements the broken communicator sums; the rest it leaves as this rank's


class FirstPieceOnly(Communicator):
    def all_reduce(self, tensor):
        super().all_reduce(tensor.view(-1)[:PIECE])
        return tensor


class FirstPiecePlatform(ReferencePlatform):
    name = "first_piece"

    def make_communicator(self, rank, world_size, init_method):
        return FirstPieceOnly("gloo", rank, world_size, init_method)


def test_the_check_passes_the_default_communicator():
    check_communicator(ReferencePlatform)


def test_the_check_names_a_sum_that_stops_after_the_first_piece():
    with pytest.raises(AssertionError, match=r"all_reduce on rank 0 \(torch.float32 \[2, 300000\]\) differs"):
        check_communicator(FirstPiecePlatform)


class DropsLastRow(Communicator):
    """Receives all but the last row of a tensor (as a pipeline hand-off cut short would)."""

    def recv(self, tensor, src):
        super().recv(tensor, src)
        tensor[-1].zero_()
        return tensor


class DropsLastRowPlatform(ReferencePlatform):
    name = "drops_last_row"

    def make_communicator(self, rank, world_size, init_method):
        return DropsLastRow("gloo", rank, world_size, init_method)


def test_the_check_names_a_recv_that_loses_data():
    with pytest.raises(AssertionError, match=r"recv on rank 0 \(torch.float32 \[5, 33\]\) is not what rank 1 sent"):
        check_communicator(DropsLastRowPlatform)
