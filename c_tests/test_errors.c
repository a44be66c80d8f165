/* Bad input gets DC_ERR_INVALID_ARGUMENT (or the documented status) with a message, nothing is
 * sent, and the communicator keeps working. */
#include "common.h"

int main(void) {
  int rank, size;
  EXPECT(dc_last_error() != NULL, "dc_last_error returned NULL");
  EXPECT(strcmp(dc_status_name((dc_status)12345), "") != 0, "unknown status has an empty name");

  /* bad init options fail before any rendezvous */
  dc_init_options o;
  dc_init_options_default(&o);
  EXPECT(o.struct_size == sizeof o && o.rank == -1 && o.world_size == -1, "dc_init_options_default");
  dc_comm *c = NULL;
  o.backend = "carrier-pigeon";
  CHECK_STATUS(dc_init(&o, &c), DC_ERR_INVALID_ARGUMENT);
  EXPECT(c == NULL, "out-pointer written on failure");
  dc_init_options_default(&o);
  o.init_method = "udp://nowhere:1";
  CHECK_STATUS(dc_init(&o, &c), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_init(NULL, NULL), DC_ERR_INVALID_ARGUMENT);

  dc_comm *w = test_init(&rank, &size);
  float f[8] = {0}, g[8] = {0};
  int32_t i32[64] = {0};
  dc_request *req = NULL;

  /* NULL comm */
  CHECK_STATUS(dc_comm_rank(NULL, &rank), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_comm_rank(w, NULL), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_barrier(NULL), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_allreduce(f, g, 1, DC_FLOAT32, DC_SUM, NULL), DC_ERR_INVALID_ARGUMENT);
  /* enum values outside the defined set */
  CHECK_STATUS(dc_allreduce(f, g, 1, 10, DC_SUM, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_allreduce(f, g, 1, -1, DC_SUM, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_allreduce(f, g, 1, DC_FLOAT32, 8, w), DC_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(dc_last_error(), "dc_allreduce") != NULL, "message does not name the call: %s", dc_last_error());
  /* bitwise op on a floating dtype */
  CHECK_STATUS(dc_allreduce(f, g, 1, DC_FLOAT32, DC_BXOR, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_reduce_scatter(f, g, 1, DC_BFLOAT16, DC_BAND, w), DC_ERR_INVALID_ARGUMENT);
  /* NULL buffers with a non-zero count, overflowing counts */
  CHECK_STATUS(dc_allreduce(NULL, g, 1, DC_FLOAT32, DC_SUM, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_allreduce(f, NULL, 1, DC_FLOAT32, DC_SUM, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_allreduce(f, g, SIZE_MAX / 4 + 1, DC_FLOAT32, DC_SUM, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_allgather(f, g, SIZE_MAX / 2, DC_FLOAT32, w), DC_ERR_INVALID_ARGUMENT);
  /* partially overlapping buffers */
  CHECK_STATUS(dc_allreduce(f, f + 1, 4, DC_FLOAT32, DC_SUM, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_alltoall(i32, i32, 1, DC_INT32, w), DC_ERR_INVALID_ARGUMENT);
  /* roots outside [0, size) */
  CHECK_STATUS(dc_broadcast(f, 1, DC_FLOAT32, size, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_broadcast(f, 1, DC_FLOAT32, -1, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_reduce(f, g, 1, DC_FLOAT32, DC_SUM, size, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_gather(f, g, 1, DC_FLOAT32, size + 1, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_scatter(f, g, 1, DC_FLOAT32, -2, w), DC_ERR_INVALID_ARGUMENT);
  /* v-forms: NULL arrays, sendcount that disagrees with recvcounts[rank] */
  CHECK_STATUS(dc_allgatherv(f, 1, g, NULL, NULL, DC_FLOAT32, w), DC_ERR_INVALID_ARGUMENT);
  size_t counts[64], displs[64];
  for (int r = 0; r < size && r < 64; r++) { counts[r] = 1; displs[r] = (size_t)r; }
  CHECK_STATUS(dc_allgatherv(f, 2, g, counts, displs, DC_FLOAT32, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_alltoallv(i32, counts, NULL, i32 + 32, counts, displs, DC_INT32, w), DC_ERR_INVALID_ARGUMENT);
  /* non-blocking forms need a request pointer */
  CHECK_STATUS(dc_iallreduce(f, g, 1, DC_FLOAT32, DC_SUM, w, NULL), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_ibarrier(w, NULL), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_request_wait(NULL), DC_ERR_INVALID_ARGUMENT);
  /* streams need the NCCL backend (which "auto" picks on machines with a GPU per rank) */
  const char *be = NULL;
  CHECK(dc_comm_backend(w, &be));
  if (strcmp(be, "nccl") != 0) CHECK_STATUS(dc_comm_set_stream(w, (void *)0x1234), DC_ERR_UNAVAILABLE);
  CHECK(dc_comm_set_stream(w, NULL));
  /* NULL is a no-op where documented */
  CHECK(dc_comm_destroy(NULL));
  CHECK(dc_request_free(NULL));
  const char *backend = NULL;
  CHECK(dc_comm_backend(w, &backend));
  EXPECT(backend && backend[0], "empty backend name");

  /* after all that, the communicator still works */
  for (int i = 0; i < 8; i++) f[i] = (float)rank;
  CHECK(dc_iallreduce(f, g, 8, DC_FLOAT32, DC_SUM, w, &req));
  CHECK(dc_request_wait(req));
  CHECK(dc_request_free(req));
  float want = (float)(size * (size - 1) / 2);
  for (int i = 0; i < 8; i++) EXPECT(g[i] == want, "allreduce after errors: %g", g[i]);

  /* a timeout names the operation: rank 0 waits for a message nobody sends */
  CHECK(dc_comm_set_timeout(w, 300));
  if (rank == 0) {
    CHECK_STATUS(dc_recv(i32, 1, DC_INT32, size - 1, 999, w, NULL), DC_ERR_TIMEOUT);
    EXPECT(strstr(dc_last_error(), "rank") != NULL, "timeout message names no rank: %s", dc_last_error());
  }
  CHECK(dc_comm_set_timeout(w, 0));
  CHECK(dc_barrier(w));
  CHECK(dc_comm_destroy(w));
  if (rank == 0) printf("test_errors: all checks passed on %d ranks\n", size);
  return 0;
}
