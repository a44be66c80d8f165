"""DistributedDataParallel on the "distcomm" backend: a torch script switched to distcomm by
importing ``distcomm.torch`` and naming the backend, nothing else.

A small MLP learns a regression target; every step each rank trains on its shard of one global
batch and DDP averages the gradients. Run it like any torch script:

    torchrun --nproc-per-node 4 examples/python/torch_ddp.py            # torchrun
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 python examples/python/torch_ddp.py &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=1 python examples/python/torch_ddp.py
    dcrun -n 4 --rank0-store python examples/python/torch_ddp.py        # dcrun: rank 0 serves
                                                                         # torch's store
    python examples/python/torch_ddp.py                                  # one process, no DDP

Options: --backend (default distcomm; gloo for comparison), --steps, --out FILE (rank 0 saves
the trained weights there with torch.save).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn

import distcomm.torch  # noqa: F401  registers the backend "distcomm"

GLOBAL_BATCH = 24  # divisible by 1, 2, 3, 4 (and 6, 8, 12): every rank gets an equal shard


def model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 4))


def batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 16, generator=g)
    y = torch.sin(x[:, :4] * 2) + 0.1 * x[:, 4:8] ** 2
    return x, y


def train(net: nn.Module, rank: int, size: int, steps: int, lr: float) -> None:
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    per = GLOBAL_BATCH // size
    for step in range(steps):
        x, y = batch(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)  # the mean over the shard: DDP averages shards
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step:3d}  loss {loss.item():.6f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="distcomm")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    net = model()
    if distributed:
        dist.init_process_group(args.backend)
        rank, size = dist.get_rank(), dist.get_world_size()
        net = nn.parallel.DistributedDataParallel(net)
    else:
        rank, size = 0, 1
    train(net, rank, size, args.steps, args.lr)
    weights = (net.module if distributed else net).state_dict()
    if distributed:
        # Every rank ends with the same weights (bitwise): DDP's averaged gradients are identical.
        flat = torch.cat([w.reshape(-1) for w in weights.values()])
        ref = flat.clone()
        dist.broadcast(ref, 0)
        agree = torch.tensor([int(torch.equal(flat, ref))])
        dist.all_reduce(agree, op=dist.ReduceOp.MIN)
        if rank == 0:
            print(f"ranks agree: {bool(agree.item())}")
    if rank == 0:
        print(f"trained {args.steps} steps on {size} rank(s) with {args.backend if distributed else 'no backend'}")
        if args.out:
            torch.save(weights, args.out)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
