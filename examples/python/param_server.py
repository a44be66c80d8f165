"""A tiny parameter server over distcomm.rpc (paddle.distributed.rpc's API).

Worker "ps" (rank 0) holds the weights of a linear model; every other rank is a trainer that
pulls the weights, computes the gradient on its own data shard, and pushes it; the server
applies each gradient as it arrives (asynchronous SGD). At the end the trainers check that the
model fits the data.

Run: dcrun -n 3 python examples/python/param_server.py
"""

import os
import threading

import numpy as np

from distcomm import rpc

TRUE_W = np.array([0.5, -1.0, 2.0, 3.0])
STEPS = 60
LR = 0.1

# Server state (only used on the "ps" worker, by the calls it serves).
_weights = np.zeros(4)
_version = 0
_lock = threading.Lock()


def pull():
    with _lock:
        return _weights.copy(), _version


def push(grad):
    global _weights, _version
    with _lock:
        _weights = _weights - LR * grad
        _version += 1
        return _version


def main():
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc("ps" if rank == 0 else f"trainer{rank}")
    if rank != 0:
        rng = np.random.default_rng(rank)
        x = rng.normal(size=(256, 4))
        y = x @ TRUE_W + rng.normal(scale=0.01, size=256)
        for step in range(STEPS):
            w, _ = rpc.rpc_sync("ps", pull)
            grad = 2 * x.T @ (x @ w - y) / len(y)
            fut = rpc.rpc_async("ps", push, args=(grad,))
            if step % 20 == 0:
                print(f"trainer{rank} step {step} loss {np.mean((x @ w - y) ** 2):.5f}", flush=True)
            fut.wait()
        w, version = rpc.rpc_sync("ps", pull)
        err = float(np.max(np.abs(w - TRUE_W)))
        print(f"trainer{rank}: {version} updates applied, max weight error {err:.4f}", flush=True)
        assert err < 0.05, err
    rpc.shutdown()
    if rank == 1:
        print("trainers agree: the server's model fits every shard", flush=True)


if __name__ == "__main__":
    main()
