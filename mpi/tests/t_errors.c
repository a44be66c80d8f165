/* Bad arguments under MPI_ERRORS_RETURN give the standard's error class and leave the program
 * running; user error handlers are called; error strings; MPI_ERR_UNSUPPORTED_OPERATION. */
#include "common.h"

static int handler_calls = 0, handler_class = -1;
static MPI_Comm handler_comm = MPI_COMM_NULL;

static void handler(MPI_Comm *comm, int *code, ...) {
  handler_calls++;
  handler_comm = *comm;
  MPI_Error_class(*code, &handler_class);
}

/* A handler that makes a failing MPI call itself (as mpi4py's does when it wraps the comm):
 * that call must return to it, not recurse through the handler until the stack ends. */
static int nested_calls = 0, nested_rc = MPI_SUCCESS;

static void nested_handler(MPI_Comm *comm, int *code, ...) {
  int one = 1;
  (void)code;
  if (++nested_calls == 1)
    nested_rc = MPI_Send(&one, 1, MPI_INT, 0, -1, *comm); /* a bad tag: fails again */
}

int main(int argc, char **argv) {
  int rank, size, x = 1, y = 0;
  t_init(&argc, &argv, &rank, &size);
  MPI_Errhandler eh;
  OK(MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh));
  CHECK(eh == MPI_ERRORS_ARE_FATAL);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));

  /* Point to point. */
  FAILS(MPI_Send(&x, 1, MPI_INT, size, 0, MPI_COMM_WORLD), MPI_ERR_RANK);
  FAILS(MPI_Send(&x, 1, MPI_INT, -7, 0, MPI_COMM_WORLD), MPI_ERR_RANK);
  FAILS(MPI_Send(&x, 1, MPI_INT, 0, -5, MPI_COMM_WORLD), MPI_ERR_TAG);
  {
    /* A send-receive whose send half is bad fails and leaves no receive posted into its buffer:
     * the next message of that tag goes to the next receive (a receive left behind would take
     * it, and this Recv would wait out the timeout). */
    int left = -1, next = -1, v = 42, me2 = rank;
    FAILS(MPI_Sendrecv(&x, 1, MPI_INT, size, 0, &left, 1, MPI_INT, me2, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE), MPI_ERR_RANK);
    MPI_Request q;
    OK(MPI_Isend(&v, 1, MPI_INT, me2, 77, MPI_COMM_WORLD, &q));
    OK(MPI_Recv(&next, 1, MPI_INT, me2, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    OK(MPI_Wait(&q, MPI_STATUS_IGNORE));
    CHECK(next == 42 && left == -1);
  }
  FAILS(MPI_Send(&x, 1, MPI_INT, 0, MPI_ANY_TAG, MPI_COMM_WORLD), MPI_ERR_TAG);
  FAILS(MPI_Send(&x, -1, MPI_INT, 0, 0, MPI_COMM_WORLD), MPI_ERR_COUNT);
  FAILS(MPI_Send(&x, 1, MPI_DATATYPE_NULL, 0, 0, MPI_COMM_WORLD), MPI_ERR_TYPE);
  FAILS(MPI_Send(NULL, 4, MPI_INT, 0, 0, MPI_COMM_WORLD), MPI_ERR_BUFFER);
  FAILS(MPI_Recv(&y, 1, MPI_INT, size + 3, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE), MPI_ERR_RANK);
  FAILS(MPI_Send(&x, 1, MPI_INT, 0, 0, MPI_COMM_NULL), MPI_ERR_COMM);
  if (expect_distcomm()) { /* MPICH's requests are pointers: it crashes on this one */
    MPI_Request bogus = MPI_Request_fromint(0x7654321);
    FAILS(MPI_Wait(&bogus, MPI_STATUS_IGNORE), MPI_ERR_REQUEST);
  }

  /* A message longer than the receive buffer: truncation, and the program goes on. */
  int four[4] = {1, 2, 3, 4}, one = 0;
  MPI_Request rq;
  OK(MPI_Isend(four, 4, MPI_INT, rank, 8, MPI_COMM_WORLD, &rq));
  FAILS(MPI_Recv(&one, 1, MPI_INT, rank, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE), MPI_ERR_TRUNCATE);
  OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  /* The same through a send-receive to ourselves (its direct path), and the program goes on. */
  {
    MPI_Status ts;
    FAILS(MPI_Sendrecv(four, 4, MPI_INT, rank, 9, &one, 1, MPI_INT, rank, 9, MPI_COMM_WORLD, &ts), MPI_ERR_TRUNCATE);
    OK(MPI_Sendrecv(four, 1, MPI_INT, rank, 9, &one, 1, MPI_INT, rank, 9, MPI_COMM_WORLD, &ts));
    CHECK(one == 1);
  }

  /* Collectives (every rank makes the same bad call, so nothing is left half done). */
  FAILS(MPI_Bcast(&x, 1, MPI_INT, size, MPI_COMM_WORLD), MPI_ERR_ROOT);
  FAILS(MPI_Reduce(&x, &y, 1, MPI_INT, MPI_OP_NULL, 0, MPI_COMM_WORLD), MPI_ERR_OP);
  float f = 1, g;
  FAILS(MPI_Allreduce(&f, &g, 1, MPI_FLOAT, MPI_BXOR, MPI_COMM_WORLD), MPI_ERR_OP);
  if (expect_distcomm()) /* MPICH 5.0.2 from PyPI lets this one through */
    FAILS(MPI_Allreduce(&x, &y, -2, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_ERR_COUNT);
  OK(MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  CHECK(y == size);
  {
    /* Send and receive buffers that are the same (not MPI_IN_PLACE) or overlap: aliasing,
     * refused before anything is sent (MPICH checks the same buffer only). */
    int v[8] = {0}, *all = calloc((size_t)size * 2 + 1, sizeof(int));
    FAILS(MPI_Allreduce(v, v, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_ERR_BUFFER);
    FAILS(MPI_Alltoall(all, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD), MPI_ERR_BUFFER);
    if (expect_distcomm()) {
      FAILS(MPI_Allreduce(v, v + 1, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_ERR_BUFFER);
      FAILS(MPI_Allgather(all + size - 1, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD), MPI_ERR_BUFFER);
      FAILS(MPI_Alltoall(all + size - 1, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD), MPI_ERR_BUFFER);
      MPI_Request q;
      FAILS(MPI_Iallreduce(v, v + 2, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &q), MPI_ERR_BUFFER);
    }
    OK(MPI_Allreduce(v, v + 4, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD)); /* apart: fine */
    free(all);
  }

  /* Buffered sends: none without a buffer, none beyond its size. */
  FAILS(MPI_Bsend(&x, 1, MPI_INT, rank, 0, MPI_COMM_WORLD), MPI_ERR_BUFFER);
  char small[MPI_BSEND_OVERHEAD + 8];
  OK(MPI_Buffer_attach(small, sizeof small));
  int many[256] = {0};
  FAILS(MPI_Bsend(many, 256, MPI_INT, rank, 0, MPI_COMM_WORLD), MPI_ERR_BUFFER);
  void *det;
  int dsz;
  OK(MPI_Buffer_detach(&det, &dsz));
  CHECK(det == (void *)small && dsz == (int)sizeof small);

  /* An uncommitted and a freed datatype. */
  MPI_Datatype pair, kept_t;
  OK(MPI_Type_contiguous(2, MPI_INT, &pair));
  FAILS(MPI_Send(four, 1, pair, rank, 0, MPI_COMM_WORLD), MPI_ERR_TYPE);
  OK(MPI_Type_commit(&pair));
  kept_t = pair;
  OK(MPI_Type_free(&pair));
  if (expect_distcomm()) /* (MPICH may still find the freed handle valid) */
    FAILS(MPI_Send(four, 1, kept_t, rank, 0, MPI_COMM_WORLD), MPI_ERR_TYPE);
  MPI_Datatype predef = MPI_INT;
  FAILS(MPI_Type_free(&predef), MPI_ERR_TYPE);

  /* A freed communicator. */
  MPI_Comm dup, kept;
  OK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  kept = dup;
  OK(MPI_Comm_free(&dup));
  FAILS(MPI_Barrier(kept), MPI_ERR_COMM);
  FAILS(MPI_Comm_free(&dup), MPI_ERR_COMM);

  /* Error strings and classes. */
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0, cls = -1;
  int rc = MPI_Send(&x, 1, MPI_INT, size, 0, MPI_COMM_WORLD);
  OK(MPI_Error_class(rc, &cls));
  CHECK(cls == MPI_ERR_RANK);
  OK(MPI_Error_string(rc, msg, &len));
  CHECK(len > 0 && (size_t)len == strlen(msg));
  OK(MPI_Error_string(MPI_ERR_TRUNCATE, msg, &len));
  CHECK(len > 0);
  OK(MPI_Error_class(MPI_ERR_OTHER, &cls));
  CHECK(cls == MPI_ERR_OTHER);
  if (expect_distcomm()) {
    OK(MPI_Error_string(rc, msg, &len));
    CHECK(strstr(msg, "MPI_Send") != NULL && strstr(msg, "MPI_ERR_RANK") != NULL);
    /* A function outside the supported set answers MPI_ERR_UNSUPPORTED_OPERATION and names
     * itself; DC_DEBUG=WARN logs it (scripts/mpi_test.sh checks the log). */
    rc = MPI_Close_port("no-such-port");
    OK(MPI_Error_class(rc, &cls));
    CHECK(cls == MPI_ERR_UNSUPPORTED_OPERATION);
    OK(MPI_Error_string(rc, msg, &len));
    CHECK(strstr(msg, "MPI_Close_port") != NULL);
    rc = PMPI_Comm_spawn("x", MPI_ARGV_NULL, 1, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &dup, MPI_ERRCODES_IGNORE);
    OK(MPI_Error_class(rc, &cls));
    CHECK(cls == MPI_ERR_UNSUPPORTED_OPERATION);
  }

  /* A user error handler: called with the comm and the error; the call then returns. */
  MPI_Errhandler mine;
  OK(MPI_Comm_create_errhandler(handler, &mine));
  OK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  OK(MPI_Comm_set_errhandler(dup, mine));
  rc = MPI_Send(&x, 1, MPI_INT, 0, -1, dup);
  /* (what the call returns after a user handler differs: MPICH says MPI_SUCCESS, we the code) */
  CHECK(handler_calls == 1 && handler_class == MPI_ERR_TAG && handler_comm == dup);
  OK(MPI_Comm_call_errhandler(dup, MPI_ERR_ARG));
  CHECK(handler_calls == 2 && handler_class == MPI_ERR_ARG);
  OK(MPI_Errhandler_free(&mine));
  CHECK(mine == MPI_ERRHANDLER_NULL);

  MPI_Errhandler nested;
  OK(MPI_Comm_create_errhandler(nested_handler, &nested));
  OK(MPI_Comm_set_errhandler(dup, nested));
  (void)MPI_Send(&x, 1, MPI_INT, 0, -1, dup);
  CHECK(nested_calls >= 1);
  /* (MPICH calls the handler again inside, and returns MPI_SUCCESS after a user handler) */
  if (expect_distcomm()) CHECK(nested_calls == 1 && nested_rc != MPI_SUCCESS);
  OK(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  OK(MPI_Errhandler_free(&nested));
  {
    int topo = 0;
    OK(MPI_Topo_test(dup, &topo));
    CHECK(topo == MPI_UNDEFINED);
  }
  OK(MPI_Comm_free(&dup));

  t_done("t_errors");
  OK(MPI_Finalize());
  return 0;
}
