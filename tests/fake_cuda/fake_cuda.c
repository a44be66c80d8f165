/* A stand-in for libcuda.so.1 (-DFAKE_CUDA) and libnccl.so.2 (-DFAKE_NCCL), for tests on machines
 * without a GPU (tests/nccl_fake.rs). "Device memory" is host memory that cuMemAlloc_v2 hands out
 * and cuPointerGetAttribute recognises; NCCL ranks are threads of one process that meet in
 * process memory. Operations run synchronously when called; events report "not ready" once
 * before they report completion, so pollers are exercised. Only what distcomm calls exists. */

#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

#ifdef FAKE_CUDA
/* ---------------------------------------------------------------- CUDA driver ---------- */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { char *base; size_t len; } allocs[4096];
static int nallocs;
static __thread void *current_ctx;
static char primary_ctx[4];

EXPORT CUresult cuInit(unsigned flags) { (void)flags; return 0; }
EXPORT CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
EXPORT CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
EXPORT CUresult cuDeviceGet(int *dev, int ord) { if (ord != 0) return 101; *dev = 0; return 0; }
EXPORT CUresult cuDeviceGetPCIBusId(char *s, int len, int dev) { (void)dev; snprintf(s, (size_t)len, "0000:00:00.0"); return 0; }
EXPORT CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = &primary_ctx[dev]; return 0; }
EXPORT CUresult cuCtxGetCurrent(void **ctx) { *ctx = current_ctx; return 0; }
EXPORT CUresult cuCtxSetCurrent(void *ctx) { current_ctx = ctx; return 0; }
EXPORT CUresult cuCtxGetDevice(int *dev) { if (!current_ctx) return 201; *dev = 0; return 0; }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  char *m = calloc(1, n ? n : 1);
  pthread_mutex_lock(&mem_lock);
  allocs[nallocs].base = m;
  allocs[nallocs].len = n ? n : 1;
  nallocs++;
  pthread_mutex_unlock(&mem_lock);
  *p = (CUdeviceptr)(uintptr_t)m;
  return 0;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  pthread_mutex_lock(&mem_lock);
  for (int i = 0; i < nallocs; i++)
    if (allocs[i].base == (char *)(uintptr_t)p) {
      allocs[i] = allocs[--nallocs];
      break;
    }
  pthread_mutex_unlock(&mem_lock);
  free((void *)(uintptr_t)p);
  return 0;
}
/* CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2) -> CU_MEMORYTYPE_DEVICE (2); unknown: CUDA_ERROR_INVALID_VALUE */
/* MEMORY_TYPE (2), DEVICE_ORDINAL (9), RANGE_START_ADDR (11) and RANGE_SIZE (12). */
EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr) {
  char *p = (char *)(uintptr_t)ptr;
  int found = -1;
  pthread_mutex_lock(&mem_lock);
  for (int i = 0; i < nallocs; i++)
    if (p >= allocs[i].base && p < allocs[i].base + allocs[i].len) found = i;
  pthread_mutex_unlock(&mem_lock);
  if (found < 0) return 1;
  switch (attr) {
    case 2: *(unsigned *)data = 2; return 0;
    case 9: *(int *)data = 0; return 0;
    case 11: *(CUdeviceptr *)data = (CUdeviceptr)(uintptr_t)allocs[found].base; return 0;
    case 12: *(size_t *)data = allocs[found].len; return 0;
    default: return 1;
  }
}
EXPORT CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = malloc(8); return 0; }
EXPORT CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
EXPORT CUresult cuStreamQuery(void *s) { (void)s; return 0; }
EXPORT CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(int)); return 0; }
EXPORT CUresult cuEventRecord(void *e, void *s) { (void)s; *(int *)e = 1; return 0; }
/* Not ready once, then complete. */
EXPORT CUresult cuEventQuery(void *e) { return __sync_fetch_and_sub((int *)e, 1) > 0 ? 600 : 0; }
EXPORT CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
EXPORT CUresult cuGetErrorName(CUresult r, const char **s) { (void)r; *s = "CUDA_ERROR_FAKE"; return 0; }
EXPORT CUresult cuGetErrorString(CUresult r, const char **s) { (void)r; *s = "fake driver error"; return 0; }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) {
  (void)st;
  memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
  return 0;
}
#endif

#ifdef FAKE_NCCL
/* ---------------------------------------------------------------- NCCL ------------------ */
typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;

#define MAXR 16
typedef struct group {
  char id[128];
  int n, joined;
  pthread_mutex_t m;
  pthread_cond_t cv;
  /* collective rendezvous: generation counting barrier and per-rank staging */
  int arrived;
  long gen;
  void *stage[MAXR];
  size_t stage_len[MAXR];
  int split_color[MAXR], split_key[MAXR];
  long splits;
  /* mailboxes: queue of messages from -> to */
  struct msg { char *data; size_t len; struct msg *next; } *box[MAXR][MAXR];
  struct group *next;
} group;

typedef struct comm { group *g; int rank; } comm;

static pthread_mutex_t groups_lock = PTHREAD_MUTEX_INITIALIZER;
static group *groups;
static long id_counter;

EXPORT ncclResult_t ncclGetVersion(int *v) { *v = 22600; return 0; }
EXPORT const char *ncclGetErrorString(ncclResult_t r) { return r == 0 ? "no error" : "fake NCCL error"; }
EXPORT const char *ncclGetLastError(comm *c) { (void)c; return "fake NCCL last error"; }
EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fake-%d-%ld", (int)getpid(), __sync_add_and_fetch(&id_counter, 1));
  return 0;
}

static group *find_group(const char *id, int n) {
  pthread_mutex_lock(&groups_lock);
  group *g = groups;
  while (g && memcmp(g->id, id, 128) != 0) g = g->next;
  if (!g) {
    g = calloc(1, sizeof *g);
    memcpy(g->id, id, 128);
    g->n = n;
    pthread_mutex_init(&g->m, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->next = groups;
    groups = g;
  }
  pthread_mutex_unlock(&groups_lock);
  return g;
}

static void barrier(group *g) {
  pthread_mutex_lock(&g->m);
  long gen = g->gen;
  if (++g->arrived == g->n) {
    g->arrived = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
  } else {
    while (g->gen == gen) pthread_cond_wait(&g->cv, &g->m);
  }
  pthread_mutex_unlock(&g->m);
}

static comm *join(const char *id, int n, int rank) {
  if (n < 1 || n > MAXR || rank < 0 || rank >= n) return NULL;
  group *g = find_group(id, n);
  comm *c = calloc(1, sizeof *c);
  c->g = g;
  c->rank = rank;
  barrier(g); /* everyone has joined */
  return c;
}

EXPORT ncclResult_t ncclCommInitRank(comm **out, int n, ncclUniqueId id, int rank) {
  comm *c = join(id.internal, n, rank);
  if (!c) return 4;
  *out = c;
  return 0;
}
EXPORT ncclResult_t ncclCommSplit(comm *c, int color, int key, comm **out, void *config) {
  (void)config;
  group *g = c->g;
  g->split_color[c->rank] = color;
  g->split_key[c->rank] = key;
  barrier(g);
  long seq = g->splits;
  int members = 0, me = -1;
  for (int r = 0; r < g->n; r++) {
    if (color < 0 || g->split_color[r] != color) continue;
    int before = 0;
    for (int q = 0; q < g->n; q++)
      if (g->split_color[q] == color && (g->split_key[q] < g->split_key[r] || (g->split_key[q] == g->split_key[r] && q < r))) before++;
    if (r == c->rank) me = before;
    members++;
  }
  barrier(g);
  if (c->rank == 0) g->splits++;
  barrier(g);
  if (color < 0) {
    *out = NULL;
    return 0;
  }
  char id[128] = {0};
  snprintf(id, sizeof id, "%.80s/split%ld/%d", g->id, seq, color);
  *out = join(id, members, me);
  return *out ? 0 : 4;
}
EXPORT ncclResult_t ncclCommAbort(comm *c) { free(c); return 0; }
EXPORT ncclResult_t ncclCommDestroy(comm *c) { free(c); return 0; }
EXPORT ncclResult_t ncclCommGetAsyncError(comm *c, ncclResult_t *e) { (void)c; *e = 0; return 0; }

static size_t tsize(int dt) {
  switch (dt) {
    case 0: case 1: return 1;
    case 2: case 3: case 7: return 4;
    case 4: case 5: case 8: return 8;
    default: return 0; /* float16/bfloat16: not in the fake */
  }
}

#define RED(T)                                                                 \
  {                                                                            \
    T *o = (T *)out;                                                           \
    for (size_t i = 0; i < count; i++) {                                       \
      T acc = ((T *)ins[0])[off + i];                                          \
      for (int r = 1; r < n; r++) {                                            \
        T v = ((T *)ins[r])[off + i];                                          \
        switch (op) {                                                          \
          case 0: case 4: acc = (T)(acc + v); break;                           \
          case 1: acc = (T)(acc * v); break;                                   \
          case 2: acc = v > acc ? v : acc; break;                              \
          case 3: acc = v < acc ? v : acc; break;                              \
        }                                                                      \
      }                                                                        \
      if (op == 4) acc = (T)(acc / (T)n);                                      \
      o[i] = acc;                                                              \
    }                                                                          \
  }

static void reduce_into(void *out, void **ins, int n, size_t off, size_t count, int dt, int op) {
  switch (dt) {
    case 0: RED(int8_t) break;
    case 1: RED(uint8_t) break;
    case 2: RED(int32_t) break;
    case 3: RED(uint32_t) break;
    case 4: RED(int64_t) break;
    case 5: RED(uint64_t) break;
    case 7: RED(float) break;
    case 8: RED(double) break;
  }
}

/* Every rank stages a copy of `bytes` at `src`, all meet, `f` runs, all meet again. */
static void stage(comm *c, const void *src, size_t bytes) {
  group *g = c->g;
  g->stage[c->rank] = malloc(bytes ? bytes : 1);
  if (bytes) memcpy(g->stage[c->rank], src, bytes);
  g->stage_len[c->rank] = bytes;
  barrier(g);
}
static void unstage(comm *c) {
  barrier(c->g);
  free(c->g->stage[c->rank]);
}

EXPORT ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, int dt, int op, comm *c, void *st) {
  (void)st;
  if (!tsize(dt)) return 4;
  stage(c, s, count * tsize(dt));
  reduce_into(r, c->g->stage, c->g->n, 0, count, dt, op);
  unstage(c);
  return 0;
}
EXPORT ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, int dt, int root, comm *c, void *st) {
  (void)st;
  size_t b = count * tsize(dt);
  stage(c, c->rank == root ? s : NULL, c->rank == root ? b : 0);
  memcpy(r, c->g->stage[root], b);
  unstage(c);
  return 0;
}
EXPORT ncclResult_t ncclReduce(const void *s, void *r, size_t count, int dt, int op, int root, comm *c, void *st) {
  (void)st;
  if (!tsize(dt)) return 4;
  stage(c, s, count * tsize(dt));
  if (c->rank == root) reduce_into(r, c->g->stage, c->g->n, 0, count, dt, op);
  unstage(c);
  return 0;
}
EXPORT ncclResult_t ncclAllGather(const void *s, void *r, size_t count, int dt, comm *c, void *st) {
  (void)st;
  size_t b = count * tsize(dt);
  stage(c, s, b);
  for (int q = 0; q < c->g->n; q++) memcpy((char *)r + (size_t)q * b, c->g->stage[q], b);
  unstage(c);
  return 0;
}
EXPORT ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, int dt, int op, comm *c, void *st) {
  (void)st;
  if (!tsize(dt)) return 4;
  stage(c, s, count * tsize(dt) * (size_t)c->g->n);
  reduce_into(r, c->g->stage, c->g->n, (size_t)c->rank * count, count, dt, op);
  unstage(c);
  return 0;
}

/* point to point: grouped ops run at ncclGroupEnd, sends first */
typedef struct op { int send; void *buf; size_t bytes; int peer; comm *c; } op;
static __thread int depth;
static __thread op ops[256];
static __thread int nops;

static void do_send(op *o) {
  group *g = o->c->g;
  struct msg *m = calloc(1, sizeof *m);
  m->data = malloc(o->bytes ? o->bytes : 1);
  memcpy(m->data, o->buf, o->bytes);
  m->len = o->bytes;
  pthread_mutex_lock(&g->m);
  struct msg **q = &g->box[o->c->rank][o->peer];
  while (*q) q = &(*q)->next;
  *q = m;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->m);
}
static int do_recv(op *o) {
  group *g = o->c->g;
  pthread_mutex_lock(&g->m);
  while (!g->box[o->peer][o->c->rank]) pthread_cond_wait(&g->cv, &g->m);
  struct msg *m = g->box[o->peer][o->c->rank];
  g->box[o->peer][o->c->rank] = m->next;
  pthread_mutex_unlock(&g->m);
  int bad = m->len != o->bytes;
  if (!bad) memcpy(o->buf, m->data, m->len);
  free(m->data);
  free(m);
  return bad ? 5 : 0;
}
static ncclResult_t run_ops(void) {
  ncclResult_t r = 0;
  for (int i = 0; i < nops; i++)
    if (ops[i].send) do_send(&ops[i]);
  for (int i = 0; i < nops; i++)
    if (!ops[i].send && do_recv(&ops[i])) r = 5;
  nops = 0;
  return r;
}
static ncclResult_t add_op(int send, void *buf, size_t count, int dt, int peer, comm *c) {
  if (nops == 256) return 5;
  ops[nops++] = (op){send, buf, count * tsize(dt), peer, c};
  return depth ? 0 : run_ops();
}
EXPORT ncclResult_t ncclSend(const void *b, size_t count, int dt, int peer, comm *c, void *st) {
  (void)st;
  return add_op(1, (void *)b, count, dt, peer, c);
}
EXPORT ncclResult_t ncclRecv(void *b, size_t count, int dt, int peer, comm *c, void *st) {
  (void)st;
  return add_op(0, b, count, dt, peer, c);
}
EXPORT ncclResult_t ncclGroupStart(void) { depth++; return 0; }
EXPORT ncclResult_t ncclGroupEnd(void) { return --depth == 0 ? run_ops() : 0; }
#endif
