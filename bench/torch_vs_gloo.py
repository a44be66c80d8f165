"""distcomm against Gloo through torch.distributed's front end, in one job.

Both backends serve groups of the same ranks in the same processes, so the front end's cost is
the same for both and the rounds interleave (A B B A ...: drift falls on both alike). For each
op (all_reduce, broadcast, all_gather_into_tensor) and size (bytes of float32 per rank), each
round times 2000 calls on each backend up to 4 KiB, fewer above (6 at 16 MiB), after a tenth as
many; printed: the medians per backend and the median of the per-round ratios distcomm/Gloo
(below 1: distcomm faster), slowest rank.

    dcrun -n 2 --rank0-store python bench/torch_vs_gloo.py
    DC_TRANSPORT=socket dcrun -n 4 --rank0-store python bench/torch_vs_gloo.py   # distcomm on sockets

Gloo runs over TCP loopback as torch.distributed uses it on the CPU; distcomm takes what its
communicator chose (shared memory on one host unless DC_TRANSPORT=socket).
"""

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

import distcomm.torch  # noqa: F401  registers "distcomm"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp import per_call  # noqa: E402  (the same timing as the DDP benchmark's per-call part)

OPS = ("all_reduce", "broadcast", "all_gather_into_tensor")


def sizes(text: str):
    out = []
    for s in text.split(","):
        s = s.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1:], 1)
        out.append(int(s.rstrip("KM")) * mult)
    return out


def label(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K" if n >= 1 << 10 else str(n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="16,4K,64K,1M,16M")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    dist.init_process_group("distcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"distcomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    transport = distcomm.torch.backend_of().transport()
    if rank == 0:
        print(f"{size} ranks; distcomm on {transport}, Gloo on TCP; {args.rounds} interleaved rounds; "
              "time per call in us (slowest rank), ratio distcomm/gloo (median of rounds)")
        print(f"{'op':24s} {'size':>6s} {'distcomm':>10s} {'gloo':>10s} {'ratio':>7s}")
    for op in args.ops.split(","):
        for n in sizes(args.sizes):
            count = max(1, n // 4)
            x = torch.ones(count)
            out = torch.zeros(count * size)
            calls = {
                "all_reduce": lambda g: dist.all_reduce(x, group=g),
                "broadcast": lambda g: dist.broadcast(x, 0, group=g),
                "all_gather_into_tensor": lambda g: dist.all_gather_into_tensor(out, x, group=g),
            }
            iters = 2000 if n <= 4096 else 300 if n <= 1 << 16 else 40 if n <= 1 << 20 else 6
            warmup = max(2, iters // 10)
            t = {k: [] for k in groups}
            order = list(groups)
            for r in range(args.rounds):
                for k in (order if r % 2 == 0 else order[::-1]):
                    t[k].append(per_call(lambda: calls[op](groups[k]), iters, warmup))
            if rank == 0:
                ratio = statistics.median(a / b for a, b in zip(t["distcomm"], t["gloo"]))
                print(f"{op:24s} {label(n):>6s} {statistics.median(t['distcomm']):10.1f} "
                      f"{statistics.median(t['gloo']):10.1f} {ratio:7.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
