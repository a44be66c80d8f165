/* Partitioned communication (MPI 4.0): MPI_Psend_init / MPI_Precv_init around a ring, started
 * three times, parts marked ready one by one, as a range and as a list, in any order;
 * MPI_Parrived; partitioned messages never match a receive of MPI_ANY_TAG. */
#include "common.h"

#define PARTS 4
#define PER 3

int main(int argc, char **argv) {
  int rank, size;
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int to = (rank + 1) % size, from = (rank + size - 1) % size;
  int out[PARTS * PER], in[PARTS * PER];
  MPI_Request sreq, rreq;
  OK(MPI_Psend_init(out, PARTS, PER, MPI_INT, to, 5, MPI_COMM_WORLD, MPI_INFO_NULL, &sreq));
  OK(MPI_Precv_init(in, PARTS, PER, MPI_INT, from, 5, MPI_COMM_WORLD, MPI_INFO_NULL, &rreq));

  /* A receive of any tag posted first must not take the partitioned message. */
  int plain = -1;
  MPI_Request any;
  OK(MPI_Irecv(&plain, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &any));

  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < PARTS * PER; i++) out[i] = rank * 1000 + round * 100 + i, in[i] = -1;
    OK(MPI_Start(&rreq));
    OK(MPI_Start(&sreq));
    if (round == 0) {
      for (int p = PARTS - 1; p >= 0; p--) OK(MPI_Pready(p, sreq));
    } else if (round == 1) {
      OK(MPI_Pready_range(0, PARTS - 1, sreq));
    } else {
      int list[PARTS] = {2, 0, 3, 1};
      OK(MPI_Pready_list(PARTS, list, sreq));
    }
    int arrived = 0;
    while (!arrived) OK(MPI_Parrived(rreq, PARTS - 1, &arrived));
    OK(MPI_Wait(&sreq, MPI_STATUS_IGNORE));
    OK(MPI_Wait(&rreq, MPI_STATUS_IGNORE));
    for (int i = 0; i < PARTS * PER; i++) CHECK(in[i] == from * 1000 + round * 100 + i);
  }
  /* Every partitioned message has arrived; no plain one is sent yet. */
  OK(MPI_Barrier(MPI_COMM_WORLD));
  int flag = 1;
  OK(MPI_Test(&any, &flag, MPI_STATUS_IGNORE));
  CHECK(!flag && plain == -1);
  OK(MPI_Barrier(MPI_COMM_WORLD));
  OK(MPI_Send(&rank, 1, MPI_INT, to, 9, MPI_COMM_WORLD));
  MPI_Status st;
  OK(MPI_Wait(&any, &st));
  CHECK(plain == from && st.MPI_TAG == 9);

  if (expect_distcomm()) {
    /* A part out of range, or marked twice; a part of a request not started. */
    OK(MPI_Start(&rreq));
    OK(MPI_Start(&sreq));
    FAILS(MPI_Pready(PARTS, sreq), MPI_ERR_ARG);
    OK(MPI_Pready_range(0, PARTS - 2, sreq));
    FAILS(MPI_Pready(0, sreq), MPI_ERR_ARG);
    FAILS(MPI_Pready(0, rreq), MPI_ERR_REQUEST);
    OK(MPI_Pready(PARTS - 1, sreq));
    OK(MPI_Wait(&sreq, MPI_STATUS_IGNORE));
    OK(MPI_Wait(&rreq, MPI_STATUS_IGNORE));
    FAILS(MPI_Pready(0, sreq), MPI_ERR_REQUEST);
  }
  OK(MPI_Request_free(&sreq));
  OK(MPI_Request_free(&rreq));
  t_done("t_partitioned");
  OK(MPI_Finalize());
  return 0;
}
