"""torch.distributed's API over libdistcomm, on NumPy arrays.

Conventions (as in torch.distributed):

* Ranks in ``src``/``dst`` arguments are *global* ranks (ranks of the world group), also when a
  ``group`` is given; they are translated to the group's ranks here.
* Calling a collective on a group the caller is not a member of does nothing and returns None
  (with a RuntimeWarning).
* ``async_op=True`` (or paddle's ``sync_op=False``) returns a :class:`Work`; the arrays passed in
  are kept alive until it completes, and must not be touched until then.
* "Tensors" are NumPy arrays, tensors of any framework (anything with ``__dlpack__``: PyTorch,
  JAX, CuPy, Paddle; bfloat16 and float16 included), or any object with
  ``__array_interface__`` or the buffer protocol, all used in place without a copy. Tensors
  written to (outputs, and the in-place arguments of all_reduce, broadcast, ...) must be
  C-contiguous and writable; host tensors only read may have any layout (copied when not
  contiguous). Tensors on a CUDA device go through the library's NCCL path when the group has
  one (see :func:`get_backend`); they must be contiguous, and a call takes all its tensors on the
  device or all on the host (list forms that would need a staging buffer take host memory only).
* Bad arguments raise :class:`DistInvalidArgument` (a ValueError) before anything is sent.

Like the C API, a group is used by one thread at a time; different groups may be used from
different threads at once, and a :class:`Work` may be waited on from any thread.
"""

import atexit
import ctypes
import datetime
import enum
import math
import os
import pickle
import sys
import threading
import time
import warnings
import weakref
from ctypes import byref, c_bool, c_char_p, c_int32, c_size_t, c_void_p
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from . import _dlpack
from ._errors import (
    DistAbortedError,
    DistError,
    DistInvalidArgument,
    DistInvalidUsage,
    DistMismatchError,
    DistTimeoutError,
    DistUnavailableError,
    error_for_status,
)

Timeout = Union[datetime.timedelta, float, int, None]

__all__ = [
    "ReduceOp",
    "Backend",
    "ProcessGroup",
    "GroupMember",
    "group",
    "Work",
    "P2POp",
    "is_available",
    "is_initialized",
    "is_gloo_available",
    "is_nccl_available",
    "is_mpi_available",
    "init_process_group",
    "init_parallel_env",
    "destroy_process_group",
    "abort",
    "new_group",
    "get_rank",
    "get_world_size",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "barrier",
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "alltoall",
    "alltoall_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "all_gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "gather_object",
    "send_object_list",
    "recv_object_list",
    "library_path",
    "library_version",
]


# ---------------------------------------------------------------------------------------------
# Reduction ops, backends, dtypes
# ---------------------------------------------------------------------------------------------


class ReduceOp(enum.IntEnum):
    """Reduction operators (values are the library's ``DC_SUM`` ... ``DC_BXOR``).

    ``AVG`` on integers truncates toward zero; ``BAND``/``BOR``/``BXOR`` need integer arrays.
    ``PROD`` is paddle's name for ``PRODUCT``.
    """

    SUM = 0
    PRODUCT = 1
    MAX = 2
    MIN = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PROD = 1  # alias (paddle)


class Backend(str):
    """Backend names accepted by :func:`init_process_group`.

    ``"gloo"`` (torch's CPU backend) means distcomm's automatic choice, as does ``None``.
    """

    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"
    AUTO = "auto"
    SOCKET = "socket"
    SHM = "shm"


_DC_DTYPES = {
    ("i", 1): 0,
    ("u", 1): 1,
    ("i", 4): 2,
    ("u", 4): 3,
    ("i", 8): 4,
    ("u", 8): 5,
    ("f", 2): 6,
    ("f", 4): 7,
    ("f", 8): 8,
}
DC_BFLOAT16 = 9
try:  # bfloat16 is optional: NumPy has none of its own
    import ml_dtypes as _ml_dtypes

    _BF16: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except Exception:  # pragma: no cover - depends on what is installed
    _BF16 = None

_SUPPORTED = "int8, uint8, int32, uint32, int64, uint64, float16, float32, float64" + (
    ", bfloat16" if _BF16 is not None else " (bfloat16 with ml_dtypes installed)"
)
_FLOATING = {6, 7, 8, DC_BFLOAT16}


def _dc_dtype(dt: np.dtype, what: str) -> int:
    if (_BF16 is not None and dt == _BF16) or (dt.metadata or {}).get("distcomm") == "bfloat16":
        return DC_BFLOAT16
    code = _DC_DTYPES.get((dt.kind, dt.itemsize))
    if code is None or not dt.isnative:
        raise DistInvalidArgument(f"{what}: dtype {dt} is not supported (supported: {_SUPPORTED})")
    return code


def _reduce_op(op: Any, dtype_code: int) -> int:
    if isinstance(op, bool) or not isinstance(op, (int, np.integer)):
        raise DistInvalidArgument(f"op {op!r} is not a ReduceOp")
    try:
        op = ReduceOp(int(op))
    except ValueError:
        raise DistInvalidArgument(f"op {op!r} is not a ReduceOp (0..7)") from None
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and dtype_code in _FLOATING:
        raise DistInvalidArgument(f"ReduceOp.{op.name} needs an integer dtype")
    return int(op)


# ---------------------------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------------------------


def _as_array(obj: Any, what: str) -> np.ndarray:
    """A NumPy view of `obj`'s memory, never a copy: an array as it is, a tensor of any framework
    through DLPack (``__dlpack__``), anything else through ``__array_interface__`` or the buffer
    protocol."""
    if isinstance(obj, np.ndarray):
        return obj
    if _dlpack.has_dlpack(obj):
        return _dlpack.view(obj, what)
    if hasattr(obj, "__array_interface__"):
        return np.asarray(obj)
    try:
        view = memoryview(obj)
    except TypeError:
        raise DistInvalidArgument(
            f"{what}: expected a tensor or array (an object with __dlpack__, __array_interface__ "
            f"or the buffer protocol), got {type(obj).__name__}"
        ) from None
    return np.asarray(view)


def _out(obj: Any, what: str) -> Tuple[np.ndarray, int]:
    """An array the library writes into: C-contiguous and writable. Returns (array, dtype code)."""
    a = _as_array(obj, what)
    code = _dc_dtype(a.dtype, what)
    if not a.flags.c_contiguous:
        raise DistInvalidArgument(
            f"{what}: the array is not C-contiguous; results are written in place, so pass a "
            f"contiguous array (numpy.ascontiguousarray makes one)"
        )
    if not a.flags.writeable:
        raise DistInvalidArgument(f"{what}: the array is read-only, but results are written into it")
    return a, code


def _in(obj: Any, what: str) -> Tuple[np.ndarray, int]:
    """An array the library only reads (host arrays are copied when not C-contiguous)."""
    a = _as_array(obj, what)
    code = _dc_dtype(a.dtype, what)
    if not a.flags.c_contiguous:
        if isinstance(a, _dlpack.DeviceArray):
            raise DistInvalidArgument(f"{what}: the CUDA tensor is not contiguous (strides {a.strides}); pass a contiguous one")
        a = np.ascontiguousarray(a)
    return a, code


def _device_arrays(keep: Any) -> Tuple[int, int]:
    """(CUDA arrays, non-empty host arrays) among what a call keeps alive."""
    if isinstance(keep, _dlpack.DeviceArray):
        return 1, 0
    if isinstance(keep, np.ndarray):
        return 0, int(keep.size > 0)
    dev = host = 0
    if isinstance(keep, (list, tuple)):
        for k in keep:
            d, h = _device_arrays(k)
            dev, host = dev + d, host + h
    return dev, host


def _check_memory(pg: "ProcessGroup", keep: Any, fn: str) -> None:
    """CUDA memory needs the group's NCCL communicator: without one the library would take its
    addresses for host memory. Checked before anything is sent."""
    dev, host = _device_arrays(keep)
    if not dev:
        return
    backend = get_backend(pg)
    if backend != "nccl":
        raise DistUnavailableError(
            f"{fn}: a tensor is on a CUDA device, but {pg!r} has no NCCL communicator (transport "
            f"{backend!r}): that needs libnccl.so.2 and a GPU of its own for every rank; move the "
            "tensor to the host")
    if host:
        raise DistInvalidArgument(
            f"{fn}: the call mixes CUDA tensors and host arrays (list arguments that are not views "
            "of one buffer are staged in host memory); pass all on the device, as one tensor "
            "(e.g. all_gather_into_tensor), or all on the host")


def _ptr(a: Optional[np.ndarray]) -> Optional[int]:
    return None if a is None else a.ctypes.data


def _same(ref: np.ndarray, other: np.ndarray, what: str, ref_what: str) -> None:
    if other.dtype != ref.dtype:
        raise DistInvalidArgument(f"{what} has dtype {other.dtype}, {ref_what} has {ref.dtype}")
    if other.size != ref.size:
        raise DistInvalidArgument(f"{what} has {other.size} elements, {ref_what} has {ref.size}")


def _list(obj: Any, what: str) -> list:
    if not isinstance(obj, (list, tuple)):
        raise DistInvalidArgument(f"{what}: expected a list, got {type(obj).__name__}")
    return obj  # type: ignore[return-value]


def _sizes(n: int, counts: Sequence[int]) -> "ctypes.Array[c_size_t]":
    return (c_size_t * max(n, 1))(*counts)


def _displs(counts: Sequence[int]) -> List[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def _is_async(async_op: bool, sync_op: Optional[bool]) -> bool:
    return bool(async_op) or sync_op is False


# ---------------------------------------------------------------------------------------------
# Process groups
# ---------------------------------------------------------------------------------------------


class ProcessGroup:
    """A group of ranks with its own communicator (``dc_comm``).

    ``rank()`` and ``size()`` are this process's rank in the group and the group's size;
    ``ranks`` lists the group's members as global ranks, in group-rank order.
    """

    def __init__(self, handle: int, ranks: Sequence[int], rank: int, name: str, is_world: bool = False):
        self._handle: Optional[int] = handle
        self._ranks: Tuple[int, ...] = tuple(ranks)
        self._index = {g: i for i, g in enumerate(self._ranks)}
        self._rank = rank
        self._name = name
        self._is_world = is_world
        self._backend: Optional[str] = None

    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return len(self._ranks)

    @property
    def ranks(self) -> List[int]:
        """The members as global ranks, in group-rank order."""
        return list(self._ranks)

    @property
    def group_name(self) -> str:
        return self._name

    def name(self) -> str:
        """The backend's name, as torch's ProcessGroup.name()."""
        return get_backend(self)

    def __repr__(self) -> str:
        state = "" if self._handle is not None else ", destroyed"
        return f"ProcessGroup(name={self._name!r}, rank={self._rank}, ranks={list(self._ranks)}{state})"

    # -- internal --

    def _h(self) -> int:
        if self._handle is None:
            raise DistInvalidUsage(f"{self!r} has been destroyed")
        return self._handle

    def _group_rank(self, global_rank: Any, what: str) -> int:
        if isinstance(global_rank, bool) or not isinstance(global_rank, (int, np.integer)):
            raise DistInvalidArgument(f"{what} must be an int (a global rank), got {global_rank!r}")
        g = int(global_rank)
        world = _world()
        if not 0 <= g < world.size():
            raise DistInvalidArgument(f"{what} {g} is outside [0, {world.size()}) (the world's ranks)")
        r = self._index.get(g)
        if r is None:
            raise DistInvalidArgument(f"{what} {g} is not a member of {self!r}")
        return r

    def _destroy(self) -> None:
        h, self._handle = self._handle, None
        if h is not None:
            _lib.check(_lib.load().dc_comm_destroy(h), "dc_comm_destroy")


class _NonGroupMember:
    """What :func:`new_group` returns on ranks that are not in the new group."""

    def rank(self) -> int:
        return -1

    def size(self) -> int:
        return -1

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


class GroupMember:
    """``GroupMember.WORLD`` is the default group once initialised; ``NON_GROUP_MEMBER`` is
    what :func:`new_group` returns to ranks outside the new group."""

    WORLD: Optional[ProcessGroup] = None
    NON_GROUP_MEMBER = _NonGroupMember()


#: torch's ``dist.group.WORLD``.
group = GroupMember

_state_lock = threading.RLock()
_WORLD: Optional[ProcessGroup] = None
_GROUPS: List[ProcessGroup] = []
_INIT_PID: Optional[int] = None
_PENDING: "set[Work]" = set()
_atexit_registered = False


def _world() -> ProcessGroup:
    w = _WORLD
    if w is None:
        raise DistInvalidUsage(
            "the default process group is not initialised: call init_process_group() first"
        )
    if _INIT_PID != os.getpid():
        raise DistInvalidUsage(
            f"the process group was initialised in process {_INIT_PID}; a forked child "
            "cannot use it (call init_process_group in the child, or use the 'spawn' start method)"
        )
    return w


def _resolve(grp: Any, what: str = "") -> Optional[ProcessGroup]:
    """The ProcessGroup for a ``group`` argument; None when this rank is not a member."""
    world = _world()
    _reap()
    if grp is None:
        return world
    if isinstance(grp, _NonGroupMember):
        if what:
            warnings.warn(
                f"{what}: this rank (global rank {world.rank()}) is not in the given group; "
                "nothing was done",
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    if isinstance(grp, ProcessGroup):
        grp._h()
        return grp
    raise DistInvalidArgument(f"group must be a ProcessGroup (or None), got {type(grp).__name__}")


def _timeout_ms(timeout: Timeout) -> int:
    if timeout is None:
        return 0
    if isinstance(timeout, datetime.timedelta):
        secs = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        secs = float(timeout)
    else:
        raise DistInvalidArgument(f"timeout must be a datetime.timedelta or seconds, got {timeout!r}")
    if not secs > 0 or math.isinf(secs):
        raise DistInvalidArgument(f"timeout must be positive and finite, got {timeout!r}")
    return min(int(math.ceil(secs * 1000.0)), 2**62)


def _backend_arg(backend: Optional[str]) -> Optional[str]:
    if backend is None:
        return None
    b = str(backend).strip().lower()
    if ":" in b:  # torch's "cpu:gloo,cuda:nccl": the CPU entry (arrays live in host memory)
        pairs = dict(p.split(":", 1) for p in b.split(",") if ":" in p)
        b = pairs.get("cpu", next(iter(pairs.values()), ""))
    if b in ("", "auto", "gloo"):
        return None
    if b in ("socket", "shm", "nccl"):
        return b
    raise DistUnavailableError(
        f"backend {backend!r} is not part of distcomm (use None/'gloo'/'auto', 'socket', 'shm' or 'nccl')"
    )


def _comm_int(fn: Callable, h: int) -> int:
    v = c_int32()
    _lib.check(fn(h, byref(v)))
    return v.value


def is_available() -> bool:
    """True when libdistcomm can be loaded (see :func:`library_path` for where it was found)."""
    try:
        _lib.load()
        return True
    except DistError:
        return False


def is_initialized() -> bool:
    """True between :func:`init_process_group` and :func:`destroy_process_group`."""
    return _WORLD is not None and _INIT_PID == os.getpid()


def is_gloo_available() -> bool:
    """True: ``"gloo"`` is accepted and means distcomm's CPU transports."""
    return is_available()


def is_nccl_available() -> bool:
    """False: this build of distcomm has no NCCL support."""
    return False


def is_mpi_available() -> bool:
    """False: distcomm does not use MPI (but runs under mpirun; see the README)."""
    return False


def library_path() -> str:
    """Path of the loaded libdistcomm."""
    return _lib.library_path()


def library_version() -> Tuple[int, int, int]:
    """The library's version as (major, minor, patch)."""
    v = int(_lib.load().dc_version())
    return (v // 10000, v // 100 % 100, v % 100)


def init_process_group(
    backend: Optional[str] = None,
    init_method: Optional[str] = None,
    timeout: Timeout = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: Optional[str] = None,
    pg_options: Any = None,
    device_id: Any = None,
    *,
    token: Optional[str] = None,
    encrypt: Optional[bool] = None,
) -> None:
    """Joins the job and creates the default (world) group; blocks until every rank has joined.

    Arguments follow ``torch.distributed.init_process_group`` (same order):

    * ``backend``: None, ``"gloo"`` or ``"auto"`` (distcomm picks the transport), ``"socket"``,
      ``"shm"`` or ``"nccl"`` (those two fail with DistUnavailableError in builds without them).
    * ``init_method``: ``"env://"`` (default: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
      ``WORLD_SIZE`` or a launcher's variables), ``"tcp://HOST:PORT"`` or ``"file:///PATH"``.
    * ``timeout``: a ``datetime.timedelta`` or seconds, for the rendezvous and every later
      blocking call (default ``DC_TIMEOUT_MS`` or 300 s).
    * ``world_size``, ``rank``: -1 reads them from the environment.
    * ``group_name``: keeps several jobs sharing one store or file apart.
    * ``store`` is not supported (pass ``init_method``); ``pg_options`` and ``device_id`` are
      ignored.
    * ``token`` (keyword only): the job's secret, the same on every rank (default
      ``DC_TOKEN``); ``encrypt``: encrypt the connections between hosts (default
      ``DC_ENCRYPT=1``); every rank must say the same.

    Raises DistInvalidUsage when already initialised, and the library's errors
    (DistTimeoutError naming missing ranks, DistRendezvousError, DistInvalidArgument naming a
    bad variable, ...).
    """
    global _WORLD, _INIT_PID, _atexit_registered
    if store is not None:
        raise DistUnavailableError("store objects are not supported: pass init_method (env://, tcp://, file://)")
    b = _backend_arg(backend)
    ms = _timeout_ms(timeout)
    for name, v in (("rank", rank), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -1 <= int(v) < 2**31:
            raise DistInvalidArgument(f"{name} must be an int >= -1, got {v!r}")
    if encrypt is not None and not isinstance(encrypt, bool):
        raise DistInvalidArgument(f"encrypt must be None, True or False, got {encrypt!r}")
    if token is not None and not isinstance(token, str):
        raise DistInvalidArgument(f"token must be a str, got {type(token).__name__}")
    lib = _lib.load()
    with _state_lock:
        if is_initialized():
            raise DistInvalidUsage("init_process_group was already called; call destroy_process_group() first")
        opts = _lib.InitOptions()
        lib.dc_init_options_default(byref(opts))
        opts.init_method = init_method.encode() if init_method else None
        opts.backend = b.encode() if b else None
        opts.rank = int(rank)
        opts.world_size = int(world_size)
        opts.group_name = group_name.encode() if group_name else None
        opts.timeout_ms = ms
        opts.token = token.encode() if token else None
        opts.encrypt = -1 if encrypt is None else int(encrypt)
        h = c_void_p()
        _lib.check(lib.dc_init(byref(opts), byref(h)), "dc_init")
        r = _comm_int(lib.dc_comm_rank, h.value)
        n = _comm_int(lib.dc_comm_size, h.value)
        _WORLD = ProcessGroup(h.value, range(n), r, group_name or "default", is_world=True)
        _GROUPS.clear()
        _INIT_PID = os.getpid()
        GroupMember.WORLD = _WORLD
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True


def init_parallel_env() -> ProcessGroup:
    """paddle.distributed.init_parallel_env: initialises from the environment (if not done
    yet) and returns the world group."""
    if not is_initialized():
        init_process_group()
    return _world()


def new_group(
    ranks: Optional[Iterable[int]] = None,
    timeout: Timeout = None,
    backend: Optional[str] = None,
    pg_options: Any = None,
    **kwargs: Any,
) -> Union[ProcessGroup, _NonGroupMember]:
    """Creates a group of the given global ranks (all ranks when None).

    Collective over the world: every rank calls it, in the same order, with the same ranks, also
    the ranks that are not in the new group. As in torch, the ranks are sorted: group rank i is
    the i-th smallest global rank. Ranks outside the group get ``GroupMember.NON_GROUP_MEMBER``.
    ``timeout`` sets the group's timeout; ``backend`` and ``pg_options`` are ignored.
    """
    world = _world()
    _reap()
    n = world.size()
    if ranks is None:
        members = list(range(n))
    else:
        try:
            members = list(ranks)
        except TypeError:
            raise DistInvalidArgument(f"ranks must be a list of global ranks, got {ranks!r}") from None
        for r in members:
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= int(r) < n:
                raise DistInvalidArgument(f"rank {r!r} in ranks is not a global rank in [0, {n})")
        members = sorted(int(r) for r in members)
        if len(set(members)) != len(members):
            raise DistInvalidArgument(f"ranks {members} has duplicates")
        if not members:
            raise DistInvalidArgument("ranks is empty")
    ms = _timeout_ms(timeout)
    lib = _lib.load()
    arr = (c_int32 * len(members))(*members)
    out = c_void_p()
    _lib.check(lib.dc_comm_new_group(world._h(), arr, len(members), byref(out)), "dc_comm_new_group")
    if not out.value:
        return GroupMember.NON_GROUP_MEMBER
    r = _comm_int(lib.dc_comm_rank, out.value)
    pg = ProcessGroup(out.value, members, r, f"group{len(_GROUPS) + 1}")
    if ms:
        _lib.check(lib.dc_comm_set_timeout(out.value, ms))
    with _state_lock:
        _GROUPS.append(pg)
    return pg


def destroy_process_group(group: Any = None) -> None:
    """Destroys a group, or with None every group and the default group (after which
    :func:`init_process_group` may be called again). Pending non-blocking collectives on a group
    are completed first. Not collective."""
    global _WORLD
    with _state_lock:
        world = _world()
        if isinstance(group, _NonGroupMember):
            return
        if group is None or group is world:
            errors = []
            for pg in reversed(_GROUPS):
                try:
                    pg._destroy()
                except DistError as e:
                    errors.append(e)
            _GROUPS.clear()
            _WORLD = None
            GroupMember.WORLD = None
            world._destroy()
            if errors:
                raise errors[0]
            return
        if not isinstance(group, ProcessGroup):
            raise DistInvalidArgument(f"group must be a ProcessGroup (or None), got {type(group).__name__}")
        group._h()
        if group in _GROUPS:
            _GROUPS.remove(group)
        group._destroy()


def abort(group: Any = None) -> None:
    """Aborts a group (None: the world and every group): every pending and later operation on it
    fails with DistAbortedError, here and on its peers. Callable from any thread, also while
    another thread is blocked in a call. Destroy the group afterwards."""
    pg = _world() if group is None else group
    if isinstance(pg, _NonGroupMember):
        return
    if not isinstance(pg, ProcessGroup):
        raise DistInvalidArgument(f"group must be a ProcessGroup (or None), got {type(pg).__name__}")
    _lib.check(_lib.load().dc_comm_abort(pg._h()), "dc_comm_abort")


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (default: the world); -1 if it is not a member."""
    pg = _resolve(group)
    return -1 if pg is None else pg.rank()


def get_world_size(group: Any = None) -> int:
    """The number of ranks in ``group`` (default: the world); -1 if this rank is not a member."""
    pg = _resolve(group)
    return -1 if pg is None else pg.size()


def get_backend(group: Any = None) -> str:
    """The transport the group uses, as the library names it (``"socket"``, ``"shm"``, ...)."""
    pg = _resolve(group)
    if pg is None:
        raise DistInvalidArgument("this rank is not a member of the group")
    if pg._backend is None:
        name = c_char_p()
        _lib.check(_lib.load().dc_comm_backend(pg._h(), byref(name)))
        pg._backend = (name.value or b"").decode()
    return pg._backend


def get_global_rank(group: Any, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group``."""
    pg = _resolve(group)
    if pg is None:
        raise DistInvalidArgument("this rank is not a member of the group")
    if isinstance(group_rank, bool) or not isinstance(group_rank, (int, np.integer)) or not 0 <= group_rank < pg.size():
        raise DistInvalidArgument(f"group_rank {group_rank!r} is outside [0, {pg.size()})")
    return pg._ranks[int(group_rank)]


def get_group_rank(group: Any, global_rank: int) -> int:
    """The rank in ``group`` of ``global_rank``."""
    pg = _resolve(group)
    if pg is None:
        raise DistInvalidArgument("this rank is not a member of the group")
    return pg._group_rank(global_rank, "global_rank")


def get_process_group_ranks(group: Any) -> List[int]:
    """The global ranks of ``group``'s members, in group-rank order."""
    pg = _resolve(group)
    if pg is None:
        raise DistInvalidArgument("this rank is not a member of the group")
    return pg.ranks


# ---------------------------------------------------------------------------------------------
# Work: a non-blocking operation
# ---------------------------------------------------------------------------------------------


class Work:
    """A pending non-blocking operation (``async_op=True``).

    It keeps the arrays of the operation alive until it completes. ``wait()`` blocks until it
    completes (raising its error, if any); ``is_completed()`` never blocks. After completion the
    outputs hold their results (list outputs are filled in when completion is noticed: by
    ``wait()``, by ``is_completed()`` returning True, or by the next call into the package).
    """

    def __init__(
        self,
        req: int,
        pg: ProcessGroup,
        keep: Tuple[Any, ...],
        finish: Optional[Callable[[], None]],
        what: str,
        recv_count: Optional[int] = None,
        outputs: Optional[List[Any]] = None,
    ):
        self._req: Optional[int] = req
        self._pg = pg
        self._keep = keep
        self._finish = finish
        self._what = what
        self._recv_count = recv_count
        self._outputs = outputs or []
        self._error: Optional[BaseException] = None
        self._source = -1
        self._lock = threading.Lock()

    def _complete(self, status: Optional[int]) -> None:
        """Called with self._lock held once the request is known to have completed."""
        lib = _lib.load()
        req = self._req
        assert req is not None
        if status is None:
            status = lib.dc_request_wait(req)  # completed: returns at once
        if status != 0:
            self._error = error_for_status(status, _lib.last_error() or self._what)
        elif self._recv_count is not None:
            info = _lib.RecvInfo()
            _lib.check(lib.dc_request_recv_info(req, byref(info)))
            self._source = self._pg._ranks[info.source]
            if info.count != self._recv_count:
                self._error = DistMismatchError(
                    f"{self._what}: received {info.count} elements from rank {self._source}, "
                    f"the array holds {self._recv_count}"
                )
        lib.dc_request_free(req)
        self._req = None
        if self._error is None and self._finish is not None:
            try:
                self._finish()
            except BaseException as e:  # pragma: no cover - defensive
                self._error = e
        self._finish = None
        self._keep = ()
        _PENDING.discard(self)

    def is_completed(self) -> bool:
        """True once the operation has finished (successfully or not). Never blocks: while
        another thread is inside ``wait()``, this reports False until that wait returns."""
        if self._req is None:
            return True
        if not self._lock.acquire(blocking=False):
            return self._req is None
        try:
            if self._req is None:
                return True
            done = c_bool(False)
            _lib.check(_lib.load().dc_request_is_completed(self._req, byref(done)))
            if done.value:
                self._complete(None)
            return bool(done.value)
        finally:
            self._lock.release()

    def wait(self, timeout: Timeout = None) -> bool:
        """Blocks until the operation completes and returns True, or raises its error.

        ``timeout`` (timedelta or seconds) bounds this wait only: DistTimeoutError is raised
        when it passes, and the operation stays pending (it still ends by the group's timeout).
        """
        if timeout is not None:
            deadline = time.monotonic() + _timeout_ms(timeout) / 1000.0
            pause = 0.0001
            while not self.is_completed():
                if time.monotonic() >= deadline:
                    raise DistTimeoutError(f"{self._what}: Work.wait({timeout!r}) timed out; the operation is still pending")
                time.sleep(pause)
                pause = min(pause * 2, 0.01)
        with self._lock:
            if self._req is not None:
                self._complete(_lib.load().dc_request_wait(self._req))
        if self._error is not None:
            raise self._error
        return True

    def is_success(self) -> bool:
        """True when the operation completed without error."""
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        """The operation's error once completed, else None."""
        return self._error if self.is_completed() else None

    def source_rank(self) -> int:
        """For a completed receive: the global rank of the sender."""
        self.wait()
        if self._recv_count is None:
            raise DistInvalidUsage("source_rank() is only defined for receives")
        return self._source

    def result(self) -> List[Any]:
        """Waits, then returns the operation's output arrays."""
        self.wait()
        return list(self._outputs)

    def __repr__(self) -> str:
        state = "pending" if self._req is not None else ("failed" if self._error else "completed")
        return f"<Work {self._what} {state}>"


def _reap() -> None:
    """Notices finished non-blocking operations (fills list outputs, frees their requests)."""
    if _PENDING:
        for w in list(_PENDING):
            try:
                w.is_completed()
            except DistError:
                pass


def _run(
    pg: ProcessGroup,
    fn: str,
    args: Tuple[Any, ...],
    async_op: bool,
    keep: Tuple[Any, ...] = (),
    finish: Optional[Callable[[], None]] = None,
    outputs: Optional[List[Any]] = None,
) -> Optional[Work]:
    """Calls dc_<fn> (blocking) or dc_i<fn> (returning a Work). `keep` holds every array of
    the call."""
    _check_memory(pg, keep, fn)
    lib = _lib.load()
    if not async_op:
        _lib.check(getattr(lib, "dc_" + fn)(*args), "dc_" + fn)
        if finish is not None:
            finish()
        return None
    req = c_void_p()
    _lib.check(getattr(lib, "dc_i" + fn)(*args, byref(req)), "dc_i" + fn)
    w = Work(req.value, pg, keep, finish, fn, outputs=outputs)
    _PENDING.add(w)
    return w


# ---------------------------------------------------------------------------------------------
# Collectives on arrays
# ---------------------------------------------------------------------------------------------


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Returns when every rank of the group has entered the barrier."""
    pg = _resolve(group, "barrier")
    if pg is None:
        return None
    return _run(pg, "barrier", (pg._h(),), _is_async(async_op, sync_op))


def broadcast(tensor: Any, src: int, group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Copies ``src``'s array into ``tensor`` on every rank of the group (in place)."""
    pg = _resolve(group, "broadcast")
    if pg is None:
        return None
    root = pg._group_rank(src, "src")
    if root == pg.rank():
        a = _as_array(tensor, "tensor")
        code = _dc_dtype(a.dtype, "tensor")
        if not a.flags.c_contiguous:
            raise DistInvalidArgument("tensor: the array is not C-contiguous (use numpy.ascontiguousarray)")
    else:
        a, code = _out(tensor, "tensor")
    return _run(pg, "broadcast", (_ptr(a), a.size, code, root, pg._h()), _is_async(async_op, sync_op), keep=(a,), outputs=[a])


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Reduces ``tensor`` across the group with ``op``; every rank ends with the result in place
    (bitwise identical on every rank)."""
    pg = _resolve(group, "all_reduce")
    if pg is None:
        return None
    a, code = _out(tensor, "tensor")
    o = _reduce_op(op, code)
    p = _ptr(a)
    return _run(pg, "allreduce", (p, p, a.size, code, o, pg._h()), _is_async(async_op, sync_op), keep=(a,), outputs=[a])


def reduce(tensor: Any, dst: int, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Reduces ``tensor`` across the group into ``dst``'s ``tensor`` (in place there; the other
    ranks' arrays are left as they are)."""
    pg = _resolve(group, "reduce")
    if pg is None:
        return None
    root = pg._group_rank(dst, "dst")
    if root == pg.rank():
        a, code = _out(tensor, "tensor")
        recv = _ptr(a)
    else:
        a, code = _in(tensor, "tensor")
        recv = None
    o = _reduce_op(op, code)
    return _run(pg, "reduce", (_ptr(a), recv, a.size, code, o, root, pg._h()), _is_async(async_op, sync_op), keep=(a,), outputs=[a])


def _out_list(lst: Any, n: int, ref: np.ndarray, what: str, ref_what: str = "tensor", fill: bool = False) -> List[np.ndarray]:
    lst = _list(lst, what)
    if fill and len(lst) == 0 and isinstance(lst, list):
        # paddle: an empty output list is filled with new arrays
        lst.extend(np.empty_like(ref) for _ in range(n))
    if len(lst) != n:
        raise DistInvalidArgument(f"{what} has {len(lst)} entries, the group has {n} ranks")
    outs = []
    for i, t in enumerate(lst):
        a, _ = _out(t, f"{what}[{i}]")
        _host_only(a, f"{what}[{i}]")
        _same(ref, a, f"{what}[{i}]", ref_what)
        outs.append(a)
    return outs


def _host_only(a: Any, what: str) -> None:
    """List arguments are staged through one host buffer: refuse CUDA memory there."""
    if isinstance(a, _dlpack.DeviceArray):
        raise DistInvalidArgument(
            f"{what} is on a CUDA device; list arguments are staged in host memory, so pass one "
            "device tensor instead (all_gather_into_tensor, reduce_scatter_tensor, "
            "all_to_all_single) or host arrays")


def _in_list(lst: Any, n: int, ref: Optional[np.ndarray], what: str, ref_what: str) -> List[np.ndarray]:
    lst = _list(lst, what)
    if len(lst) != n:
        raise DistInvalidArgument(f"{what} has {len(lst)} entries, the group has {n} ranks")
    ins = []
    for i, t in enumerate(lst):
        a, _ = _in(t, f"{what}[{i}]")
        _host_only(a, f"{what}[{i}]")
        if ref is not None:
            _same(ref, a, f"{what}[{i}]", ref_what)
        ins.append(a)
    return ins


def _copy_rows(outs: List[np.ndarray], tmp: np.ndarray) -> Callable[[], None]:
    def finish() -> None:
        for i, o in enumerate(outs):
            np.copyto(o.reshape(-1), tmp[i])

    return finish


def all_gather(tensor_list: List[Any], tensor: Any, group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Gathers ``tensor`` from every rank into ``tensor_list`` (one array per rank, each with
    ``tensor``'s dtype and size). An empty list is filled with new arrays (paddle)."""
    pg = _resolve(group, "all_gather")
    if pg is None:
        return None
    a, code = _in(tensor, "tensor")
    outs = _out_list(tensor_list, pg.size(), a, "tensor_list", fill=True)
    tmp = np.empty((pg.size(), a.size), dtype=a.dtype)
    return _run(pg, "allgather", (_ptr(a), _ptr(tmp), a.size, code, pg._h()), _is_async(async_op, sync_op),
                keep=(a, tmp, outs), finish=_copy_rows(outs, tmp), outputs=outs)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Gathers ``input_tensor`` from every rank into ``output_tensor`` (size * input size
    elements, rank r's block at r * input size). No copies."""
    pg = _resolve(group, "all_gather_into_tensor")
    if pg is None:
        return None
    a, code = _in(input_tensor, "input_tensor")
    out, ocode = _out(output_tensor, "output_tensor")
    if out.dtype != a.dtype:
        raise DistInvalidArgument(f"output_tensor has dtype {out.dtype}, input_tensor has {a.dtype}")
    if out.size != a.size * pg.size():
        raise DistInvalidArgument(f"output_tensor has {out.size} elements, needs {pg.size()} x {a.size}")
    return _run(pg, "allgather", (_ptr(a), _ptr(out), a.size, code, pg._h()), _is_async(async_op, sync_op), keep=(a, out), outputs=[out])


def gather(tensor: Any, gather_list: Optional[List[Any]] = None, dst: int = 0, group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Gathers ``tensor`` from every rank into ``gather_list`` on ``dst`` (one array per rank);
    ``gather_list`` must be None (or empty) on the other ranks."""
    pg = _resolve(group, "gather")
    if pg is None:
        return None
    root = pg._group_rank(dst, "dst")
    a, code = _in(tensor, "tensor")
    if root == pg.rank():
        if gather_list is None:
            raise DistInvalidArgument("gather_list is required on the destination rank")
        outs = _out_list(gather_list, pg.size(), a, "gather_list", fill=True)
        tmp = np.empty((pg.size(), a.size), dtype=a.dtype)
        return _run(pg, "gather", (_ptr(a), _ptr(tmp), a.size, code, root, pg._h()), _is_async(async_op, sync_op),
                    keep=(a, tmp, outs), finish=_copy_rows(outs, tmp), outputs=outs)
    if gather_list:
        raise DistInvalidArgument("gather_list must not be given on ranks other than dst")
    return _run(pg, "gather", (_ptr(a), None, a.size, code, root, pg._h()), _is_async(async_op, sync_op), keep=(a,))


def scatter(tensor: Any, scatter_list: Optional[List[Any]] = None, src: int = 0, group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Sends ``scatter_list[i]`` of ``src`` to rank i's ``tensor``; ``scatter_list`` must be None
    (or empty) on the other ranks."""
    pg = _resolve(group, "scatter")
    if pg is None:
        return None
    root = pg._group_rank(src, "src")
    out, code = _out(tensor, "tensor")
    send = None
    if root == pg.rank():
        if scatter_list is None:
            raise DistInvalidArgument("scatter_list is required on the source rank")
        ins = _in_list(scatter_list, pg.size(), out, "scatter_list", "tensor")
        send = np.concatenate([x.reshape(-1) for x in ins]) if ins else np.empty(0, out.dtype)
    elif scatter_list:
        raise DistInvalidArgument("scatter_list must not be given on ranks other than src")
    return _run(pg, "scatter", (_ptr(send), _ptr(out), out.size, code, root, pg._h()), _is_async(async_op, sync_op),
                keep=(send, out), outputs=[out])


def reduce_scatter(output: Any, input_list: List[Any], op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Reduces ``input_list[i]`` across the group into rank i's ``output``."""
    pg = _resolve(group, "reduce_scatter")
    if pg is None:
        return None
    out, code = _out(output, "output")
    o = _reduce_op(op, code)
    ins = _in_list(input_list, pg.size(), out, "input_list", "output")
    send = np.concatenate([x.reshape(-1) for x in ins])
    return _run(pg, "reduce_scatter", (_ptr(send), _ptr(out), out.size, code, o, pg._h()), _is_async(async_op, sync_op),
                keep=(send, out), outputs=[out])


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Reduces ``input`` (size * output size elements) across the group; rank r gets block r
    in ``output``. No copies."""
    pg = _resolve(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    out, code = _out(output, "output")
    a, _ = _in(input, "input")
    o = _reduce_op(op, code)
    if a.dtype != out.dtype:
        raise DistInvalidArgument(f"input has dtype {a.dtype}, output has {out.dtype}")
    if a.size != out.size * pg.size():
        raise DistInvalidArgument(f"input has {a.size} elements, needs {pg.size()} x {out.size}")
    return _run(pg, "reduce_scatter", (_ptr(a), _ptr(out), out.size, code, o, pg._h()), _is_async(async_op, sync_op),
                keep=(a, out), outputs=[out])


def _alltoallv(pg: ProcessGroup, send: np.ndarray, scounts: List[int], recv: np.ndarray, rcounts: List[int], code: int,
               async_op: bool, keep: Tuple[Any, ...], finish: Optional[Callable[[], None]] = None,
               outputs: Optional[List[Any]] = None) -> Optional[Work]:
    n = pg.size()
    sc, sd = _sizes(n, scounts), _sizes(n, _displs(scounts))
    rc, rd = _sizes(n, rcounts), _sizes(n, _displs(rcounts))
    args = (_ptr(send), sc, sd, _ptr(recv), rc, rd, code, pg._h())
    return _run(pg, "alltoallv", args, async_op, keep=keep + (send, recv), finish=finish, outputs=outputs)


def all_to_all(output_tensor_list: List[Any], input_tensor_list: List[Any], group: Any = None, async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Sends ``input_tensor_list[j]`` to rank j, which receives it in its
    ``output_tensor_list[i]`` (i = this rank). Sizes may differ per rank; dtypes may not."""
    pg = _resolve(group, "all_to_all")
    if pg is None:
        return None
    n = pg.size()
    ins = _in_list(input_tensor_list, n, None, "input_tensor_list", "")
    outl = _list(output_tensor_list, "output_tensor_list")
    if len(outl) != n:
        raise DistInvalidArgument(f"output_tensor_list has {len(outl)} entries, the group has {n} ranks")
    outs = [_out(t, f"output_tensor_list[{i}]")[0] for i, t in enumerate(outl)]
    dtype = ins[0].dtype
    code = _dc_dtype(dtype, "input_tensor_list[0]")
    for what, arrs in (("input_tensor_list", ins), ("output_tensor_list", outs)):
        for i, x in enumerate(arrs):
            if x.dtype != dtype:
                raise DistInvalidArgument(f"{what}[{i}] has dtype {x.dtype}, input_tensor_list[0] has {dtype}")
    send = np.concatenate([x.reshape(-1) for x in ins])
    rcounts = [x.size for x in outs]
    recv = np.empty(sum(rcounts), dtype=dtype)

    def finish() -> None:
        off = 0
        for o in outs:
            np.copyto(o.reshape(-1), recv[off:off + o.size])
            off += o.size

    return _alltoallv(pg, send, [x.size for x in ins], recv, rcounts, code, _is_async(async_op, sync_op),
                      keep=(outs,), finish=finish, outputs=outs)


def _splits(splits: Optional[Sequence[int]], rows: int, n: int, what: str, arr_what: str) -> List[int]:
    if splits is None:
        if rows % n:
            raise DistInvalidArgument(f"{arr_what}'s first dimension {rows} is not divisible by the group size {n}; pass {what}")
        return [rows // n] * n
    try:
        s = [int(x) for x in splits]
    except (TypeError, ValueError):
        raise DistInvalidArgument(f"{what} must be a list of {n} non-negative ints, got {splits!r}") from None
    if len(s) != n or any(x < 0 for x in s):
        raise DistInvalidArgument(f"{what} must be a list of {n} non-negative ints, got {splits!r}")
    if sum(s) != rows:
        raise DistInvalidArgument(f"{what} {s} sums to {sum(s)}, {arr_what}'s first dimension is {rows}")
    return s


def all_to_all_single(output: Any, input: Any, output_split_sizes: Optional[Sequence[int]] = None,
                      input_split_sizes: Optional[Sequence[int]] = None, group: Any = None,
                      async_op: bool = False, *, sync_op: Optional[bool] = None) -> Optional[Work]:
    """Splits ``input`` along its first dimension (equally, or by ``input_split_sizes``), sends
    split j to rank j, and writes what rank i sent into ``output``'s split i (equal, or by
    ``output_split_sizes``). Without split sizes on every rank, input and output have equal
    sizes divisible by the group size. No copies."""
    pg = _resolve(group, "all_to_all_single")
    if pg is None:
        return None
    n = pg.size()
    out, code = _out(output, "output")
    a, _ = _in(input, "input")
    if a.dtype != out.dtype:
        raise DistInvalidArgument(f"input has dtype {a.dtype}, output has {out.dtype}")
    if a.ndim == 0 or out.ndim == 0:
        raise DistInvalidArgument("input and output need at least one dimension (they are split along the first)")
    in_row = a.size // a.shape[0] if a.shape[0] else int(np.prod(a.shape[1:]))
    out_row = out.size // out.shape[0] if out.shape[0] else int(np.prod(out.shape[1:]))
    if output_split_sizes is None and input_split_sizes is None:
        _splits(None, a.shape[0], n, "input_split_sizes", "input")
        if out.size != a.size:
            raise DistInvalidArgument(f"output has {out.size} elements, input has {a.size} (pass split sizes for unequal ones)")
        return _run(pg, "alltoall", (_ptr(a), _ptr(out), a.size // n, code, pg._h()), _is_async(async_op, sync_op),
                    keep=(a, out), outputs=[out])
    if in_row != out_row:
        raise DistInvalidArgument(f"input rows have {in_row} elements, output rows {out_row}")
    si = _splits(input_split_sizes, a.shape[0], n, "input_split_sizes", "input")
    so = _splits(output_split_sizes, out.shape[0], n, "output_split_sizes", "output")
    return _alltoallv(pg, a, [x * in_row for x in si], out, [x * out_row for x in so], code, _is_async(async_op, sync_op),
                      keep=(), outputs=[out])


def alltoall_single(in_tensor: Any, out_tensor: Any, in_split_sizes: Optional[Sequence[int]] = None,
                    out_split_sizes: Optional[Sequence[int]] = None, group: Any = None, sync_op: bool = True) -> Optional[Work]:
    """paddle.distributed.alltoall_single: :func:`all_to_all_single` with paddle's argument order."""
    return all_to_all_single(out_tensor, in_tensor, out_split_sizes, in_split_sizes, group, async_op=not sync_op)


def alltoall(in_tensor_list: List[Any], out_tensor_list: List[Any], group: Any = None, sync_op: bool = True) -> Optional[Work]:
    """paddle.distributed.alltoall: :func:`all_to_all` with paddle's argument order; an empty
    ``out_tensor_list`` is filled with new arrays shaped like the inputs."""
    if isinstance(out_tensor_list, list) and not out_tensor_list and isinstance(in_tensor_list, (list, tuple)):
        out_tensor_list.extend(np.empty_like(_as_array(x, "in_tensor_list")) for x in in_tensor_list)
    return all_to_all(out_tensor_list, in_tensor_list, group, async_op=not sync_op)


# ---------------------------------------------------------------------------------------------
# Point to point
# ---------------------------------------------------------------------------------------------


def _tag(tag: Any) -> int:
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= int(tag) < 2**31:
        raise DistInvalidArgument(f"tag must be an int in [0, 2**31), got {tag!r}")
    return int(tag)


def _send(tensor: Any, dst: int, group: Any, tag: int, async_op: bool) -> Optional[Work]:
    pg = _resolve(group, "send")
    if pg is None:
        return None
    peer = pg._group_rank(dst, "dst")
    t = _tag(tag)
    a, code = _in(tensor, "tensor")
    return _run(pg, "send", (_ptr(a), a.size, code, peer, t, pg._h()), async_op, keep=(a,))


def _recv_args(tensor: Any, src: Optional[int], group: Any, tag: int) -> Optional[Tuple[ProcessGroup, np.ndarray, int, int, int]]:
    pg = _resolve(group, "recv")
    if pg is None:
        return None
    peer = -1 if src is None else pg._group_rank(src, "src")
    t = _tag(tag)
    out, code = _out(tensor, "tensor")
    _check_memory(pg, (out,), "recv")
    return pg, out, code, peer, t


def send(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> None:
    """Sends ``tensor`` to global rank ``dst``. Returns once the data is handed to the transport
    (messages are buffered by the receiver, so crossing sends never deadlock)."""
    _send(tensor, dst, group, tag, False)


def recv(tensor: Any, src: Optional[int] = None, group: Any = None, tag: int = 0) -> int:
    """Receives into ``tensor`` from global rank ``src`` (None: any rank) with ``tag``; returns
    the sender's global rank (-1 when this rank is not in ``group``). A message whose length
    differs from the array's is DistMismatchError (a longer one writes nothing past the end)."""
    r = _recv_args(tensor, src, group, tag)
    if r is None:
        return -1
    pg, out, code, peer, t = r
    info = _lib.RecvInfo()
    _lib.check(_lib.load().dc_recv(_ptr(out), out.size, code, peer, t, pg._h(), byref(info)), "dc_recv")
    sender = pg._ranks[info.source]
    if info.count != out.size:
        raise DistMismatchError(f"recv: received {info.count} elements from rank {sender}, the array holds {out.size}")
    return sender


def isend(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> Optional[Work]:
    """Non-blocking :func:`send`; do not modify ``tensor`` until the Work completes."""
    return _send(tensor, dst, group, tag, True)


def irecv(tensor: Any, src: Optional[int] = None, group: Any = None, tag: int = 0) -> Optional[Work]:
    """Non-blocking :func:`recv`; ``work.source_rank()`` tells the sender after completion."""
    r = _recv_args(tensor, src, group, tag)
    if r is None:
        return None
    pg, out, code, peer, t = r
    req = c_void_p()
    _lib.check(_lib.load().dc_irecv(_ptr(out), out.size, code, peer, t, pg._h(), byref(req)), "dc_irecv")
    w = Work(req.value, pg, (out,), None, "recv", recv_count=out.size, outputs=[out])
    _PENDING.add(w)
    return w


class P2POp:
    """One operation for :func:`batch_isend_irecv`: ``op`` is isend or irecv (send/recv are
    taken to mean them), ``peer`` a global rank."""

    def __init__(self, op: Callable, tensor: Any, peer: int, group: Any = None, tag: int = 0):
        if op in (isend, send):
            self.op: Callable = isend
        elif op in (irecv, recv):
            self.op = irecv
        else:
            raise DistInvalidArgument("P2POp.op must be distcomm.isend or distcomm.irecv")
        self.tensor, self.peer, self.group, self.tag = tensor, peer, group, tag

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: List[P2POp]) -> List[Work]:
    """Starts every operation of the list and returns their Works (wait on each)."""
    ops = _list(p2p_op_list, "p2p_op_list")
    for i, p in enumerate(ops):
        if not isinstance(p, P2POp):
            raise DistInvalidArgument(f"p2p_op_list[{i}] is not a P2POp")
    works = []
    for p in ops:
        w = p.op(p.tensor, p.peer, p.group, p.tag)
        if w is not None:
            works.append(w)
    return works


# ---------------------------------------------------------------------------------------------
# Object collectives (pickle: trusted peers only)
# ---------------------------------------------------------------------------------------------
#
# Objects travel pickled: unpickling runs code chosen by the sender, so use these only between
# trusted ranks of one job (as with torch.distributed). Sizes go first (int64), then the bytes.


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _bytes_array(parts: Sequence[bytes]) -> np.ndarray:
    joined = bytearray(b"".join(parts))
    return np.frombuffer(joined, dtype=np.uint8) if joined else np.empty(0, np.uint8)


def _loads(buf: np.ndarray, sizes: Sequence[int]) -> List[Any]:
    out, off = [], 0
    data = buf.tobytes()
    for s in sizes:
        out.append(pickle.loads(data[off:off + s]))
        off += s
    return out


_I64 = 4  # DC_INT64
_U8 = 1  # DC_UINT8


def all_gather_object(object_list: List[Any], obj: Any, group: Any = None) -> None:
    """Gathers a picklable object from every rank into ``object_list`` (as many entries as the
    group has ranks). Pickled: trusted peers only."""
    pg = _resolve(group, "all_gather_object")
    if pg is None:
        return
    n = pg.size()
    if not isinstance(object_list, list) or len(object_list) != n:
        raise DistInvalidArgument(f"object_list must be a list of {n} entries (the group's size)")
    data = _bytes_array([_dumps(obj)])
    sizes = np.zeros(n, dtype=np.int64)
    mine = np.array([data.size], dtype=np.int64)
    lib, h = _lib.load(), pg._h()
    _lib.check(lib.dc_allgather(_ptr(mine), _ptr(sizes), 1, _I64, h), "dc_allgather")
    counts = [int(s) for s in sizes]
    recv = np.empty(sum(counts), dtype=np.uint8)
    _lib.check(lib.dc_allgatherv(_ptr(data), data.size, _ptr(recv), _sizes(n, counts), _sizes(n, _displs(counts)), _U8, h),
               "dc_allgatherv")
    object_list[:] = _loads(recv, counts)


def broadcast_object_list(object_list: List[Any], src: int = 0, group: Any = None, device: Any = None) -> None:
    """Replaces ``object_list``'s entries on every rank with ``src``'s (lists of equal length on
    every rank). Pickled: trusted peers only."""
    pg = _resolve(group, "broadcast_object_list")
    if pg is None:
        return
    root = pg._group_rank(src, "src")
    if not isinstance(object_list, list):
        raise DistInvalidArgument("object_list must be a list")
    lib, h = _lib.load(), pg._h()
    if root == pg.rank():
        parts = [_dumps(o) for o in object_list]
        sizes = np.array([len(p) for p in parts], dtype=np.int64)
        data = _bytes_array(parts)
    else:
        sizes = np.zeros(len(object_list), dtype=np.int64)
        data = None
    _lib.check(lib.dc_broadcast(_ptr(sizes), sizes.size, _I64, root, h), "dc_broadcast")
    if data is None:
        data = np.empty(int(sizes.sum()), dtype=np.uint8)
    _lib.check(lib.dc_broadcast(_ptr(data), data.size, _U8, root, h), "dc_broadcast")
    if root != pg.rank():
        object_list[:] = _loads(data, [int(s) for s in sizes])


def scatter_object_list(scatter_object_output_list: List[Any], scatter_object_input_list: Optional[List[Any]] = None,
                        src: int = 0, group: Any = None) -> None:
    """Rank i receives ``scatter_object_input_list[i]`` of ``src`` in
    ``scatter_object_output_list[0]``. Pickled: trusted peers only."""
    pg = _resolve(group, "scatter_object_list")
    if pg is None:
        return
    n = pg.size()
    root = pg._group_rank(src, "src")
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise DistInvalidArgument("scatter_object_output_list must be a list with at least one entry")
    lib, h = _lib.load(), pg._h()
    zero = [0] * n
    if root == pg.rank():
        if not isinstance(scatter_object_input_list, (list, tuple)) or len(scatter_object_input_list) != n:
            raise DistInvalidArgument(f"scatter_object_input_list must be a list of {n} objects on the source rank")
        parts = [_dumps(o) for o in scatter_object_input_list]
        sizes = np.array([len(p) for p in parts], dtype=np.int64)
        data = _bytes_array(parts)
        scounts = [len(p) for p in parts]
    else:
        sizes, data, scounts = None, np.empty(0, np.uint8), zero
    mine = np.zeros(1, dtype=np.int64)
    _lib.check(lib.dc_scatter(_ptr(sizes), _ptr(mine), 1, _I64, root, h), "dc_scatter")
    recv = np.empty(int(mine[0]), dtype=np.uint8)
    rcounts = list(zero)
    rcounts[root] = recv.size
    sc, rc = _sizes(n, scounts), _sizes(n, rcounts)
    _lib.check(lib.dc_alltoallv(_ptr(data), sc, _sizes(n, _displs(scounts)), _ptr(recv), rc, _sizes(n, _displs(rcounts)), _U8, h),
               "dc_alltoallv")
    scatter_object_output_list[0] = pickle.loads(recv.tobytes())


def gather_object(obj: Any, object_gather_list: Optional[List[Any]] = None, dst: int = 0, group: Any = None) -> None:
    """Gathers a picklable object from every rank into ``object_gather_list`` on ``dst`` (a
    list of the group's size there; ignored elsewhere). Pickled: trusted peers only."""
    pg = _resolve(group, "gather_object")
    if pg is None:
        return
    n = pg.size()
    root = pg._group_rank(dst, "dst")
    me = pg.rank() == root
    if me and (not isinstance(object_gather_list, list) or len(object_gather_list) != n):
        raise DistInvalidArgument(f"object_gather_list must be a list of {n} entries on the destination rank")
    lib, h = _lib.load(), pg._h()
    data = _bytes_array([_dumps(obj)])
    mine = np.array([data.size], dtype=np.int64)
    sizes = np.zeros(n, dtype=np.int64) if me else None
    _lib.check(lib.dc_gather(_ptr(mine), _ptr(sizes), 1, _I64, root, h), "dc_gather")
    scounts = [0] * n
    scounts[root] = data.size
    rcounts = [int(s) for s in sizes] if sizes is not None else [0] * n
    recv = np.empty(sum(rcounts), dtype=np.uint8)
    _lib.check(lib.dc_alltoallv(_ptr(data), _sizes(n, scounts), _sizes(n, _displs(scounts)), _ptr(recv),
                                _sizes(n, rcounts), _sizes(n, _displs(rcounts)), _U8, h), "dc_alltoallv")
    if me:
        assert object_gather_list is not None
        object_gather_list[:] = _loads(recv, rcounts)


def send_object_list(object_list: List[Any], dst: int, group: Any = None) -> None:
    """Sends the picklable objects of ``object_list`` to global rank ``dst`` (sizes, then
    bytes). Pickled: trusted peers only."""
    if not isinstance(object_list, list):
        raise DistInvalidArgument("object_list must be a list")
    parts = [_dumps(o) for o in object_list]
    send(np.array([len(p) for p in parts], dtype=np.int64), dst, group)
    send(_bytes_array(parts), dst, group)


def recv_object_list(object_list: List[Any], src: Optional[int] = None, group: Any = None) -> int:
    """Receives objects sent by :func:`send_object_list` into ``object_list`` (of the sender's
    length); returns the sender's global rank. Pickled: trusted peers only."""
    if not isinstance(object_list, list):
        raise DistInvalidArgument("object_list must be a list")
    sizes = np.zeros(len(object_list), dtype=np.int64)
    sender = recv(sizes, src, group)
    data = np.empty(int(sizes.sum()), dtype=np.uint8)
    recv(data, sender, group)
    object_list[:] = _loads(data, [int(s) for s in sizes])
    return sender


# ---------------------------------------------------------------------------------------------
# Interpreter exit
# ---------------------------------------------------------------------------------------------


def _exit_timeout() -> float:
    try:
        return max(0.1, float(os.environ.get("DISTCOMM_EXIT_TIMEOUT", "10")))
    except ValueError:
        return 10.0


def _at_exit() -> None:
    """Destroys what the program left behind, without hanging.

    Operations still pending get a short grace period; if they do not finish, the job's
    communicators are aborted (the peers' pending operations then fail with DistAbortedError
    rather than waiting for their timeout). The destroy runs on a helper thread and is given
    DISTCOMM_EXIT_TIMEOUT seconds (default 10); if it is still stuck then, the process exits
    anyway (the peers notice the closed connections).
    """
    world = _WORLD
    if world is None or _INIT_PID != os.getpid():
        return
    budget = _exit_timeout()
    deadline = time.monotonic() + min(2.0, budget / 2)
    try:
        while _PENDING and time.monotonic() < deadline:
            _reap()
            time.sleep(0.005)
        if _PENDING:
            sys.stderr.write(
                f"distcomm: {len(_PENDING)} operation(s) still pending at exit; aborting the job's communicators\n"
            )
            _lib.load().dc_comm_abort(world._h())
    except Exception:
        pass

    def cleanup() -> None:
        try:
            destroy_process_group()
        except Exception:
            pass

    try:
        t = threading.Thread(target=cleanup, name="distcomm-exit", daemon=True)
        t.start()
    except RuntimeError:  # no new threads at this stage of finalisation: do it here
        cleanup()
        return
    t.join(budget)
    if t.is_alive():
        # Not aborting now: the destroy may be freeing the handles at this very moment.
        sys.stderr.write("distcomm: destroying the process group at exit did not finish in "
                         f"{budget:g} s (DISTCOMM_EXIT_TIMEOUT); exiting anyway\n")
