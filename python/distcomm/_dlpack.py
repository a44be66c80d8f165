"""Tensors of any framework, without a copy: a NumPy view of what an object's ``__dlpack__``
exports (PyTorch, JAX, CuPy, Paddle and NumPy itself speak DLPack), read and written in place.

The view keeps the exported capsule alive; the capsule's destructor (the producer's) releases
the tensor when the view is gone. Only CPU memory is viewed here: a tensor on a CUDA device is
refused with a clear error (the NCCL path of the Python package is not there yet).
"""

import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int, c_int64, c_uint8, c_uint16, c_uint64, c_void_p, py_object
from typing import Any, Optional

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


def view(obj: Any, what: str) -> np.ndarray:
    """A NumPy array over the memory of ``obj`` (an object with ``__dlpack__``), zero-copy."""
    device = _device_of(obj)
    if device is not None and device not in _CPU_DEVICES:
        kind = "a CUDA device" if device in _CUDA_DEVICES else f"DLPack device type {device}"
        raise DistUnavailableError(
            f"{what}: the tensor is on {kind}; the Python package reads and writes host memory only "
            f"for now (move it to the CPU, e.g. tensor.cpu())"
        )
    try:
        capsule = obj.__dlpack__()
    except BufferError as e:  # e.g. a read-only NumPy array, which DLPack cannot mark
        raise DistInvalidArgument(f"{what}: cannot be exported through DLPack: {e}") from None
    except TypeError as e:
        raise DistInvalidArgument(f"{what}: its __dlpack__ failed: {e}") from None
    if not _is_valid(capsule, b"dltensor"):
        raise DistInvalidArgument(f"{what}: __dlpack__ did not return an unused DLPack capsule")
    managed = _DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor"))
    t = managed.dl_tensor
    if t.device.device_type not in _CPU_DEVICES:
        raise DistUnavailableError(f"{what}: the tensor is not in host memory (DLPack device type {t.device.device_type})")
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
    if count == 0 or not t.data:
        return np.empty(shape, dtype)
    if any(s < 0 for s, n in zip(strides, shape) if n > 1):
        raise DistInvalidArgument(f"{what}: negative strides are not supported (pass a contiguous tensor)")
    span = item + sum(s * (n - 1) for s, n in zip(strides, shape))
    buf = (ctypes.c_char * span).from_address(t.data + t.byte_offset)
    # The view's base is `buf`, which holds the capsule: the tensor lives as long as the view.
    buf._distcomm_capsule = capsule  # type: ignore[attr-defined]
    buf._distcomm_owner = obj  # type: ignore[attr-defined]
    return np.ndarray(shape, dtype=dtype, buffer=buf, strides=strides)
