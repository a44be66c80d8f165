/* Data-parallel linear regression by full-batch gradient descent.
 *
 * Every rank owns a shard of one synthetic dataset, computes the gradient of the squared error on
 * its shard, and dc_allreduce sums the shards' gradients, so each step equals one step of a single
 * process on the whole batch. At the end every rank checks that its weights are identical to the
 * other ranks' and match a single-process run on the whole dataset.
 *
 * Run: dcrun -n 4 ./train_linear */
#include <distcomm.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SAMPLES 4096
#define N_FEATURES 8
#define STEPS 200
#define LEARNING_RATE 0.05

#define CHECK(call)                                                                    \
  do {                                                                                 \
    dc_status s_ = (call);                                                             \
    if (s_ != DC_SUCCESS) {                                                            \
      fprintf(stderr, "%s failed: %s: %s\n", #call, dc_status_name(s_), dc_last_error()); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

/* A deterministic dataset: y = x . w_true + small noise, the same on every rank. */
static void sample(int i, double x[N_FEATURES], double *y) {
  unsigned s = 2654435761u * (unsigned)(i + 1);
  double dot = 0;
  for (int j = 0; j < N_FEATURES; j++) {
    s = s * 1103515245u + 12345u;
    x[j] = ((s >> 8) % 2000) / 1000.0 - 1.0;
    dot += x[j] * (j + 1) * 0.5; /* w_true[j] = (j + 1) / 2 */
  }
  s = s * 1103515245u + 12345u;
  *y = dot + (((s >> 8) % 1000) / 1000.0 - 0.5) * 0.01;
}

/* Sum over samples [lo, hi) of the squared-error gradient and loss. */
static void shard_gradient(int lo, int hi, const double w[N_FEATURES], double grad_loss[N_FEATURES + 1]) {
  memset(grad_loss, 0, sizeof(double) * (N_FEATURES + 1));
  for (int i = lo; i < hi; i++) {
    double x[N_FEATURES], y, pred = 0;
    sample(i, x, &y);
    for (int j = 0; j < N_FEATURES; j++) pred += x[j] * w[j];
    double err = pred - y;
    for (int j = 0; j < N_FEATURES; j++) grad_loss[j] += 2 * err * x[j];
    grad_loss[N_FEATURES] += err * err;
  }
}

static void step(double w[N_FEATURES], const double total[N_FEATURES + 1]) {
  for (int j = 0; j < N_FEATURES; j++) w[j] -= LEARNING_RATE * total[j] / N_SAMPLES;
}

int main(void) {
  dc_comm *world;
  int rank, size;
  CHECK(dc_init(NULL, &world));
  CHECK(dc_comm_rank(world, &rank));
  CHECK(dc_comm_size(world, &size));

  int lo = (int)((long)N_SAMPLES * rank / size), hi = (int)((long)N_SAMPLES * (rank + 1) / size);
  double w[N_FEATURES] = {0}, local[N_FEATURES + 1], total[N_FEATURES + 1];
  for (int t = 0; t < STEPS; t++) {
    shard_gradient(lo, hi, w, local);
    CHECK(dc_allreduce(local, total, N_FEATURES + 1, DC_FLOAT64, DC_SUM, world));
    step(w, total);
    if (rank == 0 && (t % 20 == 0 || t == STEPS - 1)) printf("step %3d  loss %.6f\n", t, total[N_FEATURES] / N_SAMPLES);
  }

  /* Every rank holds the same bytes... */
  double *all = malloc(sizeof(double) * N_FEATURES * (size_t)size);
  CHECK(dc_allgather(w, all, N_FEATURES, DC_FLOAT64, world));
  int ok = 1;
  for (int r = 0; r < size; r++) ok &= memcmp(all + r * N_FEATURES, w, sizeof w) == 0;
  /* ...and the same weights as one process training on the whole batch. */
  double ref[N_FEATURES] = {0}, g[N_FEATURES + 1];
  for (int t = 0; t < STEPS; t++) {
    shard_gradient(0, N_SAMPLES, ref, g);
    step(ref, g);
  }
  double worst = 0;
  for (int j = 0; j < N_FEATURES; j++) worst = fmax(worst, fabs(w[j] - ref[j]));
  ok &= worst < 1e-9;
  if (rank == 0) {
    printf("weights:");
    for (int j = 0; j < N_FEATURES; j++) printf(" %.4f", w[j]);
    printf("\nranks agree: %s; max difference to single-process training: %.2e\n", ok ? "yes" : "NO", worst);
  }
  free(all);
  CHECK(dc_comm_destroy(world));
  return ok ? 0 : 1;
}
