"""GPU check of the Python package on CUDA memory (run by scripts/gpu_check.sh on a machine with
a GPU; not a pytest module). Under `dcrun -n 1 --rank0-store`: the torch backend "distcomm" on
CUDA tensors (every collective, torch's side streams, Work and futures, DDP against plain
training) and the package's own API on CUDA tensors from torch and CuPy (DLPack). Under
`dcrun -n 2 --rank0-store` on one GPU (`refusal` argument): NCCL refuses two ranks per GPU, so
the groups stay on the CPU transports, and CUDA tensors must be refused with a clear error.

Prints "PASS name" / "FAIL name: why" lines and "N passed, M failed"; exits 1 on a failure.
"""

import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import distcomm
import distcomm.torch as dct

RANK = int(os.environ.get("RANK", "0"))
R = dist.ReduceOp
results = {"passed": 0, "failed": 0}


def check(name, fn):
    try:
        fn()
        results["passed"] += 1
        print(f"[{RANK}] PASS {name}", flush=True)
    except Exception:
        results["failed"] += 1
        print(f"[{RANK}] FAIL {name}: {traceback.format_exc()}", flush=True)


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert torch.equal(a.cpu(), b.cpu()), (a, b)


def cu(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype, device="cuda")


# ---- the torch backend, world size 1 ----------------------------------------------------------


def backend_is_nccl():
    assert dct.backend_of().transport() == "nccl", dct.backend_of().transport()


def allreduce_dtypes_and_ops():
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8):
        x = cu([1, 2, 3, 4], dtype)
        for op in (R.SUM, R.MAX, R.MIN, R.PRODUCT):
            y = x.clone()
            dist.all_reduce(y, op=op)
            same(y, x)
    z = cu([2.0, 4.0])
    dist.all_reduce(z, op=R.AVG)
    same(z, cu([2.0, 4.0]))
    p = cu([2.0, 4.0])
    premul = dist._make_nccl_premul_sum(0.5)
    try:
        dist.all_reduce(p, op=premul)
        same(p, cu([1.0, 2.0]))
    except ValueError as e:  # torch releases whose ReduceOp does not show its factor to Python
        assert "PREMUL_SUM without a readable factor" in str(e), e
        print(f"[{RANK}]   (PREMUL_SUM refused: this torch hides the factor; ReduceOp has {[a for a in dir(premul) if not a.startswith('__')]})", flush=True)
    b = torch.tensor([True, False], device="cuda")
    dist.all_reduce(b)
    same(b, torch.tensor([True, False], device="cuda"))
    big = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
    ref = big.clone()
    dist.all_reduce(big)
    same(big, ref)


def bitwise_ops_are_refused_clearly():
    x = cu([1, 2], torch.int32)
    try:
        dist.all_reduce(x, op=R.BXOR)
    except dist.DistBackendError as e:
        assert "bitwise" in str(e), e
    else:
        raise AssertionError("BXOR on CUDA memory went through")


def broadcast_reduce_gather_scatter():
    x = cu([5.0, 6.0, 7.0])
    dist.broadcast(x, src=0)
    same(x, cu([5.0, 6.0, 7.0]))
    dist.reduce(x, dst=0)
    same(x, cu([5.0, 6.0, 7.0]))
    out = [torch.zeros(3, device="cuda")]
    dist.gather(x, gather_list=out, dst=0)
    same(out[0], x)
    s = torch.zeros(3, device="cuda")
    dist.scatter(s, scatter_list=[x], src=0)
    same(s, x)


def allgather_forms():
    x = torch.arange(6, dtype=torch.int64, device="cuda") + 10
    outs = [torch.zeros(6, dtype=torch.int64, device="cuda")]
    dist.all_gather(outs, x)
    same(outs[0], x)
    whole = torch.zeros(6, dtype=torch.int64, device="cuda")
    dist.all_gather_into_tensor(whole, x)
    same(whole, x)
    # an output that is not contiguous: staged on the device, copied when complete
    column = torch.zeros(6, 2, dtype=torch.int64, device="cuda")[:, 1]
    w = dist.all_gather([column], x, async_op=True)
    w.wait()
    same(column, x)


def reduce_scatter_and_alltoall():
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    out = torch.zeros(8, device="cuda")
    dist.reduce_scatter_tensor(out, x)
    same(out, x)
    o2 = torch.zeros(8, device="cuda")
    dist.reduce_scatter(o2, [x])
    same(o2, x)
    a = torch.zeros(8, device="cuda")
    dist.all_to_all_single(a, x)
    same(a, x)
    a2 = torch.zeros(8, device="cuda")
    dist.all_to_all_single(a2, x, output_split_sizes=[8], input_split_sizes=[8])
    same(a2, x)
    outs = [torch.zeros(8, device="cuda")]
    dist.all_to_all(outs, [x])
    same(outs[0], x)


def side_stream_order():
    """Work queued on a side stream before the collective must be done before it reads."""
    s = torch.cuda.Stream()
    src = torch.randn(1 << 24, device="cuda")
    torch.cuda.synchronize()
    out = torch.zeros(1 << 24, device="cuda")
    with torch.cuda.stream(s):
        y = src
        for _ in range(20):  # long enough that an unordered read would see stale data
            y = y * 1.0001
        want = y.clone()
        dist.all_gather_into_tensor(out, y)
    torch.cuda.synchronize()
    same(out, want)


def async_work_and_future():
    x = torch.ones(1 << 20, device="cuda")
    w = dist.all_reduce(x, async_op=True)
    fut = w.get_future()
    w.wait()
    assert w.is_completed()
    got = fut.wait()
    same(got[0], torch.ones(1 << 20, device="cuda"))
    ws = [dist.all_reduce(torch.full((1000,), float(i), device="cuda"), async_op=True) for i in range(20)]
    for w in ws:
        w.wait()
    dist.barrier()


def cpu_tensors_on_the_same_group():
    x = torch.tensor([1, 2, 3], dtype=torch.int32)
    dist.all_reduce(x, op=R.BOR)
    same(x, torch.tensor([1, 2, 3], dtype=torch.int32))


def mixing_cpu_and_cuda_is_refused():
    try:
        dist.all_gather_into_tensor(torch.zeros(3), cu([1.0, 2.0, 3.0]))
    except (dist.DistBackendError, ValueError) as e:
        assert "mixes CUDA device memory and host memory" in str(e), e
    else:
        raise AssertionError("a call mixing CPU and CUDA tensors went through")


def a_buffer_past_its_allocation_is_refused():
    """The library checks a device buffer against its CUDA allocation (through the raw C call:
    the package's API never passes a count larger than the tensor). The buffer comes from the
    driver itself: torch's caching allocator hands out pieces of larger segments."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)) == 0
    try:
        start, size = ctypes.c_uint64(), ctypes.c_size_t()
        cuda.cuPointerGetAttribute(ctypes.byref(start), 11, ctypes.c_uint64(ptr.value + 4096))
        cuda.cuPointerGetAttribute(ctypes.byref(size), 12, ctypes.c_uint64(ptr.value + 4096))
        print(f"[{RANK}]   (driver: allocation {ptr.value:#x}+1 MiB reported as {start.value:#x}+{size.value})", flush=True)
        lib = distcomm._lib.load()
        h = dct.backend_of()._handle()
        p = ptr.value + 4096
        st = lib.dc_allreduce(p, p, (1 << 18) - 1024 + 1, 7, 0, h)  # one float too many
        assert st != 0, "an allreduce running past the allocation was accepted"
        assert "CUDA allocation ends" in distcomm._lib.last_error(), distcomm._lib.last_error()
        st = lib.dc_allreduce(p, p, (1 << 18) - 1024, 7, 0, h)  # exactly to the end: fine
        assert st == 0, distcomm._lib.last_error()
    finally:
        torch.cuda.synchronize()
        cuda.cuMemFree_v2(ctypes.c_uint64(ptr.value))


def ddp_matches_plain_training():
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).cuda()
    plain = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).cuda()
    plain.load_state_dict(model.state_dict())
    ddp = DDP(model, device_ids=[0])
    g = torch.Generator(device="cuda").manual_seed(1)
    data = [(torch.randn(32, 64, device="cuda", generator=g), torch.randn(32, 8, device="cuda", generator=g)) for _ in range(30)]
    for net in (ddp, plain):
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        for xb, yb in data:
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(xb), yb).backward()
            opt.step()
    for (k, a), b in zip(ddp.module.state_dict().items(), plain.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), k


def timing_against_nccl():
    """Per-call time of a small blocking allreduce through the backend against torch's NCCL
    (world size 1: both are the call overhead)."""
    nccl = dist.new_group(backend="nccl")
    x = torch.ones(1024, device="cuda")
    for name, grp in (("distcomm", None), ("nccl", nccl)):
        for _ in range(20):
            dist.all_reduce(x, group=grp)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = 300
        for _ in range(n):
            dist.all_reduce(x, group=grp)
            torch.cuda.synchronize()
        print(f"[{RANK}] TIMING torch all_reduce 4 KiB on {name}: {(time.perf_counter() - t0) / n * 1e6:.1f} us/call", flush=True)


# ---- the package's own API on CUDA tensors ------------------------------------------------------


def package_api_on_cuda():
    distcomm.init_process_group(backend="nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{29400 + os.getpid() % 500}")
    try:
        assert distcomm.get_backend() == "nccl", distcomm.get_backend()
        x = cu([1.0, 2.0, 3.0])
        distcomm.all_reduce(x)
        same(x, cu([1.0, 2.0, 3.0]))
        out = torch.zeros(3, device="cuda")
        distcomm.all_gather_into_tensor(out, x)
        same(out, x)
        w = distcomm.broadcast(x, src=0, async_op=True)
        w.wait()
        bf = cu([1.5, -2.0], torch.bfloat16)
        distcomm.all_reduce(bf, op=distcomm.ReduceOp.MAX)
        same(bf, cu([1.5, -2.0], torch.bfloat16))
        try:
            distcomm.all_gather([torch.zeros(3, device="cuda")], x)
        except distcomm.DistInvalidArgument as e:
            assert "staged in host memory" in str(e), e
        else:
            raise AssertionError("a list of CUDA tensors went through host staging")
        try:
            import cupy

            c = cupy.arange(10, dtype=cupy.float32)
            distcomm.all_reduce(c)
            assert cupy.asnumpy(c).tolist() == list(range(10))
            print(f"[{RANK}]   (CuPy {cupy.__version__} array through DLPack)", flush=True)
        except ImportError:
            print(f"[{RANK}]   (no CuPy here)", flush=True)
    finally:
        distcomm.destroy_process_group()


# ---- two ranks on one GPU: no NCCL, CUDA refused ------------------------------------------------


def refused_without_nccl():
    assert dct.backend_of().transport() != "nccl"
    x = cu([1.0, 2.0])
    try:
        dist.all_reduce(x)
    except dist.DistBackendError as e:
        assert "no NCCL" in str(e), e
    else:
        raise AssertionError("a CUDA tensor went to a group without NCCL")
    y = torch.ones(2)
    dist.all_reduce(y)  # the group still works on the CPU
    same(y, torch.full((2,), float(dist.get_world_size())))


def main():
    torch.cuda.set_device(0)
    dist.init_process_group("distcomm", timeout=datetime.timedelta(seconds=120))
    if sys.argv[1:] == ["refusal"]:
        check("2 ranks on one GPU: CUDA tensors refused clearly, CPU ones work", refused_without_nccl)
    else:
        for name, fn in [
            ("backend uses NCCL", backend_is_nccl),
            ("allreduce: dtypes, ops, AVG, PREMUL_SUM, bool, 16 MiB", allreduce_dtypes_and_ops),
            ("bitwise ops refused clearly", bitwise_ops_are_refused_clearly),
            ("broadcast, reduce, gather, scatter", broadcast_reduce_gather_scatter),
            ("all_gather forms (list, into tensor, staged)", allgather_forms),
            ("reduce_scatter, all_to_all forms", reduce_scatter_and_alltoall),
            ("side stream ordering", side_stream_order),
            ("async Work and future", async_work_and_future),
            ("CPU tensors on the same group", cpu_tensors_on_the_same_group),
            ("mixing CPU and CUDA refused", mixing_cpu_and_cuda_is_refused),
            ("device buffer past its allocation refused", a_buffer_past_its_allocation_is_refused),
            ("DDP matches plain training", ddp_matches_plain_training),
            ("timing against NCCL", timing_against_nccl),
        ]:
            check(name, fn)
    dist.destroy_process_group()
    if sys.argv[1:] != ["refusal"]:
        check("package API on CUDA tensors (torch, CuPy)", package_api_on_cuda)
    print(f"[{RANK}] torch_cuda_check: {results['passed']} passed, {results['failed']} failed", flush=True)
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
