/* Probes and matched probes (real sizes of large messages, wildcards, order, MPI_PROC_NULL),
 * synchronous sends (not complete before the receive matched), MPI_Cancel of receives, and
 * persistent requests; the MPI 4 request and status additions. Each rank talks to its
 * neighbours on a ring (to itself at 1 rank). */
#include "common.h"
#include <stdint.h>

#define BIG 300000 /* doubles: large enough to be announced rather than sent eagerly */

static int rank, size, next, prev;

static void fill(double *v, int n, double base) {
  for (int i = 0; i < n; i++) v[i] = base + i;
}

static int same(const double *v, int n, double base) {
  for (int i = 0; i < n; i++)
    if (v[i] != base + i) return 0;
  return 1;
}

/* Probe and Iprobe: the size of a large message, a tag chosen over order, then order. */
static void probes(void) {
  double *big = malloc(sizeof(double) * BIG), *in = malloc(sizeof(double) * BIG);
  int small[10], got[10];
  for (int i = 0; i < 10; i++) small[i] = rank * 100 + i;
  fill(big, BIG, rank * 1e7);
  MPI_Request rq[2];
  OK(MPI_Isend(small, 10, MPI_INT, next, 7, MPI_COMM_WORLD, &rq[0]));
  OK(MPI_Isend(big, BIG, MPI_DOUBLE, next, 8, MPI_COMM_WORLD, &rq[1]));

  MPI_Status st;
  int count = -1, flag = 0;
  OK(MPI_Probe(prev, 8, MPI_COMM_WORLD, &st));
  OK(MPI_Get_count(&st, MPI_DOUBLE, &count));
  CHECK(count == BIG && st.MPI_SOURCE == prev && st.MPI_TAG == 8);
  /* Any tag: the first one sent, and again (a probe takes nothing). */
  for (int k = 0; k < 2; k++) {
    OK(MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
    OK(MPI_Get_count(&st, MPI_INT, &count));
    CHECK(st.MPI_SOURCE == prev && st.MPI_TAG == 7 && count == 10);
  }
  while (!flag) OK(MPI_Iprobe(prev, 7, MPI_COMM_WORLD, &flag, &st));
  CHECK(st.MPI_TAG == 7);
  OK(MPI_Iprobe(prev, 12345, MPI_COMM_WORLD, &flag, &st));
  CHECK(flag == 0);
  OK(MPI_Recv(got, 10, MPI_INT, prev, 7, MPI_COMM_WORLD, &st));
  for (int i = 0; i < 10; i++) CHECK(got[i] == prev * 100 + i);
  OK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st));
  CHECK(flag == 1 && st.MPI_TAG == 8);
  OK(MPI_Recv(in, BIG, MPI_DOUBLE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &st));
  CHECK(same(in, BIG, prev * 1e7));
  OK(MPI_Waitall(2, rq, MPI_STATUSES_IGNORE));
  free(big);
  free(in);
}

/* Mprobe, Improbe, Mrecv, Imrecv: two messages of one tag, received out of order through
 * their handles, each getting exactly its own message. */
static void matched(void) {
  double *big = malloc(sizeof(double) * BIG), *in = malloc(sizeof(double) * BIG);
  double small[3] = {rank + 0.5, rank + 1.5, rank + 2.5}, got[3];
  fill(big, BIG, rank * 1e7 + 1);
  MPI_Request rq[2];
  OK(MPI_Isend(big, BIG, MPI_DOUBLE, next, 9, MPI_COMM_WORLD, &rq[0]));
  OK(MPI_Isend(small, 3, MPI_DOUBLE, next, 9, MPI_COMM_WORLD, &rq[1]));

  MPI_Message m1 = MPI_MESSAGE_NULL, m2 = MPI_MESSAGE_NULL;
  MPI_Status st;
  int count = -1, flag = 0;
  OK(MPI_Mprobe(MPI_ANY_SOURCE, 9, MPI_COMM_WORLD, &m1, &st));
  OK(MPI_Get_count(&st, MPI_DOUBLE, &count));
  CHECK(count == BIG && st.MPI_SOURCE == prev && m1 != MPI_MESSAGE_NULL);
  while (!flag) OK(MPI_Improbe(prev, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &m2, &st));
  OK(MPI_Get_count(&st, MPI_DOUBLE, &count));
  CHECK(count == 3 && st.MPI_TAG == 9 && m2 != MPI_MESSAGE_NULL && m2 != m1);
  /* Both are taken: nothing left for a probe. */
  OK(MPI_Iprobe(prev, 9, MPI_COMM_WORLD, &flag, &st));
  CHECK(flag == 0);

  OK(MPI_Mrecv(got, 3, MPI_DOUBLE, &m2, &st));
  CHECK(m2 == MPI_MESSAGE_NULL && st.MPI_SOURCE == prev && st.MPI_TAG == 9);
  CHECK(got[0] == prev + 0.5 && got[2] == prev + 2.5);
  MPI_Request r;
  OK(MPI_Imrecv(in, BIG, MPI_DOUBLE, &m1, &r));
  CHECK(m1 == MPI_MESSAGE_NULL);
  OK(MPI_Wait(&r, &st));
  OK(MPI_Get_count(&st, MPI_DOUBLE, &count));
  CHECK(count == BIG && same(in, BIG, prev * 1e7 + 1));
  OK(MPI_Waitall(2, rq, MPI_STATUSES_IGNORE));

  /* Large-count forms and a message of zero bytes. */
  MPI_Request self;
  OK(MPI_Isend(NULL, 0, MPI_INT, 0, 10, MPI_COMM_SELF, &self));
  OK(MPI_Mprobe(0, 10, MPI_COMM_SELF, &m1, &st));
  MPI_Count cc = -1;
  OK(MPI_Get_count_c(&st, MPI_INT, &cc));
  CHECK(cc == 0);
  OK(MPI_Mrecv_c(NULL, 0, MPI_INT, &m1, &st));
  CHECK(st.MPI_SOURCE == 0 && st.MPI_TAG == 10);
  OK(MPI_Wait(&self, MPI_STATUS_IGNORE));

  /* MPI_PROC_NULL: MPI_MESSAGE_NO_PROC, received at once as an empty message. */
  OK(MPI_Mprobe(MPI_PROC_NULL, 0, MPI_COMM_WORLD, &m1, &st));
  CHECK(m1 == MPI_MESSAGE_NO_PROC && st.MPI_SOURCE == MPI_PROC_NULL);
  OK(MPI_Mrecv(got, 3, MPI_DOUBLE, &m1, &st));
  OK(MPI_Get_count(&st, MPI_DOUBLE, &count));
  CHECK(m1 == MPI_MESSAGE_NULL && st.MPI_SOURCE == MPI_PROC_NULL && count == 0);
  OK(MPI_Improbe(MPI_PROC_NULL, 0, MPI_COMM_WORLD, &flag, &m1, &st));
  CHECK(flag == 1 && m1 == MPI_MESSAGE_NO_PROC);
  OK(MPI_Imrecv_c(got, 3, MPI_DOUBLE, &m1, &r));
  OK(MPI_Wait(&r, &st));
  CHECK(st.MPI_SOURCE == MPI_PROC_NULL);
  OK(MPI_Iprobe(MPI_PROC_NULL, 0, MPI_COMM_WORLD, &flag, &st));
  CHECK(flag == 1 && st.MPI_SOURCE == MPI_PROC_NULL);
  free(big);
  free(in);
}

/* A synchronous send is not complete while its receive is not posted; it is once it is. */
static void synchronous(void) {
  int x = 1000 + rank, got = -1, go = 1;
  MPI_Request rq;
  MPI_Status st;
  if (rank == 0) {
    int to = size > 1 ? 1 : 0, flag = 0;
    OK(MPI_Issend(&x, 1, MPI_INT, to, 20, MPI_COMM_WORLD, &rq));
    double until = MPI_Wtime() + 0.2;
    int early = 0;
    while (MPI_Wtime() < until && !early) {
      if (MPI_Test(&rq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) early = 1;
    }
    CHECK(!early);
    if (to == 0) {
      OK(MPI_Recv(&got, 1, MPI_INT, 0, 20, MPI_COMM_WORLD, &st));
      CHECK(got == 1000);
    } else {
      OK(MPI_Send(&go, 1, MPI_INT, to, 21, MPI_COMM_WORLD));
    }
    OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  } else if (rank == 1) {
    OK(MPI_Recv(&go, 1, MPI_INT, 0, 21, MPI_COMM_WORLD, &st));
    OK(MPI_Recv(&got, 1, MPI_INT, 0, 20, MPI_COMM_WORLD, &st));
    CHECK(got == 1000 && st.MPI_TAG == 20);
  }
  /* Blocking and large, around the ring: even ranks send first. */
  double *big = malloc(sizeof(double) * BIG), *in = malloc(sizeof(double) * BIG);
  fill(big, BIG, rank * 3e6);
  if (size == 1) {
    OK(MPI_Irecv(in, BIG, MPI_DOUBLE, 0, 22, MPI_COMM_WORLD, &rq));
    OK(MPI_Ssend(big, BIG, MPI_DOUBLE, 0, 22, MPI_COMM_WORLD));
    OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  } else if (rank % 2 == 0) {
    OK(MPI_Ssend_c(big, BIG, MPI_DOUBLE, next, 22, MPI_COMM_WORLD));
    OK(MPI_Recv(in, BIG, MPI_DOUBLE, prev, 22, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  } else {
    OK(MPI_Recv(in, BIG, MPI_DOUBLE, prev, 22, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    OK(MPI_Ssend(big, BIG, MPI_DOUBLE, next, 22, MPI_COMM_WORLD));
  }
  CHECK(same(in, BIG, prev * 3e6));
  /* Both sides post their receives first, then synchronous sends: no deadlock. */
  int a = rank, b = -1;
  MPI_Request r2[2];
  OK(MPI_Irecv(&b, 1, MPI_INT, prev, 23, MPI_COMM_WORLD, &r2[0]));
  OK(MPI_Issend_c(&a, 1, MPI_INT, next, 23, MPI_COMM_WORLD, &r2[1]));
  OK(MPI_Waitall(2, r2, MPI_STATUSES_IGNORE));
  CHECK(b == prev);
  OK(MPI_Ssend(&a, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD));
  free(big);
  free(in);
}

/* Cancel: a receive nothing matches is cancelled; one that matched is not. */
static void cancels(void) {
  int v = -1, flag = -1, x = 77 + rank;
  MPI_Request rq;
  MPI_Status st;
  OK(MPI_Irecv(&v, 1, MPI_INT, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &rq));
  OK(MPI_Cancel(&rq));
  OK(MPI_Wait(&rq, &st));
  OK(MPI_Test_cancelled(&st, &flag));
  CHECK(flag == 1 && rq == MPI_REQUEST_NULL);

  OK(MPI_Irecv(&v, 1, MPI_INT, prev, 31, MPI_COMM_WORLD, &rq));
  MPI_Request s;
  OK(MPI_Issend(&x, 1, MPI_INT, next, 31, MPI_COMM_WORLD, &s));
  OK(MPI_Wait(&s, MPI_STATUS_IGNORE));
  /* Our neighbour's synchronous send completed only once our receive matched it. */
  OK(MPI_Barrier(MPI_COMM_WORLD));
  OK(MPI_Cancel(&rq));
  OK(MPI_Wait(&rq, &st));
  OK(MPI_Test_cancelled(&st, &flag));
  CHECK(flag == 0 && v == 77 + prev && st.MPI_SOURCE == prev);

  if (expect_distcomm()) {
    /* distcomm never cancels a send: it is delivered. */
    OK(MPI_Isend(&x, 1, MPI_INT, 0, 32, MPI_COMM_SELF, &s));
    OK(MPI_Cancel(&s));
    OK(MPI_Wait(&s, &st));
    OK(MPI_Test_cancelled(&st, &flag));
    CHECK(flag == 0);
    OK(MPI_Recv(&v, 1, MPI_INT, 0, 32, MPI_COMM_SELF, MPI_STATUS_IGNORE));
    CHECK(v == x);
  }
}

/* Persistent requests, started again and again. */
static void persistent(void) {
  double out[4], in[4];
  MPI_Request rq[2];
  MPI_Status sts[2];
  OK(MPI_Recv_init(in, 4, MPI_DOUBLE, prev, 40, MPI_COMM_WORLD, &rq[0]));
  OK(MPI_Send_init(out, 4, MPI_DOUBLE, next, 40, MPI_COMM_WORLD, &rq[1]));
  /* Inactive: complete at once, with an empty status, and the handle stays. */
  OK(MPI_Wait(&rq[0], &sts[0]));
  CHECK(rq[0] != MPI_REQUEST_NULL && sts[0].MPI_TAG == MPI_ANY_TAG && sts[0].MPI_SOURCE == MPI_ANY_SOURCE);
  for (int it = 0; it < 3; it++) {
    fill(out, 4, rank * 10 + it * 1000);
    if (it == 1) {
      OK(MPI_Start(&rq[0]));
      OK(MPI_Start(&rq[1]));
    } else {
      OK(MPI_Startall(2, rq));
    }
    if (it == 2) {
      int flag = 0;
      while (!flag) OK(MPI_Testall(2, rq, &flag, sts));
    } else {
      OK(MPI_Waitall(2, rq, sts));
    }
    CHECK(rq[0] != MPI_REQUEST_NULL && rq[1] != MPI_REQUEST_NULL);
    CHECK(sts[0].MPI_SOURCE == prev && sts[0].MPI_TAG == 40);
    CHECK(same(in, 4, prev * 10 + it * 1000));
  }
  OK(MPI_Request_free(&rq[0]));
  OK(MPI_Request_free(&rq[1]));
  CHECK(rq[0] == MPI_REQUEST_NULL && rq[1] == MPI_REQUEST_NULL);

  /* Synchronous and buffered persistent sends; large-count forms. */
  static char bbuf[4096];
  OK(MPI_Buffer_attach(bbuf, sizeof bbuf));
  MPI_Request p[3];
  int a = rank, b = -1, c = -1;
  OK(MPI_Recv_init_c(&b, 1, MPI_INT, prev, 41, MPI_COMM_WORLD, &p[0]));
  OK(MPI_Ssend_init_c(&a, 1, MPI_INT, next, 41, MPI_COMM_WORLD, &p[1]));
  OK(MPI_Bsend_init(&a, 1, MPI_INT, next, 42, MPI_COMM_WORLD, &p[2]));
  for (int it = 0; it < 2; it++) {
    b = c = -1;
    OK(MPI_Startall(3, p));
    OK(MPI_Recv(&c, 1, MPI_INT, prev, 42, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    int idx = -1, done = 0;
    while (done < 3) {
      OK(MPI_Waitany(3, p, &idx, MPI_STATUS_IGNORE));
      /* Completed persistent requests stay, inactive: Waitany passes over them. */
      CHECK(idx != MPI_UNDEFINED);
      done++;
    }
    OK(MPI_Waitany(3, p, &idx, MPI_STATUS_IGNORE));
    CHECK(idx == MPI_UNDEFINED);
    CHECK(b == prev && c == prev);
  }
  for (int i = 0; i < 3; i++) OK(MPI_Request_free(&p[i]));
  void *addr;
  int bsize;
  OK(MPI_Buffer_detach(&addr, &bsize));

  /* Ready sends: the receive is posted (and everyone knows it) before the send starts. */
  OK(MPI_Recv_init(&b, 1, MPI_INT, prev, 43, MPI_COMM_WORLD, &p[0]));
  OK(MPI_Rsend_init(&a, 1, MPI_INT, next, 43, MPI_COMM_WORLD, &p[1]));
  OK(MPI_Start(&p[0]));
  OK(MPI_Barrier(MPI_COMM_WORLD));
  OK(MPI_Start(&p[1]));
  OK(MPI_Waitall(2, p, MPI_STATUSES_IGNORE));
  CHECK(b == prev);
  OK(MPI_Request_free(&p[0]));
  OK(MPI_Request_free(&p[1]));
}

/* MPI 4: Isendrecv(_replace), Request_get_status_any/all/some, status fields, addresses. */
static void mpi4(void) {
  int a = rank, b = -1, flag = -1, idx = -1, n = -1;
  MPI_Request rq[2];
  MPI_Status st, sts[2];
  OK(MPI_Isendrecv(&a, 1, MPI_INT, next, 60, &b, 1, MPI_INT, prev, 60, MPI_COMM_WORLD, &rq[0]));
  OK(MPI_Wait(&rq[0], &st));
  CHECK(b == prev && rq[0] == MPI_REQUEST_NULL);
  /* (MPICH 5.0.2 leaves this status unset.) */
  if (expect_distcomm()) CHECK(st.MPI_SOURCE == prev && st.MPI_TAG == 60);
  double v[3] = {rank, rank + 0.25, rank + 0.5};
  OK(MPI_Isendrecv_replace_c(v, 3, MPI_DOUBLE, next, 61, prev, 61, MPI_COMM_WORLD, &rq[0]));
  OK(MPI_Wait(&rq[0], &st));
  CHECK(v[0] == prev && v[2] == prev + 0.5);

  /* Looking at requests leaves them for the completion call. */
  OK(MPI_Irecv(&b, 1, MPI_INT, prev, 62, MPI_COMM_WORLD, &rq[0]));
  OK(MPI_Irecv(&n, 1, MPI_INT, prev, 63, MPI_COMM_WORLD, &rq[1]));
  OK(MPI_Request_get_status_all(2, rq, &flag, sts));
  CHECK(flag == 0);
  OK(MPI_Send(&a, 1, MPI_INT, next, 63, MPI_COMM_WORLD));
  flag = 0;
  while (!flag) OK(MPI_Request_get_status_any(2, rq, &idx, &flag, &st));
  CHECK(idx == 1 && st.MPI_TAG == 63 && rq[1] != MPI_REQUEST_NULL);
  int out = -1, ind[2];
  OK(MPI_Request_get_status_some(2, rq, &out, ind, sts));
  CHECK(out == 1 && ind[0] == 1);
  OK(MPI_Barrier(MPI_COMM_WORLD));
  OK(MPI_Send(&a, 1, MPI_INT, next, 62, MPI_COMM_WORLD));
  flag = 0;
  while (!flag) OK(MPI_Request_get_status_all(2, rq, &flag, sts));
  CHECK(sts[0].MPI_TAG == 62 && sts[1].MPI_TAG == 63);
  OK(MPI_Waitall(2, rq, MPI_STATUSES_IGNORE));
  CHECK(b == prev && n == prev);
  rq[0] = rq[1] = MPI_REQUEST_NULL;
  OK(MPI_Request_get_status_any(2, rq, &idx, &flag, &st));
  CHECK(flag == 1 && idx == MPI_UNDEFINED);
  OK(MPI_Request_get_status_some(2, rq, &out, ind, sts));
  CHECK(out == MPI_UNDEFINED);

  int s = -1, t = -1, e = -1;
  OK(MPI_Status_set_source(&st, 3));
  OK(MPI_Status_set_tag(&st, 44));
  OK(MPI_Status_set_error(&st, MPI_ERR_TAG));
  OK(MPI_Status_get_source(&st, &s));
  OK(MPI_Status_get_tag(&st, &t));
  OK(MPI_Status_get_error(&st, &e));
  CHECK(s == 3 && t == 44 && e == MPI_ERR_TAG);
  MPI_Aint a0, a1;
  OK(MPI_Get_address(&v[0], &a0));
  OK(MPI_Get_address(&v[2], &a1));
  CHECK(MPI_Aint_diff(a1, a0) == 2 * (MPI_Aint)sizeof(double));
}

static void bad_arguments(void) {
  int flag, v = 0;
  MPI_Status st;
  MPI_Request rq;
  MPI_Message m;
  FAILS(MPI_Probe(size, 0, MPI_COMM_WORLD, &st), MPI_ERR_RANK);
  FAILS(MPI_Iprobe(0, -7, MPI_COMM_WORLD, &flag, &st), MPI_ERR_TAG);
  FAILS(MPI_Mprobe(-5, 0, MPI_COMM_WORLD, &m, &st), MPI_ERR_RANK);
  FAILS(MPI_Ssend(&v, -1, MPI_INT, 0, 0, MPI_COMM_WORLD), MPI_ERR_COUNT);
  FAILS(MPI_Issend(&v, 1, MPI_INT, size, 0, MPI_COMM_WORLD, &rq), MPI_ERR_RANK);
  FAILS(MPI_Send_init(&v, 1, MPI_INT, 0, -3, MPI_COMM_WORLD, &rq), MPI_ERR_TAG);
  FAILS(MPI_Recv_init(&v, 1, MPI_INT, size + 3, 0, MPI_COMM_WORLD, &rq), MPI_ERR_RANK);
  if (expect_distcomm()) {
    m = (MPI_Message)(intptr_t)0x12345; /* never a message handle */
    FAILS(MPI_Mrecv(&v, 1, MPI_INT, &m, &st), MPI_ERR_REQUEST);
    m = MPI_MESSAGE_NULL;
    FAILS(MPI_Mrecv(&v, 1, MPI_INT, &m, &st), MPI_ERR_REQUEST);
    rq = MPI_REQUEST_NULL;
    FAILS(MPI_Start(&rq), MPI_ERR_REQUEST);
    FAILS(MPI_Cancel(&rq), MPI_ERR_REQUEST);
    OK(MPI_Isend(&v, 1, MPI_INT, 0, 50, MPI_COMM_SELF, &rq));
    FAILS(MPI_Start(&rq), MPI_ERR_REQUEST); /* not persistent */
    OK(MPI_Recv(&flag, 1, MPI_INT, 0, 50, MPI_COMM_SELF, MPI_STATUS_IGNORE));
    OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
    OK(MPI_Recv_init(&v, 1, MPI_INT, 0, 51, MPI_COMM_SELF, &rq));
    OK(MPI_Start(&rq));
    FAILS(MPI_Start(&rq), MPI_ERR_REQUEST); /* active already */
    OK(MPI_Cancel(&rq));
    OK(MPI_Wait(&rq, &st));
    OK(MPI_Test_cancelled(&st, &flag));
    CHECK(flag == 1);
    OK(MPI_Request_free(&rq));
  }
}

int main(int argc, char **argv) {
  t_init(&argc, &argv, &rank, &size);
  next = (rank + 1) % size;
  prev = (rank + size - 1) % size;
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
  probes();
  OK(MPI_Barrier(MPI_COMM_WORLD));
  matched();
  OK(MPI_Barrier(MPI_COMM_WORLD));
  synchronous();
  OK(MPI_Barrier(MPI_COMM_WORLD));
  cancels();
  OK(MPI_Barrier(MPI_COMM_WORLD));
  persistent();
  OK(MPI_Barrier(MPI_COMM_WORLD));
  mpi4();
  bad_arguments();
  OK(MPI_Barrier(MPI_COMM_WORLD));
  t_done("t_probe");
  OK(MPI_Finalize());
  return 0;
}
