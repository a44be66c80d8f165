"""A distcomm communicator for a torch process group, found through the store torch hands to
the backend.

torch gives every group a ``Store`` (env://, tcp://, file:// or torchrun's: whatever
``init_process_group`` was told). distcomm's own rendezvous wants a TCP store it can serve and
a job token, so the group's rank 0 provides both and announces them through torch's store:

1. every rank writes its host name to the torch store; rank 0 reads them all: if the group is
   on one host, its store listens on 127.0.0.1, else on the address that reaches torch's
   master (``MASTER_ADDR``) or its host name's address;
2. rank 0 takes a free port there and a fresh random token (``secrets``) and publishes
   ``host, port, token`` under a key of this generation of the group;
3. every rank calls ``dc_init`` with ``tcp://host:port``, its rank, the group's size and
   timeout and that token: rank 0 serves distcomm's store, the others connect, and from then on
   the library's own rendezvous runs (data mesh, shared memory between the ranks of a host).

So whoever can reach torch's store learns the token, exactly as whoever can reach it can join
torch's job; and nothing depends on how torch's store was made. The port is found by binding
port 0 and closing it just before the library binds it again (as torchrun does for its own
port): another process grabbing it in between makes rank 0 fail with "already in use".
"""

import os
import secrets
import socket
import threading
from ctypes import byref, c_int32, c_void_p
from typing import Any, Dict, List, Optional, Tuple

from .. import _lib
from . import _errors

#: dc_init reads DC_TOKEN and DC_LAUNCHER_STORE from the process environment (no option field
#: for them yet): one init at a time changes them, and puts them back at once.
_ENV_LOCK = threading.Lock()


def _get(store: Any, key: str) -> bytes:
    v = store.get(key)
    return bytes(v)


def _local_host() -> str:
    return socket.gethostname()


def _reachable_address() -> str:
    """This host's address as seen by the others: the source address of a route to torch's
    master (MASTER_ADDR), else the host name's address."""
    master = os.environ.get("MASTER_ADDR", "").strip().strip("[]")
    if master:
        try:
            fam = socket.AF_INET6 if ":" in master else socket.AF_INET
            with socket.socket(fam, socket.SOCK_DGRAM) as s:
                s.connect((master, 9))  # UDP connect sends nothing: it only picks the route
                addr = s.getsockname()[0]
            if not addr.startswith("127.") and addr != "::1":
                return addr
        except OSError:
            pass
    try:
        addr = socket.gethostbyname(socket.gethostname())
        if not addr.startswith("127."):
            return addr
    except OSError:
        pass
    raise _errors.BY_CLASS[_errors.dc.DistRendezvousError](
        "the group spans several hosts, but this host (the group's rank 0) has no address other "
        "than loopback to offer them for distcomm's store: set MASTER_ADDR to an address of this "
        "host that the others reach")


def _free_port(host: str) -> int:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _announce(store: Any, rank: int, size: int, gen: int) -> Tuple[str, int, str]:
    """Rank 0: picks the store's address and the token and publishes them."""
    me = _local_host()
    keys = [f"distcomm/{gen}/host/{r}" for r in range(1, size)]
    hosts = [_get(store, k).decode() for k in keys]
    host = "127.0.0.1" if all(h == me for h in hosts) else _reachable_address()
    port = _free_port(host)
    token = secrets.token_hex(16)
    store.set(f"distcomm/{gen}/store", f"{host}\n{port}\n{token}".encode())
    return host, port, token


def _learn(store: Any, rank: int, gen: int) -> Tuple[str, int, str]:
    store.set(f"distcomm/{gen}/host/{rank}", _local_host().encode())
    v = _get(store, f"distcomm/{gen}/store").decode().split("\n")
    if len(v) != 3:
        raise _errors.BY_CLASS[_errors.dc.DistRendezvousError](f"malformed distcomm store announcement {v!r} in torch's store")
    return v[0], int(v[1]), v[2]


class _Env:
    """Sets and clears variables for the duration of a with-block, restoring them after."""

    def __init__(self, set_: Dict[str, str], clear: List[str]):
        self._set, self._clear = set_, clear
        self._old: Dict[str, Optional[str]] = {}

    def __enter__(self) -> None:
        for k in list(self._set) + self._clear:
            self._old[k] = os.environ.get(k)
        os.environ.update(self._set)
        for k in self._clear:
            os.environ.pop(k, None)

    def __exit__(self, *exc: Any) -> None:
        for k, v in self._old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def init_comm(store: Any, rank: int, size: int, timeout_ms: int, name: str) -> int:
    """A dc_comm for this rank of a group of `size` ranks whose torch store is `store`;
    returns the handle. Collective over the group's ranks."""
    # Generations keep a re-created group (same store, same name) off a stale announcement.
    gen = int(store.add(f"distcomm/gen/{rank}", 1))
    # The torch store's own errors (its timeouts, a closed store) pass through as they are.
    if rank == 0:
        host, port, token = _announce(store, rank, size, gen)
    else:
        host, port, token = _learn(store, rank, gen)
    lib = _lib.load()
    opts = _lib.InitOptions()
    lib.dc_init_options_default(byref(opts))
    url = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    opts.init_method = url.encode()
    opts.rank = rank
    opts.world_size = size
    opts.group_name = name.encode()[:200] or None
    opts.timeout_ms = timeout_ms
    h = c_void_p()
    with _ENV_LOCK, _Env({"DC_TOKEN": token}, ["DC_LAUNCHER_STORE"]):
        st = lib.dc_init(byref(opts), byref(h))
        msg = _lib.last_error() if st != 0 else ""
    if st != 0:
        raise _errors.for_status(st, f"distcomm init of torch group {name!r} (rank {rank} of {size}, store {url}): {msg}")
    return int(h.value)


def comm_int(fn: Any, h: int) -> int:
    v = c_int32()
    st = fn(h, byref(v))
    if st != 0:
        raise _errors.for_status(st, _lib.last_error())
    return int(v.value)
