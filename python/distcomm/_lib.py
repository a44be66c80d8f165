"""Finding and loading ``libdistcomm.so`` and declaring the C functions the package calls.

Search order (the first that loads wins):

1. ``DISTCOMM_LIBRARY``: a path to the library, or a directory holding it. When it is set and
   does not load, that is an error: nothing else is tried.
2. Next to this package (``distcomm/libdistcomm.so*``, ``distcomm/lib/``).
3. The install prefixes: ``sys.prefix``, ``sys.base_prefix``, ``/usr/local``, ``/usr`` (each
   with ``lib``, ``lib64`` and the multiarch directory).
4. The dynamic loader's own search (``LD_LIBRARY_PATH``, ``ldconfig``):
   ``ctypes.util.find_library("distcomm")``, then ``libdistcomm.so.0`` and ``libdistcomm.so``.

Every function is declared with ``argtypes`` and ``restype`` before use; ctypes releases the
GIL during each call, so a blocked call never blocks other Python threads.
"""

import ctypes
import ctypes.util
import os
import sys
import sysconfig
import threading
from ctypes import POINTER, Structure, c_bool, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint32, c_void_p
from typing import List, Optional, Tuple

from ._errors import DistUnavailableError, error_for_status

#: The library's major version this package speaks to (the soname's number).
ABI_MAJOR = 0
SONAMES = ("libdistcomm.so", "libdistcomm.so.%d" % ABI_MAJOR)


class InitOptions(Structure):
    """``dc_init_options``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("init_method", c_char_p),
        ("backend", c_char_p),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("group_name", c_char_p),
        ("timeout_ms", c_int64),
        ("token", c_char_p),
        ("encrypt", c_int32),
    ]


class RecvInfo(Structure):
    """``dc_recv_info``."""

    _fields_ = [("source", c_int32), ("tag", c_int32), ("count", c_size_t)]


_P = c_void_p  # dc_comm *, dc_request *, buffers
_PP = POINTER(c_void_p)  # dc_comm **, dc_request **
_SZ = POINTER(c_size_t)  # counts and displacements
_ST = c_int  # dc_status

# name -> (restype, argtypes) for every function the package uses.
_BLOCKING = {
    "dc_allreduce": [_P, _P, c_size_t, c_int32, c_int32, _P],
    "dc_broadcast": [_P, c_size_t, c_int32, c_int32, _P],
    "dc_reduce": [_P, _P, c_size_t, c_int32, c_int32, c_int32, _P],
    "dc_allgather": [_P, _P, c_size_t, c_int32, _P],
    "dc_allgatherv": [_P, c_size_t, _P, _SZ, _SZ, c_int32, _P],
    "dc_gather": [_P, _P, c_size_t, c_int32, c_int32, _P],
    "dc_scatter": [_P, _P, c_size_t, c_int32, c_int32, _P],
    "dc_reduce_scatter": [_P, _P, c_size_t, c_int32, c_int32, _P],
    "dc_alltoall": [_P, _P, c_size_t, c_int32, _P],
    "dc_alltoallv": [_P, _SZ, _SZ, _P, _SZ, _SZ, c_int32, _P],
    "dc_barrier": [_P],
    "dc_send": [_P, c_size_t, c_int32, c_int32, c_int32, _P],
}
SIGNATURES = {
    "dc_status_name": (c_char_p, [c_uint32]),
    "dc_last_error": (c_char_p, []),
    "dc_version": (c_uint32, []),
    "dc_init_options_default": (None, [POINTER(InitOptions)]),
    "dc_init": (_ST, [POINTER(InitOptions), _PP]),
    "dc_comm_rank": (_ST, [_P, POINTER(c_int32)]),
    "dc_comm_size": (_ST, [_P, POINTER(c_int32)]),
    "dc_comm_backend": (_ST, [_P, POINTER(c_char_p)]),
    "dc_comm_new_group": (_ST, [_P, POINTER(c_int32), c_int32, _PP]),
    "dc_comm_split": (_ST, [_P, c_int32, c_int32, _PP]),
    "dc_comm_set_timeout": (_ST, [_P, c_int64]),
    "dc_comm_abort": (_ST, [_P]),
    "dc_comm_destroy": (_ST, [_P]),
    "dc_recv": (_ST, [_P, c_size_t, c_int32, c_int32, c_int32, _P, POINTER(RecvInfo)]),
    "dc_irecv": (_ST, [_P, c_size_t, c_int32, c_int32, c_int32, _P, _PP]),
    "dc_isend": (_ST, _BLOCKING["dc_send"] + [_PP]),
    "dc_request_wait": (_ST, [_P]),
    "dc_request_is_completed": (_ST, [_P, POINTER(c_bool)]),
    "dc_request_wait_all": (_ST, [c_size_t, _PP]),
    "dc_request_free": (_ST, [_P]),
    "dc_request_recv_info": (_ST, [_P, POINTER(RecvInfo)]),
    "dc_probe": (_ST, [c_int32, c_int32, c_int32, _P, POINTER(RecvInfo)]),
    "dc_iprobe": (_ST, [c_int32, c_int32, c_int32, _P, POINTER(c_bool), POINTER(RecvInfo)]),
    "dc_ssend": (_ST, _BLOCKING["dc_send"]),
    "dc_sendrecv": (_ST, [_P, c_size_t, c_int32, c_int32, c_int32, _P, c_size_t, c_int32, c_int32, c_int32, _P, POINTER(RecvInfo)]),
}
for _name, _args in _BLOCKING.items():
    SIGNATURES[_name] = (_ST, _args)
    if _name != "dc_send":
        SIGNATURES["dc_i" + _name[3:]] = (_ST, _args + [_PP])

_FIND_LIBRARY = "<ctypes.util.find_library>"
_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def _lib_dirs(prefix: str) -> List[str]:
    dirs = [os.path.join(prefix, "lib"), os.path.join(prefix, "lib64")]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        dirs.append(os.path.join(prefix, "lib", multiarch))
    return dirs


def _files_in(d: str) -> List[str]:
    return [os.path.join(d, n) for n in SONAMES]


def candidates() -> Tuple[bool, List[str]]:
    """(from DISTCOMM_LIBRARY?, the paths or loader names to try, in order)."""
    env = os.environ.get("DISTCOMM_LIBRARY", "").strip()
    if env:
        return True, (_files_in(env) if os.path.isdir(env) else [env])
    here = os.path.dirname(os.path.abspath(__file__))
    paths = _files_in(here) + _files_in(os.path.join(here, "lib"))
    seen = set()
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, "/usr/local", "/usr"):
        for d in _lib_dirs(prefix):
            if d not in seen:
                seen.add(d)
                paths.extend(_files_in(d))
    paths.append(_FIND_LIBRARY)  # ctypes.util.find_library("distcomm"), computed when reached
    paths.extend(reversed(SONAMES))  # the loader's search path: libdistcomm.so.0, libdistcomm.so
    return False, paths


def _declare(lib: ctypes.CDLL, path: str) -> None:
    for name, (restype, argtypes) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise DistUnavailableError(
                f"{path} has no function {name}: it is not libdistcomm, or too old for this package"
            ) from None
        fn.restype = restype
        fn.argtypes = argtypes


def load() -> ctypes.CDLL:
    """The loaded library (loads it on the first call). Raises DistUnavailableError, listing
    every place it looked, when it cannot be found."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        explicit, paths = candidates()
        tried = []
        for p in paths:
            if p == _FIND_LIBRARY:
                found = ctypes.util.find_library("distcomm")
                if not found:
                    tried.append("  ctypes.util.find_library('distcomm'): not found")
                    continue
                p = found
            is_path = os.sep in p
            if is_path and not os.path.exists(p):
                if explicit:
                    tried.append(f"  {p}: no such file")
                    continue
                d, name = os.path.split(p)
                d = d.rstrip("/")
                if tried and tried[-1].startswith(f"  {d}/: no "):
                    tried[-1] += f", {name}"
                else:
                    tried.append(f"  {d}/: no {name}")
                continue
            try:
                lib = ctypes.CDLL(p)
            except OSError as e:
                tried.append(f"  {p}: {e}")
                continue
            _declare(lib, p)
            major = lib.dc_version() // 10000
            if major != ABI_MAJOR:
                tried.append(f"  {p}: version {major}.x, this package needs {ABI_MAJOR}.x")
                continue
            _lib_path = _resolve_path(lib, p)
            _lib = lib
            return lib
        how = (
            "DISTCOMM_LIBRARY is set but does not name a loadable libdistcomm"
            if explicit
            else "cannot find libdistcomm.so; set DISTCOMM_LIBRARY to its path, install it "
            "(make install PREFIX=...) into one of the prefixes below, or add its directory to "
            "LD_LIBRARY_PATH"
        )
        raise DistUnavailableError(how + ". Looked at:\n" + "\n".join(tried))


def _resolve_path(lib: ctypes.CDLL, fallback: str) -> str:
    """The file the loader actually mapped for `lib` (via dladdr), else `fallback`."""
    try:

        class _DlInfo(Structure):
            _fields_ = [("fname", c_char_p), ("fbase", c_void_p), ("sname", c_char_p), ("saddr", c_void_p)]

        libdl = ctypes.CDLL(None)
        dladdr = libdl.dladdr
        dladdr.argtypes = [c_void_p, POINTER(_DlInfo)]
        dladdr.restype = c_int
        info = _DlInfo()
        addr = ctypes.cast(lib.dc_version, c_void_p).value
        if dladdr(addr, ctypes.byref(info)) and info.fname:
            return os.path.realpath(info.fname.decode())
    except (AttributeError, OSError):
        pass
    return fallback


def library_path() -> str:
    """The path of the loaded libdistcomm (loads it if needed)."""
    load()
    assert _lib_path is not None
    return _lib_path


def last_error() -> str:
    """This thread's ``dc_last_error()`` text."""
    msg = load().dc_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status: int, what: str = "") -> None:
    """Raises the exception for a failed status, with this thread's dc_last_error() text."""
    if status != 0:
        msg = last_error() or what
        raise error_for_status(status, msg)
