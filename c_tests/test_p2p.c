/* Point-to-point: tags, per-pair-and-tag ordering, wildcards, truncation, short messages,
 * non-blocking requests, self-sends, and argument errors. */
#include "common.h"

int main(void) {
  int rank, size;
  dc_comm *w = test_init(&rank, &size);
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;

  /* Ordering: 200 messages on one pair and tag arrive in the order sent. */
  for (int i = 0; i < 200; i++) {
    int32_t v = rank * 1000 + i, got = -1;
    dc_request *rq;
    CHECK(dc_isend(&v, 1, DC_INT32, next, 7, w, &rq));
    dc_recv_info info;
    CHECK(dc_recv(&got, 1, DC_INT32, prev, 7, w, &info));
    EXPECT(got == prev * 1000 + i, "message %d from %d arrived out of order: %d", i, prev, got);
    EXPECT(info.source == prev && info.tag == 7 && info.count == 1, "recv_info %d %d %zu", info.source, info.tag, info.count);
    CHECK(dc_request_wait(rq));
    CHECK(dc_request_free(rq));
  }

  /* Tags select: receive tag 2 before tag 1 although tag 1 was sent first. */
  {
    int64_t a = 11, b = 22, x = 0, y = 0;
    dc_request *r1, *r2;
    CHECK(dc_isend(&a, 1, DC_INT64, next, 1, w, &r1));
    CHECK(dc_isend(&b, 1, DC_INT64, next, 2, w, &r2));
    CHECK(dc_recv(&y, 1, DC_INT64, prev, 2, w, NULL));
    CHECK(dc_recv(&x, 1, DC_INT64, prev, 1, w, NULL));
    EXPECT(x == 11 && y == 22, "tag matching: x=%lld y=%lld", (long long)x, (long long)y);
    dc_request *both[2] = {r1, r2};
    CHECK(dc_request_wait_all(2, both));
    CHECK(dc_request_free(r1));
    CHECK(dc_request_free(r2));
  }

  /* DC_ANY_SOURCE and DC_ANY_TAG: rank 0 hears from everyone once. */
  if (rank == 0) {
    int *seen = calloc((size_t)size, sizeof(int));
    for (int i = 1; i < size; i++) {
      int32_t v;
      dc_recv_info info;
      CHECK(dc_recv(&v, 1, DC_INT32, DC_ANY_SOURCE, DC_ANY_TAG, w, &info));
      EXPECT(info.source >= 1 && info.source < size && v == info.source * 3 && info.tag == 100 + info.source,
             "any-source: v=%d source=%d tag=%d", v, info.source, info.tag);
      EXPECT(!seen[info.source]++, "heard twice from %d", info.source);
    }
    free(seen);
  } else {
    int32_t v = rank * 3;
    CHECK(dc_send(&v, 1, DC_INT32, 0, 100 + rank, w));
  }

  CHECK(dc_barrier(w)); /* nothing else may match rank 0's wildcard receives */

  /* Truncation and short messages between ranks 0 and 1 (a job of one rank has no rank 1). */
  if (size > 1 && rank == 1) {
    int32_t ten[10];
    for (int i = 0; i < 10; i++) ten[i] = i + 1;
    CHECK(dc_send(ten, 10, DC_INT32, 0, 5, w));
    CHECK(dc_send(ten, 3, DC_INT32, 0, 6, w));
  } else if (size > 1 && rank == 0) {
    int32_t buf[10];
    for (int i = 0; i < 10; i++) buf[i] = -1;
    CHECK_STATUS(dc_recv(buf, 5, DC_INT32, 1, 5, w, NULL), DC_ERR_INVALID_ARGUMENT);
    for (int i = 5; i < 10; i++) EXPECT(buf[i] == -1, "truncated receive wrote past count at %d", i);
    dc_recv_info info;
    CHECK(dc_recv(buf, 10, DC_INT32, 1, 6, w, &info));
    EXPECT(info.count == 3 && buf[2] == 3, "short message: count %zu", info.count);
  }

  /* A large non-blocking exchange that progresses while the caller computes. */
  {
    size_t n = 4u << 20;
    uint8_t *out = xmalloc(n), *in = xmalloc(n);
    for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(i * 7 + (size_t)rank);
    dc_request *rr, *rs;
    CHECK(dc_irecv(in, n, DC_UINT8, prev, 9, w, &rr));
    CHECK(dc_isend(out, n, DC_UINT8, next, 9, w, &rs));
    volatile double sink = 0;
    for (int i = 0; i < 1000000; i++) sink += i;
    CHECK(dc_request_wait(rr));
    dc_recv_info info;
    CHECK(dc_request_recv_info(rr, &info));
    EXPECT(info.source == prev && info.tag == 9 && info.count == n, "irecv info %d %d %zu", info.source, info.tag, info.count);
    for (size_t i = 0; i < n; i += 4099) EXPECT(in[i] == (uint8_t)(i * 7 + (size_t)prev), "large message byte %zu", i);
    CHECK_STATUS(dc_request_recv_info(rs, &info), DC_ERR_INVALID_USAGE);
    CHECK(dc_request_free(rs));
    CHECK(dc_request_free(rr));
    free(out);
    free(in);
  }

  /* dc_sendrecv around the ring: small and large (a large send that waited for its receiver
   * before the receive was started would deadlock every rank), and to oneself. */
  for (int round = 0; round < 50; round++) {
    int64_t v = rank * 100 + round, got = -1;
    dc_recv_info info;
    CHECK(dc_sendrecv(&v, 1, DC_INT64, next, 21, &got, 1, DC_INT64, prev, 21, w, &info));
    EXPECT(got == prev * 100 + round, "sendrecv round %d from %d: %lld", round, prev, (long long)got);
    EXPECT(info.source == prev && info.tag == 21 && info.count == 1, "sendrecv info %d %d %zu", info.source, info.tag, info.count);
  }
  {
    size_t n = 4u << 20;
    uint8_t *out = xmalloc(n), *in = xmalloc(n);
    for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(i * 5 + (size_t)rank);
    dc_recv_info info;
    CHECK(dc_sendrecv(out, n, DC_UINT8, next, 22, in, n / 4, DC_FLOAT32, DC_ANY_SOURCE, DC_ANY_TAG, w, &info));
    EXPECT(info.source == prev && info.tag == 22 && info.count == n / 4, "large sendrecv info %d %d %zu", info.source, info.tag, info.count);
    for (size_t i = 0; i < n; i += 4099) EXPECT(in[i] == (uint8_t)(i * 5 + (size_t)prev), "large sendrecv byte %zu", i);
    double x = 2.5, y = 0;
    CHECK(dc_sendrecv(&x, 1, DC_FLOAT64, rank, 23, &y, 1, DC_FLOAT64, rank, 23, w, NULL));
    EXPECT(y == 2.5, "sendrecv to oneself: %g", y);
    free(out);
    free(in);
  }
  /* A sendrecv with a bad send starts nothing: its receive is not left waiting to take the
   * next message on its tag, which the following call must get. */
  {
    int32_t v = rank, stray = -1, got = -1;
    CHECK_STATUS(dc_sendrecv(&v, 1, DC_INT32, size, 24, &stray, 1, DC_INT32, prev, 24, w, NULL), DC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(dc_sendrecv(&v, 1, DC_INT32, next, -2, &stray, 1, DC_INT32, prev, 24, w, NULL), DC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(dc_sendrecv(&v, 1, DC_INT32, next, 24, NULL, 1, DC_INT32, prev, 24, w, NULL), DC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(dc_sendrecv(&v, 1, 42, next, 24, &stray, 1, DC_INT32, prev, 24, w, NULL), DC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(dc_sendrecv(&v, 1, DC_INT32, next, 24, &stray, 1, DC_INT32, prev, 24, NULL, NULL), DC_ERR_INVALID_ARGUMENT);
    CHECK(dc_sendrecv(&v, 1, DC_INT32, next, 24, &got, 1, DC_INT32, prev, 24, w, NULL));
    EXPECT(got == prev && stray == -1, "after the failed sendrecvs: got %d, stray %d", got, stray);
  }

  /* Self-send. */
  {
    double v = 3.5, got = 0;
    dc_request *rq;
    CHECK(dc_isend(&v, 1, DC_FLOAT64, rank, 3, w, &rq));
    CHECK(dc_recv(&got, 1, DC_FLOAT64, rank, 3, w, NULL));
    EXPECT(got == 3.5, "self-send");
    CHECK(dc_request_free(rq));
  }

  /* Bad arguments fail before anything is sent. */
  int32_t v = 0;
  CHECK_STATUS(dc_send(&v, 1, DC_INT32, size, 0, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_send(&v, 1, DC_INT32, -1, 0, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_send(&v, 1, DC_INT32, next, -5, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_send(NULL, 1, DC_INT32, next, 0, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_send(&v, 1, 42, next, 0, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_recv(&v, 1, DC_INT32, size + 3, 0, w, NULL), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_recv(&v, 1, DC_INT32, 0, -7, w, NULL), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_irecv(&v, 1, DC_INT32, 0, 0, w, NULL), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_send(&v, SIZE_MAX / 2, DC_INT32, next, 0, w), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_send(&v, 1, DC_INT32, next, 0, NULL), DC_ERR_INVALID_ARGUMENT);

  CHECK(dc_barrier(w));
  CHECK(dc_comm_destroy(w));
  if (rank == 0) printf("test_p2p: all checks passed on %d ranks\n", size);
  return 0;
}
