"""One rank of a job checking that the native backend (distcomm/torch/_native.cpp) takes the
fast forms itself: the Python backend's methods for them are replaced by ones that fail, and
every fast form still runs and gives the right result. RANK, WORLD_SIZE, MASTER_* from the
environment; DISTCOMM_TORCH_NATIVE=1."""

import datetime

import torch
import torch.distributed as dist

import distcomm.torch  # noqa: F401  (registers the backend)
from distcomm.torch._backend import DistcommBackend

FAST = ("allreduce", "broadcast", "barrier", "allgather", "all_gather_single", "reduce_scatter_single", "all_to_all_single",
        "send", "recv", "recv_anysource")


def _python_was_asked(*args, **kwargs):
    raise AssertionError("a fast form went to the Python backend")


for name in FAST:
    setattr(DistcommBackend, name, _python_was_asked)

dist.init_process_group("distcomm", timeout=datetime.timedelta(seconds=60))
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)
assert t.tolist() == [size * (size + 1) / 2] * 3
b = torch.full((2,), float(rank))
dist.broadcast(b, size - 1)
assert b.tolist() == [float(size - 1)] * 2
dist.barrier()
g = torch.zeros(2 * size)
dist.all_gather_into_tensor(g, torch.full((2,), float(rank)))
assert g.tolist() == [float(r) for r in range(size) for _ in range(2)]
lst = [torch.zeros(2) for _ in range(size)]
dist.all_gather(lst, torch.full((2,), float(rank)))
assert [t.tolist() for t in lst] == [[float(r)] * 2 for r in range(size)]
r = torch.zeros(1)
dist.reduce_scatter_tensor(r, torch.ones(size))
assert r.item() == float(size)
a = torch.zeros(size)
dist.all_to_all_single(a, torch.full((size,), float(rank)))
assert a.tolist() == [float(x) for x in range(size)]
v = torch.zeros((rank + 1) * size)
dist.all_to_all_single(v, torch.full((size * (size + 1) // 2,), float(rank)), [rank + 1] * size, [j + 1 for j in range(size)])
assert v.tolist() == [float(src) for src in range(size) for _ in range(rank + 1)]
if rank == 0:
    dist.send(torch.full((2,), 5.0), 1)
elif rank == 1:
    got = torch.zeros(2)
    assert dist.recv(got) == 0 and got.tolist() == [5.0, 5.0]
print(f"rank {rank}: every fast form native", flush=True)
dist.destroy_process_group()
