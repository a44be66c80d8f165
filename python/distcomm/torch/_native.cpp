// The torch backend's hot path in C++ (see _native.py, which builds and loads this file).
//
// torch calls a backend written in Python through a trampoline that takes the GIL, wraps every
// tensor and option as a Python object and then wraps the Work that comes back: about 5 us per
// call before the backend does anything. NativeBackend is a c10d::Backend of its own that
// torch calls directly. The common forms of what DDP, FSDP, pipeline and expert parallelism
// call in a loop (see "the fast forms" below: one dense contiguous CPU tensor per argument, a
// dtype and op the library has) start the library's dc_i* call here and return a NativeWork
// over its request; every other call, form and error case goes to the Python backend it wraps
// (DistcommBackend), which checks, converts and reports exactly as before.
//
// The library's functions come as addresses from Python's ctypes handle (no header, no link
// against libdistcomm.so: the C ABI of API.md is fixed). Errors become the Python exceptions
// the Python backend raises (the torch-flavoured distcomm classes), made by a Python callable.

#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace {

using c10d::OpType;
using Clock = std::chrono::steady_clock;

// dc_recv_info.
struct RecvInfo {
  int32_t source;
  int32_t tag;
  size_t count;
};

// The library's entry points this file calls (signatures from include/distcomm.h).
struct Lib {
  int (*iallreduce)(const void*, void*, size_t, int32_t, int32_t, void*, void**) = nullptr;
  int (*ibroadcast)(void*, size_t, int32_t, int32_t, void*, void**) = nullptr;
  int (*iallgather)(const void*, void*, size_t, int32_t, void*, void**) = nullptr;
  int (*ireduce_scatter)(const void*, void*, size_t, int32_t, int32_t, void*, void**) = nullptr;
  int (*ibarrier)(void*, void**) = nullptr;
  int (*ialltoall)(const void*, void*, size_t, int32_t, void*, void**) = nullptr;
  int (*ialltoallv)(const void*, const size_t*, const size_t*, void*, const size_t*, const size_t*, int32_t, void*,
                    void**) = nullptr;
  int (*isend)(const void*, size_t, int32_t, int32_t, int32_t, void*, void**) = nullptr;
  int (*irecv)(void*, size_t, int32_t, int32_t, int32_t, void*, void**) = nullptr;
  int (*request_recv_info)(const void*, RecvInfo*) = nullptr;
  int (*request_wait)(void*) = nullptr;
  int (*request_is_completed)(void*, bool*) = nullptr;
  int (*request_free)(void*) = nullptr;
  const char* (*last_error)() = nullptr;
  const char* (*status_name)(uint32_t) = nullptr;
  int (*comm_abort)(void*) = nullptr;
};
Lib lib;

// status, message -> the Python exception to raise (distcomm.torch._errors.for_status). Never
// freed: it must outlive every Work, also those finished at interpreter exit.
py::object* make_error = nullptr;

constexpr int kU8 = 1;
constexpr int kMismatch = 5;     // DC_ERR_MISMATCH
constexpr int kInternal = 10;    // DC_ERR_INTERNAL
constexpr int32_t kAnySource = -1;  // DC_ANY_SOURCE
constexpr int kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kBand = 5, kBor = 6, kBxor = 7;

// torch dtype -> dc_dtype, -1 where the library has no code (as _ops.DTYPES; bool is one byte).
int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kChar: return 0;
    case at::kByte: return 1;
    case at::kBool: return 1;
    case at::kInt: return 2;
    case at::kUInt32: return 3;
    case at::kLong: return 4;
    case at::kUInt64: return 5;
    case at::kHalf: return 6;
    case at::kFloat: return 7;
    case at::kDouble: return 8;
    case at::kBFloat16: return 9;
    default: return -1;
  }
}

// torch's ReduceOp on a tensor of `t` -> dc_op, or -1 where the Python backend must decide
// (bool's logical mapping, PREMUL_SUM, bitwise ops on floating types: its errors or mappings).
int op_code(const c10d::ReduceOp& op, at::ScalarType t) {
  if (t == at::kBool) return -1;
  bool floating = at::isFloatingType(t);
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return kSum;
    case c10d::ReduceOp::PRODUCT: return kProd;
    case c10d::ReduceOp::MAX: return kMax;
    case c10d::ReduceOp::MIN: return kMin;
    case c10d::ReduceOp::AVG: return kAvg;
    case c10d::ReduceOp::BAND: return floating ? -1 : kBand;
    case c10d::ReduceOp::BOR: return floating ? -1 : kBor;
    case c10d::ReduceOp::BXOR: return floating ? -1 : kBxor;
    default: return -1;
  }
}

// A tensor the fast path takes as it is: dense, contiguous, on the CPU, not empty.
bool plain(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && t.numel() > 0;
}

// The Python exception for a failed status (GIL held by the caller).
py::object error_for(int status, const std::string& message) {
  return (*make_error)(status, message);
}

// The calling thread's last library error, or "`what` failed" where it has none.
std::string last_error_or(const char* what) {
  const char* m = lib.last_error();
  return (m != nullptr && *m != '\0') ? m : std::string(what) + " failed";
}

[[noreturn]] void raise(const py::object& err) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
  throw py::error_already_set();
}

class NativeWork;
void watch(c10::intrusive_ptr<NativeWork> w);

// One operation started with a dc_i* call; owns its request (freed with the Work) and keeps
// its tensors alive until it completes.
class NativeWork : public c10d::Work {
 public:
  NativeWork(void* req, OpType type, const char* what, std::vector<at::Tensor> outputs, at::Tensor input)
      : c10d::Work(-1, type), req_(req), what_(what), outputs_(std::move(outputs)), input_(std::move(input)) {}

  ~NativeWork() override {
    lib.request_free(req_);  // waits if still pending (the backend keeps pending Works, though)
  }

  bool isCompleted() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (done_) return true;
    }
    bool finished = false;
    if (lib.request_is_completed(req_, &finished) == 0 && !finished) return false;
    std::lock_guard<std::mutex> g(mu_);
    if (!done_) finish_locked();
    return true;
  }

  bool isSuccess() const override {
    std::lock_guard<std::mutex> g(mu_);
    return done_ && status_ == 0;
  }

  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> g(mu_);
    return eptr_;
  }

  std::vector<at::Tensor> result() override {
    wait(std::chrono::milliseconds(0));
    return outputs_;
  }

  void synchronize() override {}

  // A step after success (copying a staging buffer into list outputs), and the outputs as
  // lists of lists for the future (all_gather's shape).
  void finish_with(std::function<void()> finish, std::vector<std::vector<at::Tensor>> nested) {
    finish_ = std::move(finish);
    nested_ = std::move(nested);
    is_nested_ = true;
  }

  // A receive of `count` elements: a message of another length fails it (as in the Python
  // backend), and sourceRank() names the sender.
  void expect_recv(size_t count) { recv_count_ = static_cast<int64_t>(count); }

  int sourceRank() const override {
    if (recv_count_ < 0) return c10d::Work::sourceRank();  // torch's refusal
    std::lock_guard<std::mutex> g(mu_);
    return source_;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    if (PyGILState_Check()) {  // called from Python with the GIL: others run while this waits
      py::gil_scoped_release nogil;
      finish_within(timeout);
    } else {
      finish_within(timeout);
    }
    settle();
    if (status_ != 0) {  // wait() raises the Python backend's classes (DistcommTimeoutError ...)
      py::gil_scoped_acquire gil;
      raise(error_for(status_, message_));
    }
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    bool pending;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (future_) return future_;
      auto tensors = c10::ListType::create(c10::TensorType::get());
      future_ = c10::make_intrusive<c10::ivalue::Future>(is_nested_ ? c10::ListType::create(tensors) : tensors);
      pending = !done_;
    }
    if (pending) {
      watch(c10::intrusive_ptr<NativeWork>::reclaim_copy(this));
    } else {
      settle();
    }
    return future_;
  }

  // The watcher's wait (errors stay in the Work and its future).
  void complete() {
    finish_within(std::chrono::milliseconds(0));
    settle();
  }

 private:
  // Waits for the request (at most `timeout` when positive: then a timeout error if it is not
  // done, the operation still pending) and collects its status.
  void finish_within(std::chrono::milliseconds timeout) {
    if (timeout > std::chrono::milliseconds(0)) {
      auto deadline = Clock::now() + timeout;
      auto pause = std::chrono::microseconds(100);
      while (!isCompleted()) {
        if (Clock::now() >= deadline) {
          py::gil_scoped_acquire gil;
          auto cls = py::module_::import("distcomm.torch._errors").attr("DistcommTimeoutError");
          raise(cls(std::string(what_) + ": Work.wait(" + std::to_string(timeout.count()) +
                    " ms) timed out; the operation is still pending"));
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(10000));
      }
    }
    lib.request_wait(req_);  // without mu_: other threads may ask is_completed meanwhile
    std::lock_guard<std::mutex> g(mu_);
    if (!done_) finish_locked();
  }

  // Collects the finished request's status (mu_ held; never takes the GIL, which a Python
  // thread may hold while it waits for mu_). The request itself lives as long as the Work:
  // another thread may still be in dc_request_wait on it.
  void finish_locked() {
    int st = lib.request_wait(req_);  // done: returns at once, and sets this thread's last error
    RecvInfo info{};
    if (st == 0 && recv_count_ >= 0 && lib.request_recv_info(req_, &info) == 0) {
      source_ = info.source;
      if (static_cast<int64_t>(info.count) != recv_count_) {
        st = kMismatch;
        message_ = std::string(what_) + ": received " + std::to_string(info.count) + " elements from rank " +
                   std::to_string(info.source) + ", the tensor holds " + std::to_string(recv_count_);
      }
    }
    if (st == 0 && finish_) {
      try {
        finish_();
      } catch (const std::exception& e) {
        st = kInternal;
        message_ = std::string(what_) + ": copying into the outputs failed: " + e.what();
      }
      finish_ = nullptr;
    }
    if (st != 0 && message_.empty()) message_ = last_error_or(what_);
    if (st != 0) {
      // What the future and exception() carry: torch's DistBackendError, which needs no GIL
      // (a Python exception inside a future crosses threads that do not hold it).
      const char* name = lib.status_name(static_cast<uint32_t>(st));
      std::string text = std::string(name != nullptr ? name : "DC_ERR") + ": " + message_;  // as the Python classes' text
      eptr_ = std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, text));
    }
    input_ = at::Tensor();
    status_ = st;
    done_ = true;
  }

  // Marks the future (if one was handed out) done, once, outside mu_: its callbacks run here.
  void settle() {
    c10::intrusive_ptr<c10::ivalue::Future> fut;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!done_ || !future_ || settled_) return;
      settled_ = true;
      fut = future_;
    }
    if (eptr_) {
      fut->setError(eptr_);
    } else if (is_nested_) {
      c10::impl::GenericList lists(c10::ListType::create(c10::TensorType::get()));
      for (auto& v : nested_) lists.push_back(c10::IValue(v));
      fut->markCompleted(c10::IValue(lists));
    } else {
      fut->markCompleted(c10::IValue(outputs_));
    }
  }

  mutable std::mutex mu_;
  void* req_;
  const char* what_;
  std::vector<at::Tensor> outputs_;
  at::Tensor input_;
  bool done_ = false;
  bool settled_ = false;
  int status_ = 0;
  std::string message_;
  int64_t recv_count_ = -1;  // a receive's element count (-1: not a receive)
  std::function<void()> finish_;
  std::vector<std::vector<at::Tensor>> nested_;
  bool is_nested_ = false;
  int source_ = -1;
  std::exception_ptr eptr_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// One thread for the process that waits for Works whose futures were asked for, in the order
// asked, and completes the futures (DDP's reducer continues on it, as on NCCL's watchdog).
struct Watcher {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<c10::intrusive_ptr<NativeWork>> queue;
  bool started = false;
};
Watcher& watcher() {
  static Watcher* w = new Watcher();  // never destroyed: its thread may outlive main
  return *w;
}

void watch(c10::intrusive_ptr<NativeWork> w) {
  Watcher& ws = watcher();
  std::lock_guard<std::mutex> g(ws.mu);
  ws.queue.push_back(std::move(w));
  if (!ws.started) {
    ws.started = true;
    std::thread([&ws] {
      for (;;) {
        c10::intrusive_ptr<NativeWork> w;
        {
          std::unique_lock<std::mutex> l(ws.mu);
          ws.cv.wait(l, [&ws] { return !ws.queue.empty(); });
          w = std::move(ws.queue.front());
          ws.queue.pop_front();
        }
        w->complete();
      }
    }).detach();
  }
  ws.cv.notify_one();
}

// The group's backend as torch sees it: the fast forms here, the rest in `inner_`.
class NativeBackend : public c10d::Backend {
 public:
  // `python`: the group's DistcommBackend (a c10d::Backend written in Python); `handle_cell`:
  // the address of its ctypes cell holding the dc_comm handle (0 once it is shut down).
  NativeBackend(py::object python, int64_t handle_cell, int rank, int size)
      : c10d::Backend(rank, size),
        python_(std::move(python)),
        inner_(python_.cast<c10::intrusive_ptr<c10d::Backend>>()),
        cell_(reinterpret_cast<void* const*>(handle_cell)) {}

  ~NativeBackend() override {
    // Torn down without shutdown() (at interpreter exit, say) while operations still run: they
    // are aborted, as shutdown() would after the timeout, so that freeing them (which waits
    // for each request) cannot hang.
    bool running = false;
    for (auto& w : pending_) running = running || !w->isCompleted();
    void* comm = handle();
    if (running && comm != nullptr) lib.comm_abort(comm);
    pending_.clear();
    // The Python backend goes with the GIL held (its last reference may be here); at
    // interpreter exit it is left as it is.
    if (Py_IsInitialized() && !_Py_IsFinalizing()) {
      py::gil_scoped_acquire gil;
      inner_.reset();
      python_ = py::object();
    } else {
      (void)inner_.release();
      (void)python_.release();
    }
  }

  py::object python() const { return python_; }

  const std::string getBackendName() const override { return "distcomm"; }
  bool supportsSplitting() const override { return false; }
  bool supportsCoalescing() const override { return false; }
  bool supportsShrinking() const override { return false; }
  bool supportsReconfigure() const override { return false; }
  bool supportsWindow() const override { return false; }
  bool supportsTimeEstimation() const override { return false; }

  // -- the fast forms --

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& opts) override {
    void* comm = handle();
    if (comm != nullptr && ts.size() == 1 && plain(ts[0])) {
      at::Tensor& t = ts[0];
      int code = dtype_code(t.scalar_type());
      int op = op_code(opts.reduceOp, t.scalar_type());
      if (code >= 0 && op >= 0) {
        void* p = t.data_ptr();
        void* req = nullptr;
        int st = lib.iallreduce(p, p, static_cast<size_t>(t.numel()), code, op, comm, &req);
        return started(st, req, OpType::ALLREDUCE, "allreduce", {t}, at::Tensor());
      }
    }
    return inner_->allreduce(ts, opts);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& ts, const c10d::BroadcastOptions& opts) override {
    void* comm = handle();
    if (comm != nullptr && ts.size() == 1 && plain(ts[0]) && opts.rootTensor == 0 && opts.rootRank >= 0 &&
        opts.rootRank < size_) {
      at::Tensor& t = ts[0];
      auto [code, n] = moved(t);
      void* req = nullptr;
      int st = lib.ibroadcast(t.data_ptr(), n, code, static_cast<int32_t>(opts.rootRank), comm, &req);
      return started(st, req, OpType::BROADCAST, "broadcast", {t}, at::Tensor());
    }
    return inner_->broadcast(ts, opts);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    void* comm = handle();
    if (comm != nullptr) {
      void* req = nullptr;
      int st = lib.ibarrier(comm, &req);
      return started(st, req, OpType::BARRIER, "barrier", {}, at::Tensor());
    }
    return inner_->barrier(opts);
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& opts) override {
    void* comm = handle();
    if (comm != nullptr && plain(out) && plain(in) && out.scalar_type() == in.scalar_type() &&
        out.numel() == in.numel() * size_) {
      auto [code, n] = moved(in);
      void* req = nullptr;
      int st = lib.iallgather(in.data_ptr(), out.data_ptr(), n, code, comm, &req);
      return started(st, req, OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {out}, in);
    }
    return inner_->all_gather_single(out, in, opts);
  }

  // all_gather into a list: straight into the outputs where they are consecutive views of one
  // buffer (list(flat.chunk(n))), else into a staging buffer copied out on completion.
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                           const c10d::AllgatherOptions& opts) override {
    void* comm = handle();
    if (comm != nullptr && ins.size() == 1 && outs.size() == 1 && plain(ins[0]) &&
        static_cast<int>(outs[0].size()) == size_) {
      at::Tensor& in = ins[0];
      std::vector<at::Tensor>& list = outs[0];
      bool fits = true, consecutive = true;
      auto* base = static_cast<char*>(list[0].defined() ? list[0].data_ptr() : nullptr);
      size_t bytes = static_cast<size_t>(in.numel()) * in.element_size();
      for (size_t i = 0; i < list.size() && fits; i++) {
        fits = plain(list[i]) && list[i].scalar_type() == in.scalar_type() && list[i].numel() == in.numel();
        consecutive = consecutive && fits && static_cast<char*>(list[i].data_ptr()) == base + i * bytes;
      }
      if (fits) {
        auto [code, n] = moved(in);
        at::Tensor flat = consecutive ? at::Tensor() : at::empty({size_ * in.numel()}, in.options());
        void* dst = consecutive ? static_cast<void*>(base) : flat.data_ptr();
        void* req = nullptr;
        int st = lib.iallgather(in.data_ptr(), dst, n, code, comm, &req);
        std::function<void()> copy_out;
        if (!consecutive) {
          copy_out = [list, flat]() mutable {
            for (size_t i = 0; i < list.size(); i++) list[i].copy_(flat.narrow(0, i * list[i].numel(), list[i].numel()).view(list[i].sizes()));
          };
        }
        return started(st, req, OpType::ALLGATHER, "allgather", {}, in,
                       [&](NativeWork& w) { w.finish_with(std::move(copy_out), outs); });
      }
    }
    return inner_->allgather(outs, ins, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
    void* comm = handle();
    if (comm != nullptr && plain(out) && plain(in) && out.scalar_type() == in.scalar_type() &&
        in.numel() == out.numel() * size_) {
      int code = dtype_code(out.scalar_type());
      int op = op_code(opts.reduceOp, out.scalar_type());
      if (code >= 0 && op >= 0) {
        void* req = nullptr;
        int st = lib.ireduce_scatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), code, op, comm, &req);
        return started(st, req, OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {out}, in);
      }
    }
    return inner_->reduce_scatter_single(out, in, opts);
  }

  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                                   std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& opts) override {
    void* comm = handle();
    if (comm != nullptr && plain(out) && plain(in) && out.scalar_type() == in.scalar_type() && in.dim() > 0 && out.dim() > 0) {
      auto [code, n_in] = moved(in);
      size_t scale = n_in / static_cast<size_t>(in.numel());  // bytes per element where moved as bytes, else 1
      void* req = nullptr;
      if (in_splits.empty() && out_splits.empty()) {
        if (in.numel() == out.numel() && in.numel() % size_ == 0) {
          int st = lib.ialltoall(in.data_ptr(), out.data_ptr(), n_in / size_, code, comm, &req);
          return started(st, req, OpType::ALLTOALL_BASE, "all_to_all_single", {out}, in);
        }
      } else {
        std::vector<size_t> sc, sd, rc, rd;
        size_t in_row = static_cast<size_t>(in.numel() / in.size(0)) * scale;
        size_t out_row = static_cast<size_t>(out.numel() / out.size(0)) * scale;
        if (in_row == out_row && rows_of(in_splits, in.size(0), in_row, sc, sd) &&
            rows_of(out_splits, out.size(0), out_row, rc, rd)) {
          int st = lib.ialltoallv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(), code, comm, &req);
          return started(st, req, OpType::ALLTOALL_BASE, "all_to_all_single", {out}, in);
        }
      }
    }
    return inner_->all_to_all_single(out, in, out_splits, in_splits, opts);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& ts, int dst, int tag) override {
    void* comm = handle();
    if (comm != nullptr && ts.size() == 1 && plain(ts[0]) && dst >= 0 && dst < size_ && tag >= 0) {
      at::Tensor& t = ts[0];
      auto [code, n] = moved(t);
      void* req = nullptr;
      int st = lib.isend(t.data_ptr(), n, code, dst, tag, comm, &req);
      return started(st, req, OpType::SEND, "send", {}, t);
    }
    return inner_->send(ts, dst, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& ts, int src, int tag) override {
    if (src >= 0 && src < size_) {
      if (auto w = start_recv(ts, src, tag)) return w;
    }
    return inner_->recv(ts, src, tag);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& ts, int tag) override {
    if (auto w = start_recv(ts, kAnySource, tag)) return w;
    return inner_->recvAnysource(ts, tag);
  }

  // -- everything else: the Python backend --

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& ts, const c10d::AllreduceCoalescedOptions& opts) override {
    return inner_->allreduce_coalesced(ts, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& ts, const c10d::ReduceOptions& opts) override {
    return inner_->reduce(ts, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                                     const c10d::AllgatherOptions& opts) override {
    return inner_->allgather_coalesced(outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                                             const c10d::AllgatherOptions& opts) override {
    return inner_->all_gather_single_coalesced(outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                        const c10d::GatherOptions& opts) override {
    return inner_->gather(outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                                         const c10d::ScatterOptions& opts) override {
    return inner_->scatter(outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                                                const c10d::ReduceScatterOptions& opts) override {
    return inner_->reduce_scatter(outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    return inner_->reduce_scatter_single_coalesced(outs, ins, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                          const c10d::AllToAllOptions& opts) override {
    return inner_->alltoall(outs, ins, opts);
  }
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void abort() override { inner_->abort(); }

  // Completes what this side started (aborting after the group's timeout, at most 30 s, as
  // the Python backend does with its own), then lets the Python backend free the communicator.
  void shutdown() override {
    double seconds = 30.0;
    {
      py::gil_scoped_acquire gil;
      seconds = std::min(seconds, python_.attr("_timeout").attr("total_seconds")().cast<double>());
    }
    drain(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
    inner_->shutdown();
  }

 private:
  void* handle() const { return *cell_; }

  // (dc_dtype, count) for moving a tensor's bytes: as bytes where the library has no code.
  static std::pair<int32_t, size_t> moved(const at::Tensor& t) {
    int code = dtype_code(t.scalar_type());
    if (code < 0) return {kU8, static_cast<size_t>(t.numel()) * t.element_size()};
    return {code, static_cast<size_t>(t.numel())};
  }

  // Counts and displacements (in the library's units: `row` per row along dim 0) of
  // all_to_all_single's split sizes (empty: equal); false where they do not fit `rows`
  // (the Python backend then says why).
  bool rows_of(const std::vector<int64_t>& splits, int64_t rows, size_t row, std::vector<size_t>& counts,
               std::vector<size_t>& displs) const {
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      if (rows % size_ != 0) return false;
      s.assign(size_, rows / size_);
    }
    if (static_cast<int>(s.size()) != size_) return false;
    int64_t sum = 0;
    for (int64_t x : s) {
      if (x < 0) return false;
      counts.push_back(static_cast<size_t>(x) * row);
      displs.push_back(static_cast<size_t>(sum) * row);
      sum += x;
    }
    return sum == rows;
  }

  // A receive on the fast path, or null where the Python backend takes it.
  c10::intrusive_ptr<c10d::Work> start_recv(std::vector<at::Tensor>& ts, int32_t src, int tag) {
    void* comm = handle();
    if (comm == nullptr || ts.size() != 1 || !plain(ts[0]) || tag < 0) return {};
    at::Tensor& t = ts[0];
    auto [code, n] = moved(t);
    void* req = nullptr;
    int st = lib.irecv(t.data_ptr(), n, code, src, tag, comm, &req);
    return started(st, req, src == kAnySource ? OpType::RECVANYSOURCE : OpType::RECV, "recv", {t}, at::Tensor(),
                   [n = n](NativeWork& w) { w.expect_recv(n); });
  }

  // The Work of a call the library took (`st` 0), set up by `prepare` before any other thread
  // can see it; a refusal raises the Python backend's class for `st`.
  c10::intrusive_ptr<NativeWork> started(int st, void* req, OpType type, const char* what, std::vector<at::Tensor> outputs,
                                         at::Tensor input, const std::function<void(NativeWork&)>& prepare = nullptr) {
    if (st != 0) {
      std::string message = last_error_or(what);
      py::gil_scoped_acquire gil;
      raise(error_for(st, message));
    }
    auto w = c10::make_intrusive<NativeWork>(req, type, what, std::move(outputs), std::move(input));
    if (prepare) prepare(*w);
    keep(w);
    return w;
  }

  // Works not yet known to be complete, oldest first, kept (with their tensors) until they
  // finish, as the Python backend's Pending: a Work dropped unwaited is safe. Checking the
  // oldest on each new call keeps this O(1) per call.
  void keep(const c10::intrusive_ptr<NativeWork>& w) {
    std::lock_guard<std::mutex> g(pending_mu_);
    while (!pending_.empty() && pending_.front()->isCompleted()) pending_.pop_front();
    pending_.push_back(w);
  }

  // Waits up to `limit` for the pending Works, aborting the comm if they do not finish, as
  // DistcommBackend.shutdown does.
  void drain(std::chrono::milliseconds limit) {
    auto wait_for = [this](std::chrono::milliseconds limit) {
      auto deadline = Clock::now() + limit;
      std::unique_lock<std::mutex> g(pending_mu_);
      while (!pending_.empty()) {
        if (pending_.front()->isCompleted()) {
          pending_.pop_front();
          continue;
        }
        if (Clock::now() >= deadline) return false;
        g.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        g.lock();
      }
      return true;
    };
    if (!wait_for(limit)) {
      inner_->abort();
      wait_for(std::chrono::milliseconds(5000));
    }
  }

  py::object python_;
  c10::intrusive_ptr<c10d::Backend> inner_;
  void* const* cell_;
  std::mutex pending_mu_;
  std::deque<c10::intrusive_ptr<NativeWork>> pending_;
};

// `address_of(name)`: the address of the library's function `name` (from Python's ctypes handle).
void set_library(const py::function& address_of, py::object error_maker) {
  auto bind = [&address_of](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(address_of(name).cast<uintptr_t>());
  };
  bind(lib.iallreduce, "dc_iallreduce");
  bind(lib.ibroadcast, "dc_ibroadcast");
  bind(lib.iallgather, "dc_iallgather");
  bind(lib.ireduce_scatter, "dc_ireduce_scatter");
  bind(lib.ibarrier, "dc_ibarrier");
  bind(lib.ialltoall, "dc_ialltoall");
  bind(lib.ialltoallv, "dc_ialltoallv");
  bind(lib.isend, "dc_isend");
  bind(lib.irecv, "dc_irecv");
  bind(lib.request_recv_info, "dc_request_recv_info");
  bind(lib.request_wait, "dc_request_wait");
  bind(lib.request_is_completed, "dc_request_is_completed");
  bind(lib.request_free, "dc_request_free");
  bind(lib.last_error, "dc_last_error");
  bind(lib.status_name, "dc_status_name");
  bind(lib.comm_abort, "dc_comm_abort");
  if (make_error == nullptr) make_error = new py::object(std::move(error_maker));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "distcomm.torch's backend: the common collectives called from C++ (see _native.py)";
  m.def("set_library", &set_library, "How to find the library's functions, and the error maker");
  py::class_<NativeBackend, c10d::Backend, c10::intrusive_ptr<NativeBackend>>(m, "NativeBackend")
      .def(py::init<py::object, int64_t, int, int>())
      .def_property_readonly("python", &NativeBackend::python, "The group's DistcommBackend (written in Python)");
}
