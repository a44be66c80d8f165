"""Bad input raises DistInvalidArgument (a ValueError) on the calling rank before anything is
sent: after each, the ranks are still in step (the in_step fixture checks with an all_reduce)."""

import numpy as np
import pytest

import distcomm as dist
from distcomm import ReduceOp

Bad = dist.DistInvalidArgument


def test_exception_hierarchy():
    assert issubclass(Bad, dist.DistError) and issubclass(Bad, ValueError)
    assert issubclass(dist.DistError, RuntimeError)
    for cls, code in [(dist.DistInvalidArgument, 1), (dist.DistInvalidUsage, 2), (dist.DistTimeoutError, 3),
                      (dist.DistPeerLostError, 4), (dist.DistMismatchError, 5), (dist.DistAbortedError, 6),
                      (dist.DistUnavailableError, 7), (dist.DistSystemError, 8), (dist.DistRendezvousError, 9),
                      (dist.DistInternalError, 10), (dist.DistRemoteError, 11)]:
        e = cls("msg")
        assert e.status == code and e.status_name.startswith("DC_") and str(e).endswith("msg")


@pytest.mark.parametrize("dtype", [np.int16, np.uint16, np.bool_, np.complex64, ">f4", "U3", "O"])
def test_unsupported_dtypes(dtype):
    x = np.zeros(3, dtype=dtype)
    with pytest.raises(Bad, match="dtype"):
        dist.all_reduce(x)
    with pytest.raises(Bad, match="dtype"):
        dist.broadcast(x, 0)
    with pytest.raises(Bad, match="dtype"):
        dist.send(x, 0)


def test_not_arrays():
    for bad in ([1, 2, 3], 3.0, "abc", None):
        with pytest.raises(Bad, match="expected a tensor or array"):
            dist.all_reduce(bad)


def test_output_layout():
    x = np.zeros(10, np.float32)
    with pytest.raises(Bad, match="contiguous"):
        dist.all_reduce(x[::2])
    with pytest.raises(Bad, match="contiguous"):
        dist.all_reduce(np.zeros((3, 4), np.float32).T)
    with pytest.raises(Bad, match="contiguous"):
        dist.recv(x[::2], 0)
    ro = np.zeros(4, np.float32)
    ro.setflags(write=False)
    with pytest.raises(Bad, match="read-only"):
        dist.all_reduce(ro)
    with pytest.raises(Bad, match="read-only"):
        dist.irecv(ro)
    with pytest.raises(Bad, match="read-only"):
        dist.all_reduce(b"bytes are read-only")
    with pytest.raises(Bad, match="read-only"):
        dist.all_gather([ro] * dist.get_world_size(), np.zeros(4, np.float32))


def test_broadcast_to_readonly_on_receivers(rank, size):
    x = np.zeros(2, np.float32)
    x.setflags(write=False)
    if rank == 0:  # the source only reads: to keep the ranks in step, it fails on src too
        with pytest.raises(Bad):
            dist.broadcast(x, src=size)
    else:
        with pytest.raises(Bad, match="read-only"):
            dist.broadcast(x, src=0)


def test_ranks_out_of_range(size):
    x = np.zeros(2, np.float32)
    for bad in (size, -1, size + 5):
        with pytest.raises(Bad, match="outside"):
            dist.broadcast(x, src=bad)
        with pytest.raises(Bad, match="outside"):
            dist.reduce(x, dst=bad)
        with pytest.raises(Bad, match="outside"):
            dist.send(x, dst=bad)
        with pytest.raises(Bad, match="outside"):
            dist.recv(x, src=bad)
        with pytest.raises(Bad, match="outside"):
            dist.gather(x, None, dst=bad)
        with pytest.raises(Bad, match="outside"):
            dist.scatter(x, None, src=bad)
    for bad in ("0", 1.0, None, True):
        with pytest.raises(Bad):
            dist.broadcast(x, src=bad)


def test_ops():
    with pytest.raises(Bad, match="integer dtype"):
        dist.all_reduce(np.zeros(2, np.float32), ReduceOp.BXOR)
    with pytest.raises(Bad, match="integer dtype"):
        dist.reduce_scatter(np.zeros(1, np.float64), [np.zeros(1)] * dist.get_world_size(), ReduceOp.BAND)
    for bad in (8, -1, "sum", 1.5, None):
        with pytest.raises(Bad, match="ReduceOp"):
            dist.all_reduce(np.zeros(2, np.int32), bad)


def test_list_lengths_and_entries(rank, size):
    t = np.zeros(3, np.float32)
    with pytest.raises(Bad, match="entries"):
        dist.all_gather([np.zeros(3, np.float32)] * (size + 1), t)
    with pytest.raises(Bad, match="elements"):
        dist.all_gather([np.zeros(4, np.float32) for _ in range(size)], t)
    with pytest.raises(Bad, match="dtype"):
        dist.all_gather([np.zeros(3, np.float64) for _ in range(size)], t)
    with pytest.raises(Bad, match="list"):
        dist.all_gather(np.zeros((size, 3), np.float32), t)
    with pytest.raises(Bad, match="entries"):
        dist.reduce_scatter(t, [t] * (size - 1))
    with pytest.raises(Bad, match="entries"):
        dist.all_to_all([t] * size, [t] * (size + 1))
    with pytest.raises(Bad, match="elements"):
        dist.all_gather_into_tensor(np.zeros(size * 3 + 1, np.float32), t)
    with pytest.raises(Bad, match="elements"):
        dist.reduce_scatter_tensor(t, np.zeros(size * 3 - 1, np.float32))
    # root-only lists: wrong on the root, present elsewhere: every rank raises
    gl = [t] * (size + 1) if rank == 0 else [t]
    with pytest.raises(Bad):
        dist.gather(t, gl, dst=0)
    sl = [t] * (size - 1) if rank == 0 else [t]
    with pytest.raises(Bad):
        dist.scatter(t, sl, src=0)
    with pytest.raises(Bad):  # missing on the root, present elsewhere
        dist.scatter(t, None if rank == 0 else [t], src=0)


def test_all_to_all_single_splits(size):
    x = np.zeros(size * 2, np.int32)
    with pytest.raises(Bad, match="sums to"):
        dist.all_to_all_single(x, x.copy(), [2] * size, [1] * size)
    with pytest.raises(Bad, match="non-negative"):
        dist.all_to_all_single(x, x.copy(), [2] * (size - 1), None)
    with pytest.raises(Bad, match="divisible"):
        dist.all_to_all_single(np.zeros(size * 2 + 1, np.int32), np.zeros(size * 2 + 1, np.int32))
    with pytest.raises(Bad, match="dtype"):
        dist.all_to_all_single(x, x.astype(np.int64))


def test_tags_and_misc():
    x = np.zeros(1, np.int32)
    with pytest.raises(Bad, match="tag"):
        dist.send(x, 0, tag=-1)
    with pytest.raises(Bad, match="tag"):
        dist.irecv(x, 0, tag=2**31)
    with pytest.raises(Bad, match="group"):
        dist.barrier(group="world")
    with pytest.raises(Bad, match="P2POp"):
        dist.P2POp(dist.all_reduce, x, 0)
    with pytest.raises(Bad, match="timeout"):
        dist.new_group(timeout=-1)


def test_state_errors(rank, size):
    with pytest.raises(dist.DistInvalidUsage, match="already"):
        dist.init_process_group()
    with pytest.raises(dist.DistUnavailableError):
        dist.init_process_group(backend="mpi")
    w = dist.barrier(async_op=True)
    w.wait()
    with pytest.raises(dist.DistInvalidUsage):
        w.source_rank()
