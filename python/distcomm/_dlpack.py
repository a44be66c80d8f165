"""Tensors of any framework, without a copy: a NumPy view of what an object's ``__dlpack__``
exports (PyTorch, JAX, CuPy, Paddle and NumPy itself speak DLPack), read and written in place.

The view keeps the exported capsule alive; the capsule's destructor (the producer's) releases
the tensor when the view is gone. Memory on a CUDA device cannot be a NumPy array: it becomes a
:class:`DeviceArray` (pointer, dtype, shape, strides, device), exported for the legacy default
stream (DLPack's ``stream=1``), which the library's own CUDA stream follows: the producer makes
sure its pending work on the tensor is ordered before ours.
"""

import ctypes
import math
from ctypes import POINTER, Structure, c_char_p, c_int, c_int64, c_uint8, c_uint16, c_uint64, c_void_p, py_object
from typing import Any, Optional, Tuple, Union

import numpy as np

from ._errors import DistInvalidArgument, DistUnavailableError

#: DLPack's device types (``DLDeviceType``) that are host memory.
_CPU_DEVICES = {1, 3}  # kDLCPU, kDLCUDAHost (pinned host memory)
_CUDA_DEVICES = {2, 13}  # kDLCUDA, kDLCUDAManaged

#: DLPack's type codes.
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6

#: bfloat16 without ml_dtypes: the bits as uint16, marked so the library is told it is bfloat16.
BF16_BITS = np.dtype(np.uint16, metadata={"distcomm": "bfloat16"})


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int), ("device_id", c_int)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", _DLDevice),
        ("ndim", c_int),
        ("dtype", _DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class _DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = c_void_p
_get_pointer.argtypes = [py_object, c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = c_int
_is_valid.argtypes = [py_object, c_char_p]


def has_dlpack(obj: Any) -> bool:
    return hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray)


def _numpy_dtype(code: int, bits: int, lanes: int, what: str) -> np.dtype:
    if lanes != 1:
        raise DistInvalidArgument(f"{what}: vector dtypes (lanes={lanes}) are not supported")
    if code == _INT and bits in (8, 16, 32, 64):
        return np.dtype(f"int{bits}")
    if code == _UINT and bits in (8, 16, 32, 64):
        return np.dtype(f"uint{bits}")
    if code == _FLOAT and bits in (16, 32, 64):
        return np.dtype(f"float{bits}")
    if code == _BFLOAT and bits == 16:
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except Exception:
            return BF16_BITS
    if code == _BOOL and bits == 8:
        return np.dtype(np.bool_)
    raise DistInvalidArgument(f"{what}: DLPack dtype (code {code}, {bits} bits) is not supported")


def _device_of(obj: Any) -> Optional[int]:
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        return None
    try:
        return int(dev()[0])
    except Exception:
        return None


class _Flags:
    __slots__ = ("c_contiguous", "writeable")

    def __init__(self, c_contiguous: bool):
        self.c_contiguous = c_contiguous
        self.writeable = True


class _Address:
    __slots__ = ("data",)

    def __init__(self, data: int):
        self.data = data


class DeviceArray:
    """CUDA device memory that an object exported through DLPack, described with the few
    attributes of a NumPy array the package reads (``dtype``, ``shape``, ``strides``, ``size``,
    ``nbytes``, ``flags``, ``ctypes.data``); it holds the capsule, so the memory lives as long
    as it does. It has no element access: the package only hands its address to the library."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], strides: Tuple[int, ...], dtype: np.dtype,
                 device: int, owner: Any):
        self.dtype = dtype
        self.shape = shape
        self.strides = strides
        self.ndim = len(shape)
        self.size = math.prod(shape)
        self.itemsize = dtype.itemsize
        self.nbytes = self.size * dtype.itemsize
        self.device = device
        self.flags = _Flags(_compact(shape, strides, dtype.itemsize))
        self.ctypes = _Address(ptr)
        self._owner = owner

    def __repr__(self) -> str:
        return f"DeviceArray(cuda:{self.device}, shape={self.shape}, dtype={self.dtype})"


def _compact(shape: Tuple[int, ...], strides: Tuple[int, ...], item: int) -> bool:
    step = item
    for n, s in zip(reversed(shape), reversed(strides)):
        if n > 1 and s != step:
            return False
        step *= n
    return True


def view(obj: Any, what: str) -> Union[np.ndarray, DeviceArray]:
    """A NumPy array over the memory of ``obj`` (an object with ``__dlpack__``), zero-copy, or a
    DeviceArray when that memory is on a CUDA device."""
    device = _device_of(obj)
    if device is not None and device not in _CPU_DEVICES and device not in _CUDA_DEVICES:
        raise DistUnavailableError(f"{what}: the tensor is on DLPack device type {device}; distcomm takes host and CUDA memory")
    try:
        # stream=1: CUDA's legacy default stream, which the library's CUDA stream follows.
        capsule = obj.__dlpack__(stream=1) if device in _CUDA_DEVICES else obj.__dlpack__()
    except BufferError as e:  # e.g. a read-only NumPy array, which DLPack cannot mark
        raise DistInvalidArgument(f"{what}: cannot be exported through DLPack: {e}") from None
    except (TypeError, ValueError, RuntimeError) as e:
        raise DistInvalidArgument(f"{what}: its __dlpack__ failed: {e}") from None
    if not _is_valid(capsule, b"dltensor"):
        raise DistInvalidArgument(f"{what}: __dlpack__ did not return an unused DLPack capsule")
    managed = _DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor"))
    t = managed.dl_tensor
    on_device = t.device.device_type in _CUDA_DEVICES
    if t.device.device_type not in _CPU_DEVICES and not on_device:
        raise DistUnavailableError(f"{what}: the tensor is on DLPack device type {t.device.device_type}; distcomm takes host and CUDA memory")
    dtype = _numpy_dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes, what)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    item = dtype.itemsize
    if t.strides:
        strides = tuple(t.strides[i] * item for i in range(t.ndim))
    else:  # compact row-major
        strides, step = [], item
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
        strides = tuple(strides)
    count = 1
    for n in shape:
        count *= n
    if any(s < 0 for s, n in zip(strides, shape) if n > 1):
        raise DistInvalidArgument(f"{what}: negative strides are not supported (pass a contiguous tensor)")
    if count == 0 or not t.data:
        return np.empty(shape, dtype)  # nothing to move: no memory of either kind is touched
    if on_device:
        return DeviceArray(t.data + t.byte_offset, shape, strides, dtype, t.device.device_id, (capsule, obj))
    span = item + sum(s * (n - 1) for s, n in zip(strides, shape))
    buf = (ctypes.c_char * span).from_address(t.data + t.byte_offset)
    # The view's base is `buf`, which holds the capsule: the tensor lives as long as the view.
    buf._distcomm_capsule = capsule  # type: ignore[attr-defined]
    buf._distcomm_owner = obj  # type: ignore[attr-defined]
    return np.ndarray(shape, dtype=dtype, buffer=buf, strides=strides)
