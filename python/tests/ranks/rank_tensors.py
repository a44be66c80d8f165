"""Tensors of other frameworks, through DLPack and __array_interface__: read and written in place,
without a copy, with the same checks as arrays. `Dl` stands for a framework's tensor: it exposes
only ``__dlpack__``/``__dlpack_device__`` (over NumPy's own export), as torch, JAX and CuPy do."""

import ctypes

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


class OnDevice:
    """A tensor that says it lives on CUDA device 0: its capsule describes host memory as
    kDLCUDA memory (enough to reach every check that runs before the library is called; on a
    group without NCCL nothing may be sent)."""

    def __init__(self, a: np.ndarray):
        self._a = a
        self.streams = []
        t = _dlpack._DLManagedTensor()
        t.dl_tensor.data = a.ctypes.data
        t.dl_tensor.device.device_type, t.dl_tensor.device.device_id = 2, 0
        t.dl_tensor.ndim = a.ndim
        t.dl_tensor.dtype.code, t.dl_tensor.dtype.bits, t.dl_tensor.dtype.lanes = 2, 8 * a.itemsize, 1
        self._shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        self._strides = (ctypes.c_int64 * a.ndim)(*(s // a.itemsize for s in a.strides))
        t.dl_tensor.shape = self._shape
        t.dl_tensor.strides = self._strides
        self._managed = t

    def __dlpack__(self, stream=None, **kw):
        self.streams.append(stream)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


class _ClaimsDevice(Dl):
    def __dlpack_device__(self):
        return (2, 0)


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


def test_device_tensors_are_described_not_viewed(rank, size):
    mem = np.zeros((3, 4), dtype=np.float32)
    t = OnDevice(mem)
    d = _dlpack.view(t, "tensor")
    assert isinstance(d, _dlpack.DeviceArray)
    assert (d.ctypes.data, d.shape, d.dtype, d.size, d.nbytes, d.device) == (mem.ctypes.data, (3, 4), np.float32, 12, 48, 0)
    assert d.flags.c_contiguous and t.streams == [1]  # exported for the legacy default stream
    assert not _dlpack.view(OnDevice(mem[:, ::2]), "tensor").flags.c_contiguous


def test_device_tensors_without_nccl_are_refused_before_anything_is_sent(rank, size):
    # This job's groups have no NCCL communicator: CUDA memory must not reach the library,
    # which would take the address for host memory.
    mem = np.full(2, 7, dtype=np.float32)
    with pytest.raises(dist.DistUnavailableError, match="CUDA device.*no NCCL communicator"):
        dist.all_reduce(OnDevice(mem))
    with pytest.raises(dist.DistUnavailableError, match="no NCCL communicator"):
        dist.recv(OnDevice(mem), src=(rank + 1) % size)
    assert mem.tolist() == [7, 7]
    # Lists are staged in host memory: refused for device tensors whatever the group.
    with pytest.raises(dist.DistInvalidArgument, match="staged in host memory"):
        dist.all_gather([OnDevice(np.zeros(2, np.float32)) for _ in range(size)], OnDevice(mem))
    # A producer that says CUDA but cannot export for a CUDA stream.
    with pytest.raises(dist.DistInvalidArgument, match="__dlpack__"):
        dist.all_reduce(_ClaimsDevice(np.ones(2, dtype=np.float32)))
    with pytest.raises(dist.DistInvalidArgument, match="__dlpack__"):
        dist.all_reduce(object())
