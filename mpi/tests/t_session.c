/* Sessions (within MPI_Init .. MPI_Finalize): the process sets mpi://WORLD and mpi://SELF,
 * their info and groups, communicators made from those groups, and the session's error
 * handler; bad names and MPI_SESSION_NULL fail with their classes. */
#include "common.h"

static int eh_calls = 0, eh_class = -1;
static void session_handler(MPI_Session *s, int *code, ...) {
  (void)s;
  eh_calls++;
  MPI_Error_class(*code, &eh_class);
}

int main(int argc, char **argv) {
  int rank, size, n, len, flag;
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

  MPI_Session s;
  OK(MPI_Session_init(MPI_INFO_NULL, MPI_ERRORS_RETURN, &s));
  CHECK(s != MPI_SESSION_NULL);

  /* The process sets: both standard ones are there, with their sizes. */
  OK(MPI_Session_get_num_psets(s, MPI_INFO_NULL, &n));
  CHECK(n >= 2);
  int seen_world = 0, seen_self = 0;
  for (int i = 0; i < n; i++) {
    char name[256];
    len = 0;
    OK(MPI_Session_get_nth_pset(s, MPI_INFO_NULL, i, &len, NULL));
    CHECK(len > 1 && len <= (int)sizeof name);
    OK(MPI_Session_get_nth_pset(s, MPI_INFO_NULL, i, &len, name));
    CHECK((int)strlen(name) == len - 1);
    seen_world += strcmp(name, "mpi://WORLD") == 0;
    seen_self += strcmp(name, "mpi://SELF") == 0;
  }
  CHECK(seen_world == 1 && seen_self == 1);
  len = 0;
  FAILS(MPI_Session_get_nth_pset(s, MPI_INFO_NULL, -1, &len, NULL), MPI_ERR_ARG);

  MPI_Info info;
  char val[64];
  OK(MPI_Session_get_pset_info(s, "mpi://WORLD", &info));
  OK(MPI_Info_get_string(info, "mpi_size", &(int){sizeof val}, val, &flag));
  CHECK(flag && atoi(val) == size);
  OK(MPI_Info_free(&info));
  OK(MPI_Session_get_pset_info(s, "mpi://SELF", &info));
  OK(MPI_Info_get_string(info, "mpi_size", &(int){sizeof val}, val, &flag));
  CHECK(flag && atoi(val) == 1);
  OK(MPI_Info_free(&info));
  FAILS(MPI_Session_get_pset_info(s, "@qerty!#$", &info), MPI_ERR_ARG);
  OK(MPI_Session_get_info(s, &info));
  OK(MPI_Info_free(&info));

  /* Groups of the process sets. */
  MPI_Group gw, gs, gworld;
  int res;
  OK(MPI_Group_from_session_pset(s, "mpi://WORLD", &gw));
  OK(MPI_Comm_group(MPI_COMM_WORLD, &gworld));
  OK(MPI_Group_compare(gw, gworld, &res));
  CHECK(res == MPI_IDENT);
  OK(MPI_Group_from_session_pset(s, "mpi://SELF", &gs));
  OK(MPI_Group_size(gs, &n));
  CHECK(n == 1);
  OK(MPI_Group_rank(gs, &n));
  CHECK(n == 0);
  MPI_Group bad;
  FAILS(MPI_Group_from_session_pset(s, "@qerty!#$", &bad), MPI_ERR_ARG);

  /* Communicators from those groups: the world's processes, then this one alone. */
  MPI_Comm cw, cs;
  OK(MPI_Comm_create_from_group(gw, "t_session.world", MPI_INFO_NULL, MPI_ERRORS_RETURN, &cw));
  OK(MPI_Comm_size(cw, &n));
  CHECK(n == size);
  OK(MPI_Comm_rank(cw, &n));
  CHECK(n == rank);
  int sum = 0;
  OK(MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, cw));
  CHECK(sum == size * (size - 1) / 2);
  MPI_Errhandler got;
  OK(MPI_Comm_get_errhandler(cw, &got));
  CHECK(got == MPI_ERRORS_RETURN);
  OK(MPI_Errhandler_free(&got));
  /* Buffered sends on a communicator of the session use the session's buffer (MPI 4.1), also
   * on a duplicate of it. */
  {
    int bsize = 4 * (int)(sizeof(int) + MPI_BSEND_OVERHEAD), v = rank, r = -1;
    int peer = (rank + 1) % size, from = (rank + size - 1) % size;
    char *bbuf = malloc(bsize);
    MPI_Comm dup;
    OK(MPI_Comm_dup(cw, &dup));
    FAILS(MPI_Bsend(&v, 1, MPI_INT, peer, 7, cw), MPI_ERR_BUFFER);
    OK(MPI_Session_attach_buffer(s, bbuf, bsize));
    OK(MPI_Bsend(&v, 1, MPI_INT, peer, 7, cw));
    OK(MPI_Recv(&r, 1, MPI_INT, from, 7, cw, MPI_STATUS_IGNORE));
    CHECK(r == from);
    OK(MPI_Bsend(&v, 1, MPI_INT, peer, 8, dup));
    OK(MPI_Recv(&r, 1, MPI_INT, from, 8, dup, MPI_STATUS_IGNORE));
    CHECK(r == from);
    OK(MPI_Session_flush_buffer(s));
    MPI_Request fr;
    OK(MPI_Session_iflush_buffer(s, &fr));
    OK(MPI_Wait(&fr, MPI_STATUS_IGNORE));
    void *back = NULL;
    int back_size = 0;
    OK(MPI_Session_detach_buffer(s, &back, &back_size));
    CHECK(back == bbuf && back_size == bsize);
    FAILS(MPI_Bsend(&v, 1, MPI_INT, peer, 7, cw), MPI_ERR_BUFFER);
    OK(MPI_Comm_free(&dup));
    free(bbuf);
  }
  OK(MPI_Comm_create_from_group(gs, "t_session.self", MPI_INFO_NULL, MPI_ERRORS_RETURN, &cs));
  OK(MPI_Comm_size(cs, &n));
  CHECK(n == 1);
  OK(MPI_Comm_free(&cs));
  /* A group of some processes: the even ranks of the world make a comm of their own, while
   * the odd ones make theirs (the calls are collective over the group only). */
  int ne = 0, *ranks = malloc(sizeof(int) * size);
  for (int i = rank % 2; i < size; i += 2) ranks[ne++] = i;
  MPI_Group half;
  MPI_Comm ch;
  OK(MPI_Group_incl(gworld, ne, ranks, &half));
  OK(MPI_Comm_create_from_group(half, rank % 2 ? "t_session.odd" : "t_session.even", MPI_INFO_NULL, MPI_ERRORS_RETURN, &ch));
  OK(MPI_Comm_size(ch, &n));
  CHECK(n == ne);
  OK(MPI_Comm_rank(ch, &n));
  CHECK(n == rank / 2);
  sum = 0;
  OK(MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, ch));
  int want = 0;
  for (int i = 0; i < ne; i++) want += ranks[i];
  CHECK(sum == want);
  OK(MPI_Comm_free(&ch));
  OK(MPI_Group_free(&half));
  free(ranks);
  OK(MPI_Comm_free(&cw));
  OK(MPI_Group_free(&gw));
  OK(MPI_Group_free(&gs));
  OK(MPI_Group_free(&gworld));

  /* The session's error handler. */
  MPI_Errhandler eh;
  OK(MPI_Session_get_errhandler(s, &got));
  CHECK(got == MPI_ERRORS_RETURN);
  OK(MPI_Errhandler_free(&got));
  OK(MPI_Session_create_errhandler(session_handler, &eh));
  OK(MPI_Session_set_errhandler(s, eh));
  OK(MPI_Session_call_errhandler(s, MPI_ERR_OTHER));
  CHECK(eh_calls == 1 && eh_class == MPI_ERR_OTHER);
  (void)MPI_Session_get_pset_info(s, "no such pset", &info);
  CHECK(eh_calls == 2 && eh_class == MPI_ERR_ARG);
  OK(MPI_Session_set_errhandler(s, MPI_ERRORS_RETURN));
  OK(MPI_Errhandler_free(&eh));
  OK(MPI_Session_call_errhandler(s, MPI_ERR_OTHER));

  OK(MPI_Session_finalize(&s));
  CHECK(s == MPI_SESSION_NULL);
  FAILS(MPI_Session_get_num_psets(MPI_SESSION_NULL, MPI_INFO_NULL, &n), MPI_ERR_SESSION);
  FAILS(MPI_Session_set_errhandler(MPI_SESSION_NULL, MPI_ERRORS_RETURN), MPI_ERR_SESSION);

  t_done("t_session");
  OK(MPI_Finalize());
  return 0;
}
