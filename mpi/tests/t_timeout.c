/* Timeouts (distcomm's DC_TIMEOUT_MS, run with 1000): an MPI_Sendrecv whose peer is stopped
 * (SIGSTOP: its send waits for a receive that cannot come, and so does its receive) fails
 * within one timeout, not one for each half, on the direct path (dense types) and on the
 * general one (a vector type sent), with the send's error; its receive does not stay open to
 * take a later message meant for another call. Run at 2 ranks on one host, on distcomm only:
 * MPICH has no such timeout. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"
#include <signal.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static void nap_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Waits for a message from rank 0 with MPI_Test, which never times out. */
static void await_go(int tag) {
  int go = 0, done = 0;
  MPI_Request rq;
  OK(MPI_Irecv(&go, 1, MPI_INT, 0, tag, MPI_COMM_WORLD, &rq));
  while (!done) {
    OK(MPI_Test(&rq, &done, MPI_STATUS_IGNORE));
    if (!done) nap_ms(5);
  }
}

/* The state letter of process `pid` (R, S, T, ...) from /proc. */
static char state_of(pid_t pid) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return '?';
  char *got = fgets(line, sizeof line, f);
  fclose(f);
  char *paren = got ? strrchr(line, ')') : NULL;
  return paren && paren[1] == ' ' ? paren[2] : '?';
}

/* Rank 0: a sendrecv of a large message to the stopped rank 1 and a receive from it; it fails
 * with MPI_ERR_OTHER naming the send, within 1.5 s. */
static void sendrecv_times_out_once(const void *out, int count, MPI_Datatype type, const char *path) {
  int got = -1, cls = -1, len = 0;
  char msg[MPI_MAX_ERROR_STRING];
  double t0 = MPI_Wtime();
  int rc = MPI_Sendrecv(out, count, type, 1, 1, &got, 1, MPI_INT, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  double took = MPI_Wtime() - t0;
  CHECK(rc != MPI_SUCCESS);
  OK(MPI_Error_class(rc, &cls));
  OK(MPI_Error_string(rc, msg, &len));
  printf("rank 0: %s sendrecv failed after %.2f s: %s\n", path, took, msg);
  CHECK(cls == MPI_ERR_OTHER);
  if (expect_distcomm()) CHECK(strstr(msg, "timed out") && strstr(msg, "send"));
  CHECK(took >= 0.9 && took < 1.5);
  CHECK(got == -1);
}

int main(int argc, char **argv) {
  int rank, size;
  t_init(&argc, &argv, &rank, &size);
  CHECK(size == 2);
  const char *t = getenv("DC_TIMEOUT_MS");
  CHECK(t && strcmp(t, "1000") == 0);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

  enum { N = 1 << 20 }; /* 4 MiB of ints: a send that waits for its receive */
  int *big = calloc(N, sizeof(int));
  CHECK(big != NULL);
  MPI_Datatype every_other;
  OK(MPI_Type_vector(N / 2, 1, 2, MPI_INT, &every_other));
  OK(MPI_Type_commit(&every_other));

  int pid = (int)getpid();
  OK(MPI_Bcast(&pid, 1, MPI_INT, 1, MPI_COMM_WORLD));
  if (rank == 0) {
    for (int i = 0; i < 2000 && state_of(pid) != 'T'; i++) nap_ms(5);
    CHECK(state_of(pid) == 'T');
    sendrecv_times_out_once(big, N, MPI_INT, "dense (direct)");
    sendrecv_times_out_once(big, 1, every_other, "vector (general)");
    CHECK(kill(pid, SIGCONT) == 0);
    /* Rank 1 now sends on the receives' tag: the messages come to these receives, not to
     * the withdrawn ones. */
    int go = 1, a = -1, b = -1;
    OK(MPI_Send(&go, 1, MPI_INT, 1, 3, MPI_COMM_WORLD));
    OK(MPI_Recv(&a, 1, MPI_INT, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    OK(MPI_Recv(&b, 1, MPI_INT, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    CHECK(a == 41 && b == 42);
  } else {
    raise(SIGSTOP); /* until rank 0's calls have timed out */
    await_go(3);
    int a = 41, b = 42;
    OK(MPI_Send(&a, 1, MPI_INT, 0, 2, MPI_COMM_WORLD));
    OK(MPI_Send(&b, 1, MPI_INT, 0, 2, MPI_COMM_WORLD));
  }
  OK(MPI_Type_free(&every_other));
  free(big);
  OK(MPI_Barrier(MPI_COMM_WORLD));
  t_done("t_timeout");
  OK(MPI_Finalize());
  return 0;
}
