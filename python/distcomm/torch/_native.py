"""The backend's hot path compiled against the installed torch (``_native.cpp``).

torch calls a backend written in Python through a trampoline that costs about 5 us per call
before the backend runs (the GIL, a Python object for every tensor, option and Work). The
C++ ``NativeBackend`` is what torch calls instead: the common forms of allreduce, broadcast,
barrier, all_gather (into a list or a tensor), reduce_scatter_tensor, all_to_all_single, send,
recv and recv from any source on dense CPU tensors start the library's call there (see "the
fast forms" in _native.cpp); everything else goes to the Python ``DistcommBackend`` it wraps.

The extension is built on first use with the C++ compiler torch's own extensions use
(``$CXX``, else ``c++``) against this torch's headers, and cached per source, torch and Python
under ``$DISTCOMM_TORCH_NATIVE_CACHE`` (default ``~/.cache/distcomm/torch-native``); ranks of
a job that start together build it once (a file lock). ``DISTCOMM_TORCH_NATIVE``, read as
each group is made: ``0`` gives the group the Python backend alone, ``1`` requires the native
one (an error when it cannot be built), unset: the native one when it builds, else a warning
once and the Python backend alone.
"""

import ctypes
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from types import ModuleType
from typing import List, Optional

import torch

from .. import _lib
from . import _errors

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native.cpp")
_NAME = "_distcomm_torch_native"
_lock = threading.Lock()
_module: Optional[ModuleType] = None
_failure: Optional[str] = None  # why it is not available (once decided)


def mode() -> str:
    """"off", "on" (required) or "auto", from DISTCOMM_TORCH_NATIVE."""
    v = os.environ.get("DISTCOMM_TORCH_NATIVE", "").strip().lower()
    if v in ("0", "off", "false", "no"):
        return "off"
    if v in ("1", "on", "true", "yes"):
        return "on"
    return "auto"


def _cache_dir() -> str:
    base = os.environ.get("DISTCOMM_TORCH_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "distcomm", "torch-native")
    with open(_SOURCE, "rb") as f:
        src = f.read()
    key = hashlib.sha256(src + torch.__version__.encode() + sys.version.encode() + sysconfig.get_config_var("EXT_SUFFIX").encode())
    return os.path.join(base, key.hexdigest()[:16])


def _command(out: str) -> List[str]:
    from torch.utils import cpp_extension

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
    cmd = [cxx, "-O2", "-fPIC", "-shared", "-std=c++20", "-fvisibility=hidden",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           f"-DTORCH_EXTENSION_NAME={_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [f"-I{sysconfig.get_paths()['include']}", _SOURCE, "-o", out,
            f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    return cmd


def _build(directory: str) -> str:
    """The extension's path in `directory`, built there first if it is not yet (one process
    builds; the others wait on the lock and find it)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, _NAME + sysconfig.get_config_var("EXT_SUFFIX"))
    with open(os.path.join(directory, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(path):
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".so")
            os.close(fd)
            try:
                r = subprocess.run(_command(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                if r.returncode != 0:
                    raise RuntimeError(f"compiling {_SOURCE} failed:\n{r.stdout[-4000:]}")
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    return path


def _load() -> ModuleType:
    path = _build(_cache_dir())
    loader = importlib.machinery.ExtensionFileLoader(_NAME, path)
    spec = importlib.util.spec_from_file_location(_NAME, path, loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    lib = _lib.load()
    mod.set_library(lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, _errors.for_status)
    return mod


def module() -> Optional[ModuleType]:
    """The loaded extension (built first if needed), or None where it could not be built (an
    error instead under DISTCOMM_TORCH_NATIVE=1)."""
    global _module, _failure
    with _lock:
        if _module is None and _failure is None:
            try:
                _module = _load()
            except Exception as e:  # no compiler, no headers, another torch ...
                _failure = f"{type(e).__name__}: {e}"
                if mode() != "on":
                    warnings.warn(f"distcomm.torch: the native backend could not be built, using the Python backend "
                                  f"alone (about 5 us more per call; DISTCOMM_TORCH_NATIVE=0 silences this): {_failure}",
                                  RuntimeWarning, stacklevel=3)
        if _module is None and mode() == "on":
            raise _errors.unavailable(f"distcomm.torch: the native backend could not be built ({_failure})")
        return _module
