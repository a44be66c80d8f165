"""Point to point: send/recv (blocking, any source, tags), isend/irecv, batch_isend_irecv."""

import time

import numpy as np
import pytest

import distcomm as dist


def test_ring(rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    dist.send(np.full(4, rank, np.float32), right)
    x = np.zeros(4, np.float32)
    assert dist.recv(x, left) == left
    assert np.all(x == left)


def test_keywords_as_in_torch_docs(rank, size):
    t = np.zeros(1)
    if rank == 0:
        t += 1
        dist.send(tensor=t, dst=1)
    elif rank == 1:
        dist.recv(tensor=t, src=0)
    assert t[0] == (1.0 if rank in (0, 1) else 0.0)


def test_recv_any_source(rank, size):
    if rank == 0:
        senders = []
        for _ in range(size - 1):
            x = np.zeros(2, np.int64)
            s = dist.recv(x)  # src=None: any rank
            assert x.tolist() == [s, s * s]
            senders.append(s)
        assert sorted(senders) == list(range(1, size))
    else:
        dist.send(np.array([rank, rank * rank], np.int64), 0)


def test_tags_select_messages(rank, size):
    if rank == 1:
        dist.send(np.array([5], np.int32), 0, tag=5)
        dist.send(np.array([7], np.int32), 0, tag=7)
    elif rank == 0:
        x = np.zeros(1, np.int32)
        dist.recv(x, 1, tag=7)
        assert x[0] == 7
        dist.recv(x, 1, tag=5)
        assert x[0] == 5


def test_order_kept_per_pair_and_tag(rank, size):
    if rank == 0:
        for i in range(20):
            dist.send(np.array([i], np.int64), 1, tag=3)
    elif rank == 1:
        x = np.zeros(1, np.int64)
        got = []
        for _ in range(20):
            dist.recv(x, 0, tag=3)
            got.append(int(x[0]))
        assert got == list(range(20))


@pytest.mark.parametrize("dtype", [np.int8, np.uint32, np.float16, np.float64], ids=lambda d: np.dtype(d).name)
def test_isend_irecv(rank, size, dtype):
    right, left = (rank + 1) % size, (rank - 1) % size
    out = np.zeros((2, 3), dtype)
    rw = dist.irecv(out, src=left, tag=1)
    sw = dist.isend(np.full((2, 3), rank, dtype), right, tag=1)
    sw.wait()
    assert rw.wait() is True
    assert rw.source_rank() == left
    assert np.all(out == left)


def test_irecv_any_source_polling(rank, size):
    if rank == 0:
        works = []
        bufs = [np.zeros(1, np.int32) for _ in range(size - 1)]
        works = [dist.irecv(b) for b in bufs]
        deadline = time.monotonic() + 30
        while not all(w.is_completed() for w in works):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        srcs = sorted(w.source_rank() for w in works)
        assert srcs == list(range(1, size))
        assert sorted(int(b[0]) for b in bufs) == [10 * s for s in range(1, size)]
    else:
        dist.isend(np.array([10 * rank], np.int32), 0).wait()


def test_batch_isend_irecv(rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    send_buf = np.full(3, rank, np.int64)
    recv_buf = np.zeros(3, np.int64)
    ops = [dist.P2POp(dist.isend, send_buf, right), dist.P2POp(dist.irecv, recv_buf, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert np.all(recv_buf == left)


def test_work_wait_timeout_then_complete(rank, size):
    if rank == 0:
        x = np.zeros(1, np.int32)
        w = dist.irecv(x, src=1, tag=99)
        with pytest.raises(dist.DistTimeoutError):
            w.wait(timeout=0.05)
        assert not w.is_completed()
    dist.barrier()
    if rank == 1:
        dist.send(np.array([42], np.int32), 0, tag=99)
    if rank == 0:
        w.wait()
        assert x[0] == 42 and w.source_rank() == 1


def test_shorter_message_is_a_mismatch(rank, size):
    if rank == 1:
        dist.send(np.arange(3, dtype=np.int32), 0, tag=11)
        dist.send(np.arange(3, dtype=np.int32), 0, tag=12)
    elif rank == 0:
        x = np.zeros(5, np.int32)
        with pytest.raises(dist.DistMismatchError, match="3 elements"):
            dist.recv(x, 1, tag=11)
        assert x[:3].tolist() == [0, 1, 2]
        w = dist.irecv(x, 1, tag=12)
        with pytest.raises(dist.DistMismatchError):
            w.wait()
        assert w.is_completed() and not w.is_success()
        assert isinstance(w.exception(), dist.DistMismatchError)


def test_send_recv_in_group_uses_global_ranks(rank, size):
    members = list(range(1, size)) if size > 2 else [0, 1]
    g = dist.new_group(members)
    if rank in members:
        first, last = members[0], members[-1]
        if rank == first:
            dist.send(np.array([rank], np.int64), dst=last, group=g)
        if rank == last:
            x = np.zeros(1, np.int64)
            assert dist.recv(x, src=first, group=g) == first
            assert x[0] == first
            w = dist.irecv(x, group=g, tag=4)
        if rank == first:
            dist.isend(np.array([99], np.int64), last, group=g, tag=4).wait()
        if rank == last:
            w.wait()
            assert w.source_rank() == first and x[0] == 99
    dist.destroy_process_group(g)


def test_send_object_list(rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    dist.send_object_list([{"from": rank}, "x" * rank], right)
    got = [None, None]
    assert dist.recv_object_list(got, left) == left
    assert got == [{"from": left}, "x" * left]


def test_wait_in_another_thread_does_not_block_this_one(rank, size):
    """A Work waited on in a second thread: calls here go on (they only peek at it)."""
    import threading

    if rank == 0:
        x = np.zeros(1, np.int32)
        w = dist.irecv(x, src=1, tag=55)
        waiter = threading.Thread(target=w.wait)
        waiter.start()
        time.sleep(0.05)
        assert not w.is_completed()  # never blocks, even while the other thread waits
    dist.barrier()  # rank 1 sends only after this barrier
    if rank == 1:
        dist.send(np.array([5], np.int32), 0, tag=55)
    if rank == 0:
        waiter.join(30)
        assert not waiter.is_alive() and w.is_completed() and x[0] == 5
