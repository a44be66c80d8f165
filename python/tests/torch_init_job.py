"""One rank of a job initialised as ``init_process_group("distcomm", init_method=URL)`` for each
URL given (file://, tcp://), one after the other in the same process (destroy, then init
again), with RANK and WORLD_SIZE from the environment: an all_reduce and a group each time."""

import datetime
import os
import sys

import torch
import torch.distributed as dist

import distcomm.torch as dct

rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
for url in sys.argv[1:]:
    dist.init_process_group("distcomm", init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [size * (size + 1) / 2] * 3, t
    g = dist.new_group(list(range(size)))
    u = torch.ones(2)
    dist.all_reduce(u, group=g)
    assert u.tolist() == [float(size)] * 2
    print(f"rank {rank}: {url.split(':')[0]} init ok, transport {dct.backend_of().transport()}", flush=True)
    dist.destroy_process_group()
