/* GPU check of the NCCL backend: every collective and point-to-point call of distcomm on CUDA
 * device buffers, results compared with a host computation. Run by scripts/gpu_check.sh under
 * dcrun (1 rank, and 2 ranks on one GPU where NCCL allows it). Not a CPU test: the name does not
 * match c_tests/test_*.c, so the CMake test suite never picks it up.
 *
 * Device memory comes from the CUDA driver API, loaded with dlopen (libcuda.so.1 comes with
 * every NVIDIA driver; no toolkit needed to build this file).
 *
 *   gpu_check            run the checks; prints PASS/FAIL lines and "N passed, M failed"
 *   gpu_check --bench    time blocking dc_allreduce (float32 sum) on device buffers (rank 0 prints
 *                        "BENCH dc <bytes> <microseconds>" per size)
 *
 * Exit: 0 all passed, 1 a check failed, 77 dc_init failed while DC_GPU_CHECK_INIT_MAY_FAIL=1
 * (the script's way to learn that NCCL refused several ranks on one GPU), 2 no CUDA at all. */

#define _POSIX_C_SOURCE 200809L
#include <distcomm.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef unsigned long long devptr;

static struct {
  int (*Init)(unsigned);
  int (*DeviceGetCount)(int *);
  int (*DeviceGet)(int *, int);
  int (*DevicePrimaryCtxRetain)(void **, int);
  int (*CtxSetCurrent)(void *);
  int (*MemAlloc)(devptr *, size_t);
  int (*MemFree)(devptr);
  int (*MemcpyHtoD)(devptr, const void *, size_t);
  int (*MemcpyDtoH)(void *, devptr, size_t);
  int (*MemsetD8)(devptr, unsigned char, size_t);
  int (*StreamCreate)(void **, unsigned);
  int (*StreamDestroy)(void *);
  int (*StreamSynchronize)(void *);
  int (*CtxSynchronize)(void);
} cu;

static int rank = -1, nranks = 0, passed = 0, failed = 0;
static dc_comm *world;
static const char *current = "";
static int current_failed = 0;

#define CU(call)                                                                 \
  do {                                                                           \
    int cu_r_ = (call);                                                          \
    if (cu_r_ != 0) {                                                            \
      fprintf(stderr, "rank %d: %s failed with CUresult %d\n", rank, #call, cu_r_); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

/* A failed check marks the current test failed and returns from the test function. */
#define CHECK(call)                                                                          \
  do {                                                                                       \
    dc_status s_ = (call);                                                                   \
    if (s_ != DC_SUCCESS) {                                                                  \
      printf("rank %d: FAIL %s: %s returned %s: %s\n", rank, current, #call,                 \
             dc_status_name(s_), dc_last_error());                                           \
      current_failed = 1;                                                                    \
      return;                                                                                \
    }                                                                                        \
  } while (0)

#define CHECK_STATUS(call, want)                                                             \
  do {                                                                                       \
    dc_status s_ = (call);                                                                   \
    if (s_ != (want)) {                                                                      \
      printf("rank %d: FAIL %s: %s returned %s, expected %s: %s\n", rank, current, #call,    \
             dc_status_name(s_), dc_status_name(want), dc_last_error());                     \
      current_failed = 1;                                                                    \
      return;                                                                                \
    }                                                                                        \
  } while (0)

#define EXPECT(cond, ...)                                                                    \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      printf("rank %d: FAIL %s: %s: ", rank, current, #cond);                                \
      printf(__VA_ARGS__);                                                                   \
      printf("\n");                                                                          \
      current_failed = 1;                                                                    \
      return;                                                                                \
    }                                                                                        \
  } while (0)

static void run(const char *name, void (*test)(void)) {
  current = name;
  current_failed = 0;
  test();
  if (current_failed) {
    failed++;
  } else {
    passed++;
    if (rank == 0) printf("PASS %s\n", name);
  }
  fflush(stdout);
}

static void load_cuda(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    printf("SKIP: no CUDA driver (%s)\n", dlerror());
    exit(2);
  }
#define SYM(field, name)                                                  \
  do {                                                                    \
    *(void **)(&cu.field) = dlsym(h, name);                               \
    if (!cu.field) {                                                      \
      fprintf(stderr, "libcuda.so.1 lacks %s\n", name);                   \
      exit(1);                                                            \
    }                                                                     \
  } while (0)
  SYM(Init, "cuInit");
  SYM(DeviceGetCount, "cuDeviceGetCount");
  SYM(DeviceGet, "cuDeviceGet");
  SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(CtxSetCurrent, "cuCtxSetCurrent");
  SYM(MemAlloc, "cuMemAlloc_v2");
  SYM(MemFree, "cuMemFree_v2");
  SYM(MemcpyHtoD, "cuMemcpyHtoD_v2");
  SYM(MemcpyDtoH, "cuMemcpyDtoH_v2");
  SYM(MemsetD8, "cuMemsetD8_v2");
  SYM(StreamCreate, "cuStreamCreate");
  SYM(StreamDestroy, "cuStreamDestroy_v2");
  SYM(StreamSynchronize, "cuStreamSynchronize");
  SYM(CtxSynchronize, "cuCtxSynchronize");
}

/* Selects LOCAL_RANK % device count by making its primary context current: dc_init then uses it. */
static int select_device(void) {
  CU(cu.Init(0));
  int n = 0;
  CU(cu.DeviceGetCount(&n));
  if (n < 1) {
    printf("SKIP: no CUDA device\n");
    exit(2);
  }
  const char *lr = getenv("LOCAL_RANK");
  int ord = (lr ? atoi(lr) : 0) % n;
  int dev = 0;
  void *ctx = NULL;
  CU(cu.DeviceGet(&dev, ord));
  CU(cu.DevicePrimaryCtxRetain(&ctx, dev));
  CU(cu.CtxSetCurrent(ctx));
  return ord;
}

static void *dalloc(size_t bytes) {
  devptr p = 0;
  CU(cu.MemAlloc(&p, bytes ? bytes : 1));
  CU(cu.MemsetD8(p, 0, bytes ? bytes : 1));
  return (void *)(uintptr_t)p;
}
static void dfree(void *p) { CU(cu.MemFree((devptr)(uintptr_t)p)); }
static void h2d(void *d, const void *h, size_t n) { if (n) CU(cu.MemcpyHtoD((devptr)(uintptr_t)d, h, n)); }
static void d2h(void *h, const void *d, size_t n) { if (n) CU(cu.MemcpyDtoH(h, (devptr)(uintptr_t)d, n)); }
static void *dcopy(const void *h, size_t n) {
  void *d = dalloc(n);
  h2d(d, h, n);
  return d;
}

/* Value of element i on rank r in most tests: small integers, exact in every dtype. */
static float val(int r, size_t i) { return (float)(r + 1 + (int)(i % 7)); }

/* float -> IEEE half / bfloat16 bits for the small integers used here (exact, normal numbers). */
static uint16_t half_of(float f) {
  if (f == 0.0f) return 0;
  uint32_t b;
  memcpy(&b, &f, 4);
  int e = (int)((b >> 23) & 0xff) - 127;
  uint32_t m = (b >> 13) & 0x3ff;
  return (uint16_t)(((uint32_t)(e + 15) << 10) | m);
}
static uint16_t bf16_of(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)(b >> 16);
}

/* ---- collectives ------------------------------------------------------------------------- */

static void t_backend(void) {
  const char *name = NULL;
  CHECK(dc_comm_backend(world, &name));
  EXPECT(strcmp(name, "nccl") == 0, "backend is %s", name);
}

static void allreduce_f32_sum(size_t count, int in_place) {
  size_t bytes = count * 4;
  float *h = malloc(bytes), *out = malloc(bytes);
  for (size_t i = 0; i < count; i++) h[i] = val(rank, i);
  void *s = dcopy(h, bytes), *r = in_place ? s : dalloc(bytes);
  CHECK(dc_allreduce(s, r, count, DC_FLOAT32, DC_SUM, world));
  d2h(out, r, bytes);
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += val(q, i);
    EXPECT(out[i] == want, "count %zu elem %zu: %g, want %g", count, i, out[i], want);
  }
  if (!in_place) dfree(r);
  dfree(s);
  free(h);
  free(out);
}

static void t_allreduce(void) {
  allreduce_f32_sum(1000, 0);
  allreduce_f32_sum(1 << 20, 0);
  allreduce_f32_sum(4097, 1);
}

static void t_allreduce_dtypes_ops(void) {
  enum { N = 513 };
  /* int32 max */
  int32_t hi[N], oi[N];
  for (int i = 0; i < N; i++) hi[i] = (i * 31 + rank * 17) % 101 - 50;
  void *di = dcopy(hi, sizeof hi);
  CHECK(dc_allreduce(di, di, N, DC_INT32, DC_MAX, world));
  d2h(oi, di, sizeof oi);
  for (int i = 0; i < N; i++) {
    int32_t want = -1000;
    for (int q = 0; q < nranks; q++) {
      int32_t v = (i * 31 + q * 17) % 101 - 50;
      if (v > want) want = v;
    }
    EXPECT(oi[i] == want, "int32 max elem %d: %d, want %d", i, oi[i], want);
  }
  dfree(di);
  /* int64 min */
  int64_t hl[N], ol[N];
  for (int i = 0; i < N; i++) hl[i] = (int64_t)((i * 7 + rank * 3) % 19) * 1000000000LL;
  void *dl = dcopy(hl, sizeof hl);
  CHECK(dc_allreduce(dl, dl, N, DC_INT64, DC_MIN, world));
  d2h(ol, dl, sizeof ol);
  for (int i = 0; i < N; i++) {
    int64_t want = INT64_MAX;
    for (int q = 0; q < nranks; q++) {
      int64_t v = (int64_t)((i * 7 + q * 3) % 19) * 1000000000LL;
      if (v < want) want = v;
    }
    EXPECT(ol[i] == want, "int64 min elem %d", i);
  }
  dfree(dl);
  /* float64 prod (factors 1 or 2: exact) */
  double hd[N], od[N];
  for (int i = 0; i < N; i++) hd[i] = (double)((i + rank) % 2 + 1);
  void *dd = dcopy(hd, sizeof hd);
  CHECK(dc_allreduce(dd, dd, N, DC_FLOAT64, DC_PROD, world));
  d2h(od, dd, sizeof od);
  for (int i = 0; i < N; i++) {
    double want = 1;
    for (int q = 0; q < nranks; q++) want *= (double)((i + q) % 2 + 1);
    EXPECT(od[i] == want, "float64 prod elem %d: %g, want %g", i, od[i], want);
  }
  dfree(dd);
  /* float32 avg (ncclAvg: compared with a tolerance) */
  float hf[N], of[N];
  for (int i = 0; i < N; i++) hf[i] = val(rank, (size_t)i);
  void *df = dcopy(hf, sizeof hf);
  CHECK(dc_allreduce(df, df, N, DC_FLOAT32, DC_AVG, world));
  d2h(of, df, sizeof of);
  for (int i = 0; i < N; i++) {
    double want = 0;
    for (int q = 0; q < nranks; q++) want += val(q, (size_t)i);
    want /= nranks;
    EXPECT(fabs(of[i] - want) < 1e-5 * fabs(want) + 1e-6, "float32 avg elem %d: %g, want %g", i, of[i], want);
  }
  dfree(df);
  /* float16 and bfloat16 sums of small integers (exact) */
  uint16_t hh[N], oh[N];
  for (int i = 0; i < N; i++) hh[i] = half_of(val(rank, (size_t)i));
  void *dh = dcopy(hh, sizeof hh);
  CHECK(dc_allreduce(dh, dh, N, DC_FLOAT16, DC_SUM, world));
  d2h(oh, dh, sizeof oh);
  for (int i = 0; i < N; i++) {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += val(q, (size_t)i);
    EXPECT(oh[i] == half_of(want), "float16 sum elem %d: bits %#x, want %#x", i, oh[i], half_of(want));
  }
  for (int i = 0; i < N; i++) hh[i] = bf16_of(val(rank, (size_t)i));
  h2d(dh, hh, sizeof hh);
  CHECK(dc_allreduce(dh, dh, N, DC_BFLOAT16, DC_SUM, world));
  d2h(oh, dh, sizeof oh);
  for (int i = 0; i < N; i++) {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += val(q, (size_t)i);
    EXPECT(oh[i] == bf16_of(want), "bfloat16 sum elem %d: bits %#x, want %#x", i, oh[i], bf16_of(want));
  }
  dfree(dh);
}

static void t_broadcast(void) {
  enum { N = 3001 };
  int32_t h[N];
  for (int root = 0; root < nranks; root++) {
    for (int i = 0; i < N; i++) h[i] = rank == root ? i * 3 + root : -1;
    void *d = dcopy(h, sizeof h);
    CHECK(dc_broadcast(d, N, DC_INT32, root, world));
    d2h(h, d, sizeof h);
    dfree(d);
    for (int i = 0; i < N; i++) EXPECT(h[i] == i * 3 + root, "root %d elem %d: %d", root, i, h[i]);
  }
}

static void t_reduce(void) {
  enum { N = 777 };
  int root = nranks - 1;
  float h[N], o[N];
  for (int i = 0; i < N; i++) h[i] = val(rank, (size_t)i);
  void *s = dcopy(h, sizeof h);
  void *r = rank == root ? dalloc(sizeof o) : NULL;
  CHECK(dc_reduce(s, r, N, DC_FLOAT32, DC_SUM, root, world));
  if (rank == root) {
    d2h(o, r, sizeof o);
    for (int i = 0; i < N; i++) {
      float want = 0;
      for (int q = 0; q < nranks; q++) want += val(q, (size_t)i);
      EXPECT(o[i] == want, "elem %d: %g, want %g", i, o[i], want);
    }
    dfree(r);
  }
  dfree(s);
}

static void t_allgather(void) {
  enum { N = 257 };
  int32_t mine[N];
  int32_t *all = malloc(sizeof(int32_t) * N * (size_t)nranks);
  for (int i = 0; i < N; i++) mine[i] = rank * 100000 + i;
  void *s = dcopy(mine, sizeof mine);
  void *r = dalloc(sizeof mine * (size_t)nranks);
  CHECK(dc_allgather(s, r, N, DC_INT32, world));
  d2h(all, r, sizeof mine * (size_t)nranks);
  for (int q = 0; q < nranks; q++)
    for (int i = 0; i < N; i++) EXPECT(all[q * N + i] == q * 100000 + i, "block %d elem %d", q, i);
  /* in place: the send block already sits at recvbuf + rank*N */
  memset(all, 0xff, sizeof mine * (size_t)nranks);
  memcpy(all + rank * N, mine, sizeof mine);
  h2d(r, all, sizeof mine * (size_t)nranks);
  CHECK(dc_allgather((char *)r + sizeof mine * (size_t)rank, r, N, DC_INT32, world));
  d2h(all, r, sizeof mine * (size_t)nranks);
  for (int q = 0; q < nranks; q++)
    for (int i = 0; i < N; i++) EXPECT(all[q * N + i] == q * 100000 + i, "in place: block %d elem %d", q, i);
  dfree(s);
  dfree(r);
  free(all);
}

static void t_allgatherv(void) {
  size_t counts[64], displs[64], total = 0;
  for (int q = 0; q < nranks; q++) {
    counts[q] = (size_t)(q * 5 + 3);
    displs[q] = total + 2; /* gaps between blocks */
    total = displs[q] + counts[q];
  }
  int32_t *h = malloc(counts[rank] * 4), *o = malloc(total * 4);
  for (size_t i = 0; i < counts[rank]; i++) h[i] = rank * 1000 + (int)i;
  void *s = dcopy(h, counts[rank] * 4), *r = dalloc(total * 4);
  CHECK(dc_allgatherv(s, counts[rank], r, counts, displs, DC_INT32, world));
  d2h(o, r, total * 4);
  for (int q = 0; q < nranks; q++)
    for (size_t i = 0; i < counts[q]; i++) EXPECT(o[displs[q] + i] == q * 1000 + (int)i, "block %d elem %zu", q, i);
  dfree(s);
  dfree(r);
  free(h);
  free(o);
}

static void t_gather_scatter(void) {
  enum { N = 100 };
  int64_t mine[N];
  int64_t *all = malloc(sizeof mine * (size_t)nranks);
  for (int i = 0; i < N; i++) mine[i] = rank * 1000 + i;
  int root = 0;
  void *s = dcopy(mine, sizeof mine);
  void *r = rank == root ? dalloc(sizeof mine * (size_t)nranks) : NULL;
  CHECK(dc_gather(s, r, N, DC_INT64, root, world));
  if (rank == root) {
    d2h(all, r, sizeof mine * (size_t)nranks);
    for (int q = 0; q < nranks; q++)
      for (int i = 0; i < N; i++) EXPECT(all[q * N + i] == q * 1000 + i, "gather block %d elem %d", q, i);
    dfree(r);
  }
  dfree(s);
  root = nranks - 1;
  void *ss = NULL;
  if (rank == root) {
    for (int q = 0; q < nranks; q++)
      for (int i = 0; i < N; i++) all[q * N + i] = q * 7 + i * 11;
    ss = dcopy(all, sizeof mine * (size_t)nranks);
  }
  void *rr = dalloc(sizeof mine);
  CHECK(dc_scatter(ss, rr, N, DC_INT64, root, world));
  d2h(mine, rr, sizeof mine);
  for (int i = 0; i < N; i++) EXPECT(mine[i] == rank * 7 + i * 11, "scatter elem %d", i);
  dfree(rr);
  if (ss) dfree(ss);
  free(all);
}

static void t_reduce_scatter(void) {
  enum { N = 300 };
  size_t total = (size_t)N * (size_t)nranks;
  float *h = malloc(total * 4), *o = malloc(total * 4);
  for (size_t i = 0; i < total; i++) h[i] = val(rank, i);
  void *s = dcopy(h, total * 4), *r = dalloc(N * 4);
  CHECK(dc_reduce_scatter(s, r, N, DC_FLOAT32, DC_SUM, world));
  d2h(o, r, N * 4);
  for (size_t i = 0; i < N; i++) {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += val(q, (size_t)rank * N + i);
    EXPECT(o[i] == want, "elem %zu: %g, want %g", i, o[i], want);
  }
  /* in place: recvbuf == sendbuf + rank*N */
  h2d(s, h, total * 4);
  CHECK(dc_reduce_scatter(s, (char *)s + (size_t)rank * N * 4, N, DC_FLOAT32, DC_SUM, world));
  d2h(o, s, total * 4);
  for (size_t i = 0; i < N; i++) {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += val(q, (size_t)rank * N + i);
    EXPECT(o[(size_t)rank * N + i] == want, "in place elem %zu: %g, want %g", i, o[(size_t)rank * N + i], want);
  }
  dfree(s);
  dfree(r);
  free(h);
  free(o);
}

static void t_alltoall(void) {
  enum { N = 64 };
  size_t total = (size_t)N * (size_t)nranks;
  int32_t *h = malloc(total * 4), *o = malloc(total * 4);
  for (int q = 0; q < nranks; q++)
    for (int i = 0; i < N; i++) h[q * N + i] = rank * 10000 + q * 100 + i; /* block q goes to rank q */
  void *s = dcopy(h, total * 4), *r = dalloc(total * 4);
  CHECK(dc_alltoall(s, r, N, DC_INT32, world));
  d2h(o, r, total * 4);
  for (int q = 0; q < nranks; q++)
    for (int i = 0; i < N; i++) EXPECT(o[q * N + i] == q * 10000 + rank * 100 + i, "block %d elem %d", q, i);
  dfree(s);
  dfree(r);
  /* alltoallv: rank q sends (q + p + 1) elements to rank p */
  size_t sc[64], sd[64], rc[64], rd[64], st = 0, rt = 0;
  for (int p = 0; p < nranks; p++) {
    sc[p] = (size_t)(rank + p + 1);
    sd[p] = st;
    st += sc[p] + 1;
    rc[p] = (size_t)(p + rank + 1);
    rd[p] = rt;
    rt += rc[p];
  }
  int32_t *hs = malloc(st * 4), *hr = malloc(rt * 4);
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < sc[p]; i++) hs[sd[p] + i] = rank * 1000 + p * 10 + (int)i;
  void *vs = dcopy(hs, st * 4), *vr = dalloc(rt * 4);
  CHECK(dc_alltoallv(vs, sc, sd, vr, rc, rd, DC_INT32, world));
  d2h(hr, vr, rt * 4);
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < rc[p]; i++) EXPECT(hr[rd[p] + i] == p * 1000 + rank * 10 + (int)i, "alltoallv from %d elem %zu", p, i);
  dfree(vs);
  dfree(vr);
  free(hs);
  free(hr);
  free(h);
  free(o);
}

static void t_barrier(void) {
  CHECK(dc_barrier(world));
  dc_request *req = NULL;
  CHECK(dc_ibarrier(world, &req));
  CHECK(dc_request_wait(req));
  CHECK(dc_request_free(req));
}

static void t_nonblocking(void) {
  size_t count = 1 << 22; /* 16 MiB: long enough to be seen pending at least sometimes */
  float *h = malloc(count * 4);
  for (size_t i = 0; i < count; i++) h[i] = val(rank, i);
  void *d = dcopy(h, count * 4);
  dc_request *req = NULL;
  CHECK(dc_iallreduce(d, d, count, DC_FLOAT32, DC_SUM, world, &req));
  bool done = false;
  long polls = 0;
  while (!done) {
    CHECK(dc_request_is_completed(req, &done));
    polls++;
  }
  CHECK(dc_request_wait(req));
  CHECK(dc_request_wait(req)); /* again: same status */
  CHECK(dc_request_free(req));
  d2h(h, d, count * 4);
  for (size_t i = 0; i < count; i += 4099) {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += val(q, i);
    EXPECT(h[i] == want, "elem %zu: %g, want %g", i, h[i], want);
  }
  if (rank == 0) printf("  (is_completed polled %ld times before completion)\n", polls);
  /* several outstanding at once */
  dc_request *reqs[4];
  void *bufs[4];
  for (int k = 0; k < 4; k++) {
    int32_t v[16];
    for (int i = 0; i < 16; i++) v[i] = k + rank;
    bufs[k] = dcopy(v, sizeof v);
    CHECK(dc_iallreduce(bufs[k], bufs[k], 16, DC_INT32, DC_SUM, world, &reqs[k]));
  }
  CHECK(dc_request_wait_all(4, reqs));
  for (int k = 0; k < 4; k++) {
    int32_t v[16];
    d2h(v, bufs[k], sizeof v);
    int want = 0;
    for (int q = 0; q < nranks; q++) want += k + q;
    EXPECT(v[3] == want, "request %d: %d, want %d", k, v[3], want);
    CHECK(dc_request_free(reqs[k]));
    dfree(bufs[k]);
  }
  dfree(d);
  free(h);
}

static void t_user_stream(void) {
  void *stream = NULL;
  CU(cu.StreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));
  CHECK(dc_comm_set_stream(world, stream));
  enum { N = 4096 };
  float h[N];
  for (int i = 0; i < N; i++) h[i] = val(rank, (size_t)i);
  void *d = dcopy(h, sizeof h);
  dc_request *req = NULL;
  CHECK(dc_iallreduce(d, d, N, DC_FLOAT32, DC_SUM, world, &req));
  CU(cu.StreamSynchronize(stream)); /* completes with the caller's stream */
  bool done = false;
  CHECK(dc_request_is_completed(req, &done));
  EXPECT(done, "the request must be complete once its stream is");
  CHECK(dc_request_free(req));
  CHECK(dc_allreduce(d, d, N, DC_FLOAT32, DC_SUM, world)); /* blocking, on the caller's stream */
  d2h(h, d, sizeof h);
  for (int i = 0; i < N; i++) {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += val(q, (size_t)i);
    want *= nranks;
    EXPECT(h[i] == want, "elem %d: %g, want %g", i, h[i], want);
  }
  CHECK(dc_comm_set_stream(world, NULL));
  dfree(d);
  CU(cu.StreamDestroy(stream));
}

/* ---- point to point -------------------------------------------------------------------- */

static void t_p2p(void) {
  enum { N = 1000 };
  if (nranks == 1) {
    int32_t h[N] = {0};
    void *d = dcopy(h, sizeof h);
    CHECK_STATUS(dc_send(d, N, DC_INT32, 0, 0, world), DC_ERR_UNAVAILABLE);
    dfree(d);
    return;
  }
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  int32_t h[N];
  for (int i = 0; i < N; i++) h[i] = rank * 100 + i;
  void *s = dcopy(h, sizeof h), *r = dalloc(sizeof h);
  dc_request *rq[2];
  CHECK(dc_irecv(r, N, DC_INT32, prev, 5, world, &rq[0]));
  CHECK(dc_isend(s, N, DC_INT32, next, 5, world, &rq[1]));
  CHECK(dc_request_wait_all(2, rq));
  dc_recv_info info;
  CHECK(dc_request_recv_info(rq[0], &info));
  EXPECT(info.source == prev && info.tag == 5 && info.count == N, "info %d %d %zu", info.source, info.tag, info.count);
  CHECK(dc_request_free(rq[0]));
  CHECK(dc_request_free(rq[1]));
  d2h(h, r, sizeof h);
  for (int i = 0; i < N; i++) EXPECT(h[i] == prev * 100 + i, "ring elem %d: %d", i, h[i]);
  /* blocking pair, DC_ANY_TAG on the receiver */
  if (rank == 0) {
    CHECK(dc_send(s, N, DC_INT32, 1, 9, world));
  } else if (rank == 1) {
    CHECK(dc_recv(r, N, DC_INT32, 0, DC_ANY_TAG, world, &info));
    EXPECT(info.source == 0 && info.tag == 9 && info.count == N, "info %d %d %zu", info.source, info.tag, info.count);
    d2h(h, r, sizeof h);
    for (int i = 0; i < N; i++) EXPECT(h[i] == i, "pair elem %d: %d", i, h[i]);
  }
  dfree(s);
  dfree(r);
}

/* ---- what is refused --------------------------------------------------------------------- */

static void t_refusals(void) {
  int32_t h[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  void *d = dcopy(h, sizeof h);
  CHECK_STATUS(dc_recv(d, 8, DC_INT32, DC_ANY_SOURCE, 0, world, NULL), DC_ERR_UNAVAILABLE);
  CHECK_STATUS(dc_allreduce(d, d, 8, DC_INT32, DC_BXOR, world), DC_ERR_UNAVAILABLE);
  int32_t host[8];
  CHECK_STATUS(dc_allreduce(d, host, 8, DC_INT32, DC_SUM, world), DC_ERR_INVALID_ARGUMENT);
  /* host buffers on the same comm go through the CPU transports, bitwise ops included */
  int32_t hs[8], hr[8];
  for (int i = 0; i < 8; i++) hs[i] = 1 << rank;
  CHECK(dc_allreduce(hs, hr, 8, DC_INT32, DC_BOR, world));
  EXPECT(hr[0] == (1 << nranks) - 1, "host bor: %d", hr[0]);
  dfree(d);
}

/* ---- groups ------------------------------------------------------------------------------ */

static void t_groups(void) {
  dc_comm *half = NULL;
  CHECK(dc_comm_split(world, rank % 2, -rank, &half));
  EXPECT(half != NULL, "split returned NULL");
  int hr = -1, hn = 0;
  CHECK(dc_comm_rank(half, &hr));
  CHECK(dc_comm_size(half, &hn));
  const char *name = NULL;
  CHECK(dc_comm_backend(half, &name));
  EXPECT(strcmp(name, "nccl") == 0, "child backend %s", name);
  float h[100];
  for (int i = 0; i < 100; i++) h[i] = (float)(rank + 1);
  void *d = dcopy(h, sizeof h);
  CHECK(dc_allreduce(d, d, 100, DC_FLOAT32, DC_SUM, half));
  d2h(h, d, sizeof h);
  float want = 0;
  for (int q = rank % 2; q < nranks; q += 2) want += (float)(q + 1);
  EXPECT(h[7] == want, "split allreduce: %g, want %g", h[7], want);
  CHECK(dc_comm_destroy(half));
  /* new_group in reverse order, then abort it */
  int32_t ranks[64];
  for (int q = 0; q < nranks; q++) ranks[q] = nranks - 1 - q;
  dc_comm *rev = NULL;
  CHECK(dc_comm_new_group(world, ranks, nranks, &rev));
  CHECK(dc_comm_rank(rev, &hr));
  EXPECT(hr == nranks - 1 - rank, "new_group rank %d", hr);
  int32_t v[4] = {hr, hr, hr, hr};
  void *dv = dcopy(v, sizeof v);
  CHECK(dc_broadcast(dv, 4, DC_INT32, 0, rev));
  d2h(v, dv, sizeof v);
  EXPECT(v[2] == 0, "broadcast from new rank 0: %d", v[2]);
  CHECK(dc_barrier(rev));
  CHECK(dc_comm_abort(rev));
  CHECK_STATUS(dc_allreduce(dv, dv, 4, DC_INT32, DC_SUM, rev), DC_ERR_ABORTED);
  CHECK(dc_comm_destroy(rev));
  dfree(dv);
  dfree(d);
  /* the world is untouched by the child's abort */
  CHECK(dc_barrier(world));
}

/* ---- benchmark --------------------------------------------------------------------------- */

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int bench(void) {
  static const size_t sizes[] = {4096, 65536, 1 << 20, 16 << 20, 64 << 20};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t bytes = sizes[k], count = bytes / 4;
    void *d = dalloc(bytes);
    int iters = bytes >= (16 << 20) ? 20 : 100;
    for (int i = 0; i < 5; i++) {
      dc_status s = dc_allreduce(d, d, count, DC_FLOAT32, DC_SUM, world);
      if (s != DC_SUCCESS) {
        fprintf(stderr, "rank %d: bench allreduce: %s: %s\n", rank, dc_status_name(s), dc_last_error());
        return 1;
      }
    }
    dc_barrier(world);
    double t0 = now_us();
    for (int i = 0; i < iters; i++) dc_allreduce(d, d, count, DC_FLOAT32, DC_SUM, world);
    double us = (now_us() - t0) / iters;
    if (rank == 0) printf("BENCH dc %zu %.1f\n", bytes, us);
    fflush(stdout);
    dfree(d);
  }
  return 0;
}

int main(int argc, char **argv) {
  int bench_mode = argc > 1 && strcmp(argv[1], "--bench") == 0;
  load_cuda();
  int ord = select_device();
  dc_init_options o;
  dc_init_options_default(&o);
  o.backend = "nccl";
  o.timeout_ms = 120000;
  dc_status s = dc_init(&o, &world);
  if (s != DC_SUCCESS) {
    printf("dc_init(backend \"nccl\") failed: %s: %s\n", dc_status_name(s), dc_last_error());
    const char *may = getenv("DC_GPU_CHECK_INIT_MAY_FAIL");
    return may && strcmp(may, "1") == 0 ? 77 : 1;
  }
  dc_comm_rank(world, &rank);
  dc_comm_size(world, &nranks);
  if (nranks > 64) {
    printf("at most 64 ranks\n");
    return 1;
  }
  if (rank == 0) printf("gpu_check: %d rank(s), rank 0 on CUDA device %d, mode %s\n", nranks, ord, bench_mode ? "bench" : "check");
  if (bench_mode) {
    int r = bench();
    dc_comm_destroy(world);
    return r;
  }
  run("backend is nccl", t_backend);
  run("allreduce float32 sum (1000, 1M, in place)", t_allreduce);
  run("allreduce int32 max, int64 min, float64 prod, float32 avg, float16/bfloat16 sum", t_allreduce_dtypes_ops);
  run("broadcast from every root", t_broadcast);
  run("reduce", t_reduce);
  run("allgather (and in place)", t_allgather);
  run("allgatherv", t_allgatherv);
  run("gather and scatter", t_gather_scatter);
  run("reduce_scatter (and in place)", t_reduce_scatter);
  run("alltoall and alltoallv", t_alltoall);
  run("barrier and ibarrier", t_barrier);
  run("non-blocking allreduce, is_completed, wait_all", t_nonblocking);
  run("caller's stream (dc_comm_set_stream)", t_user_stream);
  run("send/recv, isend/irecv, recv_info", t_p2p);
  run("refusals: any-source, bitwise op, mixed memory; host buffers on the NCCL comm", t_refusals);
  run("split, new_group, abort of a child", t_groups);
  s = dc_comm_destroy(world);
  if (s != DC_SUCCESS) {
    printf("rank %d: dc_comm_destroy: %s: %s\n", rank, dc_status_name(s), dc_last_error());
    failed++;
  }
  printf("gpu_check rank %d of %d: %d passed, %d failed\n", rank, nranks, passed, failed);
  return failed ? 1 : 0;
}
