/* More communicators: Comm_split_type by hardware (shared, guided, unguided), Comm_idup while
 * the ranks do other things first, Comm_create_group by the group's members alone, Comm_create
 * with disjoint groups, per-communicator buffers for buffered sends, names of null handles, a
 * receive posted before its communicator is freed (it still gets its message). */
#include "common.h"

static void check_congruent(MPI_Comm a, MPI_Comm b) {
  int res;
  OK(MPI_Comm_compare(a, b, &res));
  CHECK(res == MPI_CONGRUENT);
}

int main(int argc, char **argv) {
  int rank, size, s, r;
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

  /* Split types. One rank alone asks for its host's comm while the others pass UNDEFINED. */
  MPI_Comm c;
  for (int root = 0; root < size; root++) {
    OK(MPI_Comm_split_type(MPI_COMM_WORLD, rank == root ? MPI_COMM_TYPE_SHARED : MPI_UNDEFINED, 0, MPI_INFO_NULL, &c));
    if (rank == root) {
      CHECK(c != MPI_COMM_NULL);
      OK(MPI_Comm_size(c, &s));
      CHECK(s == 1);
      OK(MPI_Comm_free(&c));
    } else {
      CHECK(c == MPI_COMM_NULL);
    }
  }
  /* Guided by "mpi_shared_memory": the same as shared; no info, no key, or an unknown
   * resource type: MPI_COMM_NULL. */
  MPI_Comm shared, guided;
  MPI_Info info;
  OK(MPI_Info_create(&info));
  OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_HW_GUIDED, 0, MPI_INFO_NULL, &c));
  CHECK(c == MPI_COMM_NULL);
  OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_HW_GUIDED, 0, info, &c));
  CHECK(c == MPI_COMM_NULL);
  OK(MPI_Info_set(info, "mpi_hw_resource_type", "no-such-resource"));
  OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_HW_GUIDED, 0, info, &c));
  CHECK(c == MPI_COMM_NULL);
  OK(MPI_Info_set(info, "mpi_hw_resource_type", "mpi_shared_memory"));
  OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
  OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_HW_GUIDED, rank, info, &guided));
  CHECK(guided != MPI_COMM_NULL);
  check_congruent(shared, guided);
  OK(MPI_Comm_free(&guided));
  OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_RESOURCE_GUIDED, rank, info, &guided));
  CHECK(guided != MPI_COMM_NULL);
  check_congruent(shared, guided);
  OK(MPI_Comm_free(&guided));
  OK(MPI_Info_free(&info));
  /* Unguided: a strict subset, named in the info, or MPI_COMM_NULL (one rank: always NULL). */
  OK(MPI_Info_create(&info));
  OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_HW_UNGUIDED, rank, info, &c));
  if (c != MPI_COMM_NULL) {
    char val[MPI_MAX_INFO_VAL + 1];
    int len = sizeof val, flag = 0;
    OK(MPI_Info_get_string(info, "mpi_hw_resource_type", &len, val, &flag));
    CHECK(flag == 1);
    OK(MPI_Comm_size(c, &s));
    CHECK(s < size);
    OK(MPI_Comm_free(&c));
  }
  if (size == 1) CHECK(c == MPI_COMM_NULL);
  OK(MPI_Comm_split_type(MPI_COMM_SELF, MPI_COMM_TYPE_HW_UNGUIDED, 0, info, &c));
  CHECK(c == MPI_COMM_NULL);
  OK(MPI_Info_free(&info));
  OK(MPI_Comm_free(&shared));

  /* Idup: rank 0 starts it and sends to rank 1 before waiting; rank 1 receives first and
   * starts it after (a dup that blocked would not return on rank 0). */
  MPI_Comm dup;
  MPI_Request rq;
  int v = -1;
  if (rank == 0) {
    OK(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &rq));
    v = 42;
    if (size > 1) OK(MPI_Send(&v, 1, MPI_INT, 1, 0, MPI_COMM_WORLD));
  } else {
    if (rank == 1) OK(MPI_Recv(&v, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    OK(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &rq));
  }
  OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  CHECK(rq == MPI_REQUEST_NULL);
  if (rank == 1) CHECK(v == 42);
  check_congruent(MPI_COMM_WORLD, dup);
  int sum = 0;
  OK(MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, dup));
  CHECK(sum == size * (size - 1) / 2);
  MPI_Comm dup2;
  OK(MPI_Comm_idup_with_info(dup, MPI_INFO_NULL, &dup2, &rq));
  int done = 0, rc;
  do rc = MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
  while (rc == MPI_SUCCESS && !done);
  OK(rc);
  check_congruent(dup, dup2);
  OK(MPI_Comm_free(&dup2));

  /* Create_group: only the even ranks call it (twice, same group and tag: two comms). */
  MPI_Group wg, even;
  OK(MPI_Comm_group(MPI_COMM_WORLD, &wg));
  int range[1][3] = {{0, size - 1, 2}};
  OK(MPI_Group_range_incl(wg, 1, range, &even));
  if (rank % 2 == 0) {
    MPI_Comm e1, e2;
    OK(MPI_Comm_create_group(MPI_COMM_WORLD, even, 5, &e1));
    OK(MPI_Comm_create_group(MPI_COMM_WORLD, even, 5, &e2));
    OK(MPI_Comm_size(e1, &s));
    OK(MPI_Comm_rank(e1, &r));
    CHECK(s == (size + 1) / 2 && r == rank / 2);
    int a = 0, b = 0, one = 1;
    OK(MPI_Allreduce(&one, &a, 1, MPI_INT, MPI_SUM, e2));
    OK(MPI_Allreduce(&rank, &b, 1, MPI_INT, MPI_SUM, e1));
    CHECK(a == s);
    int want = 0;
    for (int i = 0; i < size; i += 2) want += i;
    CHECK(b == want);
    OK(MPI_Comm_free(&e1));
    OK(MPI_Comm_free(&e2));
  }
  FAILS(MPI_Comm_create_group(MPI_COMM_WORLD, even, -1, &c), MPI_ERR_TAG);

  /* Comm_create with disjoint groups: evens and odds each pass their own. */
  MPI_Group mine, odd;
  OK(MPI_Group_difference(wg, even, &odd));
  mine = rank % 2 == 0 ? even : odd;
  OK(MPI_Comm_create(MPI_COMM_WORLD, mine, &c));
  CHECK(c != MPI_COMM_NULL);
  OK(MPI_Comm_size(c, &s));
  OK(MPI_Group_size(mine, &r));
  CHECK(s == r);
  OK(MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, c));
  int want = 0;
  for (int i = rank % 2; i < size; i += 2) want += i;
  CHECK(sum == want);
  OK(MPI_Comm_free(&c));
  OK(MPI_Group_free(&odd));
  OK(MPI_Group_free(&even));
  OK(MPI_Group_free(&wg));

  /* A buffer attached to a communicator serves its buffered sends, and no other's. */
  int bufsize = 4 * (sizeof(int) + MPI_BSEND_OVERHEAD);
  char *buf = malloc(bufsize);
  OK(MPI_Comm_attach_buffer(dup, buf, bufsize));
  /* A second attach fails (MPICH's class is MPI_ERR_OTHER, ours MPI_ERR_BUFFER). */
  CHECK(MPI_Comm_attach_buffer(dup, buf, bufsize) != MPI_SUCCESS);
  int peer = (rank + 1) % size, from = (rank + size - 1) % size, x = rank, y = -1;
  OK(MPI_Bsend(&x, 1, MPI_INT, peer, 2, dup));
  OK(MPI_Recv(&y, 1, MPI_INT, from, 2, dup, MPI_STATUS_IGNORE));
  CHECK(y == from);
  FAILS(MPI_Bsend(&x, 1, MPI_INT, peer, 2, MPI_COMM_WORLD), MPI_ERR_BUFFER);
  OK(MPI_Comm_flush_buffer(dup));
  OK(MPI_Bsend(&x, 1, MPI_INT, peer, 2, dup));
  OK(MPI_Comm_iflush_buffer(dup, &rq));
  OK(MPI_Recv(&y, 1, MPI_INT, from, 2, dup, MPI_STATUS_IGNORE));
  OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  void *got = NULL;
  int gotsize = 0;
  OK(MPI_Comm_detach_buffer(dup, &got, &gotsize));
  CHECK(got == buf && gotsize == bufsize);
  /* Nothing left to detach (MPICH answers it without an error). */
  if (expect_distcomm()) FAILS(MPI_Comm_detach_buffer(dup, &got, &gotsize), MPI_ERR_BUFFER);
  OK(MPI_Comm_attach_buffer(dup, MPI_BUFFER_AUTOMATIC, 0));
  OK(MPI_Bsend(&x, 1, MPI_INT, peer, 2, dup));
  OK(MPI_Recv(&y, 1, MPI_INT, from, 2, dup, MPI_STATUS_IGNORE));
  OK(MPI_Comm_detach_buffer(dup, &got, &gotsize));
  CHECK(got == MPI_BUFFER_AUTOMATIC);
  free(buf);

  char name[MPI_MAX_OBJECT_NAME];
  int len;
  OK(MPI_Comm_get_name(MPI_COMM_NULL, name, &len));
  CHECK(strcmp(name, "MPI_COMM_NULL") == 0 && len == 13);

  OK(MPI_Comm_free(&dup));

  // Comm_disconnect: collective, frees the comm; a null handle is MPI_ERR_COMM.
  MPI_Comm d;
  OK(MPI_Comm_dup(MPI_COMM_WORLD, &d));
  int token = rank;
  if (size > 1) {
    if (rank == 0) OK(MPI_Send(&token, 1, MPI_INT, 1, 7, d));
    if (rank == 1) OK(MPI_Recv(&token, 1, MPI_INT, 0, 7, d, MPI_STATUS_IGNORE));
  }
  OK(MPI_Comm_disconnect(&d));
  CHECK(d == MPI_COMM_NULL);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  MPI_Comm null = MPI_COMM_NULL;
  int cls = -1;
  MPI_Error_class(MPI_Comm_disconnect(&null), &cls);
  CHECK(cls == MPI_ERR_COMM);
  /* MPI_Comm_free with a receive pending: the communicator lives on until it completes. */
  if (size >= 2 && rank < 2) {
    MPI_Comm pair;
    int v = -1, one = 1;
    OK(MPI_Comm_dup(MPI_COMM_SELF, &pair)); /* (unused: a freed handle's slot gets reused) */
    OK(MPI_Comm_free(&pair));
    OK(MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &pair));
    if (rank == 1) {
      OK(MPI_Irecv(&v, 1, MPI_INT, 0, 9, pair, &rq));
      OK(MPI_Comm_free(&pair));
      CHECK(pair == MPI_COMM_NULL);
      MPI_Comm other; /* a new communicator meanwhile must not disturb it */
      OK(MPI_Comm_dup(MPI_COMM_SELF, &other));
      OK(MPI_Sendrecv(&one, 1, MPI_INT, 0, 8, &one, 1, MPI_INT, 0, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
      CHECK(v == 42);
      OK(MPI_Comm_free(&other));
    } else {
      OK(MPI_Sendrecv(&one, 1, MPI_INT, 1, 8, &one, 1, MPI_INT, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      v = 42;
      OK(MPI_Send(&v, 1, MPI_INT, 1, 9, pair));
      OK(MPI_Comm_free(&pair));
    }
  } else if (size >= 2) {
    MPI_Comm pair;
    OK(MPI_Comm_dup(MPI_COMM_SELF, &pair));
    OK(MPI_Comm_free(&pair));
    OK(MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, rank, &pair));
    CHECK(pair == MPI_COMM_NULL);
  }

  t_done("t_comm2");
  OK(MPI_Finalize());
  return 0;
}
