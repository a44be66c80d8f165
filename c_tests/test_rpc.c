/* RPC: named workers calling each other (sync, async, nested), failing and unknown handlers,
 * unknown workers, timeouts, worker infos, buffers, and a collective shutdown. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"
#include <time.h>

typedef struct {
  dc_rpc *agent;
  int rank, size;
} worker_ctx;

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static dc_status set_text(dc_buffer *reply, const char *text) {
  return dc_buffer_set(reply, text, strlen(text));
}

static dc_status h_echo(void *ud, const void *req, size_t len, dc_buffer *reply) {
  (void)ud;
  return dc_buffer_set(reply, req, len);
}

static dc_status h_square(void *ud, const void *req, size_t len, dc_buffer *reply) {
  (void)ud;
  if (len != sizeof(int64_t)) {
    set_text(reply, "square wants 8 bytes");
    return DC_ERR_INVALID_ARGUMENT;
  }
  int64_t v;
  memcpy(&v, req, sizeof v);
  v *= v;
  return dc_buffer_set(reply, &v, sizeof v);
}

static dc_status h_fail(void *ud, const void *req, size_t len, dc_buffer *reply) {
  (void)ud, (void)req, (void)len;
  set_text(reply, "custom failure text 17");
  return DC_ERR_INTERNAL;
}

/* A status outside dc_status: still just a failure. */
static dc_status h_weird(void *ud, const void *req, size_t len, dc_buffer *reply) {
  (void)ud, (void)req, (void)len, (void)reply;
  return (dc_status)1234;
}

/* Nested: asks the next worker to echo, returns its answer. */
static dc_status h_relay(void *ud, const void *req, size_t len, dc_buffer *reply) {
  worker_ctx *c = ud;
  char next[16];
  snprintf(next, sizeof next, "w%d", (c->rank + 1) % c->size);
  dc_buffer *r = NULL;
  dc_status s = dc_rpc_call(c->agent, next, "echo", req, len, 0, &r);
  if (s != DC_SUCCESS) {
    set_text(reply, dc_last_error());
    return s;
  }
  s = dc_buffer_set(reply, dc_buffer_data(r), dc_buffer_len(r));
  dc_buffer_free(r);
  return s;
}

static dc_status h_slow(void *ud, const void *req, size_t len, dc_buffer *reply) {
  (void)ud, (void)req, (void)len;
  sleep_ms(600);
  return set_text(reply, "late");
}

/* The reply buffer is lent: freeing it is refused. */
static dc_status h_free_reply(void *ud, const void *req, size_t len, dc_buffer *reply) {
  (void)ud, (void)req, (void)len;
  return dc_buffer_free(reply) == DC_ERR_INVALID_USAGE ? set_text(reply, "kept") : DC_ERR_INTERNAL;
}

static void expect_reply(dc_buffer *r, const void *want, size_t len, const char *what) {
  EXPECT(dc_buffer_len(r) == len, "%s: reply of %zu bytes, want %zu", what, dc_buffer_len(r), len);
  EXPECT(len == 0 || memcmp(dc_buffer_data(r), want, len) == 0, "%s: wrong reply bytes", what);
  EXPECT(dc_buffer_data(r) != NULL, "%s: dc_buffer_data is NULL", what);
}

int main(void) {
  const char *env_rank = getenv("RANK");
  int rank = env_rank ? atoi(env_rank) : 0;
  dc_test_rank = rank;
  char name[16];
  snprintf(name, sizeof name, "w%d", rank);

  worker_ctx ctx = {NULL, rank, 0};
  CHECK(dc_rpc_init(name, NULL, &ctx.agent));
  dc_rpc *a = ctx.agent;
  CHECK(dc_rpc_register(a, "echo", h_echo, NULL));
  CHECK(dc_rpc_register(a, "square", h_square, NULL));
  CHECK(dc_rpc_register(a, "fail", h_fail, NULL));
  CHECK(dc_rpc_register(a, "weird", h_weird, NULL));
  CHECK(dc_rpc_register(a, "relay", h_relay, &ctx));
  CHECK(dc_rpc_register(a, "slow", h_slow, NULL));
  CHECK(dc_rpc_register(a, "free_reply", h_free_reply, NULL));
  CHECK_STATUS(dc_rpc_register(a, "x", NULL, NULL), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_rpc_register(a, "", h_echo, NULL), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_rpc_register(NULL, "x", h_echo, NULL), DC_ERR_INVALID_ARGUMENT);

  /* Worker infos. */
  size_t count = 0;
  CHECK(dc_rpc_all_worker_infos(a, NULL, 0, &count));
  int size = (int)count;
  ctx.size = size;
  dc_worker_info *infos = xmalloc(count * sizeof *infos);
  CHECK(dc_rpc_all_worker_infos(a, infos, count, &count));
  EXPECT(count == (size_t)size, "count changed: %zu", count);
  for (int i = 0; i < size; i++) {
    char want[16];
    snprintf(want, sizeof want, "w%d", i);
    EXPECT(strcmp(infos[i].name, want) == 0 && infos[i].rank == i, "info %d: %s rank %d", i, infos[i].name, infos[i].rank);
    EXPECT(infos[i].host[0] != '\0' && infos[i].port > 0, "info %d: host '%s' port %u", i, infos[i].host, infos[i].port);
  }
  dc_worker_info one[1];
  CHECK(dc_rpc_all_worker_infos(a, one, 1, &count));
  EXPECT(count == (size_t)size && strcmp(one[0].name, "w0") == 0, "capacity 1: count %zu", count);
  dc_worker_info me;
  CHECK(dc_rpc_worker_info(a, NULL, &me));
  EXPECT(strcmp(me.name, name) == 0 && me.rank == rank, "self: %s %d", me.name, me.rank);
  CHECK(dc_rpc_worker_info(a, "w0", &me));
  EXPECT(me.rank == 0, "w0 has rank %d", me.rank);
  CHECK_STATUS(dc_rpc_worker_info(a, "nobody", &me), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_rpc_worker_info(a, NULL, NULL), DC_ERR_INVALID_ARGUMENT);

  /* Synchronous calls to every worker, this one included. */
  uint8_t *payload = xmalloc(5000);
  for (int i = 0; i < 5000; i++) payload[i] = (uint8_t)(i * 31 + rank);
  for (int j = 0; j < size; j++) {
    char to[16];
    snprintf(to, sizeof to, "w%d", j);
    for (int i = 0; i < 20; i++) {
      size_t len = (size_t)(i * 250);
      dc_buffer *r = NULL;
      CHECK(dc_rpc_call(a, to, "echo", i ? payload : NULL, len, 0, &r));
      expect_reply(r, payload, len, "echo");
      CHECK(dc_buffer_free(r));
      int64_t v = rank * 1000 + i, sq = v * v;
      CHECK(dc_rpc_call(a, to, "square", &v, sizeof v, 0, &r));
      expect_reply(r, &sq, sizeof sq, "square");
      CHECK(dc_buffer_free(r));
      CHECK(dc_rpc_call(a, to, "relay", payload, 64 + (size_t)i, 0, &r));
      expect_reply(r, payload, 64 + (size_t)i, "relay");
      CHECK(dc_buffer_free(r));
    }
    CHECK(dc_rpc_call(a, to, "echo", "x", 1, 0, NULL)); /* reply discarded */
  }

  /* Asynchronous calls, all in flight at once. */
  enum { PER = 8 };
  dc_request **reqs = xmalloc((size_t)size * PER * sizeof *reqs);
  int64_t *vals = xmalloc((size_t)size * PER * sizeof *vals);
  for (int j = 0; j < size; j++) {
    char to[16];
    snprintf(to, sizeof to, "w%d", j);
    for (int i = 0; i < PER; i++) {
      int k = j * PER + i;
      vals[k] = rank * 100000 + k;
      CHECK(dc_rpc_call_async(a, to, i % 2 ? "relay" : "square", &vals[k], sizeof vals[k], 0, &reqs[k]));
    }
  }
  vals[0] = -1; /* the request was copied: changing it now changes nothing */
  CHECK(dc_request_wait_all((size_t)size * PER, reqs));
  for (int k = 0; k < size * PER; k++) {
    bool done = false;
    CHECK(dc_request_is_completed(reqs[k], &done));
    EXPECT(done, "request %d not completed after wait_all", k);
    int64_t v = rank * 100000 + k, want = (k % PER) % 2 ? v : v * v;
    dc_buffer *r = NULL;
    CHECK(dc_request_take_reply(reqs[k], &r));
    expect_reply(r, &want, sizeof want, "async");
    CHECK(dc_buffer_free(r));
    CHECK_STATUS(dc_request_take_reply(reqs[k], &r), DC_ERR_INVALID_USAGE);
    CHECK(dc_request_free(reqs[k]));
  }

  /* Failures. */
  char next[16];
  snprintf(next, sizeof next, "w%d", (rank + 1) % size);
  dc_buffer *r = NULL;
  CHECK_STATUS(dc_rpc_call(a, next, "fail", NULL, 0, 0, &r), DC_ERR_REMOTE);
  EXPECT(strstr(dc_last_error(), "custom failure text 17") != NULL, "remote text missing: %s", dc_last_error());
  EXPECT(r == NULL, "reply set on failure");
  CHECK_STATUS(dc_rpc_call(a, next, "weird", NULL, 0, 0, &r), DC_ERR_REMOTE);
  CHECK_STATUS(dc_rpc_call(a, next, "square", "abc", 3, 0, &r), DC_ERR_REMOTE);
  EXPECT(strstr(dc_last_error(), "square wants 8 bytes") != NULL, "remote text missing: %s", dc_last_error());
  CHECK_STATUS(dc_rpc_call(a, next, "no_such_function", NULL, 0, 0, &r), DC_ERR_REMOTE);
  EXPECT(strstr(dc_last_error(), "no_such_function") != NULL, "unknown function not named: %s", dc_last_error());
  CHECK_STATUS(dc_rpc_call(a, "ghost", "echo", NULL, 0, 0, &r), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_rpc_call(a, NULL, "echo", NULL, 0, 0, &r), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_rpc_call(a, next, "echo", NULL, 5, 0, &r), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_rpc_call(NULL, next, "echo", NULL, 0, 0, &r), DC_ERR_INVALID_ARGUMENT);
  dc_request *rq = NULL;
  CHECK(dc_rpc_call_async(a, next, "fail", NULL, 0, 0, &rq));
  CHECK_STATUS(dc_request_wait(rq), DC_ERR_REMOTE);
  CHECK_STATUS(dc_request_take_reply(rq, &r), DC_ERR_REMOTE);
  CHECK(dc_request_free(rq));
  CHECK(dc_rpc_call(a, next, "free_reply", NULL, 0, 0, &r));
  expect_reply(r, "kept", 4, "free_reply");
  CHECK(dc_buffer_free(r));

  /* Buffers. */
  CHECK(dc_buffer_free(NULL));
  EXPECT(dc_buffer_data(NULL) == NULL && dc_buffer_len(NULL) == 0, "NULL buffer");
  CHECK_STATUS(dc_buffer_set(NULL, "x", 1), DC_ERR_INVALID_ARGUMENT);

  /* A timeout leaves the agent usable; the late reply goes nowhere. */
  CHECK_STATUS(dc_rpc_call(a, next, "slow", NULL, 0, 100, &r), DC_ERR_TIMEOUT);
  CHECK(dc_rpc_call(a, next, "echo", "ok", 2, 0, &r));
  expect_reply(r, "ok", 2, "echo after timeout");
  CHECK(dc_buffer_free(r));

  CHECK(dc_rpc_shutdown(a));
  free(payload);
  free(reqs);
  free(vals);
  free(infos);
  printf("rank %d of %d: rpc ok\n", rank, size);
  return 0;
}
