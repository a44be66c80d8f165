"""Object collectives (pickled: trusted peers only)."""

import numpy as np
import pytest

import distcomm as dist


def obj_of(r: int):
    return {"rank": r, "payload": "x" * (r * 37), "arr": np.arange(r + 1), "none": None, "t": (r, [r] * r)}


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a
    )


def test_all_gather_object(rank, size):
    out = [None] * size
    assert dist.all_gather_object(out, obj_of(rank)) is None
    assert all(same(out[r], obj_of(r)) for r in range(size))


def test_all_gather_object_large(rank, size):
    out = [None] * size
    dist.all_gather_object(out, bytes([rank]) * (1 << 20))
    assert [len(o) for o in out] == [1 << 20] * size and [o[0] for o in out] == list(range(size))


def test_broadcast_object_list(rank, size):
    for src in range(size):
        objs = [obj_of(src), src, "end"] if rank == src else [None, None, None]
        dist.broadcast_object_list(objs, src=src)
        assert same(objs[0], obj_of(src)) and objs[1:] == [src, "end"]
    empty = []
    dist.broadcast_object_list(empty, src=0)
    assert empty == []


def test_scatter_object_list(rank, size):
    for src in range(size):
        out = [None]
        inp = [obj_of(r) for r in range(size)] if rank == src else None
        dist.scatter_object_list(out, inp, src=src)
        assert same(out[0], obj_of(rank))


def test_gather_object(rank, size):
    for dst in range(size):
        out = [None] * size if rank == dst else None
        dist.gather_object(obj_of(rank), out, dst=dst)
        if rank == dst:
            assert all(same(out[r], obj_of(r)) for r in range(size))


def test_exceptions_travel_with_their_status(rank, size):
    out = [None] * size
    dist.all_gather_object(out, dist.DistTimeoutError("rank %d was slow" % rank))
    assert all(isinstance(e, dist.DistTimeoutError) and e.status == 3 for e in out)
    assert out[size - 1].message == "rank %d was slow" % (size - 1)


def test_bad_object_arguments(rank, size):
    with pytest.raises(dist.DistInvalidArgument):
        dist.all_gather_object([None] * (size + 1), 1)
    with pytest.raises(dist.DistInvalidArgument):
        dist.scatter_object_list([], [1] * size, src=0)
    with pytest.raises(dist.DistInvalidArgument):
        dist.broadcast_object_list("not a list", src=0)
    with pytest.raises(dist.DistInvalidArgument):
        dist.broadcast_object_list([1], src=size)
