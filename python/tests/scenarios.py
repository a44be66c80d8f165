"""Small jobs the host-side tests start (python scenarios.py NAME [ARGS]); each rank prints
"OK <details>" when its part went as expected and exits non-zero otherwise.

They cover what the rank-side tests cannot: error statuses that end a communicator, init
arguments, the interpreter exiting without destroy_process_group, forked children."""

import datetime
import os
import sys
import time

import numpy as np

import distcomm as dist


def ok(*what) -> None:
    print("OK", *what, flush=True)


def expect(exc_type, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc_type as e:
        assert isinstance(e, dist.DistError) and e.message, repr(e)
        return e
    raise AssertionError(f"{fn.__name__} did not raise {exc_type.__name__}")


def timeout():
    dist.init_process_group(timeout=datetime.timedelta(seconds=20))
    g = dist.new_group(timeout=1.0)
    if dist.get_rank() == 0:
        t0 = time.monotonic()
        e = expect(dist.DistTimeoutError, dist.recv, np.zeros(1), 1, g)
        took = time.monotonic() - t0
        assert 0.9 < took < 10, took
        assert e.status == 3 and e.status_name == "DC_ERR_TIMEOUT"
        ok("timeout after %.1f s:" % took, e.message)
    dist.barrier()
    dist.destroy_process_group()
    ok("done")


def mismatch():
    dist.init_process_group()
    if dist.get_rank() == 0:
        e = expect(dist.DistMismatchError, dist.all_reduce, np.zeros(4, np.float32))
    else:
        e = expect(dist.DistMismatchError, dist.all_gather, [np.zeros(4, np.float32)] * 2, np.zeros(4, np.float32))
    ok("mismatch:", e.message)
    dist.destroy_process_group()


def abort():
    dist.init_process_group()
    if dist.get_rank() == 0:
        time.sleep(0.3)
        dist.abort()
        expect(dist.DistAbortedError, dist.barrier)
        ok("aborted here")
    else:
        t0 = time.monotonic()
        e = expect(dist.DistAbortedError, dist.recv, np.zeros(1), 0)
        assert time.monotonic() - t0 < 10
        ok("aborted by the peer:", e.message)
    dist.destroy_process_group()


def abort_from_thread():
    import threading

    dist.init_process_group()
    if dist.get_rank() == 0:
        threading.Timer(0.3, dist.abort).start()
        e = expect(dist.DistAbortedError, dist.recv, np.zeros(1), 1)  # blocked in this thread
        ok("blocked call aborted from another thread:", e.message)
    else:
        e = expect(dist.DistAbortedError, dist.recv, np.zeros(1), 0)
        ok("aborted by the peer")
    dist.destroy_process_group()


def peer_lost():
    dist.init_process_group()
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(0)  # no goodbye, no atexit: like a crash
    t0 = time.monotonic()
    e = expect(dist.DistPeerLostError, dist.recv, np.zeros(1), 1)
    assert time.monotonic() - t0 < 10
    ok("peer lost:", e.message)
    dist.destroy_process_group()


def unavailable():
    # NCCL from a library that does not exist: unavailable on any machine.
    os.environ["DC_NCCL_LIBRARY"] = "/nonexistent/libnccl.so.2"
    e = expect(dist.DistUnavailableError, dist.init_process_group, backend="nccl")
    assert not dist.is_initialized()
    ok("unavailable:", e.message)


def invalid_init():
    e = expect(dist.DistInvalidArgument, dist.init_process_group, init_method="udp://nowhere:1")
    assert "init_method" in e.message and isinstance(e, ValueError)
    e2 = expect(dist.DistInvalidArgument, dist.init_process_group, timeout="soon")
    e3 = expect(dist.DistInvalidArgument, dist.init_process_group, rank="0")
    ok("invalid:", e.message, "|", e2.message, "|", e3.message)


def env_error():
    # WORLD_SIZE missing: the library names the variable
    e = expect(dist.DistInvalidArgument, dist.init_process_group)
    assert "WORLD_SIZE" in e.message, e.message
    ok("env:", e.message)


def rendezvous_error():
    # DC_TOKEN differs between the ranks: the store refuses the stranger
    try:
        dist.init_process_group()
    except (dist.DistRendezvousError, dist.DistTimeoutError) as e:
        ok(type(e).__name__, e.message)
        return
    raise AssertionError("init succeeded with a wrong token")


def token_arg():
    # token= and encrypt= given to init_process_group (no DC_TOKEN): TEST_TOKEN per rank
    assert "DC_TOKEN" not in os.environ
    try:
        dist.init_process_group(token=os.environ["TEST_TOKEN"], encrypt=False)
    except (dist.DistRendezvousError, dist.DistTimeoutError) as e:
        ok("refused", type(e).__name__, e.message)
        return
    x = np.array([1], np.int64)
    dist.all_reduce(x)
    assert x[0] == dist.get_world_size()
    dist.destroy_process_group()
    ok("joined")


def port_in_use():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    e = expect(dist.DistError, dist.init_process_group, timeout=3)
    ok(type(e).__name__, e.status_name, e.message)


def not_initialized():
    assert not dist.is_initialized()
    expect(dist.DistInvalidUsage, dist.get_rank)
    expect(dist.DistInvalidUsage, dist.all_reduce, np.zeros(1))
    expect(dist.DistInvalidUsage, dist.destroy_process_group)
    assert dist.is_available() and dist.library_version() >= (0, 1, 0)
    ok("not initialised")


def reinit():
    dist.init_process_group()
    x = np.ones(1)
    dist.all_reduce(x)
    dist.destroy_process_group()
    assert not dist.is_initialized()
    dist.init_process_group(group_name="second")
    y = np.ones(1)
    dist.all_reduce(y)
    assert x[0] == y[0] == dist.get_world_size()
    dist.destroy_process_group()
    ok("initialised twice")


def forked_child():
    dist.init_process_group()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            dist.get_rank()
        except dist.DistInvalidUsage as e:
            code = 0 if "forked" in e.message else 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    x = np.ones(1)
    dist.all_reduce(x)  # the parent's group still works
    assert x[0] == dist.get_world_size()
    dist.destroy_process_group()
    ok("forked child refused")


def init_args(method: str, rank: str, size: str):
    """init_process_group with explicit arguments and no launcher variables."""
    dist.init_process_group("gloo", init_method=method, rank=int(rank), world_size=int(size),
                            timeout=datetime.timedelta(seconds=30))
    r, n = dist.get_rank(), dist.get_world_size()
    x = np.array([r], np.int64)
    dist.all_reduce(x)
    assert x[0] == n * (n - 1) // 2 and n == int(size)
    dist.destroy_process_group()
    ok("rank", r, "of", n)


def launcher_env():
    """Only a launcher's variables (plus MASTER_ADDR/PORT): rank and size come from them."""
    for v in ("RANK", "WORLD_SIZE"):
        assert v not in os.environ, v
    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    objs = [None] * n
    dist.all_gather_object(objs, r)
    assert objs == list(range(n))
    x = np.full(3, r, np.float64)
    dist.all_reduce(x)
    assert np.all(x == n * (n - 1) / 2)
    dist.destroy_process_group()
    ok("rank", r, "of", n)


def exit_without_destroy():
    dist.init_process_group()
    x = np.ones(4)
    dist.all_reduce(x)
    dist.isend(np.ones(1), (dist.get_rank() + 1) % dist.get_world_size())  # completed, never waited
    ok("leaving without destroy_process_group")


def exit_with_pending():
    dist.init_process_group()
    dist.barrier()
    # a receive nobody will ever match, and a collective only this rank starts
    dist.irecv(np.zeros(1), src=(dist.get_rank() + 1) % dist.get_world_size(), tag=77)
    if dist.get_rank() == 0:
        dist.all_reduce(np.zeros(1), async_op=True)
    ok("leaving with pending operations")


def raise_midway():
    dist.init_process_group()
    dist.barrier()
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails before the all_reduce")
    t0 = time.monotonic()
    e = expect(dist.DistError, dist.all_reduce, np.ones(1))
    took = time.monotonic() - t0
    assert isinstance(e, (dist.DistPeerLostError, dist.DistAbortedError)), repr(e)
    ok("noticed in %.1f s:" % took, type(e).__name__, e.message)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
