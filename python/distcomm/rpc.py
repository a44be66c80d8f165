"""``paddle.distributed.rpc`` over libdistcomm's RPC agent.

::

    from distcomm import rpc

    def add(a, b):                      # module-level: sent by reference, not by value
        return a + b

    rpc.init_rpc("worker%d" % rank)     # collective; rank/world from the environment
    three = rpc.rpc_sync("worker1", add, args=(1, 2))
    fut = rpc.rpc_async("worker1", add, args=(3, 4)); seven = fut.wait()
    rpc.shutdown()                      # collective: waits for every outstanding call

``fn`` must be a module-level callable that the callee can import (pickle sends it by name); the
arguments and the result are pickled. **Unpickling runs code chosen by the sender: use RPC only
between trusted workers of one job.** An exception raised by the remote function is raised at the
caller with its type and message (as the same type when it can be pickled, else as
:class:`DistRemoteError` naming the type).

Where ``rank``, ``world_size`` or ``master_endpoint`` are not given, paddle's variables are read
(``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM``, ``PADDLE_MASTER_ENDPOINT`` = ``"ip:port"``),
then distcomm's own ``env://`` variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``,
as ``dcrun`` sets them).
"""

import ctypes
import os
import pickle
import threading
from ctypes import CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint16, c_void_p
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import _lib
from ._errors import DistInvalidUsage, DistRemoteError

__all__ = [
    "init_rpc",
    "rpc_sync",
    "rpc_async",
    "shutdown",
    "get_worker_info",
    "get_all_worker_infos",
    "get_current_worker_info",
    "WorkerInfo",
    "FutureWrapper",
]

#: The one function every Python worker registers; it unpickles and runs the call.
_ENTRY = b"__distcomm_python_call__"


class _WorkerInfoC(Structure):
    _fields_ = [("name", c_char * 64), ("rank", c_int32), ("host", c_char * 64), ("port", c_uint16)]


class WorkerInfo(NamedTuple):
    """A worker of the RPC job (as paddle's ``WorkerInfo``)."""

    name: str
    rank: int
    ip: str
    port: int


_HANDLER = CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p)
_SIGNATURES = {
    "dc_rpc_init": (c_int, [c_char_p, POINTER(_lib.InitOptions), POINTER(c_void_p)]),
    "dc_rpc_register": (c_int, [c_void_p, c_char_p, _HANDLER, c_void_p]),
    "dc_rpc_call": (c_int, [c_void_p, c_char_p, c_char_p, c_void_p, c_size_t, c_int64, POINTER(c_void_p)]),
    "dc_rpc_call_async": (c_int, [c_void_p, c_char_p, c_char_p, c_void_p, c_size_t, c_int64, POINTER(c_void_p)]),
    "dc_request_take_reply": (c_int, [c_void_p, POINTER(c_void_p)]),
    "dc_rpc_worker_info": (c_int, [c_void_p, c_char_p, POINTER(_WorkerInfoC)]),
    "dc_rpc_all_worker_infos": (c_int, [c_void_p, POINTER(_WorkerInfoC), c_size_t, POINTER(c_size_t)]),
    "dc_rpc_shutdown": (c_int, [c_void_p]),
    "dc_buffer_set": (c_int, [c_void_p, c_void_p, c_size_t]),
    "dc_buffer_data": (c_void_p, [c_void_p]),
    "dc_buffer_len": (c_size_t, [c_void_p]),
    "dc_buffer_free": (c_int, [c_void_p]),
    "dc_request_wait": (c_int, [c_void_p]),
    "dc_request_is_completed": (c_int, [c_void_p, POINTER(ctypes.c_bool)]),
    "dc_request_free": (c_int, [c_void_p]),
}

_lock = threading.Lock()
_agent: Optional[int] = None
_handler_ref = None  # keeps the ctypes callback alive while the agent may call it
_declared = False


def _c() -> ctypes.CDLL:
    global _declared
    lib = _lib.load()
    if not _declared:
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _declared = True
    return lib


def _require() -> int:
    if _agent is None:
        raise DistInvalidUsage("RPC is not initialised: call distcomm.rpc.init_rpc() first")
    return _agent


def _take_bytes(buf: int) -> bytes:
    """Copies and frees a library-owned dc_buffer."""
    lib = _c()
    try:
        n = lib.dc_buffer_len(buf)
        ptr = lib.dc_buffer_data(buf)
        return ctypes.string_at(ptr, n) if n else b""
    finally:
        lib.dc_buffer_free(buf)


def _reply(buf: int, payload: bytes) -> int:
    return _c().dc_buffer_set(buf, payload, len(payload))


def _serve(_userdata, request, request_len, reply) -> int:
    """Runs on a library thread for every incoming Python call."""
    try:
        fn, args, kwargs = pickle.loads(ctypes.string_at(request, request_len))
        result = (True, fn(*args, **kwargs))
    except BaseException as e:  # the caller gets every failure, including SystemExit
        kind = f"{type(e).__module__}.{type(e).__qualname__}"
        try:
            exc = pickle.dumps(e)
        except Exception:
            exc = None
        result = (False, (kind, str(e), exc))
    try:
        payload = pickle.dumps(result)
    except Exception as e:
        payload = pickle.dumps((False, (f"{type(e).__module__}.{type(e).__qualname__}", f"the result could not be pickled: {e}", None)))
    return _reply(reply, payload)


def _env_int(name: str) -> Optional[int]:
    v = os.environ.get(name, "").strip()
    return int(v) if v else None


def init_rpc(name: str, rank: Optional[int] = None, world_size: Optional[int] = None, master_endpoint: Optional[str] = None) -> None:
    """Joins the RPC job as worker ``name`` (unique in the job). Collective: every worker calls it.

    ``rank``/``world_size``/``master_endpoint`` default to paddle's ``PADDLE_TRAINER_ID``,
    ``PADDLE_TRAINERS_NUM`` and ``PADDLE_MASTER_ENDPOINT``, then to distcomm's ``env://``
    variables (as set by ``dcrun``).
    """
    global _agent, _handler_ref
    with _lock:
        if _agent is not None:
            raise DistInvalidUsage("init_rpc was already called in this process")
        rank = rank if rank is not None else _env_int("PADDLE_TRAINER_ID")
        world_size = world_size if world_size is not None else _env_int("PADDLE_TRAINERS_NUM")
        master_endpoint = master_endpoint or os.environ.get("PADDLE_MASTER_ENDPOINT", "").strip() or None
        lib = _c()
        opts = _lib.InitOptions()
        lib.dc_init_options_default(ctypes.byref(opts))
        keep = []
        if master_endpoint:
            method = f"tcp://{master_endpoint}".encode()
            keep.append(method)
            opts.init_method = method
        if rank is not None:
            opts.rank = int(rank)
        if world_size is not None:
            opts.world_size = int(world_size)
        agent = c_void_p()
        _lib.check(lib.dc_rpc_init(name.encode(), ctypes.byref(opts), ctypes.byref(agent)), "dc_rpc_init")
        handler = _HANDLER(_serve)
        # Published before registering: once registered, calls held for the handler run at once
        # on the agent's threads, and a served function may use the RPC API itself.
        _agent, _handler_ref = agent.value, handler
        status = lib.dc_rpc_register(agent, _ENTRY, handler, None)
        if status != 0:
            lib.dc_rpc_shutdown(agent)
            _agent, _handler_ref = None, None
            _lib.check(status, "dc_rpc_register")


def _timeout_ms(timeout: float) -> int:
    """paddle's seconds (<= 0: the default) to the library's milliseconds (0: the default)."""
    return 0 if timeout is None or timeout <= 0 else max(1, int(timeout * 1000))


def _request(fn: Callable, args: Optional[Tuple], kwargs: Optional[Dict]) -> bytes:
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    return pickle.dumps((fn, tuple(args or ()), dict(kwargs or {})))


def _result(reply: bytes) -> Any:
    ok, value = pickle.loads(reply)
    if ok:
        return value
    kind, message, exc = value
    if exc is not None:
        try:
            e = pickle.loads(exc)
        except Exception:
            e = None
        if isinstance(e, BaseException):
            raise e
    raise DistRemoteError(f"{kind}: {message}")


def rpc_sync(to: str, fn: Callable, args: Optional[Tuple] = None, kwargs: Optional[Dict] = None, timeout: float = -1) -> Any:
    """Calls ``fn(*args, **kwargs)`` on worker ``to`` and returns its result (blocking).
    ``timeout`` in seconds (<= 0: the job's default)."""
    agent, payload, lib = _require(), _request(fn, args, kwargs), _c()
    buf = c_void_p()
    _lib.check(lib.dc_rpc_call(agent, to.encode(), _ENTRY, payload, len(payload), _timeout_ms(timeout), ctypes.byref(buf)), "dc_rpc_call")
    return _result(_take_bytes(buf.value))


class FutureWrapper:
    """The result of :func:`rpc_async`: ``wait()`` returns it (or raises the remote error)."""

    def __init__(self, req: int, payload: bytes) -> None:
        self._req: Optional[int] = req
        self._payload = payload  # the library copies it, but keep it until the call is done
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: Optional[BaseException] = None

    def wait(self) -> Any:
        with self._lock:
            if not self._done:
                self._finish()
        if self._error is not None:
            raise self._error
        return self._value

    def is_completed(self) -> bool:
        with self._lock:
            if self._done:
                return True
            flag = ctypes.c_bool(False)
            _c().dc_request_is_completed(self._req, ctypes.byref(flag))
            return bool(flag.value)

    def _finish(self) -> None:
        lib = _c()
        try:
            _lib.check(lib.dc_request_wait(self._req), "dc_request_wait")
            buf = c_void_p()
            _lib.check(lib.dc_request_take_reply(self._req, ctypes.byref(buf)), "dc_request_take_reply")
            self._value = _result(_take_bytes(buf.value))
        except BaseException as e:
            self._error = e
        finally:
            lib.dc_request_free(self._req)
            self._req, self._done = None, True

    def __del__(self) -> None:
        if getattr(self, "_req", None) is not None:
            try:
                _c().dc_request_free(self._req)
            except Exception:
                pass


def rpc_async(to: str, fn: Callable, args: Optional[Tuple] = None, kwargs: Optional[Dict] = None, timeout: float = -1) -> FutureWrapper:
    """Starts ``fn(*args, **kwargs)`` on worker ``to``; returns a future whose ``wait()`` gives the
    result. ``timeout`` in seconds (<= 0: the job's default)."""
    agent, payload, lib = _require(), _request(fn, args, kwargs), _c()
    req = c_void_p()
    _lib.check(lib.dc_rpc_call_async(agent, to.encode(), _ENTRY, payload, len(payload), _timeout_ms(timeout), ctypes.byref(req)), "dc_rpc_call_async")
    return FutureWrapper(req.value, payload)


def _info(c: _WorkerInfoC) -> WorkerInfo:
    return WorkerInfo(c.name.decode("utf-8", "replace"), int(c.rank), c.host.decode("utf-8", "replace"), int(c.port))


def get_worker_info(name: str) -> WorkerInfo:
    """The worker called ``name``."""
    info = _WorkerInfoC()
    _lib.check(_c().dc_rpc_worker_info(_require(), name.encode(), ctypes.byref(info)), "dc_rpc_worker_info")
    return _info(info)


def get_current_worker_info() -> WorkerInfo:
    """This worker."""
    info = _WorkerInfoC()
    _lib.check(_c().dc_rpc_worker_info(_require(), None, ctypes.byref(info)), "dc_rpc_worker_info")
    return _info(info)


def get_all_worker_infos() -> List[WorkerInfo]:
    """Every worker of the job, by rank."""
    lib, agent = _c(), _require()
    count = c_size_t(0)
    _lib.check(lib.dc_rpc_all_worker_infos(agent, None, 0, ctypes.byref(count)), "dc_rpc_all_worker_infos")
    infos = (_WorkerInfoC * max(1, count.value))()
    _lib.check(lib.dc_rpc_all_worker_infos(agent, infos, count.value, ctypes.byref(count)), "dc_rpc_all_worker_infos")
    return [_info(infos[i]) for i in range(count.value)]


def shutdown() -> None:
    """Collective: waits until every worker's outstanding calls are done, then stops this agent."""
    global _agent, _handler_ref
    with _lock:
        agent = _require()
        _lib.check(_c().dc_rpc_shutdown(agent), "dc_rpc_shutdown")
        _agent = None
        # The agent's threads are gone; the callback may be released.
        _handler_ref = None
