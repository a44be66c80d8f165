"""Tensors of other frameworks, through DLPack and __array_interface__: read and written in place,
without a copy, with the same checks as arrays. `Dl` stands for a framework's tensor: it exposes
only ``__dlpack__``/``__dlpack_device__`` (over NumPy's own export), as torch, JAX and CuPy do."""

import numpy as np
import pytest

import distcomm as dist
from distcomm import _dlpack


class Dl:
    """A tensor that speaks only DLPack."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class OnDevice(Dl):
    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


class Iface:
    """An array that speaks only __array_interface__."""

    def __init__(self, a: np.ndarray):
        self._a = a
        self.__array_interface__ = a.__array_interface__


def test_all_reduce_in_place_through_dlpack(rank, size):
    mem = np.full(6, rank + 1, dtype=np.float32)
    dist.all_reduce(Dl(mem))
    assert mem.tolist() == [size * (size + 1) / 2] * 6, "written in place, in the tensor's memory"


def test_every_dtype_through_dlpack(rank, size):
    for dt in [np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.float64]:
        mem = np.full(3, rank + 1, dtype=dt)
        dist.all_reduce(Dl(mem))
        assert mem.tolist() == [size * (size + 1) // 2] * 3, dt


def test_bfloat16_bits_through_dlpack(rank, size):
    # bfloat16 without ml_dtypes: the library is told the dtype (max of bit patterns of positive
    # values orders like the values).
    vals = np.array([1.0, 2.0, 3.0], dtype=np.float32) * (rank + 1)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16).view(_dlpack.BF16_BITS)
    dist.all_reduce(bits, op=dist.ReduceOp.MAX)
    back = (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    assert back.tolist() == [1.0 * size, 2.0 * size, 3.0 * size]


def test_broadcast_gather_and_lists_of_tensors(rank, size):
    mem = np.arange(4, dtype=np.int64) * (rank + 1)
    dist.broadcast(Dl(mem), src=0)
    assert mem.tolist() == [0, 1, 2, 3]
    outs = [np.zeros(2, dtype=np.int32) for _ in range(size)]
    dist.all_gather([Dl(o) for o in outs], Dl(np.array([rank, -rank], dtype=np.int32)))
    assert [o.tolist() for o in outs] == [[r, -r] for r in range(size)]
    whole = np.zeros(2 * size, dtype=np.int32)
    dist.all_gather_into_tensor(Dl(whole), Iface(np.array([rank, rank], dtype=np.int32)))
    assert whole.tolist() == [r for r in range(size) for _ in range(2)]


def test_inputs_of_any_layout_outputs_contiguous(rank, size):
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    # A strided input is fine (copied)...
    out = np.zeros(2 * size, dtype=np.float64)
    dist.all_gather_into_tensor(Dl(out), Dl(base[0, ::2]))
    assert out.tolist() == [0.0, 2.0] * size
    # ...a strided output is refused before anything is sent.
    with pytest.raises(dist.DistInvalidArgument, match="C-contiguous"):
        dist.all_reduce(Dl(base[:, ::2]))
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises(dist.DistInvalidArgument, match="DLPack"):
        dist.all_reduce(Dl(ro))


def test_device_tensors_are_refused_clearly(rank, size):
    with pytest.raises(dist.DistUnavailableError, match="CUDA device"):
        dist.all_reduce(OnDevice(np.ones(2, dtype=np.float32)))
    with pytest.raises(dist.DistInvalidArgument, match="__dlpack__"):
        dist.all_reduce(object())
