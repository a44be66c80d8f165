/*
 * mpi_vcoll: MPI_Gather(v), MPI_Scatter(v), MPI_Allgather(v) and MPI_Alltoall(v) timed at a sweep of
 * block sizes (bytes per rank), the collectives mpi_bench does not cover. Built once against the
 * standard ABI and run on either library (bench/mpi_vcoll.sh interleaves them).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Output on rank 0, one CSV line per point: op,block_bytes,time_us (the slowest rank's mean over
 * the timed calls, after as many untimed). The v forms get the even counts and displacements a
 * caller of the plain form would pass. After timing, one call per point with fresh data is
 * checked everywhere; a wrong byte ends the program with status 3.
 * Usage: mpiexec -n N mpi_vcoll [largest block, default 4194304]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GATHER, GATHERV, SCATTER, SCATTERV, ALLGATHER, ALLGATHERV, ALLTOALL, ALLTOALLV, OPS };
static const char *names[OPS] = {"gather", "gatherv", "scatter", "scatterv", "allgather", "allgatherv", "alltoall", "alltoallv"};

static int rank, n;
static unsigned char *sbuf, *rbuf;
static int *counts, *displs;

static void call(int op, int b) {
  switch (op) {
  case GATHER: MPI_Gather(sbuf, b, MPI_BYTE, rbuf, b, MPI_BYTE, 0, MPI_COMM_WORLD); break;
  case GATHERV: MPI_Gatherv(sbuf, b, MPI_BYTE, rbuf, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD); break;
  case SCATTER: MPI_Scatter(sbuf, b, MPI_BYTE, rbuf, b, MPI_BYTE, 0, MPI_COMM_WORLD); break;
  case SCATTERV: MPI_Scatterv(sbuf, counts, displs, MPI_BYTE, rbuf, b, MPI_BYTE, 0, MPI_COMM_WORLD); break;
  case ALLGATHER: MPI_Allgather(sbuf, b, MPI_BYTE, rbuf, b, MPI_BYTE, MPI_COMM_WORLD); break;
  case ALLGATHERV: MPI_Allgatherv(sbuf, b, MPI_BYTE, rbuf, counts, displs, MPI_BYTE, MPI_COMM_WORLD); break;
  case ALLTOALL: MPI_Alltoall(sbuf, b, MPI_BYTE, rbuf, b, MPI_BYTE, MPI_COMM_WORLD); break;
  default: MPI_Alltoallv(sbuf, counts, displs, MPI_BYTE, rbuf, counts, displs, MPI_BYTE, MPI_COMM_WORLD); break;
  }
}

/* Byte i of what rank `from` sends rank `to` (block-sized sends use to = 0 unless alltoall-like). */
static unsigned char val(int from, int to, long i) { return (unsigned char)(i * 7 + from * 13 + to * 5 + 1); }

/* One checked call: the bytes each rank must hold afterwards. */
static long check(int op, int b) {
  int a2a = op == ALLTOALL || op == ALLTOALLV, scatter = op == SCATTER || op == SCATTERV;
  for (int j = 0; j < n; j++)
    for (long i = 0; i < b; i++) sbuf[(long)j * b + i] = scatter ? val(rank, j, i) : a2a ? val(rank, j, i) : val(rank, 0, i);
  memset(rbuf, 0xEE, (size_t)n * b);
  call(op, b);
  long wrong = 0;
  if (scatter) {
    for (long i = 0; i < b; i++) wrong += rbuf[i] != val(0, rank, i);
  } else if ((op != GATHER && op != GATHERV) || rank == 0) {
    for (int r = 0; r < n; r++)
      for (long i = 0; i < b; i++) wrong += rbuf[(long)r * b + i] != (a2a ? val(r, rank, i) : val(r, 0, i));
  }
  return wrong;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  long largest = argc > 1 ? atol(argv[1]) : 4194304;
  sbuf = malloc((size_t)n * largest);
  rbuf = malloc((size_t)n * largest);
  counts = malloc(sizeof(int) * n);
  displs = malloc(sizeof(int) * n);
  if (!sbuf || !rbuf || !counts || !displs) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(sbuf, rank + 1, (size_t)n * largest);
  long total_wrong = 0;
  for (int op = 0; op < OPS; op++)
    for (long b = 16; b <= largest; b *= 4) {
      for (int i = 0; i < n; i++) counts[i] = (int)b, displs[i] = (int)(i * b);
      int iters = b >= 1048576 ? 20 : b >= 65536 ? 200 : 2000;
      for (int i = 0; i < iters; i++) call(op, (int)b);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < iters; i++) call(op, (int)b);
      double t = (MPI_Wtime() - t0) / iters * 1e6, slowest;
      MPI_Reduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      long wrong = check(op, (int)b), all;
      MPI_Reduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
      if (rank == 0) printf("%s,%ld,%.3f%s\n", names[op], b, slowest, all ? ",WRONG" : "");
      total_wrong += all;
    }
  MPI_Finalize();
  return rank == 0 && total_wrong ? 3 : 0;
}
