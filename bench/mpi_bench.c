/*
 * mpi_bench: the dc-bench sweep over MPI (Open MPI or MPICH), for side-by-side comparisons.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Same options, columns, test data, checks and CSV format as dc-bench (src/bin/dc-bench), so the
 * two programs' rows can be compared one for one:
 *   mpirun -np 2 ./mpi_bench -b 8 -e 64M -f 2 -o allreduce --csv mpi.csv
 * Build: mpicc -O2 -std=c11 -Wall -o mpi_bench bench/mpi_bench.c -lm   (bench/compare.sh does this)
 * All but the MPI-specific part is bench/bench_common.h (shared with bench/oneccl_bench.cpp),
 * found beside this file; this file holds MPI's start-up, types, ops and calls and the timing.
 *
 * Mapping to MPI: allreduce MPI_Allreduce, broadcast MPI_Bcast, reduce MPI_Reduce, allgather
 * MPI_Allgather, reduce_scatter MPI_Reduce_scatter_block, alltoall MPI_Alltoall, sendrecv
 * MPI_Sendrecv (ring: send to rank+1, receive from rank-1), barrier MPI_Barrier, gather MPI_Gather,
 * scatter MPI_Scatter, allgatherv MPI_Allgatherv, alltoallv MPI_Alltoallv (v forms: every count
 * the block, block j at j * block). In-place forms
 * use MPI_IN_PLACE (reduce_scatter's in-place result lands at the start of the buffer, as MPI
 * defines it). MPI has no avg: sum, then a division of the result in its type, timed with the
 * call (what an MPI user writes). MPI has no half/bfloat16: MPI_UINT16_T with user-defined
 * commutative ops that compute in float and round each step.
 * time: the slowest rank's average per iteration (MPI_MAX over ranks after timing).
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

/* ------------------------------------------------------------------------------------------ */
/* MPI types and ops                                                                           */

#define HALF_OP(NAME, TO, FROM, EXPR)                                                         \
  static void NAME(void *in, void *inout, int *len, MPI_Datatype *t) {                       \
    (void)t;                                                                                 \
    const uint16_t *a = in;                                                                  \
    uint16_t *b = inout;                                                                     \
    for (int i = 0; i < *len; i++) {                                                         \
      float x = TO(a[i]), y = TO(b[i]);                                                      \
      b[i] = FROM(EXPR);                                                                     \
    }                                                                                        \
  }
HALF_OP(h_sum, f16_to_f32, f32_to_f16, x + y)
HALF_OP(h_prod, f16_to_f32, f32_to_f16, x * y)
HALF_OP(h_max, f16_to_f32, f32_to_f16, fmaxf(x, y))
HALF_OP(h_min, f16_to_f32, f32_to_f16, fminf(x, y))
HALF_OP(b_sum, bf16_to_f32, f32_to_bf16, x + y)
HALF_OP(b_prod, bf16_to_f32, f32_to_bf16, x * y)
HALF_OP(b_max, bf16_to_f32, f32_to_bf16, fmaxf(x, y))
HALF_OP(b_min, bf16_to_f32, f32_to_bf16, fminf(x, y))

static MPI_Op half_ops[2][4]; /* [half, bf16][sum, prod, max, min] */

static MPI_Datatype mpi_dt(int d) {
  switch (d) {
  case DT_INT8: return MPI_INT8_T;
  case DT_UINT8: return MPI_UINT8_T;
  case DT_INT32: return MPI_INT32_T;
  case DT_UINT32: return MPI_UINT32_T;
  case DT_INT64: return MPI_INT64_T;
  case DT_UINT64: return MPI_UINT64_T;
  case DT_FLOAT: return MPI_FLOAT;
  case DT_DOUBLE: return MPI_DOUBLE;
  default: return MPI_UINT16_T; /* half, bfloat16 */
  }
}

static MPI_Op mpi_op(int d, int r) {
  int base = r == R_AVG ? R_SUM : r;
  if (d == DT_HALF || d == DT_BF16) return half_ops[d == DT_BF16][base];
  switch (base) {
  case R_SUM: return MPI_SUM;
  case R_PROD: return MPI_PROD;
  case R_MAX: return MPI_MAX;
  case R_MIN: return MPI_MIN;
  case R_BAND: return MPI_BAND;
  case R_BOR: return MPI_BOR;
  default: return MPI_BXOR;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* The program                                                                                 */

static const char usage[] =
    "usage: mpirun -np N mpi_bench [options]\n"
    "dc-bench's sweep over MPI; options as dc-bench's (see dc-bench --help):\n"
    "  -b SIZE  -e SIZE  -f F  -i SIZE  -o OPS  -d TYPES  --redop OPS  -r ROOT  -w N  -n N  -c N\n"
    "  --csv FILE  --label NAME (default: openmpi or mpich, from the MPI library)\n";

static const struct program prog = {"mpi_bench", usage, 1 /* unknown_whole */, 1 /* bitwise */, 0 /* rs_own_block */,
                                    NULL /* lacks */};

/* The v forms' counts and displacements (every count the block, block j at j * block), made
   once per shape so the timed calls do not pay for them. */
static int *vcounts, *vdispls, vblock = -1;

static void v_layout(int n, int blk) {
  if (blk == vblock) return;
  for (int j = 0; j < n; j++) vcounts[j] = blk, vdispls[j] = j * blk;
  vblock = blk;
}

/* One call of the op in the given form, on MPI_COMM_WORLD. */
static void call(struct bench *b, const struct kase *c, int inplace) {
  MPI_Comm comm = MPI_COMM_WORLD;
  MPI_Datatype t = mpi_dt(c->dt);
  MPI_Op o = mpi_op(c->dt, c->redop >= 0 ? c->redop : R_SUM);
  int cnt = (int)c->sh.count, blk = (int)c->sh.block;
  int avg = c->redop == R_AVG;
  switch (c->op) {
  case OP_ALLREDUCE:
    MPI_Allreduce(inplace ? MPI_IN_PLACE : b->send, b->recv, cnt, t, o, comm);
    if (avg) divide(c->dt, b->recv, c->sh.count, b->n);
    break;
  case OP_REDUCE:
    if (inplace && b->rank == b->root) MPI_Reduce(MPI_IN_PLACE, b->recv, cnt, t, o, b->root, comm);
    else if (inplace) MPI_Reduce(b->recv, NULL, cnt, t, o, b->root, comm); /* recvbuf: root only */
    else MPI_Reduce(b->send, b->recv, cnt, t, o, b->root, comm);
    if (avg && b->rank == b->root) divide(c->dt, b->recv, c->sh.count, b->n);
    break;
  case OP_BROADCAST: MPI_Bcast(b->recv, cnt, t, b->root, comm); break;
  case OP_ALLGATHER:
    if (inplace) MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->recv, blk, t, comm);
    else MPI_Allgather(b->send, blk, t, b->recv, blk, t, comm);
    break;
  case OP_REDUCE_SCATTER:
    MPI_Reduce_scatter_block(inplace ? MPI_IN_PLACE : b->send, b->recv, blk, t, o, comm);
    if (avg) divide(c->dt, b->recv, c->sh.block, b->n);
    break;
  case OP_ALLTOALL: MPI_Alltoall(b->send, blk, t, b->recv, blk, t, comm); break;
  case OP_GATHER: MPI_Gather(b->send, blk, t, b->recv, blk, t, b->root, comm); break;
  case OP_SCATTER: MPI_Scatter(b->send, blk, t, b->recv, blk, t, b->root, comm); break;
  case OP_ALLGATHERV:
    v_layout(b->n, blk);
    MPI_Allgatherv(b->send, blk, t, b->recv, vcounts, vdispls, t, comm);
    break;
  case OP_ALLTOALLV:
    v_layout(b->n, blk);
    MPI_Alltoallv(b->send, vcounts, vdispls, t, b->recv, vcounts, vdispls, t, comm);
    break;
  case OP_SENDRECV:
    MPI_Sendrecv(b->send, cnt, t, (b->rank + 1) % b->n, 0, b->recv, cnt, t, (b->rank + b->n - 1) % b->n, 0,
                 comm, MPI_STATUS_IGNORE);
    break;
  default: MPI_Barrier(comm); break;
  }
}

/* The timed loop (MPI_Barrier before it), then the checks (see measure_fn). */
static void measure(struct bench *b, const struct kase *c, int inplace, const struct args *a, double *time,
                    long long *wrong) {
  prepare(b, c, inplace, 0);
  for (int i = 0; i < a->warmup; i++) call(b, c, inplace);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < a->iters; i++) call(b, c, inplace);
  *time = slowest((MPI_Wtime() - t0) / a->iters);
  *wrong = check_calls(b, c, inplace, a);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
#if defined(OMPI_MAJOR_VERSION)
  const char *label = "openmpi";
#elif defined(MPICH_VERSION)
  const char *label = "mpich";
#else
  const char *label = "mpi";
#endif
  struct args a;
  int rc = bench_options(argc, argv, rank, n, label, &prog, &a);
  if (rc >= 0) {
    MPI_Finalize();
    return rc;
  }
  MPI_User_function *fns[2][4] = {{h_sum, h_prod, h_max, h_min}, {b_sum, b_prod, b_max, b_min}};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) MPI_Op_create(fns[i][j], 1, &half_ops[i][j]);

  struct bench b;
  bench_init(&b, rank, n, &a, &prog, NULL, call);
  vcounts = (int *)malloc(sizeof(int) * (size_t)n);
  vdispls = (int *)malloc(sizeof(int) * (size_t)n);
  if (!vcounts || !vdispls) MPI_Abort(MPI_COMM_WORLD, 1);
  int same_host;
  char *hosts = gather_hosts(n, &same_host);
  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len;
    MPI_Get_library_version(lib, &len);
    char *nl = strpbrk(lib, "\n,");
    if (nl) *nl = 0;
    const char *btl = getenv("OMPI_MCA_btl");
    printf("# mpi_bench: %s, %d ranks, transport mpi%s%s%s, %s %s%s\n", lib, n, btl ? " (btl " : "", btl ? btl : "",
           btl ? ")" : "", same_host ? "host" : "hosts", hosts, same_host ? "" : ", ...");
    print_settings(&a);
  }
  long long total_wrong = sweep(&b, &a, measure);
  free(hosts);
  bench_free(&b);
  free(vcounts);
  free(vdispls);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) MPI_Op_free(&half_ops[i][j]);
  MPI_Finalize();
  return total_wrong > 0 ? 3 : 0;
}
