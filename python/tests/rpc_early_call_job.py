"""A job for tests/test_rpc.py: a call that reaches a worker while its init_rpc is still returning.

Every worker but w0 is slowed down just after its handler is registered (the moment a held call
starts to run). w0 calls each of them at once with a function that itself uses the RPC API; the
call must be served as on any ready worker, not fail with "RPC is not initialised"."""

import os
import sys
import time

from distcomm import rpc


def whoami():
    return rpc.get_current_worker_info().name


class _SlowRegister:
    """The library, but dc_rpc_register sleeps (without the GIL) after registering."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def dc_rpc_register(self, *args):
        status = self._lib.dc_rpc_register(*args)
        time.sleep(0.5)
        return status


def main():
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank != 0:
        slow = _SlowRegister(rpc._c())
        rpc._c = lambda: slow
    rpc.init_rpc(f"w{rank}")
    if rank == 0:
        for r in range(1, size):
            assert rpc.rpc_sync(f"w{r}", whoami) == f"w{r}"
    rpc.shutdown()
    print(f"early call ok on w{rank}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
