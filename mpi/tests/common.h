/* Shared by the MPI layer's C tests. They use only the standard's API, so the same source runs
 * on any standard-ABI library; checks of distcomm's own behaviour (library name, error strings,
 * unsupported functions) run only with EXPECT_DISTCOMM=1 in the environment. */
#ifndef MPI_TEST_COMMON_H
#define MPI_TEST_COMMON_H
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_rank = -1;
static int t_checks = 0; /* counted atomically: t_threads checks from several threads */
#define T_COUNT() __atomic_fetch_add(&t_checks, 1, __ATOMIC_RELAXED)

#define CHECK(cond)                                                                        \
  do {                                                                                     \
    T_COUNT();                                                                             \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "FAIL rank %d %s:%d: %s\n", t_rank, __FILE__, __LINE__, #cond);      \
      fflush(stderr);                                                                      \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* An MPI call that must succeed. */
#define OK(call) CHECK((call) == MPI_SUCCESS)

/* An MPI call that must fail with error class `cls` (the comm's handler is ERRORS_RETURN). */
#define FAILS(call, cls)                                                                   \
  do {                                                                                     \
    int rc_ = (call), cls_ = -1;                                                           \
    if (rc_ != MPI_SUCCESS) MPI_Error_class(rc_, &cls_);                                   \
    if (cls_ != (cls)) {                                                                   \
      fprintf(stderr, "FAIL rank %d %s:%d: %s gave rc %d (class %d), expected class %s\n", \
              t_rank, __FILE__, __LINE__, #call, rc_, cls_, #cls);                         \
      exit(1);                                                                             \
    }                                                                                      \
    T_COUNT();                                                                             \
  } while (0)

static inline int expect_distcomm(void) {
  const char *e = getenv("EXPECT_DISTCOMM");
  return e && strcmp(e, "1") == 0;
}

/* MPI_Init, this process's rank and the size of MPI_COMM_WORLD (t_rank set for the checks). */
static inline void t_init(int *argc, char ***argv, int *rank, int *size) {
  OK(MPI_Init(argc, argv));
  OK(MPI_Comm_rank(MPI_COMM_WORLD, rank));
  OK(MPI_Comm_size(MPI_COMM_WORLD, size));
  t_rank = *rank;
}

static inline void t_done(const char *name) {
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  printf("%s: rank %d of %d passed %d checks\n", name, t_rank, size, t_checks);
}
#endif
