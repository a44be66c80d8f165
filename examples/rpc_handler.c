/* A tiny parameter server over distcomm RPC.
 *
 * Rank 0 is the worker "server": it holds a weight vector and serves two functions, "pull"
 * (returns the weights) and "push" (applies a gradient). Every other rank is a "trainerN" that
 * pulls the weights, computes the gradient of 0.5 * |w - target|^2, and pushes it, a few times.
 * Handlers run on library threads, several at once, so "push" and "pull" take a small lock.
 *
 *   dcrun -n 4 ./rpc_handler
 */
#include <distcomm.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM 8
#define STEPS 50
#define LR 0.1f

typedef struct {
  float w[DIM];
  int pushes;
  atomic_flag lock;
} server_state;

static void acquire(server_state *s) {
  while (atomic_flag_test_and_set_explicit(&s->lock, memory_order_acquire)) {
  }
}

static void release(server_state *s) { atomic_flag_clear_explicit(&s->lock, memory_order_release); }

/* "pull": no request; the reply is the current weights. */
static dc_status pull(void *userdata, const void *request, size_t request_len, dc_buffer *reply) {
  (void)request, (void)request_len;
  server_state *s = userdata;
  float copy[DIM];
  acquire(s);
  memcpy(copy, s->w, sizeof copy);
  release(s);
  return dc_buffer_set(reply, copy, sizeof copy);
}

/* "push": the request is a gradient of DIM floats; the reply is empty. */
static dc_status push(void *userdata, const void *request, size_t request_len, dc_buffer *reply) {
  server_state *s = userdata;
  if (request_len != sizeof(float) * DIM) {
    const char *msg = "push: expected a gradient of 8 floats";
    dc_buffer_set(reply, msg, strlen(msg)); /* becomes the caller's dc_last_error() */
    return DC_ERR_INVALID_ARGUMENT;
  }
  float g[DIM];
  memcpy(g, request, sizeof g);
  acquire(s);
  for (int i = 0; i < DIM; i++) s->w[i] -= LR * g[i];
  s->pushes++;
  release(s);
  return DC_SUCCESS;
}

#define CHECK(call)                                                                          \
  do {                                                                                       \
    dc_status s_ = (call);                                                                   \
    if (s_ != DC_SUCCESS) {                                                                  \
      fprintf(stderr, "%s failed: %s: %s\n", #call, dc_status_name(s_), dc_last_error()); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

int main(void) {
  const char *env_rank = getenv("RANK");
  int rank = env_rank ? atoi(env_rank) : 0;
  char name[32];
  if (rank == 0) {
    snprintf(name, sizeof name, "server");
  } else {
    snprintf(name, sizeof name, "trainer%d", rank);
  }

  dc_rpc *agent;
  CHECK(dc_rpc_init(name, NULL, &agent)); /* collective: every rank joins */

  if (rank == 0) {
    static server_state state = {.lock = ATOMIC_FLAG_INIT};
    CHECK(dc_rpc_register(agent, "pull", pull, &state));
    CHECK(dc_rpc_register(agent, "push", push, &state));
    size_t n = 0;
    CHECK(dc_rpc_all_worker_infos(agent, NULL, 0, &n));
    printf("server: serving %zu trainer(s)\n", n - 1);
    /* Shutdown is collective: it returns once every trainer is done and has called it too. */
    CHECK(dc_rpc_shutdown(agent));
    printf("server: %d pushes, w[0] = %.4f\n", state.pushes, state.w[0]);
    return 0;
  }

  float target[DIM];
  for (int i = 0; i < DIM; i++) target[i] = 1.0f + (float)i;
  float w[DIM];
  for (int step = 0; step < STEPS; step++) {
    dc_buffer *reply;
    CHECK(dc_rpc_call(agent, "server", "pull", NULL, 0, 0, &reply));
    memcpy(w, dc_buffer_data(reply), sizeof w);
    dc_buffer_free(reply);
    float grad[DIM];
    for (int i = 0; i < DIM; i++) grad[i] = w[i] - target[i];
    dc_request *req; /* the push runs while we compute the loss */
    CHECK(dc_rpc_call_async(agent, "server", "push", grad, sizeof grad, 0, &req));
    float loss = 0;
    for (int i = 0; i < DIM; i++) loss += 0.5f * grad[i] * grad[i];
    CHECK(dc_request_wait(req));
    dc_request_free(req);
    if (step % 10 == 0 || step == STEPS - 1) printf("%s: step %2d loss %.5f\n", name, step, loss);
  }

  /* A failing handler's text comes back as dc_last_error(). */
  dc_status s = dc_rpc_call(agent, "server", "push", "x", 1, 0, NULL);
  printf("%s: bad push -> %s (%s)\n", name, dc_status_name(s), dc_last_error());

  CHECK(dc_rpc_shutdown(agent));
  return 0;
}
