/* Collectives beyond the basic set: v-forms (with MPI_IN_PLACE), Reduce_scatter, Scan, Exscan,
 * Reduce_local, and every non-blocking collective (overlapped with each other). */
#include "common.h"

static int rank, size;

int main(int argc, char **argv) {
  t_init(&argc, &argv, &rank, &size);
  int n = size, total = size * (size + 1) / 2; /* rank i contributes i+1 elements */
  int *counts = malloc(sizeof(int) * n), *displs = malloc(sizeof(int) * n);
  for (int i = 0, off = 0; i < n; i++) {
    counts[i] = i + 1;
    displs[i] = off + i; /* a gap of i elements before each block */
    off += i + 1;
  }
  int span = displs[n - 1] + counts[n - 1];
  int *mine = malloc(sizeof(int) * (rank + 1)), *all = malloc(sizeof(int) * span);
  for (int j = 0; j <= rank; j++) mine[j] = rank * 100 + j;

  /* Gatherv / Scatterv at every root, with and without MPI_IN_PLACE. */
  for (int root = 0; root < size; root++) {
    for (int i = 0; i < span; i++) all[i] = -1;
    OK(MPI_Gatherv(mine, rank + 1, MPI_INT, all, counts, displs, MPI_INT, root, MPI_COMM_WORLD));
    if (rank == root)
      for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) CHECK(all[displs[i] + j] == i * 100 + j);
    if (rank == root) {
      for (int i = 0; i < span; i++) all[i] = -7;
      OK(MPI_Gatherv(MPI_IN_PLACE, 0, MPI_INT, all, counts, displs, MPI_INT, root, MPI_COMM_WORLD));
      for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) CHECK(all[displs[i] + j] == (i == root ? -7 : i * 100 + j));
    } else {
      OK(MPI_Gatherv(mine, rank + 1, MPI_INT, NULL, NULL, NULL, MPI_INT, root, MPI_COMM_WORLD));
    }
    int got[64];
    if (rank == root)
      for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) all[displs[i] + j] = 1000 * root + 10 * i + j;
    OK(MPI_Scatterv(all, counts, displs, MPI_INT, got, rank + 1, MPI_INT, root, MPI_COMM_WORLD));
    for (int j = 0; j <= rank; j++) CHECK(got[j] == 1000 * root + 10 * rank + j);
    if (rank == root)
      OK(MPI_Scatterv(all, counts, displs, MPI_INT, MPI_IN_PLACE, 0, MPI_INT, root, MPI_COMM_WORLD));
    else
      OK(MPI_Scatterv(NULL, NULL, NULL, MPI_INT, got, rank + 1, MPI_INT, root, MPI_COMM_WORLD));
  }

  /* Allgatherv, in place too. */
  for (int i = 0; i < span; i++) all[i] = -1;
  OK(MPI_Allgatherv(mine, rank + 1, MPI_INT, all, counts, displs, MPI_INT, MPI_COMM_WORLD));
  for (int i = 0; i < n; i++)
    for (int j = 0; j <= i; j++) CHECK(all[displs[i] + j] == i * 100 + j);
  for (int i = 0; i < span; i++) all[i] = -1;
  for (int j = 0; j <= rank; j++) all[displs[rank] + j] = mine[j];
  OK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, counts, displs, MPI_INT, MPI_COMM_WORLD));
  for (int i = 0; i < n; i++)
    for (int j = 0; j <= i; j++) CHECK(all[displs[i] + j] == i * 100 + j);

  /* Alltoallv: rank r sends j+1 ints to rank j; receives r+1 from everyone. */
  {
    int *sc = malloc(sizeof(int) * n), *sd = malloc(sizeof(int) * n), *rc = malloc(sizeof(int) * n), *rd = malloc(sizeof(int) * n);
    int soff = 0, roff = 0;
    for (int j = 0; j < n; j++) {
      sc[j] = j + 1; sd[j] = soff; soff += j + 1;
      rc[j] = rank + 1; rd[j] = roff; roff += rank + 1;
    }
    int *sb = malloc(sizeof(int) * soff), *rb = malloc(sizeof(int) * roff);
    for (int j = 0; j < n; j++)
      for (int e = 0; e < sc[j]; e++) sb[sd[j] + e] = rank * 1000 + j * 10 + e;
    OK(MPI_Alltoallv(sb, sc, sd, MPI_INT, rb, rc, rd, MPI_INT, MPI_COMM_WORLD));
    for (int j = 0; j < n; j++)
      for (int e = 0; e <= rank; e++) CHECK(rb[rd[j] + e] == j * 1000 + rank * 10 + e);
    free(sb); free(rb); free(sc); free(sd); free(rc); free(rd);
  }

  /* Reduce_scatter with uneven counts, in place too. */
  {
    int *s = malloc(sizeof(int) * total), r[64];
    for (int i = 0; i < total; i++) s[i] = rank + i;
    OK(MPI_Reduce_scatter(s, r, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    int first = rank * (rank + 1) / 2;
    for (int j = 0; j <= rank; j++) CHECK(r[j] == size * (size - 1) / 2 + size * (first + j));
    OK(MPI_Reduce_scatter(MPI_IN_PLACE, s, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    for (int j = 0; j <= rank; j++) CHECK(s[j] == size * (size - 1) / 2 + size * (first + j));
    free(s);
  }

  /* Scan and Exscan: prefix sums; an op applied here (PROD on short). */
  {
    int v = rank + 1, s = -1, e = -1;
    OK(MPI_Scan(&v, &s, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    CHECK(s == (rank + 1) * (rank + 2) / 2);
    OK(MPI_Exscan(&v, &e, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (rank > 0) CHECK(e == rank * (rank + 1) / 2);
    short sh = 2, sp = 0;
    OK(MPI_Scan(&sh, &sp, 1, MPI_SHORT, MPI_PROD, MPI_COMM_WORLD));
    CHECK(sp == (short)(1 << (rank + 1)));
    int ip = rank;
    OK(MPI_Scan(MPI_IN_PLACE, &ip, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    CHECK(ip == rank);
  }

  /* Reduce_local. */
  {
    double a[3] = {1, 2, 3}, b[3] = {10, 20, 30};
    OK(MPI_Reduce_local(a, b, 3, MPI_DOUBLE, MPI_SUM));
    CHECK(b[0] == 11 && b[1] == 22 && b[2] == 33);
    int x[2] = {5, 0}, y[2] = {3, 1};
    OK(MPI_Reduce_local(x, y, 2, MPI_INT, MPI_LAND));
    CHECK(y[0] == 1 && y[1] == 0);
  }

  /* Every non-blocking collective, all in flight at once, completed by one Waitall. */
  {
    enum { K = 13 };
    MPI_Request rq[K];
    int bc = rank == 0 ? 42 : 0, red = -1, ar = -1, sc = -1, ex = -1, rsb = -1;
    int one = rank + 1;
    int *g = malloc(sizeof(int) * size), *ag = malloc(sizeof(int) * size), *a2a = malloc(sizeof(int) * size), *a2r = malloc(sizeof(int) * size);
    int *sv = malloc(sizeof(int) * size), *gv = malloc(sizeof(int) * span), *agv = malloc(sizeof(int) * span);
    int *rsbs = malloc(sizeof(int) * size), scat = -1;
    int *ones = malloc(sizeof(int) * n), *od = malloc(sizeof(int) * n);
    for (int i = 0; i < size; i++) { a2a[i] = rank * 10 + i; sv[i] = 7 * i; rsbs[i] = i; ones[i] = 1; od[i] = i; }
    int k = 0;
    OK(MPI_Ibarrier(MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Ibcast(&bc, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Ireduce(&one, &red, 1, MPI_INT, MPI_SUM, size - 1, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Iallreduce(&one, &ar, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Igather(&one, 1, MPI_INT, g, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Iallgather(&one, 1, MPI_INT, ag, 1, MPI_INT, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Ialltoall(a2a, 1, MPI_INT, a2r, 1, MPI_INT, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Iscatter(sv, 1, MPI_INT, &scat, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Iscan(&one, &sc, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Iexscan(&one, &ex, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Ireduce_scatter_block(rsbs, &rsb, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Igatherv(mine, rank + 1, MPI_INT, gv, counts, displs, MPI_INT, 0, MPI_COMM_WORLD, &rq[k++]));
    OK(MPI_Iallgatherv(mine, rank + 1, MPI_INT, agv, counts, displs, MPI_INT, MPI_COMM_WORLD, &rq[k++]));
    CHECK(k == K);
    OK(MPI_Waitall(K, rq, MPI_STATUSES_IGNORE));
    CHECK(bc == 42 && ar == size && sc == (rank + 1) * (rank + 2) / 2 && scat == 7 * rank && rsb == size * rank);
    if (rank > 0) CHECK(ex == rank * (rank + 1) / 2);
    if (rank == size - 1) CHECK(red == total);
    for (int i = 0; i < size; i++) CHECK(ag[i] == i + 1 && a2r[i] == i * 10 + rank);
    if (rank == 0) {
      for (int i = 0; i < size; i++) CHECK(g[i] == i + 1);
      for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) CHECK(gv[displs[i] + j] == i * 100 + j);
    }
    for (int i = 0; i < n; i++)
      for (int j = 0; j <= i; j++) CHECK(agv[displs[i] + j] == i * 100 + j);
    /* A non-blocking reduction applied here (short), completed by Test. */
    short s1 = (short)(rank + 1), s2 = 0;
    MPI_Request q;
    OK(MPI_Iallreduce(&s1, &s2, 1, MPI_SHORT, MPI_SUM, MPI_COMM_WORLD, &q));
    int flag = 0;
    while (!flag) OK(MPI_Test(&q, &flag, MPI_STATUS_IGNORE));
    CHECK(s2 == total);
    /* Ialltoallv and Ireduce_scatter, completed by Wait. */
    int *r1 = malloc(sizeof(int) * n);
    OK(MPI_Ialltoallv(a2a, ones, od, MPI_INT, r1, ones, od, MPI_INT, MPI_COMM_WORLD, &q));
    OK(MPI_Wait(&q, MPI_STATUS_IGNORE));
    for (int i = 0; i < size; i++) CHECK(r1[i] == i * 10 + rank);
    int rs = -1;
    OK(MPI_Ireduce_scatter(rsbs, &rs, ones, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &q));
    OK(MPI_Wait(&q, MPI_STATUS_IGNORE));
    CHECK(rs == size * rank);
    free(r1); free(g); free(ag); free(a2a); free(a2r); free(sv); free(gv); free(agv); free(rsbs); free(ones); free(od);
  }
  free(mine); free(all); free(counts); free(displs);
  t_done("t_coll2");
  OK(MPI_Finalize());
  return 0;
}
