/* The calls of a data-parallel step and nothing else: a 16 B and a 1 MiB allreduce and a
 * barrier, a few times, every element checked. The multi-host scale job runs it to count the
 * connections a rank holds afterwards (they are made on demand: only the peers these
 * algorithms use). */
#include "common.h"

#include <distcomm.h>

int main(void) {
  int rank, size;
  dc_comm *world = test_init(&rank, &size);
  const size_t counts[] = {4, 256 * 1024};
  for (int round = 0; round < 3; round++) {
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
      size_t n = counts[k];
      float *buf = xmalloc(n * sizeof(float));
      for (size_t i = 0; i < n; i++) buf[i] = (float)(rank + 1) + (float)(i % 7);
      CHECK(dc_allreduce(buf, buf, n, DC_FLOAT32, DC_SUM, world));
      for (size_t i = 0; i < n; i++) {
        /* Small integers: exact in float32 whatever the order of the sum. */
        double want = (double)size * (size + 1) / 2 + (double)size * (double)(i % 7);
        if (buf[i] != (float)want) FAIL("round %d, count %zu: element %zu is %g, want %g", round, n, i, buf[i], want);
      }
      free(buf);
    }
    CHECK(dc_barrier(world));
  }
  if (rank == 0) printf("allreduce 16 B and 1 MiB and barrier on %d ranks: OK\n", size);
  CHECK(dc_comm_destroy(world));
  return 0;
}
