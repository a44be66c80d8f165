"""Work: one non-blocking operation of the backend, over the library's requests.

An operation is started with the library's ``dc_i*`` call and returns at once; the library
progresses it on its own threads (nobody has to poll). ``wait()`` blocks in
``dc_request_wait`` with the GIL released; ``get_future()`` hands out a
``torch.futures.Future`` that a completer thread (one per backend, started on first use) marks
done when the requests finish, so DDP's reducer and comm hooks see results without calling
``wait()`` themselves.

A Work keeps the tensors of its operation alive until it completes, then runs its ``finish``
step (copying a staging buffer into list outputs) and frees its requests.
"""

import collections
import ctypes
import datetime
import threading
import time
from ctypes import byref, c_bool
from typing import Any, Callable, List, Optional, Sequence

import torch
from torch._C._distributed_c10d import Work as _C10dWork

from .. import _lib
from . import _errors


def _seconds(timeout: Any) -> float:
    if timeout is None:
        return 0.0
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _wait_all(reqs: List[int]) -> List[Any]:
    """Waits for each request; (status, the library's message) of each that failed (the message
    is read right after its wait: it is the calling thread's last error)."""
    wait = _lib.load().dc_request_wait
    if len(reqs) == 1:  # the common case, without building a generator and a list
        st = wait(reqs[0])
        return [(st, _lib.last_error())] if st != 0 else _NO_FAILURES
    return [(st, _lib.last_error()) for st in map(wait, reqs) if st != 0]


_NO_FAILURES: List[Any] = []  # never modified
_NO_REQS: List[int] = []  # never modified


class Work(_C10dWork):
    """A pending operation. ``wait(timeout)`` with a positive timeout bounds this wait only (a
    timeout error leaves the operation pending; it still ends by the group's timeout)."""

    # What most operations leave as is: set on the instance only where one differs (each
    # attribute set costs on every call, and DDP makes many small calls).
    _finish: Optional[Callable[[], None]] = None
    _recv_count: Optional[int] = None
    _ranks: Optional[Sequence[int]] = None
    _source = -1
    _error: Optional[BaseException] = None
    _future: Optional[torch.futures.Future] = None
    _unsettled = False  # a future was handed out and is not marked done yet

    def __init__(self, reqs: List[int], what: str, completer: "Completer", keep: Any = (),
                 outputs: Optional[List[Any]] = None, finish: Optional[Callable[[], None]] = None,
                 recv_count: Optional[int] = None, ranks: Optional[Sequence[int]] = None):
        """`reqs`: the library's requests (none zero), owned by this Work from now on."""
        super().__init__()
        self._reqs = reqs
        self._what = what
        self._keep = keep
        self._outputs = outputs if outputs is not None else []
        self._completer = completer
        self._lock = threading.Lock()
        if finish is not None:
            self._finish = finish
        if recv_count is not None:
            self._recv_count = recv_count
            self._ranks = ranks
        self._done = not reqs
        if self._done:
            self._complete([])

    # -- completion (with self._lock held, or from __init__) --

    def _complete(self, failures: List[Any]) -> None:
        """`failures`: (status, message) of each request whose wait failed."""
        lib = _lib.load()
        if failures:
            st, msg = failures[0]
            self._error = _errors.for_status(st, msg or f"{self._what} failed")
        if self._error is None and self._recv_count is not None and self._reqs:
            info = _lib.RecvInfo()
            _lib.check(lib.dc_request_recv_info(self._reqs[0], byref(info)))
            self._source = info.source
            if info.count != self._recv_count:
                src = self._ranks[info.source] if self._ranks else info.source
                self._error = _errors.BY_CLASS[_errors.dc.DistMismatchError](
                    f"{self._what}: received {info.count} elements from rank {src}, the tensor holds {self._recv_count}")
        free = lib.dc_request_free
        for req in self._reqs:
            free(req)
        self._reqs = _NO_REQS
        if self._finish is not None:
            if self._error is None:
                try:
                    with torch.no_grad():
                        self._finish()
                except BaseException as e:  # a copy into an output failed: report it as the op's error
                    self._error = _errors.translate(e)
            self._finish = None
        self._keep = ()
        self._done = True

    def _settle(self) -> None:
        """Marks the future done, once, outside self._lock: its callbacks run here and may
        call back into this Work."""
        with self._lock:
            if not (self._unsettled and self._done):
                return
            self._unsettled = False
            fut = self._future
        assert fut is not None
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._outputs)

    def _wait_locked(self) -> None:
        if not self._done:
            self._complete(_wait_all(self._reqs))

    # -- torch's Work API --

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            if timeout is not None and _seconds(timeout) > 0:
                self._wait_bounded(timeout)
            with self._lock:
                self._wait_locked()
        if self._unsettled:  # set under the lock before the future is handed out
            self._settle()
        if self._error is not None:
            raise self._error
        return True

    def _wait_bounded(self, timeout: Any) -> None:
        """Polls until done; a timeout error if that takes longer than `timeout`."""
        deadline = time.monotonic() + _seconds(timeout)
        pause = 0.0001
        while not self.is_completed():
            if time.monotonic() >= deadline:
                raise _errors.DistcommTimeoutError(
                    f"{self._what}: Work.wait({timeout}) timed out; the operation is still pending")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def is_completed(self) -> bool:
        """Never blocks; True once finished (successfully or not)."""
        if self._done:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another thread is completing it right now
        try:
            if self._done:
                return True
            lib = _lib.load()
            flag = c_bool(False)
            for r in self._reqs:
                _lib.check(lib.dc_request_is_completed(r, byref(flag)))
                if not flag.value:
                    return False
            self._complete(_wait_all(self._reqs))  # all done: returns at once
        finally:
            self._lock.release()
        self._settle()
        return True

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error if self.is_completed() else None

    def source_rank(self) -> int:
        """The sender's group rank, for a completed receive."""
        self.wait()
        if self._recv_count is None:
            raise _errors.BY_CLASS[_errors.dc.DistInvalidUsage](f"{self._what}: source_rank() is for receives only")
        return self._source

    _source_rank = source_rank

    def result(self) -> List[Any]:
        self.wait()
        return list(self._outputs)

    def synchronize(self) -> None:
        """CPU tensors: nothing to order against a stream."""

    def get_future(self) -> torch.futures.Future:
        """A torch.futures.Future that completes with the output tensors (or the error) when the
        operation does, without anyone calling wait()."""
        with self._lock:
            fut = self._future
            if fut is None:
                fut = self._future = torch.futures.Future()
                self._unsettled = True
                if not self._done:
                    assert self._completer is not None, "every Work of the backend has a completer"
                    self._completer.watch(self)
        self._settle()  # already done: now
        return fut

    def __repr__(self) -> str:
        state = "pending" if not self._done else ("failed" if self._error else "completed")
        return f"<distcomm Work {self._what} {state}>"


class Completer:
    """A daemon thread that waits for Works whose futures were asked for, in the order asked,
    and settles the futures (future callbacks then run on this thread, as on NCCL's watchdog)."""

    def __init__(self, name: str):
        self._name = name
        self._queue: "collections.deque[Work]" = collections.deque()
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def watch(self, w: Work) -> None:
        with self._cv:
            self._queue.append(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                w = self._queue.popleft()
            try:
                w.wait()
            except BaseException:
                pass  # the error is in the Work and its future


class Pending:
    """Works not yet known to be complete, oldest first: kept alive (their tensors with them)
    until they finish, and waited for when the group is shut down. Checking the oldest on each
    new call keeps this O(1) per call."""

    def __init__(self) -> None:
        self._works: "collections.deque[Work]" = collections.deque()

    def add(self, w: Work) -> None:
        # Sweep first: testing the work just started would hand it to the library's worker
        # (a test asks for progress), though its caller usually waits for it at once and then
        # runs it on its own thread, without a wake-up.
        works = self._works
        while works and works[0].is_completed():
            works.popleft()
        if not w._done:
            works.append(w)

    def wait_all(self, timeout_s: float) -> int:
        """Waits up to timeout_s for every pending Work; returns how many are still pending."""
        deadline = time.monotonic() + timeout_s
        while self._works:
            w = self._works[0]
            if w.is_completed():
                self._works.popleft()
                continue
            if time.monotonic() >= deadline:
                break
            time.sleep(0.001)
        return len(self._works)
