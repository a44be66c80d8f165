"""torch.distributed's "Writing Distributed Applications" tutorial, in its shape: processes
spawned by the script, point-to-point (blocking and not), every collective, groups, on the
"distcomm" backend. Against Gloo, only BACKEND and the import of distcomm.torch differ (the
tests run both and compare every line).

    python examples/python/torch_tutorial.py [NPROC]      # default 2 processes
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import distcomm.torch  # noqa: F401  registers the backend "distcomm"

BACKEND = "distcomm"


def say(rank, msg):
    sys.stdout.write(f"rank {rank}: {msg}\n")  # one write per line: the processes share stdout
    sys.stdout.flush()


def p2p_blocking(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        for dst in range(1, size):
            dist.send(tensor=tensor, dst=dst)
    else:
        dist.recv(tensor=tensor, src=0)
    say(rank, f"p2p blocking got {tensor[0].item()}")


def p2p_nonblocking(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 2
        reqs = [dist.isend(tensor=tensor, dst=dst) for dst in range(1, size)]
    else:
        reqs = [dist.irecv(tensor=tensor, src=0)]
    for req in reqs:
        req.wait()
    say(rank, f"p2p non-blocking got {tensor[0].item()}")


def collectives(rank, size):
    group = dist.new_group(list(range(size)))
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    say(rank, f"all_reduce {t.tolist()}")
    t = torch.tensor([float(rank)])
    dist.broadcast(t, src=size - 1)
    say(rank, f"broadcast {t.tolist()}")
    t = torch.tensor([rank + 1])
    dist.reduce(t, dst=0, op=dist.ReduceOp.PRODUCT)
    say(rank, f"reduce {t.tolist() if rank == 0 else 'n/a'}")
    outs = [torch.zeros(2, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(outs, torch.tensor([rank, rank * rank]))
    say(rank, f"all_gather {[o.tolist() for o in outs]}")
    glist = [torch.zeros(1) for _ in range(size)] if rank == 0 else None
    dist.gather(torch.tensor([rank * 10.0]), gather_list=glist, dst=0)
    say(rank, f"gather {[g.item() for g in glist] if rank == 0 else 'n/a'}")
    recv = torch.zeros(1)
    dist.scatter(recv, scatter_list=[torch.tensor([i * 100.0]) for i in range(size)] if rank == 0 else None, src=0)
    say(rank, f"scatter {recv.item()}")
    out = torch.zeros(1)
    dist.reduce_scatter(out, [torch.tensor([float(rank + i)]) for i in range(size)])
    say(rank, f"reduce_scatter {out.item()}")
    whole = torch.zeros(size * 2)
    dist.all_gather_into_tensor(whole, torch.tensor([float(rank), -float(rank)]))
    say(rank, f"all_gather_into_tensor {whole.tolist()}")
    a2a = torch.zeros(size)
    dist.all_to_all_single(a2a, torch.arange(size, dtype=torch.float32) + rank * size)
    say(rank, f"all_to_all_single {a2a.tolist()}")
    t = torch.tensor([rank], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    say(rank, f"all_reduce max {t.item()}")
    dist.barrier()
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank})
    say(rank, f"all_gather_object {objs}")


def subgroup(rank, size):
    """A group of ranks 0 and 1 (every rank calls new_group; only members use it)."""
    group = dist.new_group([0, 1])
    if rank < 2:
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        say(rank, f"group [0, 1] all_reduce {t.item()}")


def run(rank, size):
    p2p_blocking(rank, size)
    p2p_nonblocking(rank, size)
    collectives(rank, size)
    subgroup(rank, size)
    say(rank, f"backend {dist.get_backend()}, done")


def init_process(rank, size, fn, backend=BACKEND):
    """Initialise the distributed environment."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    processes = []
    mp.set_start_method("spawn")
    for rank in range(size):
        p = mp.Process(target=init_process, args=(rank, size, run))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    sys.exit(max(abs(p.exitcode or 0) for p in processes))
