"""torch's dtypes, reduction ops and tensors, checked and mapped to the library's codes.

Every check runs before anything is sent, so a bad argument on one rank fails that rank's call
at once (the other ranks then wait for it until their timeout, as with Gloo).
"""

from typing import Optional, Sequence, Tuple

import torch
import torch.distributed as tdist

from ._errors import invalid, unavailable

#: torch dtype -> the library's dc_dtype (include/distcomm.h).
DTYPES = {
    torch.int8: 0,
    torch.uint8: 1,
    torch.int32: 2,
    torch.int64: 4,
    torch.float16: 6,
    torch.float32: 7,
    torch.float64: 8,
    torch.bfloat16: 9,
    torch.bool: 1,  # one byte; reductions are mapped to logical ones in reduce_op()
}
for _name, _code in (("uint32", 3), ("uint64", 5)):  # torch >= 2.3
    if hasattr(torch, _name):
        DTYPES[getattr(torch, _name)] = _code
U8 = 1
FLOATING = {6, 7, 8, 9}
_SUPPORTED = "float16, bfloat16, float32, float64, int8, uint8, int32, int64, uint32, uint64, bool"

_R = tdist.ReduceOp.RedOpType
#: torch's ReduceOp -> dc_op
OPS = {_R.SUM: 0, _R.PRODUCT: 1, _R.MAX: 2, _R.MIN: 3, _R.AVG: 4, _R.BAND: 5, _R.BOR: 6, _R.BXOR: 7}
SUM, MAX, MIN, AVG = 0, 2, 3, 4
_COMPLEX_PARTS = {torch.complex64: 7, torch.complex128: 8, torch.complex32: 6}
_STRIDED = torch.strided
_REDUCE_OP = tdist.ReduceOp
_SUM_OP = tdist.ReduceOp.SUM
#: dtypes whose SUM needs no mapping (not bool, not complex): the common case, decided without
#: looking into the ReduceOp (its enum is slow to read and to hash).
_PLAIN_SUM = frozenset(d for d in DTYPES if d is not torch.bool)


def check_tensor(t: object, what: str, written: bool) -> torch.Tensor:
    """A dense CPU or CUDA tensor the library can use in place; `written`: results land in it,
    so it must be contiguous (inputs that are not are copied by the caller). Whether a CUDA
    tensor suits the group (NCCL, its GPU) is the backend's check (DistcommBackend._place)."""
    # Cheap attributes first (t.device builds an object): this runs on every call.
    if not isinstance(t, torch.Tensor):
        raise invalid(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu and not t.is_cuda:
        raise unavailable(f"{what} is on device {t.device}; distcomm takes CPU and CUDA tensors")
    if t.layout is not _STRIDED:
        raise invalid(f"{what}: layout {t.layout} is not supported (dense tensors only)")
    if written and not t.is_contiguous():
        raise invalid(
            f"{what} is not contiguous (strides {tuple(t.stride())}); results are written in "
            "place, so pass a contiguous tensor (tensor.contiguous() makes one)"
        )
    return t


def move_dtype(t: torch.Tensor, what: str) -> Tuple[int, int]:
    """(dc_dtype, element count) for moving `t`'s bytes: any dtype, as bytes when the library
    has no code for it (complex, int16, float8 ...)."""
    code = DTYPES.get(t.dtype)
    if code is None:
        return U8, t.numel() * t.element_size()
    return code, t.numel()


def reduce_dtype(t: torch.Tensor, what: str) -> Tuple[int, int, int]:
    """(dc_dtype, element count, elements per torch element) for reducing `t`. Complex
    tensors reduce as pairs of floats (right for SUM and AVG only: the caller checks)."""
    code = DTYPES.get(t.dtype)
    if code is not None:
        return code, t.numel(), 1
    real = _COMPLEX_PARTS.get(t.dtype)
    if real is not None:
        return real, t.numel() * 2, 2
    raise invalid(f"{what}: dtype {t.dtype} cannot be reduced by distcomm (supported: {_SUPPORTED})")


def reduce_op(op: object, t: torch.Tensor, what: str) -> Tuple[int, Optional[float]]:
    """(dc_op, pre-multiplier or None) for torch's ReduceOp on `t`'s dtype."""
    if type(op) is _REDUCE_OP and op == _SUM_OP and t.dtype in _PLAIN_SUM:
        return SUM, None
    kind = getattr(op, "op", op)
    factor = None
    if kind == _R.PREMUL_SUM:
        factor = _premul_factor(op, what)
        if not t.is_floating_point() and not t.is_complex():
            raise invalid(f"{what}: ReduceOp.PREMUL_SUM needs a floating-point tensor, got {t.dtype}")
        return SUM, factor
    code = OPS.get(kind)
    if code is None:
        raise invalid(f"{what}: ReduceOp {kind} is not supported by distcomm")
    if t.is_complex() and code not in (SUM, AVG):
        raise invalid(f"{what}: ReduceOp.{kind.name} is not defined for complex tensors (SUM, AVG and PREMUL_SUM are)")
    if t.dtype == torch.bool:
        # As ProcessGroupNCCL does: a bool sum is a logical or, a product a logical and, so that
        # every byte stays 0 or 1.
        if code == AVG:
            raise invalid(f"{what}: ReduceOp.AVG is not defined for bool tensors")
        code = {SUM: MAX, 1: MIN}.get(code, code)
    elif code in (5, 6, 7) and (t.is_floating_point() or t.is_complex()):
        raise invalid(f"{what}: ReduceOp.{kind.name} needs an integer or bool tensor, got {t.dtype}")
    return code, factor


def _premul_factor(op: object, what: str) -> float:
    f = getattr(op, "factor", None)
    if isinstance(f, torch.Tensor):
        if f.numel() != 1:
            raise invalid(f"{what}: a PREMUL_SUM factor must be one number, got a tensor of {f.numel()} elements")
        return float(f.item())
    if isinstance(f, (int, float)):
        return float(f)
    raise invalid(f"{what}: ReduceOp.PREMUL_SUM without a readable factor cannot be honoured")


def same_shape(ref: torch.Tensor, others: Sequence[torch.Tensor], what: str, ref_what: str) -> None:
    for i, o in enumerate(others):
        if o.dtype != ref.dtype:
            raise invalid(f"{what}[{i}] has dtype {o.dtype}, {ref_what} has {ref.dtype}")
        if o.numel() != ref.numel():
            raise invalid(f"{what}[{i}] has {o.numel()} elements, {ref_what} has {ref.numel()}")


def one(tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    """The single tensor of a list argument (torch passes lists for multi-device forms)."""
    if len(tensors) != 1:
        raise invalid(f"{what}: expected one tensor (one device per process), got {len(tensors)}")
    return tensors[0]
