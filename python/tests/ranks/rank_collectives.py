"""Collectives on arrays: every function, dtype and op, blocking and async, at any size."""

import array

import numpy as np
import pytest

import distcomm as dist
from distcomm import ReduceOp

INTS = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64]
FLOATS = [np.float16, np.float32, np.float64]
DTYPES = INTS + FLOATS


def data(r: int, dtype, k: int = 5) -> np.ndarray:
    """Rank r's input: small values, so sums and products stay exact in every dtype."""
    return ((np.arange(k) + r) % 3 + 1).astype(dtype)


def expected(op: ReduceOp, n: int, dtype, k: int = 5) -> np.ndarray:
    xs = np.stack([data(r, np.float64, k) for r in range(n)])
    if op == ReduceOp.SUM:
        v = xs.sum(0)
    elif op == ReduceOp.PRODUCT:
        v = xs.prod(0)
    elif op == ReduceOp.MAX:
        v = xs.max(0)
    elif op == ReduceOp.MIN:
        v = xs.min(0)
    elif op == ReduceOp.AVG:
        v = xs.sum(0) / n
        if np.dtype(dtype).kind in "iu":
            v = np.trunc(v)
    else:
        ints = np.stack([data(r, np.int64, k) for r in range(n)])
        f = {ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}[op]
        v = f.reduce(ints, axis=0)
    return v.astype(dtype)


def check(got: np.ndarray, want: np.ndarray) -> None:
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG])
def test_all_reduce(rank, size, dtype, op):
    x = data(rank, dtype)
    assert dist.all_reduce(x, op=op) is None
    check(x, expected(op, size, dtype))


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR])
def test_all_reduce_bitwise(rank, size, dtype, op):
    x = data(rank, dtype)
    dist.all_reduce(x, op)
    check(x, expected(op, size, dtype))


def test_all_reduce_prod_alias_and_int_op(rank, size):
    assert ReduceOp.PROD == ReduceOp.PRODUCT
    x = data(rank, np.int64)
    dist.all_reduce(x, op=ReduceOp.PROD)
    check(x, expected(ReduceOp.PRODUCT, size, np.int64))
    y = data(rank, np.int32)
    dist.all_reduce(y, 2)  # a plain int is accepted: MAX
    check(y, expected(ReduceOp.MAX, size, np.int32))


def test_all_reduce_shapes(rank, size):
    m = np.full((3, 4, 2), rank + 1, dtype=np.float32)
    dist.all_reduce(m)
    assert m.shape == (3, 4, 2) and np.all(m == size * (size + 1) / 2)
    s = np.array(rank, dtype=np.int64)  # 0-d
    dist.all_reduce(s, ReduceOp.MAX)
    assert s == size - 1
    e = np.empty(0, dtype=np.float64)
    dist.all_reduce(e)
    assert e.size == 0
    big = np.full(300_000, 1.0, dtype=np.float32)  # larger than one frame of the ring
    dist.all_reduce(big)
    assert np.all(big == size)


def test_all_reduce_async(rank, size):
    xs = [np.full(1000, rank + i, dtype=np.int64) for i in range(3)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    assert all(isinstance(w, dist.Work) for w in works)
    for i, (w, x) in enumerate(zip(works, xs)):
        assert w.wait() is True
        assert w.is_completed() and w.is_success() and w.exception() is None
        assert np.all(x == sum(r + i for r in range(size)))
    w = dist.all_reduce(np.ones(4), sync_op=False)  # paddle's spelling
    w.wait()
    assert w.result()[0][0] == size


def test_buffer_protocol_objects(rank, size):
    b = bytearray([rank + 1] * 4)
    dist.all_reduce(b)
    assert list(b) == [size * (size + 1) // 2] * 4
    a = array.array("i", [rank] * 3)
    dist.all_reduce(a, ReduceOp.MAX)
    assert list(a) == [size - 1] * 3


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_broadcast(rank, size, dtype):
    for src in range(size):
        x = data(rank, dtype, 7)
        assert dist.broadcast(x, src) is None
        check(x, data(src, dtype, 7))


def test_broadcast_async_and_readonly_source(rank, size):
    src = size - 1
    x = np.full(5, rank, dtype=np.int32)
    if rank == src:
        x.setflags(write=False)  # the source's array is only read
    w = dist.broadcast(x, src=src, async_op=True)
    w.wait()
    assert np.all(x == src)


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_reduce(rank, size, dtype):
    for dst in range(size):
        x = data(rank, dtype)
        dist.reduce(x, dst, op=ReduceOp.SUM)
        if rank == dst:
            check(x, expected(ReduceOp.SUM, size, dtype))
        else:
            check(x, data(rank, dtype))  # untouched
    x = data(rank, np.int64)
    w = dist.reduce(x, dst=0, op=ReduceOp.MAX, async_op=True)
    w.wait()
    if rank == 0:
        check(x, expected(ReduceOp.MAX, size, np.int64))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_all_gather(rank, size, dtype):
    out = [np.zeros((2, 3), dtype=dtype) for _ in range(size)]
    dist.all_gather(out, data(rank, dtype, 6).reshape(2, 3))
    for r in range(size):
        check(out[r].reshape(-1), data(r, dtype, 6))


def test_all_gather_variants(rank, size):
    # paddle: an empty list is filled
    out = []
    dist.all_gather(out, np.array([rank, -rank], dtype=np.int64))
    assert [o.tolist() for o in out] == [[r, -r] for r in range(size)]
    # async: the list is filled in when the Work completes
    out = [np.zeros(2, np.float32) for _ in range(size)]
    w = dist.all_gather(out, np.full(2, rank, np.float32), async_op=True)
    w.wait()
    assert [o[0] for o in out] == list(range(size))
    # a non-contiguous input is fine (it is only read)
    src = np.arange(10, dtype=np.int32) + 100 * rank
    out = [np.zeros(5, np.int32) for _ in range(size)]
    dist.all_gather(out, src[::2])
    assert [o.tolist() for o in out] == [list(range(100 * r, 100 * r + 10, 2)) for r in range(size)]
    # into one array
    big = np.zeros((size, 3), np.uint8)
    dist.all_gather_into_tensor(big, np.full(3, rank, np.uint8))
    assert big.tolist() == [[r] * 3 for r in range(size)]
    big = np.zeros(size * 2, np.float64)
    dist.all_gather_into_tensor(big, np.full(2, rank + 0.5), async_op=True).wait()
    assert big.tolist() == [r + 0.5 for r in range(size) for _ in range(2)]


@pytest.mark.parametrize("dtype", [np.int8, np.uint64, np.float16, np.float64], ids=lambda d: np.dtype(d).name)
def test_gather(rank, size, dtype):
    for dst in range(size):
        gl = [np.zeros(4, dtype) for _ in range(size)] if rank == dst else None
        dist.gather(data(rank, dtype, 4), gl, dst=dst)
        if rank == dst:
            for r in range(size):
                check(gl[r], data(r, dtype, 4))
    gl = [np.zeros(1, np.int32) for _ in range(size)] if rank == 0 else []
    dist.gather(np.array([rank * 7], np.int32), gather_list=gl, dst=0, async_op=True).wait()
    if rank == 0:
        assert [g[0] for g in gl] == [r * 7 for r in range(size)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int64, np.float32], ids=lambda d: np.dtype(d).name)
def test_scatter(rank, size, dtype):
    for src in range(size):
        out = np.zeros(3, dtype)
        sl = [np.full(3, 10 * src + r, dtype) for r in range(size)] if rank == src else None
        dist.scatter(out, sl, src=src)
        assert np.all(out == 10 * src + rank)
    out = np.zeros((2, 2), np.float64)
    sl = [np.full((2, 2), r + 0.25) for r in range(size)] if rank == 1 else None
    dist.scatter(out, scatter_list=sl, src=1, async_op=True).wait()
    assert np.all(out == rank + 0.25)


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG])
def test_reduce_scatter(rank, size, op):
    ins = [data(rank + j, np.float32, 4) for j in range(size)]
    out = np.zeros(4, np.float32)
    dist.reduce_scatter(out, ins, op=op)
    want = np.stack([data(r + rank, np.float64, 4) for r in range(size)])
    want = {ReduceOp.SUM: want.sum(0), ReduceOp.MAX: want.max(0), ReduceOp.AVG: want.mean(0)}[op]
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_reduce_scatter_tensor_and_async(rank, size):
    inp = np.arange(size * 3, dtype=np.int64) + rank
    out = np.zeros(3, np.int64)
    dist.reduce_scatter_tensor(out, inp)
    assert out.tolist() == [sum(3 * rank + i + r for r in range(size)) for i in range(3)]
    out = np.zeros(2, np.int32)
    w = dist.reduce_scatter(out, [np.full(2, j + rank, np.int32) for j in range(size)], op=ReduceOp.MIN, async_op=True)
    w.wait()
    assert out.tolist() == [rank] * 2


def test_all_to_all_uneven(rank, size):
    # rank i sends (i + j + 1) elements of value 100*i + j to rank j
    ins = [np.full(rank + j + 1, 100 * rank + j, np.int32) for j in range(size)]
    outs = [np.zeros(j + rank + 1, np.int32) for j in range(size)]
    dist.all_to_all(outs, ins)
    for j in range(size):
        assert np.all(outs[j] == 100 * j + rank)
    outs = [np.zeros(j + rank + 1, np.int32) for j in range(size)]
    dist.all_to_all(outs, ins, async_op=True).wait()
    for j in range(size):
        assert np.all(outs[j] == 100 * j + rank)


def test_all_to_all_single(rank, size):
    inp = np.arange(size * 2, dtype=np.float64) + 100 * rank
    out = np.zeros(size * 2)
    dist.all_to_all_single(out, inp)
    assert out.tolist() == [100 * i + 2 * rank + k for i in range(size) for k in range(2)]
    # rows of a 2-D array, uneven splits: rank i sends j+1 rows to rank j
    in_splits = [j + 1 for j in range(size)]
    out_splits = [rank + 1] * size
    inp = np.full((sum(in_splits), 3), rank, np.int64)
    out = np.zeros((sum(out_splits), 3), np.int64)
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
    rows = [i for i in range(size) for _ in range(rank + 1)]
    assert out[:, 0].tolist() == rows and np.all(out[:, 1] == out[:, 0])
    out[:] = -1
    dist.all_to_all_single(out, inp, out_splits, in_splits, async_op=True).wait()
    assert out[:, 0].tolist() == rows


def test_paddle_alltoall(rank, size):
    inp = np.arange(size, dtype=np.int32) + 10 * rank
    out = np.zeros(size, np.int32)
    dist.alltoall_single(inp, out)
    assert out.tolist() == [10 * i + rank for i in range(size)]
    in_splits = [1] * size
    out_splits = [1] * size
    out[:] = 0
    dist.alltoall_single(inp, out, in_splits, out_splits, sync_op=False).wait()
    assert out.tolist() == [10 * i + rank for i in range(size)]
    outs = []
    dist.alltoall([np.full(2, 10 * rank + j, np.int64) for j in range(size)], outs)
    assert [o.tolist() for o in outs] == [[10 * i + rank] * 2 for i in range(size)]


def test_barrier(rank, size):
    assert dist.barrier() is None
    w = dist.barrier(async_op=True)
    w.wait()
    assert w.is_completed()


def test_works_complete_without_wait(rank, size):
    """Non-blocking ops progress on their own; is_completed() eventually says so."""
    import time

    x = np.full(10, rank, np.int64)
    w = dist.all_reduce(x, async_op=True)
    deadline = time.monotonic() + 30
    while not w.is_completed():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert np.all(x == size * (size - 1) // 2)
    w.wait()


def test_bfloat16(rank, size):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.full(4, rank + 1, dtype=ml_dtypes.bfloat16)
    dist.all_reduce(x)
    assert np.all(x.astype(np.float32) == size * (size + 1) / 2)
