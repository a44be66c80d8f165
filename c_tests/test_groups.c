/* Subgroups: dc_comm_new_group and dc_comm_split, collectives and point-to-point inside them,
 * non-members, interleaving with the parent, and many create/destroy cycles. */
#include "common.h"

int main(void) {
  int rank, size;
  dc_comm *w = test_init(&rank, &size);

  /* split by parity, reversed order through the key */
  dc_comm *half = NULL;
  CHECK(dc_comm_split(w, rank % 2, -rank, &half));
  EXPECT(half != NULL, "split returned NULL for a member");
  int hr, hs;
  CHECK(dc_comm_rank(half, &hr));
  CHECK(dc_comm_size(half, &hs));
  int expect_size = (size + (rank % 2 ? 0 : 1)) / 2;
  EXPECT(hs == expect_size, "split size %d, want %d", hs, expect_size);
  int higher = 0; /* members with the same parity and a larger rank come first (key = -rank) */
  for (int r = rank + 2; r < size; r += 2) higher++;
  EXPECT(hr == higher, "split rank %d, want %d", hr, higher);
  int64_t v = rank, sum = 0, want = 0;
  for (int r = rank % 2; r < size; r += 2) want += r;
  CHECK(dc_allreduce(&v, &sum, 1, DC_INT64, DC_SUM, half));
  EXPECT(sum == want, "allreduce in split group: %lld, want %lld", (long long)sum, (long long)want);

  /* a parent collective between child collectives */
  int32_t one = 1, total = 0;
  CHECK(dc_allreduce(&one, &total, 1, DC_INT32, DC_SUM, w));
  EXPECT(total == size, "parent allreduce %d", total);

  /* new_group with the ranks reversed */
  int32_t *ranks = xmalloc(sizeof(int32_t) * (size_t)size);
  for (int i = 0; i < size; i++) ranks[i] = size - 1 - i;
  dc_comm *rev = NULL;
  CHECK(dc_comm_new_group(w, ranks, size, &rev));
  int rr;
  CHECK(dc_comm_rank(rev, &rr));
  EXPECT(rr == size - 1 - rank, "reversed group rank %d", rr);
  double b = rr == 0 ? 42.0 : 0.0;
  CHECK(dc_broadcast(&b, 1, DC_FLOAT64, 0, rev));
  EXPECT(b == 42.0, "broadcast in reversed group");
  /* point-to-point inside the group uses group ranks */
  if (size >= 2) {
    if (rr == 0) {
      int32_t x = 77;
      CHECK(dc_send(&x, 1, DC_INT32, 1, 0, rev));
    } else if (rr == 1) {
      int32_t x = 0;
      dc_recv_info info;
      CHECK(dc_recv(&x, 1, DC_INT32, DC_ANY_SOURCE, 0, rev, &info));
      EXPECT(x == 77 && info.source == 0, "group p2p: x=%d source=%d", x, info.source);
    }
  }

  /* a group that only rank 0 belongs to; the others get NULL */
  int32_t only0 = 0;
  dc_comm *solo = (dc_comm *)1;
  CHECK(dc_comm_new_group(w, &only0, 1, &solo));
  if (rank == 0) {
    EXPECT(solo != NULL, "member got NULL");
    int s;
    CHECK(dc_comm_size(solo, &s));
    EXPECT(s == 1, "solo size %d", s);
    CHECK(dc_barrier(solo));
    CHECK(dc_comm_destroy(solo));
  } else {
    EXPECT(solo == NULL, "non-member got a comm");
  }

  /* negative color joins no group */
  dc_comm *none = (dc_comm *)1;
  CHECK(dc_comm_split(w, rank == 0 ? -1 : 5, 0, &none));
  EXPECT((rank == 0) == (none == NULL), "split with negative color");
  if (none) {
    CHECK(dc_barrier(none));
    CHECK(dc_comm_destroy(none));
  }

  /* bad arguments */
  dc_comm *bad = NULL;
  int32_t dup[2] = {0, 0};
  if (size >= 2) CHECK_STATUS(dc_comm_new_group(w, dup, 2, &bad), DC_ERR_INVALID_ARGUMENT);
  int32_t out_of_range = size;
  CHECK_STATUS(dc_comm_new_group(w, &out_of_range, 1, &bad), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_comm_new_group(w, ranks, 0, &bad), DC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(dc_comm_split(w, 0, 0, NULL), DC_ERR_INVALID_ARGUMENT);

  /* nested split of a split, and many create/destroy cycles */
  for (int i = 0; i < 100; i++) {
    dc_comm *g = NULL, *gg = NULL;
    CHECK(dc_comm_split(w, 0, rank, &g));
    CHECK(dc_comm_split(g, rank % 2, 0, &gg));
    int32_t x = 1, y = 0;
    CHECK(dc_allreduce(&x, &y, 1, DC_INT32, DC_SUM, gg));
    EXPECT(y == expect_size, "nested split allreduce %d", y);
    CHECK(dc_comm_destroy(gg));
    CHECK(dc_comm_destroy(g));
  }

  CHECK(dc_comm_destroy(rev));
  CHECK(dc_comm_destroy(half));
  CHECK(dc_barrier(w));
  CHECK(dc_comm_destroy(w));
  free(ranks);
  if (rank == 0) printf("test_groups: all checks passed on %d ranks\n", size);
  return 0;
}
