/* Every collective of the API, blocking and non-blocking, in-place and out-of-place, checked
 * against a reference computed locally, with every rank ending with bitwise identical results. */
#include "common.h"

static int g_rank, g_size;
static dc_comm *g_world;

static const int ALL_OPS[] = {DC_SUM, DC_PROD, DC_MAX, DC_MIN, DC_AVG, DC_BAND, DC_BOR, DC_BXOR};
static const char *OP_NAMES[] = {"sum", "prod", "max", "min", "avg", "band", "bor", "bxor"};

/* Input element i of rank r for a reduction with `op` on dtype dt. */
static double input(int r, size_t i, int dt, int op) {
  if (op == DC_PROD) {
    double v = (double)((i + (size_t)r) % 2 + 1);
    return (dtype_is_signed(dt) && (i + (size_t)r) % 5 == 0) ? -v : v;
  }
  if (op == DC_BAND || op == DC_BOR || op == DC_BXOR) return (double)((((size_t)r + 1) * 37 + i * 11) % 128);
  double v = (double)((r + 1) * (int)(i % 7 + 1));
  return (dtype_is_signed(dt) && (i + (size_t)r) % 3 == 0) ? -v : v;
}

static double reference(size_t i, int dt, int op, int nranks) {
  double acc = input(0, i, dt, op);
  uint64_t bits = (uint64_t)acc;
  for (int r = 1; r < nranks; r++) {
    double v = input(r, i, dt, op);
    switch (op) {
      case DC_SUM: case DC_AVG: acc += v; break;
      case DC_PROD: acc *= v; break;
      case DC_MAX: acc = v > acc ? v : acc; break;
      case DC_MIN: acc = v < acc ? v : acc; break;
      case DC_BAND: bits &= (uint64_t)v; break;
      case DC_BOR: bits |= (uint64_t)v; break;
      case DC_BXOR: bits ^= (uint64_t)v; break;
    }
  }
  if (op == DC_BAND || op == DC_BOR || op == DC_BXOR) return (double)bits;
  if (op == DC_AVG) {
    if (dtype_is_float(dt)) return acc / nranks;
    return (double)((int64_t)acc / nranks); /* C division truncates toward zero */
  }
  return acc;
}

/* Every rank must hold the same `n` bytes. */
static void check_identical(const void *buf, size_t n, const char *what) {
  unsigned char *all = xmalloc(n * (size_t)g_size);
  CHECK(dc_allgather(buf, all, n, DC_UINT8, g_world));
  for (int r = 1; r < g_size; r++)
    EXPECT(memcmp(all, all + (size_t)r * n, n) == 0, "%s: rank %d's result differs from rank 0's", what, r);
  free(all);
}

static void test_allreduce(void) {
  const size_t counts[] = {0, 1, 5, 1000, 65537};
  for (int d = 0; d < N_DTYPES; d++) {
    int dt = ALL_DTYPES[d];
    size_t es = dtype_size(dt);
    for (int o = 0; o < 8; o++) {
      int op = ALL_OPS[o];
      if (dtype_is_float(dt) && o >= 5) {
        CHECK_STATUS(dc_allreduce(NULL, NULL, 0, dt, op, g_world), DC_ERR_INVALID_ARGUMENT);
        continue;
      }
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        size_t n = counts[c];
        if (n > 1000 && o != 0 && o != 4) continue; /* big counts: sum and avg only */
        void *send = xmalloc(n * es), *recv = xmalloc(n * es);
        for (size_t i = 0; i < n; i++) set_elem(send, dt, i, input(g_rank, i, dt, op));
        int in_place = (c % 2 == 1);
        if (in_place) memcpy(recv, send, n * es);
        CHECK(dc_allreduce(in_place ? recv : send, recv, n, dt, op, g_world));
        for (size_t i = 0; i < n; i++) {
          double want = reference(i, dt, op, g_size);
          double got = get_elem(recv, dt, i);
          EXPECT(close_enough(dt, got, want), "allreduce %s %s n=%zu in_place=%d: [%zu] = %g, want %g",
                 DTYPE_NAMES[d], OP_NAMES[o], n, in_place, i, got, want);
        }
        check_identical(recv, n * es, "allreduce");
        free(send);
        free(recv);
      }
    }
  }
}

static void test_reduce(void) {
  const int dts[] = {DC_FLOAT32, DC_INT32, DC_FLOAT16, DC_UINT8};
  for (int d = 0; d < 4; d++) {
    int dt = dts[d];
    size_t es = dtype_size(dt);
    for (int root = 0; root < g_size; root += (g_size > 2 ? g_size - 1 : 1)) {
      for (int o = 0; o < 5; o++) {
        int op = ALL_OPS[o];
        size_t n = (o == 0) ? 40000 : 257;
        void *send = xmalloc(n * es), *recv = xmalloc(n * es);
        for (size_t i = 0; i < n; i++) set_elem(send, dt, i, input(g_rank, i, dt, op));
        int in_place = (g_rank == root && o == 1);
        if (in_place) memcpy(recv, send, n * es);
        CHECK(dc_reduce(in_place ? recv : send, g_rank == root ? recv : NULL, n, dt, op, root, g_world));
        if (g_rank == root)
          for (size_t i = 0; i < n; i++)
            EXPECT(close_enough(dt, get_elem(recv, dt, i), reference(i, dt, op, g_size)),
                   "reduce %s %s root %d: [%zu] = %g, want %g", DTYPE_NAMES[d], OP_NAMES[o], root, i,
                   get_elem(recv, dt, i), reference(i, dt, op, g_size));
        free(send);
        free(recv);
      }
    }
  }
}

static void test_broadcast(void) {
  const size_t counts[] = {0, 3, 100000};
  for (int root = 0; root < g_size; root++)
    for (int c = 0; c < 3; c++) {
      size_t n = counts[c];
      double *buf = xmalloc(n * 8);
      for (size_t i = 0; i < n; i++) buf[i] = g_rank == root ? (double)(i * 3 + (size_t)root) : -1.0;
      CHECK(dc_broadcast(buf, n, DC_FLOAT64, root, g_world));
      for (size_t i = 0; i < n; i++)
        EXPECT(buf[i] == (double)(i * 3 + (size_t)root), "broadcast root %d n=%zu: [%zu] = %g", root, n, i, buf[i]);
      free(buf);
    }
}

static void test_allgather(void) {
  const size_t counts[] = {0, 1, 1000, 50000};
  for (int c = 0; c < 4; c++) {
    size_t n = counts[c];
    int32_t *send = xmalloc(n * 4), *recv = xmalloc(n * 4 * (size_t)g_size);
    for (size_t i = 0; i < n; i++) send[i] = g_rank * 1000003 + (int32_t)i;
    int in_place = c % 2;
    if (in_place) memcpy(recv + (size_t)g_rank * n, send, n * 4);
    CHECK(dc_allgather(in_place ? recv + (size_t)g_rank * n : send, recv, n, DC_INT32, g_world));
    for (int r = 0; r < g_size; r++)
      for (size_t i = 0; i < n; i++)
        EXPECT(recv[(size_t)r * n + i] == r * 1000003 + (int32_t)i, "allgather n=%zu in_place=%d: block %d [%zu]", n, in_place, r, i);
    free(send);
    free(recv);
  }
}

static void test_allgatherv(void) {
  size_t *counts = xmalloc(sizeof(size_t) * (size_t)g_size), *displs = xmalloc(sizeof(size_t) * (size_t)g_size);
  size_t total = 0;
  for (int r = 0; r < g_size; r++) {
    counts[r] = (size_t)(r * 1500 + (r % 2 ? 0 : 7)); /* rank 1 may send nothing at small sizes */
    displs[r] = total + 3;                               /* gaps between blocks */
    total = displs[r] + counts[r];
  }
  for (int in_place = 0; in_place < 2; in_place++) {
    int64_t *recv = xmalloc(total * 8), *send = xmalloc(counts[g_rank] * 8 + 8);
    for (size_t i = 0; i < total; i++) recv[i] = -5;
    for (size_t i = 0; i < counts[g_rank]; i++) send[i] = (int64_t)g_rank << 40 | (int64_t)i;
    if (in_place) memcpy(recv + displs[g_rank], send, counts[g_rank] * 8);
    CHECK(dc_allgatherv(in_place ? (void *)(recv + displs[g_rank]) : (void *)send, counts[g_rank], recv, counts, displs, DC_INT64, g_world));
    for (int r = 0; r < g_size; r++) {
      for (size_t i = 0; i < counts[r]; i++)
        EXPECT(recv[displs[r] + i] == ((int64_t)r << 40 | (int64_t)i), "allgatherv block %d [%zu]", r, i);
      EXPECT(recv[displs[r] - 1] == -5, "allgatherv wrote into the gap before block %d", r);
    }
    free(recv);
    free(send);
  }
  free(counts);
  free(displs);
}

static void test_gather_scatter(void) {
  size_t n = 3001;
  for (int root = 0; root < g_size; root++) {
    uint8_t *send = xmalloc(n), *recv = xmalloc(n * (size_t)g_size);
    for (size_t i = 0; i < n; i++) send[i] = (uint8_t)(g_rank * 31 + (int)i);
    CHECK(dc_gather(send, g_rank == root ? recv : NULL, n, DC_UINT8, root, g_world));
    if (g_rank == root)
      for (int r = 0; r < g_size; r++)
        for (size_t i = 0; i < n; i++) EXPECT(recv[(size_t)r * n + i] == (uint8_t)(r * 31 + (int)i), "gather root %d block %d [%zu]", root, r, i);
    /* scatter back: rank r gets block r of root's buffer, built from rank-dependent values */
    if (g_rank == root)
      for (int r = 0; r < g_size; r++)
        for (size_t i = 0; i < n; i++) recv[(size_t)r * n + i] = (uint8_t)(r * 7 + (int)i + root);
    memset(send, 0, n);
    CHECK(dc_scatter(g_rank == root ? recv : NULL, send, n, DC_UINT8, root, g_world));
    for (size_t i = 0; i < n; i++) EXPECT(send[i] == (uint8_t)(g_rank * 7 + (int)i + root), "scatter root %d [%zu]", root, i);
    free(send);
    free(recv);
  }
}

static void test_reduce_scatter(void) {
  const int dts[] = {DC_FLOAT32, DC_INT64, DC_BFLOAT16};
  const size_t counts[] = {0, 1, 1000, 30001};
  for (int d = 0; d < 3; d++)
    for (int c = 0; c < 4; c++) {
      int dt = dts[d];
      size_t es = dtype_size(dt), n = counts[c], whole = n * (size_t)g_size;
      void *send = xmalloc(whole * es), *recv = xmalloc(n * es);
      for (size_t i = 0; i < whole; i++) set_elem(send, dt, i, input(g_rank, i, dt, DC_SUM));
      int in_place = c % 2;
      char *mine = (char *)send + (size_t)g_rank * n * es;
      CHECK(dc_reduce_scatter(send, in_place ? (void *)mine : recv, n, dt, DC_SUM, g_world));
      const void *out = in_place ? (const void *)mine : recv;
      for (size_t i = 0; i < n; i++) {
        double want = reference((size_t)g_rank * n + i, dt, DC_SUM, g_size);
        EXPECT(close_enough(dt, get_elem(out, dt, i), want), "reduce_scatter %s n=%zu in_place=%d [%zu] = %g, want %g",
               DTYPE_NAMES[dt], n, in_place, i, get_elem(out, dt, i), want);
      }
      free(send);
      free(recv);
    }
}

static void test_alltoall(void) {
  const size_t counts[] = {0, 1, 777};
  for (int c = 0; c < 3; c++) {
    size_t n = counts[c];
    int32_t *send = xmalloc(n * 4 * (size_t)g_size), *recv = xmalloc(n * 4 * (size_t)g_size);
    for (int j = 0; j < g_size; j++)
      for (size_t i = 0; i < n; i++) send[(size_t)j * n + i] = g_rank * 100000 + j * 1000 + (int32_t)i;
    CHECK(dc_alltoall(send, recv, n, DC_INT32, g_world));
    for (int r = 0; r < g_size; r++)
      for (size_t i = 0; i < n; i++)
        EXPECT(recv[(size_t)r * n + i] == r * 100000 + g_rank * 1000 + (int32_t)i, "alltoall n=%zu block %d [%zu]", n, r, i);
    free(send);
    free(recv);
  }
  /* alltoallv: rank i sends (i + j) % 3 * 50 elements to rank j */
  size_t *sc = xmalloc(sizeof(size_t) * (size_t)g_size), *sd = xmalloc(sizeof(size_t) * (size_t)g_size);
  size_t *rc = xmalloc(sizeof(size_t) * (size_t)g_size), *rd = xmalloc(sizeof(size_t) * (size_t)g_size);
  size_t stot = 0, rtot = 0;
  for (int j = 0; j < g_size; j++) {
    sc[j] = (size_t)((g_rank + j) % 3) * 50;
    sd[j] = stot;
    stot += sc[j];
    rc[j] = (size_t)((j + g_rank) % 3) * 50;
    rd[j] = rtot + 1;
    rtot = rd[j] + rc[j];
  }
  double *send = xmalloc(stot * 8), *recv = xmalloc(rtot * 8);
  for (int j = 0; j < g_size; j++)
    for (size_t i = 0; i < sc[j]; i++) send[sd[j] + i] = g_rank * 1e6 + j * 1e3 + (double)i;
  CHECK(dc_alltoallv(send, sc, sd, recv, rc, rd, DC_FLOAT64, g_world));
  for (int r = 0; r < g_size; r++)
    for (size_t i = 0; i < rc[r]; i++)
      EXPECT(recv[rd[r] + i] == r * 1e6 + g_rank * 1e3 + (double)i, "alltoallv from %d [%zu]", r, i);
  free(send); free(recv); free(sc); free(sd); free(rc); free(rd);
}

/* Several non-blocking collectives outstanding at once, progressing while the caller computes. */
static void test_nonblocking(void) {
  size_t n = 20000;
  float *a = xmalloc(n * 4), *ar = xmalloc(n * 4);
  double *b = xmalloc(n * 8);
  int32_t *g = xmalloc(n * 4 * (size_t)g_size), *gs = xmalloc(n * 4);
  int32_t *rs_send = xmalloc(n * 4 * (size_t)g_size), *rs = xmalloc(n * 4);
  for (size_t i = 0; i < n; i++) {
    a[i] = (float)(g_rank + 1);
    b[i] = g_rank == 0 ? (double)i : 0.0;
    gs[i] = g_rank;
  }
  for (size_t i = 0; i < n * (size_t)g_size; i++) rs_send[i] = 1;
  dc_request *reqs[6];
  CHECK(dc_iallreduce(a, ar, n, DC_FLOAT32, DC_SUM, g_world, &reqs[0]));
  CHECK(dc_ibroadcast(b, n, DC_FLOAT64, 0, g_world, &reqs[1]));
  CHECK(dc_iallgather(gs, g, n, DC_INT32, g_world, &reqs[2]));
  CHECK(dc_ireduce_scatter(rs_send, rs, n, DC_INT32, DC_SUM, g_world, &reqs[3]));
  CHECK(dc_ibarrier(g_world, &reqs[4]));
  double sink = 0; /* compute while the collectives progress */
  for (int i = 0; i < 2000000; i++) sink += i * 0.5;
  bool done = false;
  CHECK(dc_request_is_completed(reqs[4], &done));
  CHECK(dc_request_wait_all(5, reqs));
  CHECK(dc_request_wait(reqs[0])); /* waiting again returns the same status */
  CHECK(dc_request_is_completed(reqs[0], &done));
  EXPECT(done, "request not completed after wait");
  float want = (float)(g_size * (g_size + 1) / 2);
  for (size_t i = 0; i < n; i++) {
    EXPECT(ar[i] == want, "iallreduce [%zu] = %g, want %g", i, ar[i], want);
    EXPECT(b[i] == (double)i, "ibroadcast [%zu]", i);
    EXPECT(rs[i] == g_size, "ireduce_scatter [%zu]", i);
  }
  for (int r = 0; r < g_size; r++) EXPECT(g[(size_t)r * n + 5] == r, "iallgather block %d", r);
  for (int i = 0; i < 5; i++) CHECK(dc_request_free(reqs[i]));

  /* the remaining non-blocking forms, all outstanding together */
  int gs4 = g_size;
  int64_t *x = xmalloc(8 * 2), *xr = xmalloc(8 * 2);
  int64_t *gat = xmalloc(8 * 2 * (size_t)gs4), *sca = xmalloc(8 * 2 * (size_t)gs4), *sc_out = xmalloc(8 * 2);
  int64_t *agv = xmalloc(8 * 2 * (size_t)gs4), *a2a_s = xmalloc(8 * 2 * (size_t)gs4), *a2a_r = xmalloc(8 * 2 * (size_t)gs4);
  int64_t *a2v_r = xmalloc(8 * 2 * (size_t)gs4);
  size_t *cnt = xmalloc(sizeof(size_t) * (size_t)gs4), *dsp = xmalloc(sizeof(size_t) * (size_t)gs4);
  for (int r = 0; r < gs4; r++) { cnt[r] = 2; dsp[r] = (size_t)r * 2; }
  x[0] = g_rank * 10; x[1] = -g_rank;
  for (int i = 0; i < 2 * gs4; i++) { sca[i] = 500 + i; a2a_s[i] = g_rank * 1000 + i; }
  int root = gs4 - 1;
  dc_request *r2[6];
  CHECK(dc_ireduce(x, g_rank == root ? xr : NULL, 2, DC_INT64, DC_MAX, root, g_world, &r2[0]));
  CHECK(dc_igather(x, g_rank == root ? gat : NULL, 2, DC_INT64, root, g_world, &r2[1]));
  CHECK(dc_iscatter(g_rank == root ? sca : NULL, sc_out, 2, DC_INT64, root, g_world, &r2[2]));
  CHECK(dc_iallgatherv(x, 2, agv, cnt, dsp, DC_INT64, g_world, &r2[3]));
  CHECK(dc_ialltoall(a2a_s, a2a_r, 2, DC_INT64, g_world, &r2[4]));
  CHECK(dc_ialltoallv(a2a_s, cnt, dsp, a2v_r, cnt, dsp, DC_INT64, g_world, &r2[5]));
  CHECK(dc_request_wait_all(6, r2));
  if (g_rank == root) {
    EXPECT(xr[0] == (gs4 - 1) * 10 && xr[1] == 0, "ireduce max: %lld %lld", (long long)xr[0], (long long)xr[1]);
    for (int r = 0; r < gs4; r++) EXPECT(gat[2 * r] == r * 10 && gat[2 * r + 1] == -r, "igather block %d", r);
  }
  EXPECT(sc_out[0] == 500 + 2 * g_rank && sc_out[1] == 501 + 2 * g_rank, "iscatter");
  for (int r = 0; r < gs4; r++) {
    EXPECT(agv[2 * r] == r * 10 && agv[2 * r + 1] == -r, "iallgatherv block %d", r);
    EXPECT(a2a_r[2 * r] == r * 1000 + 2 * g_rank && a2a_r[2 * r + 1] == r * 1000 + 2 * g_rank + 1, "ialltoall block %d", r);
    EXPECT(a2v_r[2 * r] == a2a_r[2 * r] && a2v_r[2 * r + 1] == a2a_r[2 * r + 1], "ialltoallv block %d", r);
  }
  for (int i = 0; i < 6; i++) CHECK(dc_request_free(r2[i]));
  if (sink < 0) printf("%g\n", sink);
  free(a); free(ar); free(b); free(g); free(gs); free(rs_send); free(rs);
  free(x); free(xr); free(gat); free(sca); free(sc_out); free(agv); free(a2a_s); free(a2a_r); free(a2v_r); free(cnt); free(dsp);
}

int main(void) {
  g_world = test_init(&g_rank, &g_size);
  test_allreduce();
  test_reduce();
  test_broadcast();
  test_allgather();
  test_allgatherv();
  test_gather_scatter();
  test_reduce_scatter();
  test_alltoall();
  CHECK(dc_barrier(g_world));
  test_nonblocking();
  CHECK(dc_comm_destroy(g_world));
  if (g_rank == 0) printf("test_collectives: all checks passed on %d ranks\n", g_size);
  return 0;
}
