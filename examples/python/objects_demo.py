"""Object collectives with distcomm: Python objects between ranks.

    dcrun -n 3 python examples/python/objects_demo.py

* all_gather_object: every rank learns every rank's host, pid and a small report;
* broadcast_object_list: rank 0 hands out the configuration;
* scatter_object_list: rank 0 hands each rank its own list of work items;
* gather_object: rank 0 collects the results;
* send_object_list / recv_object_list: a message passed around the ring.

Objects travel pickled. Unpickling data runs code chosen by whoever produced it, so use the
object collectives only between trusted ranks of one job (as with torch.distributed).
"""

import os
import socket
import sys

import distcomm as dist


def main() -> int:
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()

    everyone = [None] * world
    dist.all_gather_object(everyone, {"rank": rank, "host": socket.gethostname(), "pid": os.getpid()})
    if rank == 0:
        for info in everyone:
            print(f"rank {info['rank']} runs on {info['host']} as pid {info['pid']}")
    assert [e["rank"] for e in everyone] == list(range(world))

    config = [{"task": "squares", "scale": 3}, ("v", 1)] if rank == 0 else [None, None]
    dist.broadcast_object_list(config, src=0)
    assert config[0]["scale"] == 3 and config[1] == ("v", 1)

    mine = [None]
    work = [list(range(r, 20, world)) for r in range(world)] if rank == 0 else None
    dist.scatter_object_list(mine, work, src=0)
    items = mine[0]
    result = {"rank": rank, "sum": sum(config[0]["scale"] * i * i for i in items), "items": len(items)}

    results = [None] * world if rank == 0 else None
    dist.gather_object(result, results, dst=0)
    if rank == 0:
        total = sum(r["sum"] for r in results)
        want = sum(3 * i * i for i in range(20))
        print(f"results: {results}")
        print(f"total {total} (expected {want})")
        assert total == want

    # a token passed once around the ring, each rank adding its name
    token = [["start"]]
    if world > 1:
        if rank == 0:
            token[0].append(f"rank{rank}")
            dist.send_object_list(token, dst=1)
            dist.recv_object_list(token, src=world - 1)
            print("ring:", " -> ".join(token[0]))
            assert token[0] == ["start"] + [f"rank{r}" for r in range(world)]
        else:
            dist.recv_object_list(token, src=rank - 1)
            token[0].append(f"rank{rank}")
            dist.send_object_list(token, dst=(rank + 1) % world)

    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("objects demo: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
