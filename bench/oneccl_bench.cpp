/*
 * oneccl_bench: the dc-bench sweep over Intel oneCCL, for side-by-side comparisons.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Same options, columns, test data, checks and CSV format as dc-bench (src/bin/dc-bench) and
 * bench/mpi_bench.c, so the rows of the three programs compare one for one:
 *   CCL_WORKER_OFFLOAD=0 CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm \
 *     mpiexec -n 2 ./oneccl_bench -b 8 -e 64M -f 2 -o allreduce --csv oneccl.csv
 * Build (bench/compare.sh --peer oneccl does this, against oneCCL's PyPI wheels and MPICH's):
 *   mpicxx -O2 -std=c++17 -Wall -I$CCL/include -o oneccl_bench bench/oneccl_bench.cpp -L$CCL/lib -lccl
 * All but the oneCCL-specific part is bench/bench_common.h (shared with bench/mpi_bench.c), found
 * beside this file; this file holds the start-up, oneCCL's types, ops and calls and the timing.
 *
 * Start-up: the ranks are MPI processes (any MPI launcher); MPI gives rank and size, rank 0
 * creates oneCCL's main key-value store and MPI_Bcast hands its address to the others, which
 * join it; every rank then makes the oneCCL communicator. MPI is used for nothing else but the
 * untimed bookkeeping (host names, the slowest rank's time, the wrong-element count). oneCCL's
 * own transport is chosen by its environment: CCL_ATL_TRANSPORT=ofi (libfabric: FI_PROVIDER=tcp,
 * or FI_PROVIDER=shm with CCL_ATL_SHM=1, without which oneCCL refuses shm) or mpi (oneCCL's
 * messages go through the same MPI library, which must be MPICH-ABI: libmpi.so.12); oneCCL
 * wants MPI_THREAD_MULTIPLE, which is asked for.
 *
 * Mapping to oneCCL (host buffers, no stream; every call waited for): allreduce ccl::allreduce,
 * broadcast ccl::broadcast (one buffer), reduce ccl::reduce, allgather ccl::allgather,
 * reduce_scatter ccl::reduce_scatter, alltoall ccl::alltoall, sendrecv ccl::recv from rank-1 and
 * ccl::send to rank+1 (both posted, then both waited for), barrier ccl::barrier. In-place forms
 * as dc-bench's (nccl-tests'): the same pointer for allreduce and reduce; allgather's send
 * buffer is this rank's block of the receive buffer; reduce_scatter's receive buffer is this
 * rank's block of the send buffer. oneCCL has sum, prod, min and max, and every dc-bench type
 * (half: float16, bfloat16). Its avg is refused on the host ("not supported for the scheduler
 * path"): sum, then a division of the result in its type, timed with the call (as mpi_bench
 * does). It has no bitwise ops: band, bor and bxor rows are skipped.
 * time: the slowest rank's average per iteration (MPI_MAX over ranks after timing).
 */
#include <mpi.h>

#include <oneapi/ccl.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"

/* ------------------------------------------------------------------------------------------ */
/* oneCCL types and ops                                                                        */

static ccl::datatype ccl_dt(int d) {
  switch (d) {
  case DT_INT8: return ccl::datatype::int8;
  case DT_UINT8: return ccl::datatype::uint8;
  case DT_INT32: return ccl::datatype::int32;
  case DT_UINT32: return ccl::datatype::uint32;
  case DT_INT64: return ccl::datatype::int64;
  case DT_UINT64: return ccl::datatype::uint64;
  case DT_HALF: return ccl::datatype::float16;
  case DT_FLOAT: return ccl::datatype::float32;
  case DT_DOUBLE: return ccl::datatype::float64;
  default: return ccl::datatype::bfloat16;
  }
}

static ccl::reduction ccl_op(int r) {
  switch (r) {
  case R_PROD: return ccl::reduction::prod;
  case R_MAX: return ccl::reduction::max;
  case R_MIN: return ccl::reduction::min;
  default: return ccl::reduction::sum; /* avg too: see divide() */
  }
}

/* ------------------------------------------------------------------------------------------ */
/* The program                                                                                 */

static const char usage[] =
    "usage: mpiexec -n N oneccl_bench [options]\n"
    "dc-bench's sweep over oneCCL; options as dc-bench's (see dc-bench --help):\n"
    "  -b SIZE  -e SIZE  -f F  -i SIZE  -o OPS  -d TYPES  --redop OPS  -r ROOT  -w N  -n N  -c N\n"
    "  --csv FILE  --label NAME (default: oneccl)\n"
    "oneCCL's transport from its environment: CCL_ATL_TRANSPORT=ofi (CCL_ATL_SHM=1 FI_PROVIDER=shm,\n"
    "or FI_PROVIDER=tcp) or mpi;\n"
    "CCL_WORKER_OFFLOAD=0 runs its progress on the calling thread (on few cores). avg: sum, then a\n"
    "division (oneCCL's host path has no avg); band, bor, bxor, gather, scatter: not in oneCCL, skipped.\n";

static const struct program prog = {"oneccl_bench", usage, 0 /* unknown_whole */, 0 /* bitwise */, 1 /* rs_own_block */,
                                    "gather,scatter" /* lacks */};

/* The v forms' counts (every count the block: the blocks lie one after another, as oneCCL puts
   them), made again only when the shape changes, so the timed calls do not pay for them. */
static const std::vector<size_t> &v_counts(int n, size_t blk) {
  static std::vector<size_t> counts;
  if (counts.size() != (size_t)n || (n > 0 && counts[0] != blk)) counts.assign((size_t)n, blk);
  return counts;
}

static ccl::communicator &comm_of(const bench *b) { return *static_cast<ccl::communicator *>(b->comm); }

/* One call of the op in the given form, waited for. */
static void call(bench *b, const kase *c, int inplace) {
  ccl::communicator &comm = comm_of(b);
  ccl::datatype t = ccl_dt(c->dt);
  ccl::reduction o = ccl_op(c->redop >= 0 ? c->redop : R_SUM);
  size_t cnt = c->sh.count, blk = c->sh.block;
  int rank = b->rank, n = b->n, root = b->root;
  unsigned char *send = b->send, *recv = b->recv;
  unsigned char *own = recv + (size_t)rank * blk * dt_sizes[c->dt]; /* this rank's block */
  bool avg = c->redop == R_AVG;
  switch (c->op) {
  case OP_ALLREDUCE:
    ccl::allreduce(inplace ? recv : send, recv, cnt, t, o, comm).wait();
    if (avg) divide(c->dt, recv, cnt, n);
    break;
  case OP_REDUCE:
    ccl::reduce(inplace ? recv : send, recv, cnt, t, o, root, comm).wait();
    if (avg && rank == root) divide(c->dt, recv, cnt, n);
    break;
  case OP_BROADCAST: ccl::broadcast(recv, cnt, t, root, comm).wait(); break;
  case OP_ALLGATHER: ccl::allgather(inplace ? own : send, recv, blk, t, comm).wait(); break;
  case OP_REDUCE_SCATTER:
    ccl::reduce_scatter(inplace ? recv : send, inplace ? own : recv, blk, t, o, comm).wait();
    if (avg) divide(c->dt, inplace ? own : recv, blk, n);
    break;
  case OP_ALLTOALL: ccl::alltoall(send, recv, blk, t, comm).wait(); break;
  case OP_ALLGATHERV: ccl::allgatherv(send, blk, recv, v_counts(n, blk), t, comm).wait(); break;
  case OP_ALLTOALLV: ccl::alltoallv(send, v_counts(n, blk), recv, v_counts(n, blk), t, comm).wait(); break;
  case OP_SENDRECV: {
    ccl::event r = ccl::recv(recv, cnt, t, (rank + n - 1) % n, comm);
    ccl::event s = ccl::send(send, cnt, t, (rank + 1) % n, comm);
    r.wait();
    s.wait();
    break;
  }
  default: ccl::barrier(comm).wait(); break;
  }
}

/* The timed loop (ccl::barrier before it), then the checks (see measure_fn). */
static void measure(bench *b, const kase *c, int inplace, const args *a, double *time, long long *wrong) {
  prepare(b, c, inplace, 0);
  for (int i = 0; i < a->warmup; i++) call(b, c, inplace);
  ccl::barrier(comm_of(b)).wait();
  double t0 = MPI_Wtime();
  for (int i = 0; i < a->iters; i++) call(b, c, inplace);
  *time = slowest((MPI_Wtime() - t0) / a->iters);
  *wrong = check_calls(b, c, inplace, a);
}

/* The transport oneCCL was told to use, for the header line. */
static std::string transport_desc() {
  const char *t = std::getenv("CCL_ATL_TRANSPORT");
  std::string s = std::string("oneccl ") + (t && *t ? t : "default");
  const char *shm = std::getenv("CCL_ATL_SHM");
  const char *p = std::getenv("FI_PROVIDER");
  bool ofi = !t || std::strcmp(t, "ofi") == 0;
  if (ofi && shm && *shm) s += std::string(" (CCL_ATL_SHM ") + shm + (p && *p ? std::string(", FI_PROVIDER ") + p : "") + ")";
  else if (ofi && p && *p) s += std::string(" (FI_PROVIDER ") + p + ")";
  else if (p && *p) s += std::string(" (MPI's FI_PROVIDER ") + p + ")";
  const char *w = std::getenv("CCL_WORKER_OFFLOAD");
  const char *wc = std::getenv("CCL_WORKER_COUNT");
  if (w && *w) s += std::string(", CCL_WORKER_OFFLOAD ") + w;
  if (wc && *wc) s += std::string(", CCL_WORKER_COUNT ") + wc;
  return s;
}

static int run(int rank, int n, const args &a) {
  /* oneCCL's wire-up: rank 0's main key-value store, its address sent over MPI. */
  ccl::init();
  std::shared_ptr<ccl::kvs> kvs;
  ccl::kvs::address_type addr{};
  if (rank == 0) {
    kvs = ccl::create_main_kvs();
    addr = kvs->get_address();
  }
  MPI_Bcast(addr.data(), (int)addr.size(), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) kvs = ccl::create_kvs(addr);
  ccl::communicator comm = ccl::create_communicator(n, rank, kvs);

  bench b;
  bench_init(&b, rank, n, &a, &prog, &comm, call);
  int same_host;
  char *hosts = gather_hosts(n, &same_host);
  if (rank == 0) {
    ccl::library_version v = ccl::get_library_version();
    std::printf("# oneccl_bench: oneCCL %u.%u.%u (%s), %d ranks, transport %s, %s %s%s\n", v.major, v.minor, v.update,
                v.product_status ? v.product_status : "", n, transport_desc().c_str(), same_host ? "host" : "hosts",
                hosts, same_host ? "" : ", ...");
    print_settings(&a);
    for (int i = 0; i < a.nredops; i++)
      if (redop_bitwise(a.redops[i])) std::printf("# redop %s: not in oneCCL, skipped\n", redop_names[a.redops[i]]);
  }
  long long total_wrong = sweep(&b, &a, measure);
  std::free(hosts);
  bench_free(&b);
  return total_wrong > 0 ? 3 : 0;
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided); /* oneCCL's mpi transport asks it */
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  args a;
  int rc = bench_options(argc, argv, rank, n, "oneccl", &prog, &a);
  if (rc >= 0) {
    MPI_Finalize();
    return rc;
  }
  try {
    rc = run(rank, n, a); /* the communicator and the key-value store end before MPI does */
  } catch (const std::exception &e) {
    std::fprintf(stderr, "oneccl_bench: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return rc;
}
