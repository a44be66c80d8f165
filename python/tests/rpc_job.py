"""A job for tests/test_rpc.py: every rank runs this under dcrun (3 or more ranks).

Workers w0, w1, ... call each other concurrently (hundreds of calls, some nested), and check
remote exceptions, timeouts, unknown workers, worker infos and a collective shutdown."""

import os
import sys
import threading
import time

from distcomm import rpc
from distcomm import DistInvalidArgument, DistTimeoutError


def mul(a, b):
    return a * b


def whoami():
    return rpc.get_current_worker_info().name


def relay(to, a, b):
    """Nested: this worker calls another one while serving a call."""
    return ("via", whoami(), rpc.rpc_sync(to, mul, args=(a, b)))


def boom(n):
    raise ValueError(f"bad input {n}")


def sleepy(seconds):
    time.sleep(seconds)
    return "woke"


class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("no pickling")


def unpicklable_failure():
    raise Unpicklable("custom failure")


def main():
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    me = f"w{rank}"
    rpc.init_rpc(me)
    infos = rpc.get_all_worker_infos()
    assert [i.name for i in infos] == [f"w{r}" for r in range(size)], infos
    assert rpc.get_current_worker_info().rank == rank
    assert rpc.get_worker_info("w0").rank == 0

    # Concurrent calls from several threads to every worker, some nested.
    errors = []

    def caller(t):
        try:
            for i in range(40):
                to = f"w{(rank + i + t) % size}"
                assert rpc.rpc_sync(to, mul, args=(i, t + 1)) == i * (t + 1)
                if i % 8 == 0:
                    third = f"w{(rank + 2) % size}"
                    assert rpc.rpc_sync(to, relay, args=(third, i, 3)) == ("via", to, i * 3)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    futures = [rpc.rpc_async(f"w{(rank + 1) % size}", mul, args=(k, k)) for k in range(50)]
    assert [f.wait() for f in futures] == [k * k for k in range(50)]
    for t in threads:
        t.join()
    assert not errors, errors

    # Remote exceptions come back with their type and message.
    try:
        rpc.rpc_sync(f"w{(rank + 1) % size}", boom, args=(42,))
        raise AssertionError("boom did not raise")
    except ValueError as e:
        assert "bad input 42" in str(e), e
    try:
        rpc.rpc_sync(f"w{(rank + 1) % size}", unpicklable_failure)
        raise AssertionError("unpicklable_failure did not raise")
    except Exception as e:
        assert "Unpicklable" in str(e) and "custom failure" in str(e), e

    # A call that outlives its timeout fails; the agent stays usable.
    t0 = time.time()
    try:
        rpc.rpc_sync(f"w{(rank + 1) % size}", sleepy, args=(2.0,), timeout=0.3)
        raise AssertionError("sleepy did not time out")
    except DistTimeoutError:
        assert time.time() - t0 < 1.8
    assert rpc.rpc_sync(f"w{(rank + 1) % size}", mul, args=(6, 7)) == 42

    try:
        rpc.rpc_sync("nobody", mul, args=(1, 2))
        raise AssertionError("unknown worker accepted")
    except DistInvalidArgument:
        pass

    rpc.shutdown()
    print(f"rpc job ok on {me}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
