/* Communicators: dup, split, compare, free, handle conversions, collectives on new comms. */
#include "common.h"

int main(int argc, char **argv) {
  int rank, size, r, s, res;
  t_init(&argc, &argv, &rank, &size);

  MPI_Comm dup;
  OK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  CHECK(dup != MPI_COMM_NULL && dup != MPI_COMM_WORLD);
  OK(MPI_Comm_rank(dup, &r));
  OK(MPI_Comm_size(dup, &s));
  CHECK(r == rank && s == size);
  OK(MPI_Comm_compare(MPI_COMM_WORLD, MPI_COMM_WORLD, &res));
  CHECK(res == MPI_IDENT);
  OK(MPI_Comm_compare(MPI_COMM_WORLD, dup, &res));
  CHECK(res == MPI_CONGRUENT);
  /* Messages on the dup do not match receives on the world. */
  if (size > 1) {
    int a = 100 + rank, b = -1, c = -1;
    int peer = rank ^ 1;
    if (peer < size) {
      MPI_Request rq[2];
      OK(MPI_Irecv(&b, 1, MPI_INT, peer, 5, MPI_COMM_WORLD, &rq[0]));
      OK(MPI_Irecv(&c, 1, MPI_INT, peer, 5, dup, &rq[1]));
      int x = 200 + rank;
      OK(MPI_Send(&x, 1, MPI_INT, peer, 5, dup));
      OK(MPI_Send(&a, 1, MPI_INT, peer, 5, MPI_COMM_WORLD));
      OK(MPI_Waitall(2, rq, MPI_STATUSES_IGNORE));
      CHECK(b == 100 + peer && c == 200 + peer);
    }
  }

  /* Split into even and odd ranks, ordered by descending world rank. */
  MPI_Comm half;
  OK(MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half));
  OK(MPI_Comm_size(half, &s));
  OK(MPI_Comm_rank(half, &r));
  int expect_size = (size + 1 - rank % 2) / 2;
  CHECK(s == expect_size);
  /* Members of my color, highest world rank first. */
  int highest = (size - 1) - ((size - 1 - rank % 2) % 2);
  CHECK(r == (highest - rank) / 2);
  int sum = 0;
  OK(MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, half));
  int want = 0;
  for (int i = rank % 2; i < size; i += 2) want += i;
  CHECK(sum == want);
  OK(MPI_Comm_compare(MPI_COMM_WORLD, half, &res));
  CHECK(res == (size == 1 ? MPI_CONGRUENT : MPI_UNEQUAL));

  /* Same members, reversed order: similar. */
  MPI_Comm rev;
  OK(MPI_Comm_split(MPI_COMM_WORLD, 0, size - rank, &rev));
  OK(MPI_Comm_rank(rev, &r));
  CHECK(r == size - 1 - rank);
  OK(MPI_Comm_compare(MPI_COMM_WORLD, rev, &res));
  CHECK(res == (size == 1 ? MPI_CONGRUENT : MPI_SIMILAR));

  /* MPI_UNDEFINED: no communicator. */
  MPI_Comm none;
  OK(MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? 0 : MPI_UNDEFINED, 0, &none));
  if (rank == 0) {
    OK(MPI_Comm_size(none, &s));
    CHECK(s == 1);
    OK(MPI_Comm_free(&none));
  }
  CHECK(none == MPI_COMM_NULL);

  /* Handle conversions round trip. */
  CHECK(MPI_Comm_fromint(MPI_Comm_toint(MPI_COMM_WORLD)) == MPI_COMM_WORLD);
  CHECK(MPI_Comm_fromint(MPI_Comm_toint(dup)) == dup);
  CHECK(MPI_Type_fromint(MPI_Type_toint(MPI_DOUBLE)) == MPI_DOUBLE);
  CHECK(MPI_Op_fromint(MPI_Op_toint(MPI_SUM)) == MPI_SUM);
  CHECK(MPI_Comm_toint(MPI_COMM_NULL) != MPI_Comm_toint(MPI_COMM_WORLD));

  /* A dup of a dup, an errhandler inherited by the dup. */
  OK(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  MPI_Comm dup2;
  OK(MPI_Comm_dup(dup, &dup2));
  MPI_Errhandler eh;
  OK(MPI_Comm_get_errhandler(dup2, &eh));
  CHECK(eh == MPI_ERRORS_RETURN);
  OK(MPI_Errhandler_free(&eh));
  OK(MPI_Barrier(dup2));
  OK(MPI_Comm_free(&dup2));
  OK(MPI_Comm_free(&rev));
  OK(MPI_Comm_free(&half));
  OK(MPI_Comm_free(&dup));
  CHECK(dup == MPI_COMM_NULL);
  t_done("t_comm");
  OK(MPI_Finalize());
  return 0;
}
