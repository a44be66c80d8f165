"""Faults of real clusters, run by scripts/multihost_test.sh: one rank per host (network
namespaces), the peer timeout short (DC_PEER_TIMEOUT_MS).

  idle SECONDS   every rank idles that long between two allreduces: connections that carry
                 nothing but heartbeats are not taken for dead ("idle: OK")
  freeze         the last rank stops itself (SIGSTOP: a frozen host looks the same from the
                 other hosts) after arranging to be killed later; the others must fail their
                 allreduce with DistPeerLostError naming it ("lost: RANK after S s: MSG")
  cut            the last rank takes its data interface down (a network cut, the store's net
                 stays up): every rank must fail with DistPeerLostError ("lost: ...")
  flood GB BOUND rank 0 sends GB gigabytes to rank 1 (4 MiB and 64 KiB messages of one tag,
                 up to 64 in flight) as fast as it can; rank 1 starts late and checks every
                 message's sequence number and bytes. Its peak memory may grow by at most BOUND
                 MiB over what it had before ("flood: OK ..."): without flow control the sender
                 fills the receiver's memory with messages it has not asked for yet
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


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


FLOOD_SIZES = [4 << 20, 64 << 10, 64 << 10, 64 << 10]


def flood(r, gigabytes, bound_mib):
    """See the module's docstring: a fast sender, a slow receiver, memory bounded."""
    total = int(gigabytes * (1 << 30))
    sizes = []
    while sum(sizes) < total:
        sizes.extend(FLOOD_SIZES)
    buf = np.zeros(max(FLOOD_SIZES), np.uint8)
    dc.barrier()
    if r == 0:
        inflight = []
        msgs = [np.full(n, k % 251, np.uint8) for k, n in enumerate(FLOOD_SIZES * 16)]
        t0 = time.monotonic()
        for k, n in enumerate(sizes):
            m = msgs[k % len(msgs)]
            m[:8] = np.frombuffer(np.int64(k).tobytes(), np.uint8)
            m[8:] = k % 251
            inflight.append((dc.isend(m, 1), m))
            if len(inflight) >= len(msgs) // 2:
                w, _ = inflight.pop(0)
                w.wait()
        for w, _ in inflight:
            w.wait()
        print(f"flood: sent {len(sizes)} messages, {sum(sizes) / 2**30:.1f} GiB in {time.monotonic() - t0:.1f} s", flush=True)
    else:
        before = peak_rss_mib()
        time.sleep(2)  # the sender runs ahead meanwhile
        for k, n in enumerate(sizes):
            v = buf[:n]
            dc.recv(v, 0)
            seq = int(np.frombuffer(v[:8].tobytes(), np.int64)[0])
            if seq != k or not (v[8:] == k % 251).all():
                print(f"FAIL: message {k} came as {seq} or with wrong bytes", flush=True)
                sys.exit(6)
            if k % 64 == 0:
                time.sleep(0.002)  # slower than the sender throughout
        grew = peak_rss_mib() - before
        print(f"flood: received {len(sizes)} messages in order, intact; peak memory grew by {grew:.0f} MiB (bound {bound_mib} MiB)", flush=True)
        if grew > bound_mib:
            print(f"FAIL: the receiver's memory grew by {grew:.0f} MiB", flush=True)
            sys.exit(7)
        print("flood: OK", flush=True)
    dc.barrier()


def main():
    mode = sys.argv[1]
    dc.init_process_group()
    r, n = dc.get_rank(), dc.get_world_size()
    allreduce_check(n)
    if mode == "flood":
        flood(r, float(sys.argv[2]), float(sys.argv[3]))
        dc.destroy_process_group()
        return
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
