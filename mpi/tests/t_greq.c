/* Generalized requests (MPI_Grequest_start/complete: query, free and cancel functions, completion
 * from another thread, MPI_Request_free before completion, Waitall with other requests, a query
 * function's error) and MPI_Buffer_iflush. Any number of ranks. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"
#include <pthread.h>
#include <time.h>

struct state {
  int queried, freed, cancelled, cancel_complete, query_error;
};

static int query_fn(void *extra, MPI_Status *st) {
  struct state *s = extra;
  s->queried++;
  MPI_Status_set_elements(st, MPI_INT, 3);
  MPI_Status_set_cancelled(st, s->cancelled > 0);
  st->MPI_SOURCE = 7;
  st->MPI_TAG = 11;
  return s->query_error;
}
static int free_fn(void *extra) {
  ((struct state *)extra)->freed++;
  return MPI_SUCCESS;
}
static int cancel_fn(void *extra, int complete) {
  struct state *s = extra;
  s->cancelled++;
  s->cancel_complete = complete;
  return MPI_SUCCESS;
}

static void *complete_later(void *arg) {
  struct timespec ts = {0, 20000000};
  nanosleep(&ts, NULL);
  MPI_Grequest_complete(*(MPI_Request *)arg);
  return NULL;
}

int main(int argc, char **argv) {
  int rank, size, provided, flag, n;
  OK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided));
  OK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  OK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  t_rank = rank;
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));

  /* Not done until MPI_Grequest_complete; then the query's status, the free function once. */
  struct state s = {0};
  MPI_Request rq, keep;
  MPI_Status st;
  OK(MPI_Grequest_start(query_fn, free_fn, cancel_fn, &s, &rq));
  OK(MPI_Test(&rq, &flag, &st));
  CHECK(flag == 0 && s.queried == 0 && s.freed == 0);
  OK(MPI_Request_get_status(rq, &flag, &st));
  CHECK(flag == 0);
  OK(MPI_Grequest_complete(rq));
  OK(MPI_Request_get_status(rq, &flag, &st));
  CHECK(flag == 1 && s.freed == 0 && rq != MPI_REQUEST_NULL);
  OK(MPI_Wait(&rq, &st));
  CHECK(rq == MPI_REQUEST_NULL && s.freed == 1 && s.queried >= 1);
  CHECK(st.MPI_SOURCE == 7 && st.MPI_TAG == 11);
  OK(MPI_Get_count(&st, MPI_INT, &n));
  CHECK(n == 3);
  OK(MPI_Test_cancelled(&st, &flag));
  CHECK(flag == 0);

  /* Completed by another thread while this one waits. */
  if (provided == MPI_THREAD_MULTIPLE) {
    struct state t = {0};
    pthread_t th;
    OK(MPI_Grequest_start(query_fn, free_fn, cancel_fn, &t, &rq));
    keep = rq;
    CHECK(pthread_create(&th, NULL, complete_later, &keep) == 0);
    OK(MPI_Wait(&rq, &st));
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(t.queried >= 1 && t.freed == 1 && st.MPI_TAG == 11);
  }

  /* MPI_Cancel calls the cancel function (told the operation is not complete yet). */
  struct state c = {0};
  OK(MPI_Grequest_start(query_fn, free_fn, cancel_fn, &c, &rq));
  OK(MPI_Cancel(&rq));
  CHECK(c.cancelled == 1 && c.cancel_complete == 0);
  OK(MPI_Grequest_complete(rq));
  OK(MPI_Wait(&rq, &st));
  OK(MPI_Test_cancelled(&st, &flag));
  CHECK(flag == 1 && c.freed == 1);

  /* Freed before completion: the free function runs at MPI_Grequest_complete. */
  struct state f = {0};
  OK(MPI_Grequest_start(query_fn, free_fn, cancel_fn, &f, &rq));
  keep = rq;
  OK(MPI_Request_free(&rq));
  CHECK(rq == MPI_REQUEST_NULL && f.freed == 0);
  OK(MPI_Grequest_complete(keep));
  CHECK(f.freed == 1 && f.queried == 0);

  /* Waitall over a generalized request and a message to this rank. */
  struct state w = {0};
  MPI_Request two[2];
  MPI_Status sts[2];
  int x = rank + 100, y = -1;
  OK(MPI_Grequest_start(query_fn, free_fn, cancel_fn, &w, &two[0]));
  OK(MPI_Irecv(&y, 1, MPI_INT, rank, 5, MPI_COMM_WORLD, &two[1]));
  OK(MPI_Send(&x, 1, MPI_INT, rank, 5, MPI_COMM_WORLD));
  OK(MPI_Grequest_complete(two[0]));
  OK(MPI_Waitall(2, two, sts));
  CHECK(y == rank + 100 && w.freed == 1 && sts[0].MPI_TAG == 11 && sts[1].MPI_TAG == 5);

  /* A query function's error is the completion's error. */
  struct state e = {0};
  e.query_error = MPI_ERR_OTHER;
  OK(MPI_Grequest_start(query_fn, free_fn, cancel_fn, &e, &rq));
  OK(MPI_Grequest_complete(rq));
  int rc = MPI_Wait(&rq, &st), cls = -1;
  MPI_Error_class(rc, &cls);
  CHECK(rc != MPI_SUCCESS && cls == MPI_ERR_OTHER);
  CHECK(e.freed == 1);

  /* MPI_Buffer_iflush: the buffered sends of the process's buffer, as a request. */
  int bufsize = 4 * (sizeof(int) + MPI_BSEND_OVERHEAD);
  char *buf = malloc(bufsize);
  OK(MPI_Buffer_attach(buf, bufsize));
  int peer = (rank + 1) % size, from = (rank + size - 1) % size;
  x = rank;
  OK(MPI_Bsend(&x, 1, MPI_INT, peer, 2, MPI_COMM_WORLD));
  OK(MPI_Buffer_iflush(&rq));
  OK(MPI_Recv(&y, 1, MPI_INT, from, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  CHECK(y == from);
  void *got;
  OK(MPI_Buffer_detach(&got, &bufsize));
  CHECK(got == buf);
  free(buf);

  t_done("t_greq");
  OK(MPI_Finalize());
  return 0;
}
