"""Benchmark of the torch.distributed backend "distcomm" against Gloo, in one job.

Part 1, the DDP step: an MLP of about 25M parameters (4 x Linear(2560, 2560) + bias) trained
with DistributedDataParallel, one copy on the distcomm default group and one on a Gloo group of
the same ranks, in interleaved rounds (A B B A ...: drift of the machine falls on both alike).
Each round times --steps steps after --warmup; the medians per backend and the median of the
per-round ratios (gloo / distcomm) are printed. The batch is small (--batch, default 8), so
the step is dominated by the allreduce of the 100 MB of gradients.

Part 1 also times DDP with a comm hook that communicates nothing ("free comm"): the floor of
the step (compute and DDP's bucket copies), so gloo / free-comm is the most any backend could
gain over Gloo on these cores.

Part 2, per-call overhead: a 4-byte all_reduce called --calls times through torch's front end
on distcomm (the default group: the native backend where it builds; a second group of the same
ranks on the Python backend alone) and on Gloo, async + wait on distcomm, the Python backend's
allreduce() called directly (without torch's dispatch into it), and the library's own
dc_allreduce through ctypes (distcomm's array API) as the floor of a call from Python, in
interleaved rounds. Compare the distcomm numbers with dc-bench's for the same size:

    dcrun -n 2 dc-bench -b 4 -e 4 -o allreduce -n 10000

Run (2 ranks; rank 0 prints):

    dcrun -n 2 --rank0-store python bench/torch_ddp.py [--rounds 6] [--steps 10] [--busy]
    torchrun --nproc-per-node 2 bench/torch_ddp.py

Without OMP_NUM_THREADS each rank computes on one thread, as under torchrun.

--busy starts one busy process (a spinning Python loop) on the machine for the whole run, as
the issue's "with one busy process" case. Timings mean something only on a quiet machine.
"""

import argparse
import multiprocessing
import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import distcomm
import distcomm.torch  # noqa: F401  registers "distcomm"


def spin() -> None:
    while True:
        pass


def _no_comm(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook that communicates nothing (the bucket as it is)."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def mlp(width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def time_steps(model: nn.Module, x: torch.Tensor, steps: int) -> float:
    """Seconds per training step (forward, backward with DDP's allreduce, SGD update)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        model(x).square().mean().backward()
        opt.step()
    dist.barrier()
    return (time.perf_counter() - t0) / steps


def per_call(fn, calls: int, warmup: int = 200) -> float:
    """Microseconds per call of fn (after `warmup` calls, at most `calls`), the slowest rank's
    (bench/torch_vs_gloo.py times with this too)."""
    for _ in range(min(warmup, calls)):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = torch.tensor([(time.perf_counter() - t0) / calls * 1e6])
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    return us.item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=2560)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--busy", action="store_true")
    args = ap.parse_args()

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # as torchrun does for several processes per host
    dist.init_process_group("distcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    busy = None
    if args.busy and rank == 0:
        busy = multiprocessing.get_context("spawn").Process(target=spin, daemon=True)
        busy.start()

    # A group of the same ranks on the Python backend alone (DISTCOMM_TORCH_NATIVE is read as
    # each group is made), beside the default group's native one.
    saved = os.environ.get("DISTCOMM_TORCH_NATIVE")
    os.environ["DISTCOMM_TORCH_NATIVE"] = "0"
    python_only = dist.new_group(backend="distcomm")
    if saved is None:
        del os.environ["DISTCOMM_TORCH_NATIVE"]
    else:
        os.environ["DISTCOMM_TORCH_NATIVE"] = saved
    net = mlp(args.width, args.layers)
    params = sum(p.numel() for p in net.parameters())
    # "free comm": DDP whose comm hook returns the bucket as it is (no communication): the
    # floor of the step on these cores (compute, DDP's bucket copies), which bounds how much
    # faster any backend can make it.
    free = DDP(mlp(args.width, args.layers))
    free.register_comm_hook(None, _no_comm)
    models = {"distcomm": DDP(mlp(args.width, args.layers)), "gloo": DDP(mlp(args.width, args.layers), process_group=gloo),
              "free comm": free, "distcomm (Python backend)": DDP(mlp(args.width, args.layers), process_group=python_only)}
    x = torch.randn(args.batch, args.width)
    for m in models.values():
        time_steps(m, x, args.warmup)
    times = {name: [] for name in models}
    order = list(models)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            times[name].append(time_steps(models[name], x, args.steps))
    if rank == 0:
        print(f"DDP step, MLP {args.layers} x {args.width}^2 ({params / 1e6:.1f}M parameters, "
              f"{params * 4 / 2**20:.0f} MiB of gradients), batch {args.batch}, {size} ranks, "
              f"{args.rounds} interleaved rounds of {args.steps} steps{', one busy process' if args.busy else ''}:")
        for name, ts in times.items():
            print(f"  {name:26s} median {statistics.median(ts) * 1e3:8.2f} ms/step  (rounds: "
                  + ", ".join(f"{t * 1e3:.1f}" for t in ts) + ")")
        ratios = [g / d for g, d in zip(times["gloo"], times["distcomm"])]
        print(f"  gloo / distcomm: median {statistics.median(ratios):.2f}x")
        ratios = [p / d for p, d in zip(times["distcomm (Python backend)"], times["distcomm"])]
        print(f"  distcomm (Python backend) / distcomm: median {statistics.median(ratios):.2f}x")
        bound = [g / c for g, c in zip(times["gloo"], times["free comm"])]
        print(f"  gloo / free comm (the most any backend could gain over Gloo here): median {statistics.median(bound):.2f}x")

    one = torch.ones(1)
    backend = distcomm.torch.backend_of()
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    native = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__ == "NativeBackend"
    calls = {
        f"torch all_reduce, distcomm ({'native' if native else 'Python, no native backend'})": lambda: dist.all_reduce(one),
        "torch all_reduce, distcomm (Python backend)": lambda: dist.all_reduce(one, group=python_only),
        "torch all_reduce, gloo": lambda: dist.all_reduce(one, group=gloo),
        "torch all_reduce async+wait, distcomm": lambda: dist.all_reduce(one, async_op=True).wait(),
        # The Python backend called directly, without torch's dispatch into it.
        "Python backend allreduce().wait()": lambda: backend.allreduce([one], opts).wait(),
    }
    dc_world = None
    arr = np.ones(1, dtype=np.float32)
    # The floor: the library called through ctypes by distcomm's array API, on its own world
    # (formed through torch's store address: a second distcomm job of the same ranks).
    try:
        distcomm.init_process_group(init_method=_init_url(), rank=rank, world_size=size)
        dc_world = True
        calls["distcomm.all_reduce (ctypes, numpy)"] = lambda: distcomm.all_reduce(arr)
    except distcomm.DistError as e:
        if rank == 0:
            print(f"(no ctypes floor: {e})")
    # Interleaved rounds (the order reversed every other round); Gloo's calls are slow, so it
    # makes a tenth of them.
    samples = {k: [] for k in calls}
    names = list(calls)
    for r in range(3):
        for k in (names if r % 2 == 0 else names[::-1]):
            samples[k].append(per_call(calls[k], args.calls // 10 if "gloo" in k else args.calls))
    res = {k: statistics.median(v) for k, v in samples.items()}
    if rank == 0:
        print(f"per-call time of a 4-byte all_reduce, {size} ranks, medians of 3 interleaved rounds of {args.calls} "
              "calls (slowest rank):")
        for k, v in res.items():
            print(f"  {k:42s} {v:8.2f} us")
        print("  compare with: dcrun -n 2 dc-bench -b 4 -e 4 -o allreduce -n 10000")
    if dc_world:
        distcomm.destroy_process_group()
    if busy is not None:
        busy.terminate()
    dist.destroy_process_group()


def _init_url() -> str:
    """A tcp:// store for distcomm's own world: rank 0 picks a free port and tells the others
    through torch's default group (broadcast of the port)."""
    import socket

    port = torch.zeros(1, dtype=torch.int64)
    if dist.get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    dist.broadcast(port, 0)
    return f"tcp://127.0.0.1:{int(port.item())}"


if __name__ == "__main__":
    main()
