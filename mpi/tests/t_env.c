#define _DEFAULT_SOURCE
/* Environment: init/finalize state, thread level, versions, names, clocks, attributes. */
#include "common.h"
#include <unistd.h>

int main(int argc, char **argv) {
  int flag = -1, provided = -1, v, sv, len;
  OK(MPI_Initialized(&flag));
  CHECK(flag == 0);
  OK(MPI_Finalized(&flag));
  CHECK(flag == 0);
  OK(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided));
  MPI_Comm_rank(MPI_COMM_WORLD, &t_rank);
  CHECK(provided >= MPI_THREAD_SINGLE && provided <= MPI_THREAD_MULTIPLE);
  int q = -1;
  OK(MPI_Query_thread(&q));
  CHECK(q == provided);
  OK(MPI_Initialized(&flag));
  CHECK(flag == 1);
  OK(MPI_Is_thread_main(&flag));
  CHECK(flag == 1);
  OK(MPI_Get_version(&v, &sv));
  CHECK(v == MPI_VERSION && sv == MPI_SUBVERSION && v == 5 && sv == 0);
  int amaj = -1, amin = -1;
  OK(MPI_Abi_get_version(&amaj, &amin));
  CHECK(amaj == 1 && amin == 0);

  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  OK(MPI_Get_library_version(lib, &len));
  CHECK(len > 0 && (size_t)len == strlen(lib));
  if (expect_distcomm()) CHECK(strstr(lib, "distcomm") != NULL && strstr(lib, "MPICH") == NULL);

  char name[MPI_MAX_PROCESSOR_NAME], host[256] = "";
  OK(MPI_Get_processor_name(name, &len));
  gethostname(host, sizeof host);
  CHECK(len == (int)strlen(name) && strcmp(name, host) == 0);

  double t0 = MPI_Wtime(), tick = MPI_Wtick();
  CHECK(tick > 0 && tick < 1);
  usleep(20000);
  double t1 = MPI_Wtime();
  CHECK(t1 - t0 >= 0.019 && t1 - t0 < 5);

  int *val = NULL;
  OK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &val, &flag));
  CHECK(flag == 1 && val != NULL && *val >= 32767);
  OK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_WTIME_IS_GLOBAL, &val, &flag));
  CHECK(flag == 0 || (*val == 0 || *val == 1));

  int size;
  OK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  OK(MPI_Comm_size(MPI_COMM_SELF, &v));
  CHECK(v == 1);
  OK(MPI_Comm_rank(MPI_COMM_SELF, &v));
  CHECK(v == 0);
  CHECK(MPI_Aint_add(100, 28) == 128 && MPI_Aint_diff(128, 100) == 28);

  t_done("t_env");
  OK(MPI_Finalize());
  OK(MPI_Finalized(&flag));
  CHECK(flag == 1);
  OK(MPI_Initialized(&flag));
  CHECK(flag == 1);
  return 0;
}
