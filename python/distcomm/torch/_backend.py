"""The ``"distcomm"`` backend of torch.distributed: a ``torch._C._distributed_c10d.Backend``
subclass whose methods start the library's non-blocking calls (``dc_i*``) on the tensors'
memory and return :class:`~distcomm.torch._work.Work` objects.

Ranks arriving here are group ranks (torch translates global ones). Every argument is checked
before the first call into the library, so a bad one raises on this rank with nothing sent.
Tensors the library writes must be contiguous; inputs that are not contiguous are copied first;
CUDA tensors go through the library's NCCL path when the group's communicator has one (they run
on torch's current stream, and a Work completes when the GPU has finished); list outputs (all_gather, gather, all_to_all) are filled from one staging buffer
when the operation completes, or written directly when they are consecutive views of one
buffer (``list(flat.chunk(n))``).
"""

import ctypes
import datetime
import os
from ctypes import byref, c_size_t, c_void_p
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import ProcessGroup as _C10dProcessGroup

from .. import _lib
from . import _errors
from ._ops import U8, check_tensor, move_dtype, one, reduce_dtype, reduce_op, same_shape
from ._work import Completer, Pending, Work

# A valid address for zero-element buffers (the library refuses NULL where a buffer is due).
_EMPTY = ctypes.create_string_buffer(16)
_EMPTY_PTR = ctypes.addressof(_EMPTY)


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    if t is None:
        return None
    return t.data_ptr() if t.numel() else _EMPTY_PTR


def _detached(t: torch.Tensor) -> torch.Tensor:
    """`t` as autograd does not see it (detach() costs an object: only where grad is on)."""
    return t.detach() if t.requires_grad else t


def _out(t: Any, what: str) -> torch.Tensor:
    """A tensor the library writes: contiguous, on the CPU (detached: autograd does not see
    collectives, as with Gloo)."""
    return _detached(check_tensor(t, what, written=True))


def _in(t: Any, what: str) -> torch.Tensor:
    """A tensor the library only reads (copied when not contiguous)."""
    t = _detached(check_tensor(t, what, written=False))
    return t if t.is_contiguous() else t.contiguous()


def _target(t: Any, what: str) -> torch.Tensor:
    """A tensor filled by a copy when the operation completes (any strides)."""
    return _detached(check_tensor(t, what, written=False))


def _consecutive(ts: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """The flat tensor that `ts` are consecutive contiguous views of, in order, else None."""
    if not ts or any(not t.is_contiguous() or t.dtype != ts[0].dtype for t in ts):
        return None
    base = ts[0]
    step = base.numel() * base.element_size()
    p0 = base.data_ptr()
    for i, t in enumerate(ts):
        if t.numel() != base.numel() or t.data_ptr() != p0 + i * step:
            return None
    if step == 0:
        return None
    storage = base.untyped_storage()
    if any(t.untyped_storage().data_ptr() != storage.data_ptr() for t in ts):
        return None
    flat = torch.empty(0, dtype=base.dtype, device=base.device)
    flat.set_(storage, base.storage_offset(), (base.numel() * len(ts),))
    return flat


def _settled(tmp: torch.Tensor) -> None:
    """Copies out of a CUDA staging buffer are queued on the finishing thread's stream: wait for
    them, so the outputs are ready when the Work and its future say so."""
    if tmp.is_cuda:
        torch.cuda.current_stream(tmp.device).synchronize()


def _copy_blocks(outs: List[torch.Tensor], tmp: torch.Tensor) -> Callable[[], None]:
    def finish() -> None:
        for i, o in enumerate(outs):
            o.copy_(tmp[i].view(o.shape))
        _settled(tmp)

    return finish


def _copy_pieces(outs: List[torch.Tensor], tmp: torch.Tensor) -> Callable[[], None]:
    def finish() -> None:
        off = 0
        for o in outs:
            n = o.numel()
            o.copy_(tmp[off:off + n].view(o.shape))
            off += n
        _settled(tmp)

    return finish


def _first_cuda(keep: Any) -> Optional[torch.Tensor]:
    """The first CUDA tensor among what a call keeps alive (tensors, lists and tuples of them)."""
    if isinstance(keep, torch.Tensor):
        return keep if keep.is_cuda else None
    if isinstance(keep, (list, tuple)):
        for k in keep:
            t = _first_cuda(k)
            if t is not None:
                return t
    return None


def _sizes(vals: Sequence[int]) -> "ctypes.Array[c_size_t]":
    return (c_size_t * max(len(vals), 1))(*vals)


def _displs(counts: Sequence[int]) -> List[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def _base() -> type:
    """What a backend written in Python derives from. Recent torch lets Python subclass c10d's
    Backend (one per device type of a group); older releases (2.11, for one) give that class no
    Python constructor, and a third-party backend is a ProcessGroup subclass instead, which the
    creator returns to stand for the whole group (torch's own Python process groups do this).
    DISTCOMM_TORCH_BASE=processgroup picks the second on any torch (to test it)."""
    if os.environ.get("DISTCOMM_TORCH_BASE", "").lower() == "processgroup":
        return _C10dProcessGroup

    class _Probe(_C10dBackend):
        pass

    try:
        _Probe(0, 1)
    except TypeError:  # "No constructor defined!"
        return _C10dProcessGroup
    return _C10dBackend


_BASE = _base()


class DistcommBackend(_BASE):  # type: ignore[misc]
    """One torch process group's distcomm communicator (``dc_comm``)."""

    def __init__(self, handle: int, rank: int, size: int, timeout: datetime.timedelta, name: str):
        super().__init__(rank, size)
        # The communicator's handle (None from shutdown on), in a cell where the native backend
        # (_native.cpp) reads it on each call.
        self._hcell = c_void_p(handle)
        self._lib = _lib.load()
        self._name = name
        self._timeout = timeout
        self._rank = rank
        self._size = size
        self._pending = Pending()
        self._completer = Completer(f"distcomm-{name}")
        self._nccl = self.transport() == "nccl"
        # Without CUDA there are no CUDA tensors to look for: each call skips the search.
        self._cuda_here = torch.cuda.is_available()
        self._stream: Optional[int] = None  # the CUDA stream last given to the library (None: its own)

    # -- identity --

    def getBackendName(self) -> str:
        return "distcomm"

    # torch reads these through the C++ virtuals, which look for Python overrides: one inherited
    # from the C++ binding calls itself until the stack runs out (torch 2.15), so each is defined
    # here. No coalescing manager of our own: torch's _coalescing_manager then calls the
    # *_coalesced methods below.
    supports_coalescing = property(lambda self: False)
    supports_splitting = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)
    _supports_time_estimate = property(lambda self: False)

    def __repr__(self) -> str:
        return f"DistcommBackend(group={self._name!r}, rank={self._rank}, size={self._size})"

    if _BASE is _C10dProcessGroup:
        # A ProcessGroup reads its name and description from its first backend, and this one
        # has none (it is the group): torch's front end reads them here instead.
        _group_name_: str = ""
        _group_desc_: str = ""
        group_name = property(lambda self: self._group_name_)
        group_desc = property(lambda self: self._group_desc_)

        def _set_group_name(self, name: str) -> None:
            self._group_name_ = name

        def _set_group_desc(self, desc: str) -> None:
            self._group_desc_ = desc

        def _get_backend(self, device: Any) -> "DistcommBackend":
            return self  # the backend of every device type is this group itself

    def transport(self) -> str:
        """The library's transport for this group ("shm", "socket", ...)."""
        name = ctypes.c_char_p()
        self._check(self._lib.dc_comm_backend(self._handle(), byref(name)), "dc_comm_backend")
        return (name.value or b"").decode()

    # -- plumbing --

    @property
    def _h(self) -> Optional[int]:
        return self._hcell.value

    def _handle(self) -> int:
        if self._h is None:
            raise _errors.BY_CLASS[_errors.dc.DistInvalidUsage](f"{self!r} has been shut down")
        return self._h

    def _check(self, st: int, what: str) -> None:
        if st != 0:
            raise _errors.for_status(st, _lib.last_error() or what)

    def _root(self, r: int, what: str) -> int:
        if not 0 <= r < self._size:
            raise _errors.invalid(f"{what} {r} is outside the group's ranks [0, {self._size})")
        return r

    def _start(self, what: str, calls: Sequence[Tuple[str, Tuple[Any, ...]]], keep: Any = (),
               outputs: Optional[List[Any]] = None, finish: Optional[Callable[[], None]] = None,
               recv_count: Optional[int] = None) -> Work:
        """Starts each (dc_iNAME, args) and returns one Work over their requests. `keep`
        holds every tensor of the call (see _place)."""
        if len(calls) == 1 and finish is None and recv_count is None:
            fn, args = calls[0]
            return self._start_one(what, getattr(self._lib, fn), args, keep, outputs)
        self._place(keep, what)
        reqs: List[int] = []
        lib = self._lib
        req = c_void_p()
        out = byref(req)
        try:
            for fn, args in calls:
                self._check(getattr(lib, fn)(*args, out), fn)
                reqs.append(req.value)
        except BaseException:
            if reqs:  # already started: they must finish before their buffers go
                self._pending.add(Work(reqs, what, self._completer, keep=keep))
            raise
        w = Work(reqs, what, self._completer, keep=keep, outputs=outputs, finish=finish, recv_count=recv_count)
        self._pending.add(w)
        return w

    def _start_one(self, what: str, fn: Any, args: Tuple[Any, ...], keep: Any, outputs: Optional[List[Any]]) -> Work:
        """`_start` of one library call `fn` (DDP's many small calls take this path)."""
        if self._cuda_here:
            self._place(keep, what)
        req = c_void_p()
        st = fn(*args, byref(req))
        if st != 0:
            raise _errors.for_status(st, _lib.last_error() or what)
        w = Work([req.value], what, self._completer, keep=keep, outputs=outputs)
        self._pending.add(w)
        return w

    def _place(self, keep: Any, what: str) -> None:
        """CUDA tensors need the group's NCCL communicator (without one the library would take
        their addresses for host memory), and run on torch's current stream. The library itself
        refuses a call that mixes CPU and CUDA memory or uses another GPU than the group's."""
        if not self._cuda_here:
            return
        t = _first_cuda(keep)
        if t is None:
            return
        if not self._nccl:
            raise _errors.unavailable(
                f"{what}: the tensor is on {t.device}, but this group's distcomm communicator has no "
                f"NCCL (transport {self.transport()!r}): it needs libnccl.so.2 and a GPU of its own for "
                "every rank (ranks sharing a GPU stay on the CPU); move the tensor with .cpu() or "
                "register 'cpu:distcomm,cuda:nccl'")
        # torch's default stream is the legacy one, which the library's own stream follows.
        stream = torch.cuda.current_stream(t.device).cuda_stream or None
        if stream != self._stream:
            self._check(self._lib.dc_comm_set_stream(self._handle(), stream), "dc_comm_set_stream")
            self._stream = stream

    # -- collectives --

    def barrier(self, opts: Any = None) -> Work:
        return self._start("barrier", [("dc_ibarrier", (self._handle(),))])

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> Work:
        root = self._root(opts.rootRank, "broadcast: root")
        t = one(tensors, "broadcast")
        t = _in(t, "broadcast: tensor") if root == self._rank else _out(t, "broadcast: tensor")
        code, n = move_dtype(t, "broadcast: tensor")
        return self._start("broadcast", [("dc_ibroadcast", (_ptr(t), n, code, root, self._handle()))],
                           keep=(t,), outputs=[t])

    def _allreduce_args(self, t: torch.Tensor, op: Any, what: str) -> Tuple[Any, ...]:
        code, n, _ = reduce_dtype(t, what)
        dc_op, factor = reduce_op(op, t, what)
        return code, n, dc_op, factor

    def allreduce(self, tensors: List[torch.Tensor], opts: Any) -> Work:
        t = _out(one(tensors, "allreduce"), "allreduce: tensor")
        code, n, op, factor = self._allreduce_args(t, opts.reduceOp, "allreduce")
        if factor is not None:
            t.mul_(factor)
        p = _ptr(t)
        return self._start_one("allreduce", self._lib.dc_iallreduce, (p, p, n, code, op, self._handle()),
                               (t,), [t])

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any) -> Work:
        ts = [_out(t, f"allreduce_coalesced: tensors[{i}]") for i, t in enumerate(tensors)]
        args = [self._allreduce_args(t, opts.reduceOp, f"allreduce_coalesced: tensors[{i}]") for i, t in enumerate(ts)]
        calls = []
        for t, (code, n, op, factor) in zip(ts, args):
            if factor is not None:
                t.mul_(factor)
            p = _ptr(t)
            calls.append(("dc_iallreduce", (p, p, n, code, op, self._handle())))
        return self._start("allreduce_coalesced", calls, keep=(ts,), outputs=ts)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> Work:
        root = self._root(opts.rootRank, "reduce: root")
        t = one(tensors, "reduce")
        at_root = root == self._rank
        t = _out(t, "reduce: tensor") if at_root else _in(t, "reduce: tensor")
        code, n, op, factor = self._allreduce_args(t, opts.reduceOp, "reduce")
        send = t
        if factor is not None:
            if at_root:
                t.mul_(factor)
            else:
                send = t * factor  # the caller's tensor is only read on other ranks
        recv = _ptr(t) if at_root else None
        return self._start("reduce", [("dc_ireduce", (_ptr(send), recv, n, code, op, root, self._handle()))],
                           keep=(t, send), outputs=[t])

    def _allgather_call(self, out: torch.Tensor, inp: torch.Tensor, what: str) -> Tuple[str, Tuple[Any, ...]]:
        if out.dtype != inp.dtype:
            raise _errors.invalid(f"{what}: output has dtype {out.dtype}, input has {inp.dtype}")
        if out.numel() != inp.numel() * self._size:
            raise _errors.invalid(f"{what}: output has {out.numel()} elements, needs {self._size} x {inp.numel()}")
        code, n = move_dtype(inp, what)
        return ("dc_iallgather", (_ptr(inp), _ptr(out), n, code, self._handle()))

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        return self.allgather_coalesced(output_tensors, input_tensors, opts, what="allgather")

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
                            opts: Any = None, what: str = "allgather_coalesced") -> Work:
        if len(output_lists) != len(input_tensors):
            raise _errors.invalid(f"{what}: {len(output_lists)} output lists for {len(input_tensors)} inputs")
        calls, keep, finishes, outputs = [], [], [], []
        for j, (outs, inp) in enumerate(zip(output_lists, input_tensors)):
            inp = _in(inp, f"{what}: input[{j}]")
            if len(outs) != self._size:
                raise _errors.invalid(f"{what}: output list has {len(outs)} tensors, the group has {self._size} ranks")
            outs = [_target(o, f"{what}: output[{j}][{i}]") for i, o in enumerate(outs)]
            same_shape(inp, outs, f"{what}: output[{j}]", "the input")
            flat = _consecutive(outs)
            if flat is None:
                flat = torch.empty(self._size * inp.numel(), dtype=inp.dtype, device=inp.device)
                finishes.append(_copy_blocks(outs, flat.view(self._size, -1)))
            calls.append(self._allgather_call(flat, inp, what))
            keep += [inp, flat, outs]
            outputs.append(outs)
        return self._start(what, calls, keep=keep, outputs=outputs, finish=_chain(finishes))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        out, inp = _out(output, "all_gather_into_tensor: output"), _in(input, "all_gather_into_tensor: input")
        call = self._allgather_call(out, inp, "all_gather_into_tensor")
        return self._start("all_gather_into_tensor", [call], keep=(out, inp), outputs=[out])

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Work:
        what = "allgather_into_tensor_coalesced"
        if len(outputs) != len(inputs):
            raise _errors.invalid(f"{what}: {len(outputs)} outputs for {len(inputs)} inputs")
        outs = [_out(o, f"{what}: outputs[{i}]") for i, o in enumerate(outputs)]
        ins = [_in(t, f"{what}: inputs[{i}]") for i, t in enumerate(inputs)]
        calls = [self._allgather_call(o, t, what) for o, t in zip(outs, ins)]
        return self._start(what, calls, keep=(outs, ins), outputs=outs)

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any) -> Work:
        root = self._root(opts.rootRank, "gather: root")
        inp = _in(one(input_tensors, "gather"), "gather: input")
        code, n = move_dtype(inp, "gather: input")
        if root != self._rank:
            if output_tensors and any(len(o) for o in output_tensors):
                raise _errors.invalid("gather: gather_list must be empty on ranks other than the destination")
            return self._start("gather", [("dc_igather", (_ptr(inp), None, n, code, root, self._handle()))], keep=(inp,))
        outs = one(output_tensors, "gather: gather_list")
        if len(outs) != self._size:
            raise _errors.invalid(f"gather: gather_list has {len(outs)} tensors, the group has {self._size} ranks")
        outs = [_target(o, f"gather: gather_list[{i}]") for i, o in enumerate(outs)]
        same_shape(inp, outs, "gather: gather_list", "the input")
        flat = _consecutive(outs)
        finish = None
        if flat is None:
            flat = torch.empty(self._size * inp.numel(), dtype=inp.dtype, device=inp.device)
            finish = _copy_blocks(outs, flat.view(self._size, -1))
        return self._start("gather", [("dc_igather", (_ptr(inp), _ptr(flat), n, code, root, self._handle()))],
                           keep=(inp, flat, outs), outputs=[outs], finish=finish)

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any) -> Work:
        root = self._root(opts.rootRank, "scatter: root")
        out = _out(one(output_tensors, "scatter"), "scatter: output")
        code, n = move_dtype(out, "scatter: output")
        send = None
        if root == self._rank:
            ins = one(input_tensors, "scatter: scatter_list")
            if len(ins) != self._size:
                raise _errors.invalid(f"scatter: scatter_list has {len(ins)} tensors, the group has {self._size} ranks")
            ins = [_in(t, f"scatter: scatter_list[{i}]") for i, t in enumerate(ins)]
            same_shape(out, ins, "scatter: scatter_list", "the output")
            send = _consecutive(ins)
            if send is None:
                send = torch.cat([t.reshape(-1) for t in ins]) if ins else torch.empty(0, dtype=out.dtype, device=out.device)
        elif input_tensors and any(len(i) for i in input_tensors):
            raise _errors.invalid("scatter: scatter_list must be empty on ranks other than the source")
        return self._start("scatter", [("dc_iscatter", (_ptr(send), _ptr(out), n, code, root, self._handle()))],
                           keep=(send, out), outputs=[out])

    def _reduce_scatter_call(self, out: torch.Tensor, inp: torch.Tensor, op: Any, what: str,
                             may_scale_input: bool) -> Tuple[Tuple[str, Tuple[Any, ...]], torch.Tensor]:
        if inp.dtype != out.dtype:
            raise _errors.invalid(f"{what}: input has dtype {inp.dtype}, output has {out.dtype}")
        if inp.numel() != out.numel() * self._size:
            raise _errors.invalid(f"{what}: input has {inp.numel()} elements, needs {self._size} x {out.numel()}")
        code, n, dc_op, factor = self._allreduce_args(out, op, what)
        if factor is not None:
            inp = inp.mul_(factor) if may_scale_input else inp * factor
        return ("dc_ireduce_scatter", (_ptr(inp), _ptr(out), n, code, dc_op, self._handle())), inp

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any) -> Work:
        what = "reduce_scatter"
        out = _out(one(output_tensors, what), f"{what}: output")
        ins = one(input_tensors, f"{what}: input_list")
        if len(ins) != self._size:
            raise _errors.invalid(f"{what}: input_list has {len(ins)} tensors, the group has {self._size} ranks")
        ins = [_in(t, f"{what}: input_list[{i}]") for i, t in enumerate(ins)]
        same_shape(out, ins, f"{what}: input_list", "the output")
        flat = _consecutive(ins)
        own = flat is None
        if own:
            flat = torch.cat([t.reshape(-1) for t in ins])
        call, send = self._reduce_scatter_call(out, flat, opts.reduceOp, what, may_scale_input=own)
        return self._start(what, [call], keep=(out, send), outputs=[out])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Work:
        what = "reduce_scatter_tensor"
        out, inp = _out(output, f"{what}: output"), _in(input, f"{what}: input")
        call, send = self._reduce_scatter_call(out, inp, opts.reduceOp, what, may_scale_input=False)
        return self._start(what, [call], keep=(out, send), outputs=[out])

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any) -> Work:
        what = "reduce_scatter_tensor_coalesced"
        if len(outputs) != len(inputs):
            raise _errors.invalid(f"{what}: {len(outputs)} outputs for {len(inputs)} inputs")
        outs = [_out(o, f"{what}: outputs[{i}]") for i, o in enumerate(outputs)]
        ins = [_in(t, f"{what}: inputs[{i}]") for i, t in enumerate(inputs)]
        made = [self._reduce_scatter_call(o, t, opts.reduceOp, what, may_scale_input=False) for o, t in zip(outs, ins)]
        return self._start(what, [c for c, _ in made], keep=(outs, [s for _, s in made]), outputs=outs)

    def _splits(self, splits: Sequence[int], t: torch.Tensor, what: str) -> List[int]:
        """Rows per rank along dim 0: equal when `splits` is empty."""
        rows = t.shape[0] if t.dim() else 0
        if not splits:
            if t.dim() == 0 or rows % self._size:
                raise _errors.invalid(f"{what}: dim 0 ({rows}) is not divisible by the group size {self._size}; pass split sizes")
            return [rows // self._size] * self._size
        s = [int(x) for x in splits]
        if len(s) != self._size or any(x < 0 for x in s):
            raise _errors.invalid(f"{what}: split sizes {s} must be {self._size} non-negative ints")
        if sum(s) != rows:
            raise _errors.invalid(f"{what}: split sizes {s} sum to {sum(s)}, dim 0 is {rows}")
        return s

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int],
                          input_split_sizes: List[int], opts: Any = None) -> Work:
        what = "all_to_all_single"
        out, inp = _out(output, f"{what}: output"), _in(input, f"{what}: input")
        if out.dtype != inp.dtype:
            raise _errors.invalid(f"{what}: output has dtype {out.dtype}, input has {inp.dtype}")
        code, _ = move_dtype(inp, what)
        scale = 1 if code != U8 or inp.element_size() == 1 else inp.element_size()  # bytes for dtypes moved as bytes
        if not output_split_sizes and not input_split_sizes:
            if inp.numel() != out.numel() or inp.numel() % self._size:
                raise _errors.invalid(f"{what}: input ({inp.numel()}) and output ({out.numel()}) need equal sizes "
                                      f"divisible by the group size {self._size}, or split sizes")
            n = inp.numel() // self._size * scale
            return self._start(what, [("dc_ialltoall", (_ptr(inp), _ptr(out), n, code, self._handle()))],
                               keep=(out, inp), outputs=[out])
        si = self._splits(input_split_sizes, inp, f"{what}: input")
        so = self._splits(output_split_sizes, out, f"{what}: output")
        in_row = inp[0].numel() if inp.shape[0] else 0
        out_row = out[0].numel() if out.shape[0] else 0
        if inp.shape[0] and out.shape[0] and in_row != out_row:
            raise _errors.invalid(f"{what}: input rows have {in_row} elements, output rows {out_row}")
        sc = [x * in_row * scale for x in si]
        rc = [x * out_row * scale for x in so]
        args = (_ptr(inp), _sizes(sc), _sizes(_displs(sc)), _ptr(out), _sizes(rc), _sizes(_displs(rc)), code, self._handle())
        return self._start(what, [("dc_ialltoallv", args)], keep=(out, inp, args), outputs=[out])

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        what = "all_to_all"
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise _errors.invalid(f"{what}: needs {self._size} input and output tensors, got {len(input_tensors)} and {len(output_tensors)}")
        ins = [_in(t, f"{what}: input_tensor_list[{i}]") for i, t in enumerate(input_tensors)]
        outs = [_target(t, f"{what}: output_tensor_list[{i}]") for i, t in enumerate(output_tensors)]
        dtype = ins[0].dtype
        for lst, name in ((ins, "input_tensor_list"), (outs, "output_tensor_list")):
            for i, t in enumerate(lst):
                if t.dtype != dtype:
                    raise _errors.invalid(f"{what}: {name}[{i}] has dtype {t.dtype}, input_tensor_list[0] has {dtype}")
        code, _ = move_dtype(ins[0], what)
        scale = 1 if code != U8 or ins[0].element_size() == 1 else ins[0].element_size()
        send = torch.cat([t.reshape(-1) for t in ins])
        recv = torch.empty(sum(t.numel() for t in outs), dtype=dtype, device=send.device)
        sc = [t.numel() * scale for t in ins]
        rc = [t.numel() * scale for t in outs]
        args = (_ptr(send), _sizes(sc), _sizes(_displs(sc)), _ptr(recv), _sizes(rc), _sizes(_displs(rc)), code, self._handle())
        return self._start(what, [("dc_ialltoallv", args)], keep=(send, recv, outs, args), outputs=outs,
                           finish=_copy_pieces(outs, recv))

    alltoall_base = all_to_all_single  # torch < 2.15's names for the same methods
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- point to point --

    def _tag(self, tag: int) -> int:
        if not 0 <= int(tag) < 2**31:
            raise _errors.invalid(f"tag {tag} must be in [0, 2**31)")
        return int(tag)

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int) -> Work:
        peer = self._root(dst, "send: dst")
        t = _in(one(tensors, "send"), "send: tensor")
        code, n = move_dtype(t, "send: tensor")
        return self._start("send", [("dc_isend", (_ptr(t), n, code, peer, self._tag(tag), self._handle()))], keep=(t,))

    def _recv(self, tensors: List[torch.Tensor], src: int, tag: int) -> Work:
        t = _out(one(tensors, "recv"), "recv: tensor")
        code, n = move_dtype(t, "recv: tensor")
        return self._start("recv", [("dc_irecv", (_ptr(t), n, code, src, self._tag(tag), self._handle()))],
                           keep=(t,), outputs=[t], recv_count=n)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int) -> Work:
        return self._recv(tensors, self._root(src, "recv: src"), tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int) -> Work:
        return self._recv(tensors, -1, tag)  # DC_ANY_SOURCE

    # -- state --

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        ms = max(1, int(timeout.total_seconds() * 1000))
        self._check(self._lib.dc_comm_set_timeout(self._handle(), ms), "dc_comm_set_timeout")
        self._timeout = timeout

    def abort(self) -> None:
        """Fails every pending operation here and on the peers (DistBackendError: aborted)."""
        if self._h is not None:
            self._lib.dc_comm_abort(self._h)

    def shutdown(self) -> None:
        """Completes what is pending (aborting after the group's timeout), then frees the comm."""
        h = self._h
        if h is None:
            return
        if self._pending.wait_all(min(self._timeout.total_seconds(), 30.0)):
            self._lib.dc_comm_abort(h)
            self._pending.wait_all(5.0)
        self._hcell.value = None
        self._lib.dc_comm_destroy(h)


def _chain(finishes: List[Callable[[], None]]) -> Optional[Callable[[], None]]:
    if not finishes:
        return None

    def finish() -> None:
        for f in finishes:
            f()

    return finish
