"""One rank of the DDP comparison (test_torch.py): the example's model trained 50 steps with
DDP on the "distcomm" default group, then again from the same start on a Gloo group of the
same ranks; rank 0 saves both weights to ARGV[1] (torch.save of a pair of state dicts)."""

import datetime
import importlib.util
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import distcomm.torch  # noqa: F401

from harness import EXAMPLES

spec = importlib.util.spec_from_file_location("torch_ddp", EXAMPLES / "torch_ddp.py")
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)

dist.init_process_group("distcomm", timeout=datetime.timedelta(seconds=120))
rank, size = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
results = []
for group in (None, gloo):
    net = DDP(ex.model(), process_group=group)
    ex.train(net, rank, size, 50, 0.05)
    results.append({k: v.detach().clone() for k, v in net.module.state_dict().items()})
if rank == 0:
    torch.save(results, sys.argv[1])
    print(f"trained on {size} ranks: distcomm and gloo")
dist.destroy_process_group()
