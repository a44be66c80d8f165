"""distcomm as a torch.distributed backend.

::

    import torch.distributed as dist
    import distcomm.torch  # registers the backend "distcomm" for CPU and CUDA tensors

    dist.init_process_group("distcomm")   # env://, tcp://, file://, torchrun: unchanged
    model = torch.nn.parallel.DistributedDataParallel(model)

Every group (the default one and each ``new_group(..., backend="distcomm")``) gets its own
distcomm communicator, formed through the store torch hands the backend (see ``_rendezvous``).
Operations start the library's non-blocking calls and return Work objects whose futures
complete on their own. CUDA tensors go through the library's NCCL path, on torch's current
stream, when the group's communicator has one (the library's "auto" choice: NCCL is loadable
and every rank has a GPU of its own, the one current when the group is made); otherwise they are
refused with a clear error, and ``"cpu:distcomm,cuda:nccl"`` mixes the two.
"""

import ctypes
import datetime
from typing import Any, Optional

import torch
import torch.distributed as _dist
from torch._C._distributed_c10d import ProcessGroup as _ProcessGroup

from .. import _lib
from . import _errors
from . import _native
from ._backend import DistcommBackend
from ._errors import DistcommError, DistcommInvalidArgument, DistcommTimeoutError, DistcommUnavailableError
from ._rendezvous import comm_int, init_comm
from ._work import Work

__all__ = [
    "BACKEND_NAME",
    "DistcommBackend",
    "Work",
    "DistcommError",
    "DistcommInvalidArgument",
    "DistcommTimeoutError",
    "DistcommUnavailableError",
    "backend_of",
    "recv_any",
]

BACKEND_NAME = "distcomm"


def _timeout_ms(timeout: Optional[datetime.timedelta]) -> int:
    if timeout is None:
        return 0
    return max(1, int(timeout.total_seconds() * 1000))


def _create(opts: Any, backend_options: Any = None) -> Any:
    """torch's creator hook (extended API): one distcomm communicator per torch group, as the
    native backend over the Python one where the native one is available (see _native)."""
    rank, size = int(opts.group_rank), int(opts.group_size)
    name = str(opts.group_id or "default")
    h = init_comm(opts.store, rank, size, _timeout_ms(opts.timeout), f"torch-{name}")
    lib = _lib.load()
    if comm_int(lib.dc_comm_rank, h) != rank or comm_int(lib.dc_comm_size, h) != size:
        lib.dc_comm_destroy(h)
        raise _errors.BY_CLASS[_errors.dc.DistInternalError](f"torch group {name}: distcomm formed another rank or size")
    b = DistcommBackend(h, rank, size, opts.timeout or datetime.timedelta(minutes=30), name)
    if isinstance(b, _ProcessGroup):
        b._set_group_name(name)  # torch names the groups it makes itself, not ours
        return b
    # DISTCOMM_TORCH_NATIVE is read as each group is made (a Python-only group beside native ones).
    native = _native.module() if _native.mode() != "off" else None
    if native is None:
        return b
    return native.NativeBackend(b, ctypes.addressof(b._hcell), rank, size)


def backend_of(group: Any = None) -> DistcommBackend:
    """The DistcommBackend of a torch group (default: the world), for what torch's front end
    does not pass through (see recv_any)."""
    pg = group if group is not None else _dist.group.WORLD
    if pg is None:
        raise _errors.BY_CLASS[_errors.dc.DistInvalidUsage]("the default process group is not initialised")
    if isinstance(pg, DistcommBackend):  # torch releases where the backend is the group itself
        return pg
    b = pg._get_backend(torch.device("cpu"))
    b = getattr(b, "python", b)  # the native backend wraps the Python one
    if not isinstance(b, DistcommBackend):
        raise _errors.invalid(f"the group's CPU backend is {b.getBackendName() if hasattr(b, 'getBackendName') else type(b).__name__}, not distcomm")
    return b


def recv_any(tensor: torch.Tensor, group: Any = None, tag: int = 0) -> int:
    """``dist.recv(tensor)`` without ``src``: receives from any rank and returns the sender's
    global rank. (torch 2.15's front end cannot ask a backend written in Python for the sender:
    the Work it hands back does not forward ``_source_rank()``.)"""
    pg = group if group is not None else _dist.group.WORLD
    work = backend_of(pg).recv_anysource([tensor], tag)
    work.wait()
    return _dist.get_global_rank(pg, work.source_rank()) if pg is not _dist.group.WORLD else work.source_rank()


def _register() -> None:
    if BACKEND_NAME.upper() in getattr(_dist.Backend, "_plugins", {}):
        return
    _dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


_register()
