/* Persistent collectives (MPI 4.0 *_init): started several times with new inputs, in a
 * different order on different ranks (matched by init order), intracommunicator and every
 * form; and a receive of no elements of MPI_DATATYPE_NULL (MPICH takes it as no bytes). */
#include "common.h"

int main(int argc, char **argv) {
  int rank, size;
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

  /* A broadcast and a barrier, started in opposite orders on even and odd ranks. */
  int a = -1;
  MPI_Request rq[2];
  OK(MPI_Bcast_init(&a, 1, MPI_INT, 0, MPI_COMM_WORLD, MPI_INFO_NULL, &rq[0]));
  OK(MPI_Barrier_init(MPI_COMM_WORLD, MPI_INFO_NULL, &rq[1]));
  for (int round = 0; round < 3; round++) {
    if (rank == 0) a = 40 + round;
    if (rank % 2 == 0) {
      OK(MPI_Start(&rq[0]));
      OK(MPI_Start(&rq[1]));
    } else {
      OK(MPI_Startall(2, (MPI_Request[]){rq[1], rq[0]}));
    }
    OK(MPI_Waitall(2, rq, MPI_STATUSES_IGNORE));
    CHECK(rq[0] != MPI_REQUEST_NULL && rq[1] != MPI_REQUEST_NULL); /* inactive, not freed */
    CHECK(a == 40 + round);
  }
  /* Started while active: MPI_ERR_REQUEST. */
  OK(MPI_Start(&rq[1]));
  FAILS(MPI_Start(&rq[1]), MPI_ERR_REQUEST);
  OK(MPI_Wait(&rq[1], MPI_STATUS_IGNORE));
  OK(MPI_Request_free(&rq[0]));
  OK(MPI_Request_free(&rq[1]));
  CHECK(rq[0] == MPI_REQUEST_NULL);

  /* Allreduce, reduce, scan, exscan and allgather, each started twice with new inputs. */
  int in = 0, sum = -1, red = -1, sc = -1, ex = -1, *all = malloc(sizeof(int) * size);
  MPI_Request r5[5];
  OK(MPI_Allreduce_init(&in, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &r5[0]));
  OK(MPI_Reduce_init(&in, &red, 1, MPI_INT, MPI_MAX, size - 1, MPI_COMM_WORLD, MPI_INFO_NULL, &r5[1]));
  OK(MPI_Scan_init(&in, &sc, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &r5[2]));
  OK(MPI_Exscan_init(&in, &ex, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &r5[3]));
  OK(MPI_Allgather_init_c(&in, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD, MPI_INFO_NULL, &r5[4]));
  for (int round = 1; round <= 2; round++) {
    in = round * (rank + 1);
    OK(MPI_Startall(5, r5));
    OK(MPI_Waitall(5, r5, MPI_STATUSES_IGNORE));
    CHECK(sum == round * size * (size + 1) / 2);
    if (rank == size - 1) CHECK(red == round * size);
    CHECK(sc == round * (rank + 1) * (rank + 2) / 2);
    if (rank > 0) CHECK(ex == round * rank * (rank + 1) / 2);
    for (int j = 0; j < size; j++) CHECK(all[j] == round * (j + 1));
  }
  for (int j = 0; j < 5; j++) OK(MPI_Request_free(&r5[j]));
  free(all);

  /* A bad argument gives its class at the init call (MPICH) or when the request is started
   * (distcomm: the non-blocking collective's own checks), never a crash or a hang. */
  MPI_Request bad = MPI_REQUEST_NULL;
  int e = MPI_Bcast_init(&a, -1, MPI_INT, 0, MPI_COMM_WORLD, MPI_INFO_NULL, &bad), cls = -1;
  if (e == MPI_SUCCESS) {
    if (expect_distcomm()) FAILS(MPI_Start(&bad), MPI_ERR_COUNT);
    OK(MPI_Request_free(&bad));
  } else {
    OK(MPI_Error_class(e, &cls));
    CHECK(cls == MPI_ERR_COUNT);
  }

  /* No elements of MPI_DATATYPE_NULL, from MPI_PROC_NULL and from ourselves. */
  MPI_Status st;
  MPI_Request r;
  OK(MPI_Irecv(NULL, 0, MPI_DATATYPE_NULL, MPI_PROC_NULL, 1, MPI_COMM_WORLD, &r));
  OK(MPI_Wait(&r, &st));
  CHECK(st.MPI_SOURCE == MPI_PROC_NULL);
  OK(MPI_Irecv(NULL, 0, MPI_DATATYPE_NULL, rank, 2, MPI_COMM_WORLD, &r));
  OK(MPI_Send(NULL, 0, MPI_DATATYPE_NULL, rank, 2, MPI_COMM_WORLD));
  OK(MPI_Wait(&r, &st));
  int cnt = -1;
  OK(MPI_Get_count(&st, MPI_BYTE, &cnt));
  CHECK(st.MPI_SOURCE == rank && cnt == 0);

  /* The count and displacement arrays are read by the init call (as MPICH does): changed
   * afterwards, they do not change what each start moves. */
  {
    int *counts = malloc(size * sizeof(int)), *displs = malloc(size * sizeof(int));
    int *all = calloc(2 * size, sizeof(int)), mine[2] = {rank, -rank};
    for (int i = 0; i < size; i++) counts[i] = 2, displs[i] = 2 * i;
    MPI_Request r;
    OK(MPI_Allgatherv_init(mine, 2, MPI_INT, all, counts, displs, MPI_INT, MPI_COMM_WORLD, MPI_INFO_NULL, &r));
    for (int i = 0; i < size; i++) counts[i] = -7, displs[i] = 1 << 30;
    for (int round = 0; round < 2; round++) {
      OK(MPI_Start(&r));
      OK(MPI_Wait(&r, MPI_STATUS_IGNORE));
      for (int i = 0; i < size; i++) CHECK(all[2 * i] == i && all[2 * i + 1] == -i);
    }
    OK(MPI_Request_free(&r));
    free(counts);
    free(displs);
    free(all);
  }

  /* Requests made and freed again and again (their communicators are reused once every member
   * has freed theirs), freed in different orders on different ranks. */
  for (int i = 0; i < 200; i++) {
    MPI_Request p[2];
    int x = rank == 0 ? i : -1, y = rank == size - 1 ? 2 * i : -1;
    OK(MPI_Bcast_init(&x, 1, MPI_INT, 0, MPI_COMM_WORLD, MPI_INFO_NULL, &p[0]));
    OK(MPI_Bcast_init(&y, 1, MPI_INT, size - 1, MPI_COMM_WORLD, MPI_INFO_NULL, &p[1]));
    OK(MPI_Startall(2, p));
    OK(MPI_Waitall(2, p, MPI_STATUSES_IGNORE));
    CHECK(x == i && y == 2 * i);
    OK(MPI_Request_free(&p[rank % 2]));
    OK(MPI_Request_free(&p[1 - rank % 2]));
  }

  t_done("t_pcoll");
  OK(MPI_Finalize());
  return 0;
}
