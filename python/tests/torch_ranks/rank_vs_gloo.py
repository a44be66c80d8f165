"""Every collective and point-to-point call of torch.distributed on the "distcomm" backend,
compared with Gloo's results for the same inputs (bitwise: the inputs are small integers or
halves, so every sum is exact whatever the order of the additions)."""

import os

import pytest
import torch
import torch.distributed as dist

import distcomm.torch as dct

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]
ALL = FLOATS + INTS


def data(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Deterministic per-rank inputs whose sums and products are exact in every dtype."""
    g = torch.Generator().manual_seed(1000 * rank + 17 * salt + n)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randint(-8, 9, (n,), generator=g).double() / 2).to(dtype)
    hi = 4 if dtype in (torch.uint8, torch.int8) else 50
    return torch.randint(1, hi, (n,), generator=g).to(dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
    assert torch.equal(a, b), (a, b)


def gloo_ops(dtype):
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    if not dtype.is_floating_point:
        ops += [R.BAND, R.BOR, R.BXOR]
    return ops


@pytest.mark.parametrize("dtype", ALL)
def test_all_reduce_matches_gloo(gloo, rank, size, dtype):
    for op in gloo_ops(dtype):
        x = data(rank, 37, dtype, salt=int(op))
        if op == R.PRODUCT and dtype in (torch.uint8, torch.int8):
            x = x.clamp(max=2)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, op=op)
        dist.all_reduce(b, op=op, group=gloo)
        same(a, b)
        w = dist.all_reduce(x, op=op, async_op=True)  # the async form gives the same
        w.wait()
        same(x, b)


@pytest.mark.parametrize("dtype", FLOATS + [torch.int32, torch.int64])
def test_avg_and_premul_sum(gloo, rank, size, dtype):
    """Gloo has no AVG and no PREMUL_SUM: compared with its SUM (divided / of scaled inputs)."""
    x = data(rank, 20, dtype) * 2
    a, s = x.clone(), x.clone()
    dist.all_reduce(a, op=R.AVG)
    dist.all_reduce(s, op=R.SUM, group=gloo)
    if dtype.is_floating_point:
        torch.testing.assert_close(a, (s.double() / size).to(dtype))
    else:
        same(a, torch.div(s, size, rounding_mode="trunc"))
    if dtype.is_floating_point and getattr(dist._make_nccl_premul_sum(2.0), "factor", None) is None:
        # torch releases (2.11) whose ReduceOp hides PREMUL_SUM's factor from Python: refused.
        with pytest.raises(ValueError, match="PREMUL_SUM without a readable factor"):
            dist.all_reduce(x.clone(), op=dist._make_nccl_premul_sum(2.0))
    elif dtype.is_floating_point:
        p, q = x.clone(), x.clone() * 2
        dist.all_reduce(p, op=dist._make_nccl_premul_sum(2.0))
        dist.all_reduce(q, group=gloo)
        same(p, q)
        # reduce_scatter_tensor with PREMUL_SUM leaves its input as it was
        inp, out = data(rank, 4 * size, dtype), torch.zeros(4, dtype=dtype)
        keep = inp.clone()
        dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(0.5))
        ref = torch.zeros(4, dtype=dtype)
        dist.reduce_scatter_tensor(ref, inp * 0.5, group=gloo)
        same(out, ref)
        same(inp, keep)


def test_bool_reductions(rank, size):
    x = data(rank, 16, torch.bool)
    anyx, allx = [torch.zeros(16, dtype=torch.bool) for _ in range(2)]
    gathered = [torch.zeros(16, dtype=torch.bool) for _ in range(size)]
    dist.all_gather(gathered, x)
    stack = torch.stack(gathered)
    for op, want in ((R.SUM, stack.any(0)), (R.MAX, stack.any(0)), (R.MIN, stack.all(0)),
                     (R.PRODUCT, stack.all(0)), (R.BOR, stack.any(0)), (R.BAND, stack.all(0))):
        y = x.clone()
        dist.all_reduce(y, op=op)
        same(y, want)
        assert y.view(torch.uint8).max() <= 1  # every byte a valid bool
    with pytest.raises(ValueError, match="AVG"):
        dist.all_reduce(x.clone(), op=R.AVG)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.int16, torch.complex64])
def test_broadcast_every_root(gloo, rank, size, dtype):
    """Data movement works for any dtype (int16, which Gloo lacks, travels as bytes)."""
    base = torch.int64 if dtype in (torch.int16, torch.complex64) else dtype
    for root in range(size):
        x = data(rank, 11, base).to(dtype)
        a = x.clone()
        dist.broadcast(a, root)
        same(a, data(root, 11, base).to(dtype))
        if dtype != torch.int16:
            b = x.clone()
            dist.broadcast(b, root, group=gloo)
            same(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bfloat16])
def test_reduce_every_root(gloo, rank, size, dtype):
    for root in range(size):
        x = data(rank, 9, dtype, salt=root)
        a, b = x.clone(), x.clone()
        dist.reduce(a, root, op=R.MAX)
        dist.reduce(b, root, op=R.MAX, group=gloo)
        if rank == root:
            same(a, b)
        else:
            same(a, x)  # other ranks' tensors are left as they were


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool])
def test_all_gather_forms(gloo, rank, size, dtype):
    x = data(rank, 6, dtype)
    # a list of separate tensors
    a = [torch.zeros(6, dtype=dtype) for _ in range(size)]
    b = [torch.zeros(6, dtype=dtype) for _ in range(size)]
    dist.all_gather(a, x)
    dist.all_gather(b, x, group=gloo)
    for u, v in zip(a, b):
        same(u, v)
    # a list of consecutive views of one buffer (written in place, no staging)
    flat = torch.zeros(6 * size, dtype=dtype)
    dist.all_gather(list(flat.chunk(size)), x)
    same(flat, torch.cat(b))
    # into one tensor, out of place and in place (the input is this rank's block of the output)
    out = torch.zeros(size * 6, dtype=dtype)
    dist.all_gather_into_tensor(out, x)
    same(out, torch.cat(b))
    inplace = torch.zeros(size, 6, dtype=dtype)
    inplace[rank].copy_(x)
    dist.all_gather_into_tensor(inplace, inplace[rank])
    same(inplace.reshape(-1), torch.cat(b))


def test_all_gather_coalesced_forms(gloo, rank, size):
    xs = [data(rank, 3, torch.float32), data(rank, 5, torch.int64)]
    outs = [torch.zeros(size * 3), torch.zeros(size * 5, dtype=torch.int64)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, x in zip(outs, xs):
            dist.all_gather_into_tensor(o, x)
    cm.wait()
    for o, x in zip(outs, xs):
        ref = torch.zeros_like(o)
        dist.all_gather_into_tensor(ref, x, group=gloo)
        same(o, ref)


def test_all_gather_coalesced_lists(gloo, rank, size):
    """torch's all_gather_coalesced (lists of lists) -> the backend's allgather_coalesced."""
    import warnings

    ins = [data(rank, 2, torch.float32), data(rank, 3, torch.float32)]  # torch wants one dtype
    a = [[torch.zeros(2) for _ in range(size)], [torch.zeros(3) for _ in range(size)]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in torch
        dist.all_gather_coalesced(a, ins)
    for lst, x in zip(a, ins):
        ref = [torch.zeros_like(x) for _ in range(size)]
        dist.all_gather(ref, x, group=gloo)
        for u, v in zip(lst, ref):
            same(u, v)


def test_all_reduce_coalesced(gloo, rank, size):
    xs = [data(rank, 4, torch.float32), data(rank, 7, torch.float64), data(rank, 3, torch.int32)]
    ys = [x.clone() for x in xs]
    with dist._coalescing_manager(async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x)
    cm.wait()
    for y in ys:
        dist.all_reduce(y, group=gloo)
    for x, y in zip(xs, ys):
        same(x, y)
    # the backend's allreduce_coalesced itself
    zs = [data(rank, 5, torch.float32), data(rank, 2, torch.int64)]
    refs = [z.clone() for z in zs]
    dct.backend_of().allreduce_coalesced(zs, dist.AllreduceCoalescedOptions()).wait()
    for r in refs:
        dist.all_reduce(r, group=gloo)
    for z, r in zip(zs, refs):
        same(z, r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bfloat16])
def test_gather_and_scatter(gloo, rank, size, dtype):
    for root in range(size):
        x = data(rank, 5, dtype, salt=root)
        a = [torch.zeros(5, dtype=dtype) for _ in range(size)] if rank == root else None
        b = [torch.zeros(5, dtype=dtype) for _ in range(size)] if rank == root else None
        dist.gather(x, a, dst=root)
        dist.gather(x, b, dst=root, group=gloo)
        if rank == root:
            for u, v in zip(a, b):
                same(u, v)
        pieces = [data(r, 4, dtype, salt=root + 7) for r in range(size)] if rank == root else None
        u, v = torch.zeros(4, dtype=dtype), torch.zeros(4, dtype=dtype)
        dist.scatter(u, pieces, src=root)
        dist.scatter(v, pieces, src=root, group=gloo)
        same(u, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
def test_reduce_scatter_forms(gloo, rank, size, dtype):
    ins = [data(rank, 5, dtype, salt=i) for i in range(size)]
    a, b = torch.zeros(5, dtype=dtype), torch.zeros(5, dtype=dtype)
    dist.reduce_scatter(a, ins)
    dist.reduce_scatter(b, ins, group=gloo)
    same(a, b)
    flat = torch.cat(ins)
    c = torch.zeros(5, dtype=dtype)
    dist.reduce_scatter_tensor(c, flat, op=R.MIN)
    d = torch.zeros(5, dtype=dtype)
    dist.reduce_scatter_tensor(d, flat, op=R.MIN, group=gloo)
    same(c, d)
    with dist._coalescing_manager(async_ops=True) as cm:
        e = torch.zeros(5, dtype=dtype)
        dist.reduce_scatter_tensor(e, flat)
    cm.wait()
    same(e, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16, torch.int16])
def test_all_to_all_forms(gloo, rank, size, dtype):
    """int16 (which Gloo lacks) travels as bytes: compared with Gloo's int64 results, cast."""
    base = torch.int64 if dtype == torch.int16 else dtype

    def g(t):  # what Gloo moves for the same values
        return t.to(base)

    # equal splits
    x = data(rank, 3 * size, base).to(dtype)
    a, b = torch.zeros_like(x), torch.zeros_like(g(x))
    dist.all_to_all_single(a, x)
    dist.all_to_all_single(b, g(x), group=gloo)
    same(a, b.to(dtype))
    # uneven splits of rows (rank r sends r + j + 1 rows of 2 to rank j)
    sends = [rank + j + 1 for j in range(size)]
    recvs = [r + rank + 1 for r in range(size)]
    x2 = data(rank, 2 * sum(sends), base).to(dtype).view(-1, 2)
    a2, b2 = torch.zeros(sum(recvs), 2, dtype=dtype), torch.zeros(sum(recvs), 2, dtype=base)
    dist.all_to_all_single(a2, x2, recvs, sends)
    dist.all_to_all_single(b2, g(x2), recvs, sends, group=gloo)
    same(a2, b2.to(dtype))
    # lists of tensors
    ins = [data(rank, 4, base, salt=j).to(dtype) for j in range(size)]
    outs_a = [torch.zeros(4, dtype=dtype) for _ in range(size)]
    dist.all_to_all(outs_a, ins)
    # (Gloo has the list form only in later torch releases: the expected blocks directly.)
    for j, u in enumerate(outs_a):
        same(u, data(j, 4, base, salt=rank).to(dtype))
    # of different sizes (Gloo wants equal ones): rank j sends j + 1 elements to each rank
    ins = [data(rank, rank + 1, base, salt=j).to(dtype) for j in range(size)]
    outs = [torch.zeros(j + 1, dtype=dtype) for j in range(size)]
    dist.all_to_all(outs, ins)
    for j, u in enumerate(outs):
        same(u, data(j, j + 1, base, salt=rank).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16,
                                   torch.float16, torch.uint8, torch.bool, torch.complex128])
def test_send_recv_ring(rank, size, dtype):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    x = torch.arange(10).to(dtype) + (rank if dtype != torch.bool else 0)
    got = torch.zeros_like(x)
    if rank % 2 == 0:
        dist.send(x, nxt, tag=3)
        dist.recv(got, prv, tag=3)
    else:
        dist.recv(got, prv, tag=3)
        dist.send(x, nxt, tag=3)
    same(got, torch.arange(10).to(dtype) + (prv if dtype != torch.bool else 0))


def test_isend_irecv_and_batch(rank, size):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    out, inc = torch.full((4,), float(rank)), torch.zeros(4)
    ops = [dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, inc, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(inc, torch.full((4,), float(prv)))
    r = dist.irecv(inc, prv, tag=9)
    s = dist.isend(out * 2, nxt, tag=9)
    s.wait()
    r.wait()
    same(inc, torch.full((4,), 2.0 * prv))


def test_recv_from_any_rank(rank, size):
    """dist.recv(t) without src: torch's front end cannot ask a Python backend for the sender
    (PyWorkHolder does not forward _source_rank), so distcomm.torch.recv_any does it."""
    if rank == 0:
        senders = set()
        for _ in range(size - 1):
            t = torch.zeros(2)
            src = dct.recv_any(t, tag=5)
            assert t.tolist() == [float(src)] * 2
            senders.add(src)
        assert senders == set(range(1, size))
    else:
        dist.send(torch.full((2,), float(rank)), 0, tag=5)


def test_barrier_and_objects(rank, size):
    dist.barrier()
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(size)]
    lst = [rank, "hello"] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0, "hello"]


def test_groups(gloo, rank, size):
    sub = dist.new_group([0, 1], backend="distcomm")
    sub_gloo = dist.new_group([0, 1], backend="gloo")
    if rank in (0, 1):
        assert dist.get_backend(sub) == "distcomm"
        assert dist.get_world_size(sub) == 2
        a = data(rank, 8, torch.float32)
        b = a.clone()
        dist.all_reduce(a, group=sub)
        dist.all_reduce(b, group=sub_gloo)
        same(a, b)
        # src/dst are global ranks; torch translates them into the group's ranks
        c = torch.full((3,), float(rank))
        dist.broadcast(c, src=1, group=sub)
        same(c, torch.full((3,), 1.0))
    else:
        assert sub == dist.GroupMember.NON_GROUP_MEMBER
    if size >= 3:
        # a group without global rank 0: its rank 0 (global rank 1) serves its store
        tail = dist.new_group(list(range(1, size)), backend="distcomm")
        if rank >= 1:
            t = torch.ones(2)
            dist.all_reduce(t, group=tail)
            same(t, torch.full((2,), float(size - 1)))
            g = [torch.zeros(1) for _ in range(size - 1)]
            dist.all_gather(g, torch.tensor([float(rank)]), group=tail)
            assert [x.item() for x in g] == [float(r) for r in range(1, size)]
        dist.destroy_process_group(tail)
    if rank in (0, 1):
        dist.destroy_process_group(sub)
        dist.destroy_process_group(sub_gloo)


def test_work_future_and_completion(rank, size):
    t = torch.full((1000,), float(rank))
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    total = float(sum(range(size)))
    assert chained.wait().tolist() == [2 * total] * 1000
    assert fut.done()
    w.wait()
    # The backend's own Work: is_completed/is_success/exception (torch's front end wraps it in a
    # holder that forwards only wait and get_future; its is_completed stays False: see README).
    be = dct.backend_of()
    x = torch.ones(5)
    work = be.allreduce([x], dist.AllreduceOptions())
    assert isinstance(work, dct.Work)
    work.wait()
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert work.result()[0].tolist() == [float(size)] * 5
    # a future callback may call back into its Work (the future is settled outside its lock)
    w3 = be.allreduce([torch.ones(2)], dist.AllreduceOptions())
    seen = w3.get_future().then(lambda f: (w3.wait(), w3.is_completed()))
    w3.wait()
    assert seen.wait() == (True, True)
    # a future asked for before completion settles without anyone calling wait()
    y = torch.ones(3)
    if rank == 0:
        w2 = be.recv([y], 1 % size, 77) if size > 1 else None
        fut2 = w2.get_future()
        dist.barrier()
        assert fut2.wait()[0].tolist() == [7.0] * 3
        assert w2.is_completed() and w2.source_rank() == 1
    else:
        dist.barrier()
        if rank == 1:
            dist.send(torch.full((3,), 7.0), 0, tag=77)


def _native_or_skip():
    """The group's C++ backend (distcomm.torch._native): required with DISTCOMM_TORCH_NATIVE=1,
    absent with 0 (both checked); elsewhere the test skips where it could not be built."""
    if os.environ.get("DISTCOMM_TORCH_BASE") == "processgroup":
        pytest.skip("no native backend where the backend is a ProcessGroup subclass")
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    native = type(be).__name__ == "NativeBackend"
    want = os.environ.get("DISTCOMM_TORCH_NATIVE")
    if want == "1":
        assert native, f"DISTCOMM_TORCH_NATIVE=1 but the group's backend is {type(be).__name__}"
    elif want == "0":
        assert isinstance(be, dct.DistcommBackend), type(be)
    if not native:
        pytest.skip("the native backend is off or could not be built here")
    return be


def test_native_backend_and_its_work(rank, size):
    """torch calls the C++ backend; it takes the common forms itself and hands the others, with
    their checks and errors, to the Python backend it wraps."""
    be = _native_or_skip()
    assert be.python is dct.backend_of() and dist.get_backend() == "distcomm"
    total = float(sum(range(size)))
    opts = dist.AllreduceOptions()
    x = torch.full((5,), float(rank))
    w = be.allreduce([x], opts)
    assert not isinstance(w, dct.Work)  # started here, not in Python
    assert w.wait() and w.is_completed() and w.is_success() and w.exception() is None
    assert x.tolist() == [total] * 5 and w.result()[0] is not None
    # a future asked for before completion settles without wait(), with the outputs
    y = torch.full((4,), float(rank + 1))
    fut = be.allreduce([y], opts).get_future()
    assert fut.wait()[0].tolist() == [total + size] * 4
    # Works dropped unwaited are kept (with their tensors) until they finish
    outs = [torch.full((300,), float(i)) for i in range(40)]
    for t in outs:
        be.allreduce([t], opts)
    be.barrier(dist.BarrierOptions()).wait()
    dist.barrier()
    assert all(t.tolist() == [float(i * size)] * 300 for i, t in enumerate(outs))
    # forms that go to the Python backend (a bool reduction, BXOR on floats: its refusal) and
    # one that does not (MAX on floats)
    b = torch.tensor([rank == 0, True, False])
    be.allreduce([b], opts).wait()
    assert b.tolist() == [True, True, False]  # a logical or, as the Python backend maps it
    mopts = dist.AllreduceOptions()
    mopts.reduceOp = R.MAX
    m = torch.tensor([float(rank)])
    be.allreduce([m], mopts).wait()
    assert m.item() == float(size - 1)
    with pytest.raises(ValueError, match="integer"):
        dist.all_reduce(torch.ones(3), op=R.BXOR)
    # the tensor forms of all-gather and reduce-scatter, and broadcast from every root
    inp = torch.arange(3, dtype=torch.int64) + 10 * rank
    out = torch.zeros(3 * size, dtype=torch.int64)
    dist.all_gather_into_tensor(out, inp)
    assert out.tolist() == [10 * r + i for r in range(size) for i in range(3)]
    rs = torch.zeros(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * size, dtype=torch.float64))
    assert rs.tolist() == [float(size * (2 * rank + i)) for i in range(2)]
    for root in range(size):
        t = torch.full((6,), float(rank), dtype=torch.bfloat16)
        dist.broadcast(t, root)
        assert t.tolist() == [float(root)] * 6
    # all_gather into a list: separate tensors (staged, copied out), views of one buffer (written
    # directly), and the future's value as all_gather's lists of lists
    sep = [torch.zeros(2, 3) for _ in range(size)]
    dist.all_gather(sep, torch.full((2, 3), float(rank)))
    assert [t.tolist() for t in sep] == [[[float(r)] * 3] * 2 for r in range(size)]
    flat = torch.zeros(4 * size)
    dist.all_gather(list(flat.chunk(size)), torch.full((4,), float(rank + 1)))
    assert flat.tolist() == [float(r + 1) for r in range(size) for _ in range(4)]
    outs = [[torch.zeros(1) for _ in range(size)]]
    opts_ag = torch._C._distributed_c10d.AllgatherOptions()
    got = be.allgather(outs, [torch.tensor([float(rank)])], opts_ag).get_future().wait()
    assert [[t.item() for t in lst] for lst in got] == [[float(r) for r in range(size)]]
    # all_to_all_single with equal split sizes and with uneven ones (rank j gets j + 1 rows of
    # two from each rank)
    inp = torch.arange(2 * size, dtype=torch.float32) + 100 * rank
    out = torch.zeros(2 * size)
    dist.all_to_all_single(out, inp)
    assert out.tolist() == [100.0 * r + 2 * rank + i for r in range(size) for i in range(2)]
    rows = [1000 * rank + 10 * j + k for j in range(size) for k in range(j + 1)]
    inp = torch.tensor([[v, v] for v in rows], dtype=torch.int64)
    out = torch.zeros((rank + 1) * size, 2, dtype=torch.int64)
    dist.all_to_all_single(out, inp, [rank + 1] * size, [j + 1 for j in range(size)])
    assert out.tolist() == [[1000 * r + 10 * rank + k] * 2 for r in range(size) for k in range(rank + 1)]
    # point to point: send and recv, a receive from any rank (torch asks this Work for the
    # sender, which a Python backend's Work cannot answer), and a message of another length than
    # the tensor (a mismatch, as in the Python backend)
    if rank == 1:
        dist.send(torch.full((4,), 7.0), 0, tag=41)
        dist.send(torch.full((4,), 8.0), 0, tag=42)
        dist.send(torch.full((3,), 9.0), 0, tag=43)
    elif rank == 0:
        t = torch.zeros(4)
        assert dist.recv(t, 1, tag=41) == 1 and t.tolist() == [7.0] * 4
        assert dist.recv(t, tag=42) == 1 and t.tolist() == [8.0] * 4
        with pytest.raises(dist.DistBackendError, match="received 3 elements from rank 1, the tensor holds 5"):
            dist.recv(torch.zeros(5), 1, tag=43)


def test_timeouts(rank, size):
    """A group's timeout from new_group(timeout=...) (init_process_group's takes the same path);
    a receive nobody answers fails with torch's DistBackendError naming the timeout."""
    import datetime
    import time

    g = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2), backend="distcomm")
    g2 = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2), backend="distcomm")
    if rank == 0:
        nb = g2._get_backend(torch.device("cpu"))
        if type(nb).__name__ == "NativeBackend":
            # the C++ backend's Work: a bounded wait, then the group's timeout as the same classes
            # (rank 1 never joins this allreduce), in wait() and in the future
            w = nb.allreduce([torch.ones(2)], dist.AllreduceOptions())
            fut = w.get_future()
            with pytest.raises(dist.DistBackendError, match="still pending"):
                w.wait(datetime.timedelta(milliseconds=50))
            with pytest.raises(dct.DistcommTimeoutError, match="(?i)time"):
                w.wait()
            assert w.is_completed() and not w.is_success() and w.exception() is not None
            with pytest.raises(dist.DistBackendError, match="(?i)time"):
                fut.wait()
            nb.allreduce([torch.ones(2)], dist.AllreduceOptions())  # dropped: the group's shutdown drains it
        t0 = time.monotonic()
        w = dist.irecv(torch.zeros(2), 1, group=g, tag=1234)
        with pytest.raises(dist.DistBackendError, match="(?i)time"):
            w.wait()
        assert time.monotonic() - t0 < 30
        w = dct.backend_of(g).recv([torch.zeros(2)], 1, 1235)
        with pytest.raises(dist.DistBackendError, match="still pending"):
            w.wait(datetime.timedelta(milliseconds=50))  # bounds this wait only
    dist.barrier()
    if rank in (0, 1):
        if rank == 0:
            dct.backend_of(g).abort()  # the pending receive: fail it rather than wait at destroy
        dist.destroy_process_group(g)
        t0 = time.monotonic()
        dist.destroy_process_group(g2)
        assert time.monotonic() - t0 < 20  # within the group's 2 s timeout and an abort's wait


def test_bad_input_refused_before_sending(rank, size):
    """Refusals happen on every rank here (the same bad call everywhere), before any data moves:
    the in_step check after the test would see stray messages."""
    with pytest.raises(ValueError, match="not contiguous"):
        dist.all_reduce(torch.zeros(4, 6).t())
    with pytest.raises(ValueError, match="not contiguous"):
        dist.all_gather_into_tensor(torch.zeros(6, size).t(), torch.zeros(6))
    with pytest.raises(dist.DistBackendError, match="cannot be reduced"):
        dist.all_reduce(torch.ones(3, dtype=torch.int16))
    with pytest.raises(ValueError, match="complex"):
        dist.all_reduce(torch.ones(3, dtype=torch.complex64), op=R.MAX)
    with pytest.raises(ValueError, match="integer"):
        dist.all_reduce(torch.ones(3), op=R.BXOR)
    with pytest.raises(ValueError, match="elements"):
        dist.all_gather_into_tensor(torch.zeros(size * 3 + 1), torch.zeros(3))
    # a tensor on another device than the group's (CPU): the backend's own check
    be = dct.backend_of()
    with pytest.raises(dist.DistBackendError, match="device meta"):
        be.allreduce([torch.zeros(3, device="meta")], dist.AllreduceOptions())
    # complex SUM is fine (pairs of floats)
    z = torch.ones(3, dtype=torch.complex64) * (1 + 2j)
    dist.all_reduce(z)
    assert z.tolist() == [complex(size, 2 * size)] * 3


def test_errors_are_distcomm_and_torch_classes(rank, size):
    import distcomm

    with pytest.raises(distcomm.DistInvalidArgument) as e:
        dist.all_reduce(torch.ones(2, dtype=torch.int16))
    assert isinstance(e.value, dist.DistBackendError) and isinstance(e.value, ValueError)
