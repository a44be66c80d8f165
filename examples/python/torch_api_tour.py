"""A script written against torch.distributed's documentation, run with distcomm.

The only changes from a torch script are the imports: ``import distcomm as dist`` in place of
``import torch.distributed as dist``, and NumPy arrays in place of tensors (``np.zeros`` for
``torch.zeros``). Everything else (function names, keyword names, global ranks in src/dst,
groups, async work handles, the "gloo" backend, launching with multiprocessing) follows the
torch.distributed docs.

Two ways to run it, as with torch:

    python examples/python/torch_api_tour.py            # starts 4 ranks itself (multiprocessing)
    dcrun -n 4 python examples/python/torch_api_tour.py # or under a launcher (RANK is set)
"""

import os
import sys

import numpy as np

import distcomm as dist  # was: import torch.distributed as dist

# was: import torch.multiprocessing as mp
import multiprocessing as mp


def point_to_point(rank, size):
    tensor = np.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)  # blocking
    elif rank == 1:
        dist.recv(tensor=tensor, src=0)
    assert rank > 1 or tensor[0] == 1

    tensor = np.zeros(1)
    if rank == 0:
        tensor += 2
        req = dist.isend(tensor=tensor, dst=1)  # non-blocking
        req.wait()
    elif rank == 1:
        req = dist.irecv(tensor=tensor, src=0)
        req.wait()
    assert rank > 1 or tensor[0] == 2


def collectives(rank, size):
    group = dist.new_group([0, 1])
    tensor = np.ones(1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    if rank in (0, 1):
        assert tensor[0] == 2

    tensor = np.array([rank], dtype=np.float32)
    dist.broadcast(tensor, src=size - 1)
    assert tensor[0] == size - 1

    tensor = np.array([rank + 1], dtype=np.int64)
    dist.reduce(tensor, dst=0, op=dist.ReduceOp.PRODUCT)
    if rank == 0:
        assert tensor[0] == np.prod(np.arange(1, size + 1))

    tensor_list = [np.zeros(2, dtype=np.int64) for _ in range(size)]
    tensor = np.arange(2, dtype=np.int64) + 1 + 2 * rank
    dist.all_gather(tensor_list, tensor)
    assert np.concatenate(tensor_list).tolist() == list(range(1, 2 * size + 1))

    gather_list = [np.zeros(1) for _ in range(size)] if rank == 0 else None
    dist.gather(np.array([float(rank)]), gather_list=gather_list, dst=0)
    if rank == 0:
        assert [t[0] for t in gather_list] == list(range(size))

    out = np.zeros(1)
    scatter_list = [np.array([float(i * i)]) for i in range(size)] if rank == 0 else None
    dist.scatter(out, scatter_list=scatter_list, src=0)
    assert out[0] == rank * rank

    output = np.zeros(1, dtype=np.float32)
    dist.reduce_scatter(output, [np.array([rank * 10.0 + i], dtype=np.float32) for i in range(size)])
    assert output[0] == sum(r * 10.0 + rank for r in range(size))

    inp = np.arange(size, dtype=np.float32) + rank * size
    output = np.empty(size, dtype=np.float32)
    dist.all_to_all_single(output, inp)
    assert output.tolist() == [float(i * size + rank) for i in range(size)]

    work = dist.all_reduce(np.ones(3), async_op=True)
    work.wait()
    assert work.is_completed()

    dist.barrier()


def objects(rank, size):
    gathered = [None for _ in range(size)]
    dist.all_gather_object(gathered, {"rank": rank})
    assert gathered == [{"rank": r} for r in range(size)]

    objects = ["foo", 12, {1: 2}] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(objects, src=0)
    assert objects == ["foo", 12, {1: 2}]

    output_list = [None]
    dist.scatter_object_list(output_list, [f"for rank {i}" for i in range(size)] if rank == 0 else None, src=0)
    assert output_list == [f"for rank {rank}"]


def run(rank, size):
    point_to_point(rank, size)
    collectives(rank, size)
    objects(rank, size)
    if rank == 0:
        print(f"torch.distributed-style script on {size} ranks, backend {dist.get_backend()}: OK", flush=True)


def init_process(rank, size, fn, backend="gloo"):
    """Initialize the distributed environment."""
    os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "29500")
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:  # started by a launcher (torchrun, dcrun, ...)
        dist.init_process_group(backend="gloo")
        run(dist.get_rank(), dist.get_world_size())
        dist.destroy_process_group()
        sys.exit(0)
    size = int(os.environ.get("NPROC", "4"))
    processes = []
    mp.set_start_method("spawn")
    for rank in range(size):
        p = mp.Process(target=init_process, args=(rank, size, run))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    sys.exit(max(abs(p.exitcode or 0) for p in processes))
