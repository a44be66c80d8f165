/* A failed process (distcomm's MPIX_ERR_PROC_FAILED, an error class beyond the standard ABI):
 * rank 1 of 3 is killed (SIGKILL; with the argument "exit": it ends with _exit(0), without
 * MPI_Finalize). Under MPI_ERRORS_RETURN ranks 0 and 2 get MPIX_ERR_PROC_FAILED, naming rank 1,
 * from a receive from it, from a receive from any source (until MPIX_Comm_failure_ack) and
 * from collectives on MPI_COMM_WORLD, within seconds; the calls that
 * do not need rank 1 still work, and the survivors finalize. A killed rank ends the whole job
 * unless the launcher is told otherwise (mpiexec -disable-auto-cleanup). Run at 3 ranks, on
 * distcomm only. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"
#include <signal.h>
#include <unistd.h>

#ifndef MPIX_ERR_PROC_FAILED
#error "this test needs MPIX_ERR_PROC_FAILED (distcomm's mpi.h)"
#endif

/* The call failed with MPIX_ERR_PROC_FAILED and its string names rank 1. */
static void proc_failed(int rc, const char *what) {
  int cls = -1, len = 0;
  char msg[MPI_MAX_ERROR_STRING];
  CHECK(rc != MPI_SUCCESS);
  OK(MPI_Error_class(rc, &cls));
  OK(MPI_Error_string(rc, msg, &len));
  printf("rank %d: %s: %s\n", t_rank, what, msg);
  CHECK(cls == MPIX_ERR_PROC_FAILED);
  CHECK(strstr(msg, "MPIX_ERR_PROC_FAILED") != NULL && strstr(msg, "rank 1") != NULL);
  OK(MPI_Error_string(MPIX_ERR_PROC_FAILED, msg, &len));
  CHECK(strstr(msg, "MPIX_ERR_PROC_FAILED") == msg);
}

int main(int argc, char **argv) {
  int rank, size;
  t_init(&argc, &argv, &rank, &size);
  CHECK(size == 3);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
  int one = 1, sum = 0;
  OK(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  CHECK(sum == 3);
  if (rank == 1) {
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "exit") == 0) _exit(0);
    raise(SIGKILL);
  }
  double t0 = MPI_Wtime();
  int v = -1;
  proc_failed(MPI_Recv(&v, 1, MPI_INT, 1, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv from rank 1");
  CHECK(MPI_Wtime() - t0 < 10);
  MPI_Request rq;
  /* A non-blocking receive fails when it is started or when it is waited for. */
  int rc = MPI_Irecv(&v, 1, MPI_INT, 1, 6, MPI_COMM_WORLD, &rq);
  if (rc == MPI_SUCCESS) rc = MPI_Wait(&rq, MPI_STATUS_IGNORE);
  proc_failed(rc, "MPI_Irecv/MPI_Wait from rank 1");
  /* A receive from any source could be rank 1's to satisfy: it fails too (nobody sends). */
  proc_failed(MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv from any source");
  CHECK(MPI_Wtime() - t0 < 15);
  /* ULFM's acknowledgement: once rank 1's loss is acknowledged, receives from any source go
   * on with the others (rank 0 sends to rank 2, which receives from any source); one from
   * rank 1 itself still fails. */
  OK(MPIX_Comm_failure_ack(MPI_COMM_WORLD));
  MPI_Group acked, world_group;
  OK(MPIX_Comm_failure_get_acked(MPI_COMM_WORLD, &acked));
  int nacked = -1, in_world = -1, zero = 0;
  OK(MPI_Group_size(acked, &nacked));
  CHECK(nacked == 1);
  OK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  OK(MPI_Group_translate_ranks(acked, 1, &zero, world_group, &in_world));
  CHECK(in_world == 1);
  OK(MPI_Group_free(&acked));
  OK(MPI_Group_free(&world_group));
  if (rank == 0) {
    int hello = 42;
    OK(MPI_Send(&hello, 1, MPI_INT, 2, 10, MPI_COMM_WORLD));
  } else {
    MPI_Status st;
    v = -1;
    OK(MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, 10, MPI_COMM_WORLD, &st));
    CHECK(v == 42 && st.MPI_SOURCE == 0);
  }
  proc_failed(MPI_Recv(&v, 1, MPI_INT, 1, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv from rank 1 after the acknowledgement");
  proc_failed(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  proc_failed(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  CHECK(MPI_Wtime() - t0 < 20);

  /* What does not need rank 1 goes on. */
  int n = 0;
  OK(MPI_Comm_size(MPI_COMM_WORLD, &n));
  CHECK(n == 3);
  OK(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_SELF));
  CHECK(sum == 1);
  int me = rank * 10, got = -1;
  OK(MPI_Sendrecv(&me, 1, MPI_INT, 0, 7, &got, 1, MPI_INT, 0, 7, MPI_COMM_SELF, MPI_STATUS_IGNORE));
  CHECK(got == me);
  int peer = 2 - rank; /* 0 <-> 2 on MPI_COMM_WORLD */
  OK(MPI_Sendrecv(&me, 1, MPI_INT, peer, 8, &got, 1, MPI_INT, peer, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  CHECK(got == peer * 10);
  t_done("t_proc_failed");
  OK(MPI_Finalize());
  return 0;
}
