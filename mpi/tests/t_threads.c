/* MPI_THREAD_MULTIPLE: several threads of every rank call MPI at once. Tagged exchanges with
 * every rank on MPI_COMM_WORLD (blocking and non-blocking, MPI_ANY_SOURCE with a tag per thread),
 * a thread blocked in MPI_Recv while another thread of its rank sends and receives, collectives
 * on one Comm_dup per thread, matched probes of one tag from every thread (each message received
 * exactly once), requests completed by another thread than the one that started them (Waitany,
 * Testany, Waitsome), and Query_thread / Is_thread_main. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"
#include <pthread.h>
#include <time.h>

#define NT 4          /* threads per rank */
#define ROUNDS 20     /* exchange rounds per thread */
#define MID 3000      /* ints: a message larger than the small inline ones */
#define BIG 200000    /* doubles: large enough to be announced rather than sent eagerly */
#define NMSG 16       /* messages per thread in the matched-probe phase */

static int rank, size, next, prev, provided;
static pthread_barrier_t bar;
static MPI_Comm dups[NT];
static MPI_Request handed[NT][2 * 8]; /* requests one thread starts and the next one completes */
static int handed_buf[NT][8][4];
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;
static int seen[NT][NMSG]; /* matched-probe phase: receptions of (sender thread, index) */

static void pause_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int tag_of(int t, int phase) { return 100 * phase + t; }

/* Phase 1: every thread sends ROUNDS messages to every rank on its own tag and receives as many
 * from MPI_ANY_SOURCE on that tag; messages of one (source, tag) arrive in the order sent. */
static void exchange(int t) {
  int tag = tag_of(t, 1);
  int (*out)[4] = malloc(sizeof(int[4]) * size);
  int *mid = malloc(sizeof(int) * MID), *midin = malloc(sizeof(int) * MID);
  int *last = malloc(sizeof(int) * size);
  MPI_Request *rq = malloc(sizeof(MPI_Request) * size);
  for (int p = 0; p < size; p++) last[p] = -1;
  for (int r = 0; r < ROUNDS; r++) {
    for (int p = 0; p < size; p++) {
      out[p][0] = rank, out[p][1] = t, out[p][2] = r, out[p][3] = p;
      OK(MPI_Isend(out[p], 4, MPI_INT, p, tag, MPI_COMM_WORLD, &rq[p]));
    }
    for (int k = 0; k < size; k++) {
      int in[4];
      MPI_Status st;
      OK(MPI_Recv(in, 4, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &st));
      CHECK(st.MPI_TAG == tag && in[0] == st.MPI_SOURCE && in[1] == t && in[3] == rank);
      CHECK(in[2] > last[in[0]]); /* non-overtaking per source and tag */
      last[in[0]] = in[2];
    }
    OK(MPI_Waitall(size, rq, MPI_STATUSES_IGNORE));
  }
  for (int p = 0; p < size; p++) CHECK(last[p] == ROUNDS - 1);
  /* Blocking sends of a mid-sized message around the ring, received from a named source. */
  for (int r = 0; r < 4; r++) {
    for (int i = 0; i < MID; i++) mid[i] = rank * 1000000 + t * 10000 + r * 100 + i % 100;
    MPI_Request s;
    OK(MPI_Isend(mid, MID, MPI_INT, next, tag + 50, MPI_COMM_WORLD, &s));
    OK(MPI_Recv(midin, MID, MPI_INT, prev, tag + 50, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    for (int i = 0; i < MID; i++) CHECK(midin[i] == prev * 1000000 + t * 10000 + r * 100 + i % 100);
    OK(MPI_Wait(&s, MPI_STATUS_IGNORE));
  }
  free(out), free(mid), free(midin), free(last), free(rq);
}

/* Phase 2: thread 0 blocks in MPI_Recv for a message its own rank's thread 1 sends only after
 * a blocking ping-pong of a large message with the neighbours: the blocked receive must not
 * hold up the other thread's sends and receives on the same communicator. */
static void blocked(int t) {
  if (t == 0) {
    int v = -1;
    MPI_Status st;
    OK(MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, 77, MPI_COMM_WORLD, &st));
    CHECK(v == prev && st.MPI_SOURCE == prev);
  } else if (t == 1) {
    pause_ms(100); /* thread 0 is in its receive by now */
    double *big = malloc(sizeof(double) * BIG), *in = malloc(sizeof(double) * BIG);
    for (int i = 0; i < BIG; i++) big[i] = rank + i * 0.5;
    if (size == 1) {
      MPI_Request s;
      OK(MPI_Isend(big, BIG, MPI_DOUBLE, 0, 78, MPI_COMM_WORLD, &s));
      OK(MPI_Recv(in, BIG, MPI_DOUBLE, 0, 78, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      OK(MPI_Wait(&s, MPI_STATUS_IGNORE));
    } else if (rank % 2 == 0) {
      OK(MPI_Send(big, BIG, MPI_DOUBLE, next, 78, MPI_COMM_WORLD));
      OK(MPI_Recv(in, BIG, MPI_DOUBLE, prev, 78, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    } else {
      OK(MPI_Recv(in, BIG, MPI_DOUBLE, prev, 78, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      OK(MPI_Send(big, BIG, MPI_DOUBLE, next, 78, MPI_COMM_WORLD));
    }
    for (int i = 0; i < BIG; i += 997) CHECK(in[i] == prev + i * 0.5);
    OK(MPI_Send(&rank, 1, MPI_INT, next, 77, MPI_COMM_WORLD));
    free(big), free(in);
  } else {
    /* The others meanwhile exchange small messages on their own tags. */
    int v = rank * 10 + t, w = -1;
    OK(MPI_Sendrecv(&v, 1, MPI_INT, next, tag_of(t, 2), &w, 1, MPI_INT, prev, tag_of(t, 2), MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    CHECK(w == prev * 10 + t);
  }
}

/* Phase 3: collectives, each thread on its own duplicate of MPI_COMM_WORLD, all at once. */
static void colls(int t) {
  MPI_Comm c = dups[t];
  int n;
  OK(MPI_Comm_size(c, &n));
  CHECK(n == size);
  for (int r = 0; r < 30; r++) {
    int v[8], sum[8];
    for (int i = 0; i < 8; i++) v[i] = rank + t * 100 + r + i;
    OK(MPI_Allreduce(v, sum, 8, MPI_INT, MPI_SUM, c));
    for (int i = 0; i < 8; i++) CHECK(sum[i] == size * (size - 1) / 2 + size * (t * 100 + r + i));
    int b = rank == r % size ? 1000 * t + r : -1;
    OK(MPI_Bcast(&b, 1, MPI_INT, r % size, c));
    CHECK(b == 1000 * t + r);
  }
  double x = rank + t, y = 0;
  MPI_Request rq;
  OK(MPI_Iallreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, c, &rq));
  OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  CHECK(y == size - 1 + t);
  OK(MPI_Barrier(c));
}

/* Phase 4: every thread sends NMSG messages of one shared tag to the next rank, and every
 * thread of that rank takes messages of that tag with Mprobe/Improbe and Mrecv/Imrecv: each
 * message is received once, by one thread. */
static void mprobes(int t) {
  int tag = 400;
  MPI_Request s[NMSG];
  int out[NMSG][3];
  for (int i = 0; i < NMSG; i++) {
    out[i][0] = rank, out[i][1] = t, out[i][2] = i;
    OK(MPI_Isend(out[i], 3, MPI_INT, next, tag, MPI_COMM_WORLD, &s[i]));
  }
  for (int got = 0; got < NMSG; got++) {
    MPI_Message m;
    MPI_Status st;
    int in[3] = {-1, -1, -1};
    if (t % 2 == 0) {
      OK(MPI_Mprobe(prev, tag, MPI_COMM_WORLD, &m, &st));
      OK(MPI_Mrecv(in, 3, MPI_INT, &m, MPI_STATUS_IGNORE));
    } else {
      int flag = 0;
      while (!flag) OK(MPI_Improbe(MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &flag, &m, &st));
      MPI_Request r;
      OK(MPI_Imrecv(in, 3, MPI_INT, &m, &r));
      OK(MPI_Wait(&r, MPI_STATUS_IGNORE));
    }
    CHECK(m == MPI_MESSAGE_NULL && st.MPI_SOURCE == prev && in[0] == prev);
    CHECK(in[1] >= 0 && in[1] < NT && in[2] >= 0 && in[2] < NMSG);
    pthread_mutex_lock(&seen_lock);
    seen[in[1]][in[2]]++;
    pthread_mutex_unlock(&seen_lock);
  }
  OK(MPI_Waitall(NMSG, s, MPI_STATUSES_IGNORE));
}

/* Phase 5: thread t starts receives (and sends), the next thread completes them with Waitany,
 * Testany and Waitsome while the others do the same with theirs. */
static void handover(int t) {
  int tag = tag_of(t, 5);
  static int outv[NT][8];
  for (int i = 0; i < 8; i++) {
    OK(MPI_Irecv(handed_buf[t][i], 4, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &handed[t][i]));
    outv[t][i] = rank * 100 + t * 10 + i;
    OK(MPI_Isend(&outv[t][i], 1, MPI_INT, i % 2 ? next : prev, tag, MPI_COMM_WORLD, &handed[t][8 + i]));
  }
  pthread_barrier_wait(&bar);
  int o = (t + 1) % NT; /* complete the requests of thread o */
  int done = 0;
  while (done < 4) {
    int idx = -1;
    MPI_Status st;
    OK(MPI_Waitany(8, handed[o], &idx, &st));
    CHECK(idx >= 0 && idx < 8 && handed[o][idx] == MPI_REQUEST_NULL && st.MPI_TAG == tag_of(o, 5));
    done++;
  }
  while (done < 8) {
    int idx = -1, flag = 0;
    OK(MPI_Testany(8, handed[o], &idx, &flag, MPI_STATUS_IGNORE));
    if (flag) {
      CHECK(idx != MPI_UNDEFINED);
      done++;
    }
  }
  int left = 8, cnt, ids[8];
  while (left > 0) {
    OK(MPI_Waitsome(8, &handed[o][8], &cnt, ids, MPI_STATUSES_IGNORE));
    CHECK(cnt >= 1 && cnt <= left);
    left -= cnt;
  }
  int idx;
  OK(MPI_Waitany(8, handed[o], &idx, MPI_STATUS_IGNORE));
  CHECK(idx == MPI_UNDEFINED);
  /* Values: 4 from each neighbour (odd i went to next, even ones to prev). */
  int from_prev = 0, from_next = 0;
  for (int i = 0; i < 8; i++) {
    int v = handed_buf[o][i][0], src = v / 100, th = v / 10 % 10;
    CHECK(th == o);
    from_prev += src == prev && v % 2 == 1;
    from_next += src == next && v % 2 == 0;
  }
  CHECK(from_prev == 4 && from_next == 4);
}

static void *worker(void *arg) {
  int t = (int)(size_t)arg, flag = -1;
  OK(MPI_Is_thread_main(&flag));
  CHECK(flag == 0);
  int level = -1;
  OK(MPI_Query_thread(&level));
  CHECK(level == MPI_THREAD_MULTIPLE);
  exchange(t);
  pthread_barrier_wait(&bar);
  blocked(t);
  pthread_barrier_wait(&bar);
  colls(t);
  pthread_barrier_wait(&bar);
  mprobes(t);
  pthread_barrier_wait(&bar);
  handover(t);
  return NULL;
}

int main(int argc, char **argv) {
  OK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided));
  OK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  OK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  t_rank = rank;
  next = (rank + 1) % size, prev = (rank + size - 1) % size;
  int flag = 0, level = -1;
  OK(MPI_Is_thread_main(&flag));
  CHECK(flag == 1);
  OK(MPI_Query_thread(&level));
  CHECK(level == provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    CHECK(!expect_distcomm());
    printf("t_threads: this library provides thread level %d only: the threaded phases are skipped\n", provided);
  } else {
    for (int t = 0; t < NT; t++) OK(MPI_Comm_dup(MPI_COMM_WORLD, &dups[t]));
    pthread_barrier_init(&bar, NULL, NT);
    pthread_t th[NT];
    for (int t = 0; t < NT; t++) CHECK(pthread_create(&th[t], NULL, worker, (void *)(size_t)t) == 0);
    for (int t = 0; t < NT; t++) CHECK(pthread_join(th[t], NULL) == 0);
    pthread_barrier_destroy(&bar);
    for (int t = 0; t < NT; t++)
      for (int i = 0; i < NMSG; i++) CHECK(seen[t][i] == 1);
    for (int t = 0; t < NT; t++) OK(MPI_Comm_free(&dups[t]));
    OK(MPI_Barrier(MPI_COMM_WORLD));
  }
  t_done("t_threads");
  MPI_Finalize();
  return 0;
}
