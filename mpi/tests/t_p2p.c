/* Point to point: blocking and non-blocking, wildcards, MPI_PROC_NULL, statuses and counts,
 * message order, completion calls, large-count forms. */
#include "common.h"
#include <stdint.h>

static int rank, size;

static void ring(int n) {
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  double *out = malloc(sizeof(double) * (n + 1)), *in = malloc(sizeof(double) * (n + 1));
  for (int i = 0; i < n; i++) out[i] = rank * 1e6 + i;
  MPI_Status st;
  if (size == 1) { /* to itself: a blocking send first could wait for the receive */
    MPI_Request rq;
    OK(MPI_Isend(out, n, MPI_DOUBLE, next, 11, MPI_COMM_WORLD, &rq));
    OK(MPI_Recv(in, n, MPI_DOUBLE, prev, 11, MPI_COMM_WORLD, &st));
    OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  } else if (rank % 2 == 0) {
    OK(MPI_Send(out, n, MPI_DOUBLE, next, 11, MPI_COMM_WORLD));
    OK(MPI_Recv(in, n, MPI_DOUBLE, prev, 11, MPI_COMM_WORLD, &st));
  } else {
    OK(MPI_Recv(in, n, MPI_DOUBLE, prev, 11, MPI_COMM_WORLD, &st));
    OK(MPI_Send(out, n, MPI_DOUBLE, next, 11, MPI_COMM_WORLD));
  }
  int count = -1;
  OK(MPI_Get_count(&st, MPI_DOUBLE, &count));
  CHECK(count == n && st.MPI_SOURCE == prev && st.MPI_TAG == 11);
  for (int i = 0; i < n; i++) CHECK(in[i] == prev * 1e6 + i);
  free(out);
  free(in);
}

int main(int argc, char **argv) {
  t_init(&argc, &argv, &rank, &size);

  /* Rings of several sizes (the last one above any eager threshold). */
  ring(1);
  ring(1000);
  ring(300000);

  /* Sendrecv around the ring, and to self. */
  int next = (rank + 1) % size, prev = (rank + size - 1) % size, got = -1;
  MPI_Status st;
  OK(MPI_Sendrecv(&rank, 1, MPI_INT, next, 3, &got, 1, MPI_INT, prev, 3, MPI_COMM_WORLD, &st));
  CHECK(got == prev && st.MPI_SOURCE == prev && st.MPI_TAG == 3);

  /* Everyone sends to rank 0 with its rank as tag; rank 0 receives with wildcards. */
  if (rank == 0) {
    int seen[64] = {0};
    for (int i = 0; i < size; i++) {
      int v = -1;
      if (i == 0) {
        MPI_Request self;
        OK(MPI_Isend(&rank, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, &self));
        OK(MPI_Recv(&v, 1, MPI_INT, 0, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
        OK(MPI_Wait(&self, MPI_STATUS_IGNORE));
        CHECK(self == MPI_REQUEST_NULL);
      } else {
        OK(MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
      }
      CHECK(v == st.MPI_SOURCE && st.MPI_TAG == v && v >= 0 && v < size && !seen[v]);
      seen[v] = 1;
    }
  } else {
    OK(MPI_Send(&rank, 1, MPI_INT, 0, rank, MPI_COMM_WORLD));
  }
  /* Nobody sends the next phase's messages before rank 0 has all of these (its wildcard
   * receives would take them). */
  OK(MPI_Barrier(MPI_COMM_WORLD));

  /* Non-overtaking: 20 messages of one tag arrive in order; a specific tag picks its own. */
  if (size > 1) {
    if (rank == 1) {
      for (int i = 0; i < 20; i++) OK(MPI_Send(&i, 1, MPI_INT, 0, 9, MPI_COMM_WORLD));
      int special = 77;
      OK(MPI_Send(&special, 1, MPI_INT, 0, 10, MPI_COMM_WORLD));
    } else if (rank == 0) {
      int v = -1;
      OK(MPI_Recv(&v, 1, MPI_INT, 1, 10, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      CHECK(v == 77);
      for (int i = 0; i < 20; i++) {
        OK(MPI_Recv(&v, 1, MPI_INT, 1, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        CHECK(v == i);
      }
    }
  }

  /* MPI_PROC_NULL: complete at once, status says so. */
  int dummy = 5;
  OK(MPI_Send(&dummy, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD));
  st.MPI_SOURCE = 1234;
  OK(MPI_Recv(&dummy, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD, &st));
  int count = -1;
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(st.MPI_SOURCE == MPI_PROC_NULL && st.MPI_TAG == MPI_ANY_TAG && count == 0 && dummy == 5);

  /* Irecv/Isend pairs with every completion call. */
  enum { N = 8 };
  int sbuf[N], rbuf[N];
  MPI_Request sr[N], rr[N];
  for (int i = 0; i < N; i++) {
    sbuf[i] = rank * 100 + i;
    rbuf[i] = -1;
    OK(MPI_Irecv(&rbuf[i], 1, MPI_INT, prev, 20 + i, MPI_COMM_WORLD, &rr[i]));
  }
  for (int i = N - 1; i >= 0; i--) OK(MPI_Isend(&sbuf[i], 1, MPI_INT, next, 20 + i, MPI_COMM_WORLD, &sr[i]));
  /* Test until the first receive is done. */
  int flag = 0;
  while (!flag) OK(MPI_Test(&rr[0], &flag, &st));
  CHECK(rr[0] == MPI_REQUEST_NULL && st.MPI_TAG == 20 && rbuf[0] == prev * 100);
  /* Waitany until all receives 1..3 are in. */
  for (int k = 0; k < 3; k++) {
    int idx = -1;
    OK(MPI_Waitany(3, &rr[1], &idx, &st));
    CHECK(idx >= 0 && idx < 3 && st.MPI_TAG == 21 + idx && rbuf[1 + idx] == prev * 100 + 1 + idx);
  }
  int idx = -2;
  OK(MPI_Waitany(3, &rr[1], &idx, &st));
  CHECK(idx == MPI_UNDEFINED);
  /* Testany, then Testall, then Waitall for the rest. */
  flag = 0;
  while (!flag) OK(MPI_Testany(1, &rr[4], &idx, &flag, MPI_STATUS_IGNORE));
  CHECK(idx == 0 && rr[4] == MPI_REQUEST_NULL && rbuf[4] == prev * 100 + 4);
  flag = 0;
  MPI_Status sts[N];
  while (!flag) OK(MPI_Testall(3, &rr[5], &flag, sts));
  for (int i = 5; i < N; i++) CHECK(rr[i] == MPI_REQUEST_NULL && rbuf[i] == prev * 100 + i && sts[i - 5].MPI_TAG == 20 + i);
  OK(MPI_Waitall(N, sr, MPI_STATUSES_IGNORE));
  for (int i = 0; i < N; i++) CHECK(sr[i] == MPI_REQUEST_NULL);
  /* Null requests complete at once. */
  MPI_Request nul = MPI_REQUEST_NULL;
  OK(MPI_Wait(&nul, &st));
  CHECK(st.MPI_SOURCE == MPI_ANY_SOURCE && st.MPI_TAG == MPI_ANY_TAG);
  OK(MPI_Test(&nul, &flag, MPI_STATUS_IGNORE));
  CHECK(flag == 1);

  /* Request_free on a send: the message still arrives. */
  int fv = 1000 + rank, fr = -1;
  MPI_Request fq;
  OK(MPI_Isend(&fv, 1, MPI_INT, next, 40, MPI_COMM_WORLD, &fq));
  OK(MPI_Request_free(&fq));
  CHECK(fq == MPI_REQUEST_NULL);
  OK(MPI_Recv(&fr, 1, MPI_INT, prev, 40, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  CHECK(fr == 1000 + prev);

  /* Counts: a shorter message than the buffer; bytes that are no whole number of ints. */
  char bytes[12] = "abcdefghijk";
  char in[12] = {0};
  OK(MPI_Sendrecv(bytes, 7, MPI_CHAR, next, 41, in, 12, MPI_CHAR, prev, 41, MPI_COMM_WORLD, &st));
  OK(MPI_Get_count(&st, MPI_CHAR, &count));
  CHECK(count == 7 && memcmp(in, "abcdefg", 7) == 0 && in[7] == 0);
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == MPI_UNDEFINED);
  /* From any source with any tag: the status names the sender (a comm rank) and its tag. */
  int anyv = -1, mine = 300 + rank;
  OK(MPI_Sendrecv(&mine, 1, MPI_INT, next, 42 + rank, &anyv, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
  CHECK(anyv == 300 + prev && st.MPI_SOURCE == prev && st.MPI_TAG == 42 + prev);

  /* Buffered sends: everyone sends a large message before anyone receives (with standard
   * sends this order may wait for the receiver); Ibsend completes at once; detach returns the
   * buffer. Ready send: the receive is posted first (then a barrier). */
  {
    int big_n = 200000, bsize = 2 * (big_n * (int)sizeof(int) + MPI_BSEND_OVERHEAD) + 64;
    int *bo = malloc(sizeof(int) * big_n), *bi = malloc(sizeof(int) * big_n);
    for (int i = 0; i < big_n; i++) bo[i] = rank + i;
    char *attached = malloc(bsize);
    OK(MPI_Buffer_attach(attached, bsize));
    OK(MPI_Bsend(bo, big_n, MPI_INT, next, 60, MPI_COMM_WORLD));
    MPI_Request bq;
    int small = 5 + rank, sg = -1;
    OK(MPI_Ibsend(&small, 1, MPI_INT, next, 61, MPI_COMM_WORLD, &bq));
    OK(MPI_Wait(&bq, MPI_STATUS_IGNORE));
    OK(MPI_Recv(bi, big_n, MPI_INT, prev, 60, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    OK(MPI_Recv(&sg, 1, MPI_INT, prev, 61, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    CHECK(bi[0] == prev && bi[big_n - 1] == prev + big_n - 1 && sg == 5 + prev);
    void *det = NULL;
    int dsize = 0;
    OK(MPI_Buffer_detach(&det, &dsize));
    CHECK(det == attached && dsize == bsize);
    free(attached);
    int rv = -1, rs = 70 + rank;
    MPI_Request rr;
    OK(MPI_Irecv(&rv, 1, MPI_INT, prev, 62, MPI_COMM_WORLD, &rr));
    OK(MPI_Barrier(MPI_COMM_WORLD));
    OK(MPI_Rsend(&rs, 1, MPI_INT, next, 62, MPI_COMM_WORLD));
    OK(MPI_Wait(&rr, MPI_STATUS_IGNORE));
    CHECK(rv == 70 + prev);
    free(bo);
    free(bi);
  }

  /* A large buffered message holds its buffer space until it is matched: with room for one,
   * a second fails with MPI_ERR_BUFFER while the first waits for its receive (none is posted
   * between the barriers), and fits once MPI_Buffer_flush has seen the first received. */
  {
    int n = 100000, bsize = n * (int)sizeof(int) + MPI_BSEND_OVERHEAD;
    int *bo = malloc(sizeof(int) * n), *bi = malloc(sizeof(int) * n);
    char *attached = malloc(bsize);
    for (int i = 0; i < n; i++) bo[i] = 7 * rank + i;
    OK(MPI_Buffer_attach(attached, bsize));
    OK(MPI_Bsend(bo, n, MPI_INT, next, 63, MPI_COMM_WORLD));
    OK(MPI_Barrier(MPI_COMM_WORLD));
    OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    FAILS(MPI_Bsend(bo, n, MPI_INT, next, 63, MPI_COMM_WORLD), MPI_ERR_BUFFER);
    OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL));
    OK(MPI_Barrier(MPI_COMM_WORLD)); /* every rank has tried before any receives */
    OK(MPI_Recv(bi, n, MPI_INT, prev, 63, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    CHECK(bi[0] == 7 * prev && bi[n - 1] == 7 * prev + n - 1);
    OK(MPI_Buffer_flush());
    OK(MPI_Bsend(bo, n, MPI_INT, next, 64, MPI_COMM_WORLD));
    OK(MPI_Recv(bi, n, MPI_INT, prev, 64, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    CHECK(bi[1] == 7 * prev + 1);
    void *det = NULL;
    int dsize = 0;
    OK(MPI_Buffer_detach(&det, &dsize));
    CHECK(det == attached && dsize == bsize);
    free(attached);
    free(bo);
    free(bi);
  }

  /* Large-count forms. */
  int64_t big[4] = {rank, rank + 1, rank + 2, rank + 3}, bin[4];
  MPI_Request lr;
  OK(MPI_Irecv_c(bin, (MPI_Count)4, MPI_INT64_T, prev, 42, MPI_COMM_WORLD, &lr));
  OK(MPI_Send_c(big, (MPI_Count)4, MPI_INT64_T, next, 42, MPI_COMM_WORLD));
  OK(MPI_Wait(&lr, &st));
  MPI_Count cc = -1;
  OK(MPI_Get_count_c(&st, MPI_INT64_T, &cc));
  CHECK(cc == 4 && bin[3] == prev + 3);
  MPI_Count tsz;
  OK(MPI_Type_size_c(MPI_DOUBLE_INT, &tsz));
  CHECK(tsz == sizeof(double) + sizeof(int));

  t_done("t_p2p");
  OK(MPI_Finalize());
  return 0;
}
