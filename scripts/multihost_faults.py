"""Faults of real clusters, run by scripts/multihost_test.sh: one rank per host (network
namespaces), the peer timeout short (DC_PEER_TIMEOUT_MS).

  idle SECONDS   every rank idles that long between two allreduces: connections that carry
                 nothing but heartbeats are not taken for dead ("idle: OK")
  freeze         the last rank stops itself (SIGSTOP: a frozen host looks the same from the
                 other hosts) after arranging to be killed later; the others must fail their
                 allreduce with DistPeerLostError naming it ("lost: RANK after S s: MSG")
  cut            the last rank takes its data interface down (a network cut, the store's net
                 stays up): every rank must fail with DistPeerLostError ("lost: ...")
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np

import distcomm as dc


def allreduce_check(n):
    x = np.ones(8, np.float32)
    dc.all_reduce(x)
    assert (x == n).all(), x


def expect_loss(n, limit_s):
    """Allreduces until one fails (the first may complete: what it needed had arrived)."""
    t0 = time.monotonic()
    try:
        for _ in range(3):
            allreduce_check(n)
    except dc.DistPeerLostError as e:
        took = time.monotonic() - t0
        print(f"lost: rank {dc.get_rank()} after {took:.1f} s: {e}", flush=True)
        if took > limit_s:
            print(f"FAIL: the loss took {took:.1f} s (bound {limit_s} s)", flush=True)
            sys.exit(4)
        os._exit(0)  # the comm is broken; nothing to tear down politely
    print("FAIL: the allreduces succeeded", flush=True)
    sys.exit(5)


def main():
    mode = sys.argv[1]
    dc.init_process_group()
    r, n = dc.get_rank(), dc.get_world_size()
    allreduce_check(n)
    peer_s = int(os.environ["DC_PEER_TIMEOUT_MS"]) / 1000
    if mode == "idle":
        time.sleep(float(sys.argv[2]))
        allreduce_check(n)
        dc.barrier()
        print(f"idle: OK on rank {r}", flush=True)
        dc.destroy_process_group()
        return
    victim = n - 1
    if r == victim:
        time.sleep(0.5)
        if mode == "freeze":
            subprocess.Popen(["sh", "-c", f"sleep {3 * peer_s + 10}; kill -KILL {os.getpid()}"])
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            subprocess.run(["ip", "link", "set", "dev", os.environ.get("DC_SOCKET_IFNAME", "data0"), "down"], check=True)
            expect_loss(n, peer_s + 5)
        time.sleep(3600)
    expect_loss(n, peer_s + 5)


if __name__ == "__main__":
    main()
