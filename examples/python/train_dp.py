"""Data-parallel training over NumPy with distcomm.

A small two-layer network (tanh hidden layer) learns a regression target. The model starts from
rank 0's parameters (broadcast), each rank computes the gradient of its shard of every batch,
all_reduce sums the gradients, and every rank applies the same update. The loss is printed as it
trains; at the end the ranks check that they hold bitwise identical parameters, and rank 0 checks
them against the same training done by one process on the whole batch.

    dcrun -n 4 python examples/python/train_dp.py [--steps 200] [--lr 0.1]

Exits non-zero if the ranks disagree or the result differs from the single-process run.
"""

import argparse
import sys
from typing import Dict, Tuple

import numpy as np

import distcomm as dist

Params = Dict[str, np.ndarray]


def make_data(n: int, d: int, seed: int = 7) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    y = np.sin(x @ w) + 0.1 * x[:, 0] ** 2 + 0.01 * rng.normal(size=n)
    return x, y[:, None]


def init_params(d: int, hidden: int, seed: int) -> Params:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.normal(scale=1 / np.sqrt(d), size=(d, hidden)),
        "b1": np.zeros(hidden),
        "w2": rng.normal(scale=1 / np.sqrt(hidden), size=(hidden, 1)),
        "b2": np.zeros(1),
    }


def loss_and_grads(p: Params, x: np.ndarray, y: np.ndarray, total: int) -> Tuple[float, Params]:
    """Sum of squared errors / (2 * total) over the rows given, and its gradient: the shards'
    values add up to the whole batch's."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    out = h @ p["w2"] + p["b2"]
    err = out - y
    loss = float((err**2).sum() / (2 * total))
    g_out = err / total
    g_h = (g_out @ p["w2"].T) * (1 - h**2)
    return loss, {
        "w1": x.T @ g_h,
        "b1": g_h.sum(0),
        "w2": h.T @ g_out,
        "b2": g_out.sum(0),
    }


def flat(p: Params) -> np.ndarray:
    return np.concatenate([p[k].ravel() for k in sorted(p)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=256, help="global batch size")
    ap.add_argument("--hidden", type=int, default=16)
    args = ap.parse_args()

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()

    d, n = 8, 4096
    x, y = make_data(n, d)
    params = init_params(d, args.hidden, seed=1000 + rank)  # different on every rank ...
    for k in sorted(params):
        dist.broadcast(params[k], src=0)  # ... until rank 0's are broadcast
    start = {k: v.copy() for k, v in params.items()}

    def batch_rows(step: int) -> np.ndarray:
        first = (step * args.batch) % n
        return (np.arange(args.batch) + first) % n

    for step in range(args.steps):
        rows = batch_rows(step)[rank::world]  # this rank's shard of the global batch
        loss, grads = loss_and_grads(params, x[rows], y[rows], args.batch)
        g = flat(grads)
        packed = np.concatenate([g, [loss]])
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)  # gradients and loss of the whole batch
        g, loss = packed[:-1], packed[-1]
        off = 0
        for k in sorted(params):
            size = params[k].size
            params[k] -= args.lr * g[off:off + size].reshape(params[k].shape)
            off += size
        if rank == 0 and (step % 20 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss:.6f}", flush=True)

    # Every rank must hold the same bytes.
    mine = flat(params)
    ref = mine.copy()
    dist.broadcast(ref, src=0)
    agree = np.array([1 if np.array_equal(mine, ref) else 0], dtype=np.int32)
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    ok = bool(agree[0])

    if rank == 0:
        # The same training in one process, on whole batches.
        p = start
        for step in range(args.steps):
            rows = batch_rows(step)
            _, grads = loss_and_grads(p, x[rows], y[rows], args.batch)
            for k in p:
                p[k] = p[k] - args.lr * grads[k]
        diff = float(np.max(np.abs(flat(p) - mine)))
        print(f"ranks agree: {ok}; max difference to one process: {diff:.3g}", flush=True)
        ok = ok and diff < 1e-8
    verdict = np.array([1 if ok else 0], dtype=np.int32)
    dist.broadcast(verdict, src=0)
    dist.destroy_process_group()
    if not verdict[0]:
        print(f"rank {rank}: FAILED", file=sys.stderr)
        return 1
    if rank == 0:
        print(f"trained on {world} ranks: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
