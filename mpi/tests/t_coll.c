/* Collectives on predefined datatypes and ops, MPI_IN_PLACE where the standard allows it, user
 * operations (a non-commutative one applied in rank order), large-count forms. */
#include "common.h"
#include <stdint.h>

static int rank, size;

/* 2x2 integer matrix product: associative, not commutative. inout = in * inout; the
 * elements are MPI_INTs, four to a matrix. */
static void matmul(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  int *a = in, *b = inout;
  for (int k = 0; k < *len / 4; k++, a += 4, b += 4) {
    int c[4] = {a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2], a[2] * b[1] + a[3] * b[3]};
    memcpy(b, c, sizeof c);
  }
}

static void mat_of(int r, int m[4]) {
  m[0] = 1; m[1] = r + 1; m[2] = 0; m[3] = (r % 2) ? -1 : 1;
}

int main(int argc, char **argv) {
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Barrier(MPI_COMM_WORLD));

  /* Bcast from every root. */
  for (int root = 0; root < size; root++) {
    double v[5];
    for (int i = 0; i < 5; i++) v[i] = rank == root ? root * 10 + i : -1;
    OK(MPI_Bcast(v, 5, MPI_DOUBLE, root, MPI_COMM_WORLD));
    for (int i = 0; i < 5; i++) CHECK(v[i] == root * 10 + i);
  }

  /* Reduce to every root: int SUM, double MAX, float MIN, unsigned PROD, long long SUM. */
  for (int root = 0; root < size; root++) {
    int is = rank + 1, ir = -1;
    double ds = rank * 0.5, dr = -1;
    float fs = 10.0f - rank, fr = -1;
    unsigned us = 2, ur = 0;
    long long ls = 1LL << 40, lr = 0;
    OK(MPI_Reduce(&is, &ir, 1, MPI_INT, MPI_SUM, root, MPI_COMM_WORLD));
    OK(MPI_Reduce(&ds, &dr, 1, MPI_DOUBLE, MPI_MAX, root, MPI_COMM_WORLD));
    OK(MPI_Reduce(&fs, &fr, 1, MPI_FLOAT, MPI_MIN, root, MPI_COMM_WORLD));
    OK(MPI_Reduce(&us, &ur, 1, MPI_UNSIGNED, MPI_PROD, root, MPI_COMM_WORLD));
    OK(MPI_Reduce(&ls, &lr, 1, MPI_LONG_LONG, MPI_SUM, root, MPI_COMM_WORLD));
    if (rank == root) {
      CHECK(ir == size * (size + 1) / 2 && dr == (size - 1) * 0.5 && fr == 10.0f - (size - 1));
      CHECK(ur == (1u << size) && lr == (long long)size << 40);
      /* In place at the root. */
      int v = rank + 1;
      OK(MPI_Reduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_SUM, root, MPI_COMM_WORLD));
      CHECK(v == size * (size + 1) / 2);
    } else {
      CHECK(ir == -1);
      int v = rank + 1;
      OK(MPI_Reduce(&v, NULL, 1, MPI_INT, MPI_SUM, root, MPI_COMM_WORLD));
    }
  }

  /* Allreduce: engine types and ops, in place, and ops applied here (short, logical, MINLOC). */
  {
    int n = 1000, *a = malloc(n * sizeof(int)), *b = malloc(n * sizeof(int));
    for (int i = 0; i < n; i++) a[i] = rank * i;
    OK(MPI_Allreduce(a, b, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    for (int i = 0; i < n; i++) CHECK(b[i] == i * size * (size - 1) / 2);
    OK(MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    for (int i = 0; i < n; i++) CHECK(a[i] == (size - 1) * i);
    free(a);
    free(b);
    short sh = (short)(rank + 1), shr = 0;
    OK(MPI_Allreduce(&sh, &shr, 1, MPI_SHORT, MPI_SUM, MPI_COMM_WORLD));
    CHECK(shr == size * (size + 1) / 2);
    int land = rank != 1, lor = rank == size - 1, lxor = 1, r3[3];
    OK(MPI_Allreduce(&land, &r3[0], 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD));
    OK(MPI_Allreduce(&lor, &r3[1], 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD));
    OK(MPI_Allreduce(&lxor, &r3[2], 1, MPI_INT, MPI_LXOR, MPI_COMM_WORLD));
    CHECK(r3[0] == (size < 2) && r3[1] == 1 && r3[2] == size % 2);
    unsigned char bits = (unsigned char)(1u << (rank % 8)), bor = 0;
    OK(MPI_Allreduce(&bits, &bor, 1, MPI_BYTE, MPI_BOR, MPI_COMM_WORLD));
    CHECK(bor == (unsigned char)((1u << (size < 8 ? size : 8)) - 1));
    struct { double v; int i; } mine = {rank == size / 2 ? -5.0 : (double)rank, rank}, lo, hi;
    OK(MPI_Allreduce(&mine, &lo, 1, MPI_DOUBLE_INT, MPI_MINLOC, MPI_COMM_WORLD));
    OK(MPI_Allreduce(&mine, &hi, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD));
    CHECK(lo.v == -5.0 && lo.i == size / 2);
    int top = size - 1 == size / 2 ? (size > 1 ? size - 2 : 0) : size - 1;
    CHECK(hi.i == top && hi.v == (size == 1 ? -5.0 : (double)top));
    int tie[2] = {7, rank}, tr[2];
    OK(MPI_Allreduce(tie, tr, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD));
    CHECK(tr[0] == 7 && tr[1] == 0);
  }

  /* A user op that is not commutative: the result is M0 * M1 * ... in rank order. */
  {
    MPI_Op op;
    OK(MPI_Op_create(matmul, 0, &op));
    int m[8], r[8], want[4] = {1, 0, 0, 1};
    mat_of(rank, m);
    mat_of(rank + 1, m + 4);
    for (int i = size - 1; i >= 0; i--) {
      int mi[4], four = 4;
      mat_of(i, mi);
      matmul(mi, want, &four, NULL);
    }
    OK(MPI_Allreduce(m, r, 4, MPI_INT, op, MPI_COMM_WORLD));
    CHECK(memcmp(r, want, sizeof want) == 0);
    for (int root = 0; root < size; root++) {
      memset(r, 0, sizeof r);
      OK(MPI_Reduce(m, r, 4, MPI_INT, op, root, MPI_COMM_WORLD));
      if (rank == root) CHECK(memcmp(r, want, sizeof want) == 0);
    }
    OK(MPI_Op_free(&op));
    CHECK(op == MPI_OP_NULL);
  }

  /* Gather / Scatter / Allgather / Alltoall, with and without MPI_IN_PLACE. */
  {
    int *all = malloc(sizeof(int) * 2 * size), mine[2] = {rank, -rank};
    for (int root = 0; root < size; root++) {
      for (int i = 0; i < 2 * size; i++) all[i] = -99;
      OK(MPI_Gather(mine, 2, MPI_INT, all, 2, MPI_INT, root, MPI_COMM_WORLD));
      if (rank == root)
        for (int i = 0; i < size; i++) CHECK(all[2 * i] == i && all[2 * i + 1] == -i);
      if (rank == root) {
        for (int i = 0; i < size; i++) all[2 * i] = all[2 * i + 1] = i == root ? 500 : -1;
        OK(MPI_Gather(MPI_IN_PLACE, 2, MPI_INT, all, 2, MPI_INT, root, MPI_COMM_WORLD));
        for (int i = 0; i < size; i++) CHECK(all[2 * i] == (i == root ? 500 : i));
      } else {
        OK(MPI_Gather(mine, 2, MPI_INT, NULL, 0, MPI_INT, root, MPI_COMM_WORLD));
      }
      int got[2] = {-1, -1};
      if (rank == root)
        for (int i = 0; i < size; i++) all[2 * i] = 10 * i, all[2 * i + 1] = 10 * i + 1;
      OK(MPI_Scatter(all, 2, MPI_INT, got, 2, MPI_INT, root, MPI_COMM_WORLD));
      CHECK(got[0] == 10 * rank && got[1] == 10 * rank + 1);
      if (rank == root) {
        OK(MPI_Scatter(all, 2, MPI_INT, MPI_IN_PLACE, 2, MPI_INT, root, MPI_COMM_WORLD));
        CHECK(all[2 * root] == 10 * root);
      } else {
        OK(MPI_Scatter(NULL, 0, MPI_INT, got, 2, MPI_INT, root, MPI_COMM_WORLD));
        CHECK(got[0] == 10 * rank);
      }
    }
    for (int i = 0; i < 2 * size; i++) all[i] = -1;
    OK(MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, MPI_COMM_WORLD));
    for (int i = 0; i < size; i++) CHECK(all[2 * i] == i && all[2 * i + 1] == -i);
    for (int i = 0; i < 2 * size; i++) all[i] = i / 2 == rank ? 3 * rank : -1;
    OK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, 2, MPI_INT, MPI_COMM_WORLD));
    for (int i = 0; i < 2 * size; i++) CHECK(all[i] == 3 * (i / 2));
    int *s = malloc(sizeof(int) * size), *r = malloc(sizeof(int) * size);
    for (int i = 0; i < size; i++) s[i] = rank * 100 + i;
    OK(MPI_Alltoall(s, 1, MPI_INT, r, 1, MPI_INT, MPI_COMM_WORLD));
    for (int i = 0; i < size; i++) CHECK(r[i] == i * 100 + rank);
    OK(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, s, 1, MPI_INT, MPI_COMM_WORLD));
    for (int i = 0; i < size; i++) CHECK(s[i] == i * 100 + rank);
    free(s);
    free(r);
    free(all);
  }

  /* Reduce_scatter_block, with and without MPI_IN_PLACE, on the engine and applied here. */
  {
    int n = 3, *s = malloc(sizeof(int) * n * size), r[3];
    for (int i = 0; i < n * size; i++) s[i] = rank + i;
    OK(MPI_Reduce_scatter_block(s, r, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    for (int j = 0; j < n; j++) CHECK(r[j] == size * (size - 1) / 2 + size * (rank * n + j));
    OK(MPI_Reduce_scatter_block(MPI_IN_PLACE, s, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    for (int j = 0; j < n; j++) CHECK(s[j] == size * (size - 1) / 2 + size * (rank * n + j));
    short *ss = malloc(sizeof(short) * n * size), sr[3];
    for (int i = 0; i < n * size; i++) ss[i] = (short)(i + 1);
    OK(MPI_Reduce_scatter_block(ss, sr, n, MPI_SHORT, MPI_PROD, MPI_COMM_WORLD));
    for (int j = 0; j < n; j++) {
      short w = 1;
      for (int k = 0; k < size; k++) w = (short)(w * (rank * n + j + 1));
      CHECK(sr[j] == w);
    }
    free(ss);
    free(s);
  }

  /* Large-count forms. */
  {
    double v = rank, sum = 0;
    OK(MPI_Allreduce_c(&v, &sum, (MPI_Count)1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    CHECK(sum == size * (size - 1) / 2.0);
    OK(MPI_Bcast_c(&v, (MPI_Count)1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    CHECK(v == 0);
  }
  t_done("t_coll");
  OK(MPI_Finalize());
  return 0;
}
