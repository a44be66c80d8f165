/* MPI_ERRORS_ARE_FATAL (the default): a bad call on the last rank ends the whole job with a
 * message, while the other ranks wait in a receive that never completes; or (argument
 * "abort") the last rank calls MPI_Abort(MPI_COMM_WORLD, 3); or (argument "stuck") nobody
 * errs and every rank waits for a message that never comes, for mpiexec's MPIEXEC_TIMEOUT to
 * end. Expected: the job exits non-zero (3 for MPI_Abort) within seconds, and "never reached"
 * is never printed. */
#include "common.h"

int main(int argc, char **argv) {
  int rank, size, x = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  t_rank = rank;
  int do_abort = argc > 1 && strcmp(argv[1], "abort") == 0;
  int stuck = argc > 1 && strcmp(argv[1], "stuck") == 0;
  if (stuck) {
    MPI_Recv(&x, 1, MPI_INT, MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else if (rank == size - 1) {
    printf("t_fatal: rank %d makes the bad call\n", rank);
    fflush(stdout);
    if (do_abort) MPI_Abort(MPI_COMM_WORLD, 3);
    MPI_Send(&x, 1, MPI_INT, size + 10, 0, MPI_COMM_WORLD);
  } else {
    MPI_Recv(&x, 1, MPI_INT, size - 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  printf("t_fatal: never reached (rank %d)\n", rank);
  MPI_Finalize();
  return 0;
}
