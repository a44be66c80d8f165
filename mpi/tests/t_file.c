/* MPI-IO files: open / close / delete, MPI_MODE_DELETE_ON_CLOSE, sizes, access modes, groups,
 * independent reads and writes (explicit offsets and the individual pointer), a file shared by
 * the world's processes, and the error handlers (MPI_ERRORS_RETURN by default for files). */
#include "common.h"
#include <unistd.h>

static int eh_calls = 0, eh_class = -1;
static MPI_File eh_file = MPI_FILE_NULL;
static void file_handler(MPI_File *f, int *code, ...) {
  eh_calls++;
  eh_file = *f;
  MPI_Error_class(*code, &eh_class);
}

int main(int argc, char **argv) {
  int rank, size, amode;
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

  /* The default handler of files is MPI_ERRORS_RETURN: a failing open returns its class. */
  MPI_Errhandler eh;
  OK(MPI_File_get_errhandler(MPI_FILE_NULL, &eh));
  CHECK(eh == MPI_ERRORS_RETURN);
  OK(MPI_Errhandler_free(&eh));
  char path[256];
  snprintf(path, sizeof path, "/tmp/t_file-%d-%d.none", (int)getpid(), rank);
  MPI_File f;
  FAILS(MPI_File_open(MPI_COMM_SELF, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &f), MPI_ERR_NO_SUCH_FILE);
  FAILS(MPI_File_open(MPI_COMM_SELF, path, MPI_MODE_RDONLY | MPI_MODE_CREATE, MPI_INFO_NULL, &f), MPI_ERR_AMODE);

  /* A file of this process: written, read back, sized, deleted on close. */
  snprintf(path, sizeof path, "/tmp/t_file-%d-%d", (int)getpid(), rank);
  OK(MPI_File_open(MPI_COMM_SELF, path, MPI_MODE_RDWR | MPI_MODE_CREATE | MPI_MODE_DELETE_ON_CLOSE, MPI_INFO_NULL, &f));
  OK(MPI_File_get_amode(f, &amode));
  CHECK(amode == (MPI_MODE_RDWR | MPI_MODE_CREATE | MPI_MODE_DELETE_ON_CLOSE));
  MPI_Group g;
  int gs, count;
  OK(MPI_File_get_group(f, &g));
  OK(MPI_Group_size(g, &gs));
  CHECK(gs == 1);
  OK(MPI_Group_free(&g));
  int data[4] = {10, 20, 30, 40}, back[4] = {0};
  MPI_Status st;
  OK(MPI_File_write_at(f, 8, data, 4, MPI_INT, &st));
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == 4);
  MPI_Offset sz;
  OK(MPI_File_get_size(f, &sz));
  CHECK(sz == 8 + 4 * (MPI_Offset)sizeof(int));
  OK(MPI_File_read_at(f, 8 + sizeof(int), back, 3, MPI_INT, &st));
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == 3 && back[0] == 20 && back[2] == 40);
  /* Reading past the end: fewer elements, as the status says. */
  OK(MPI_File_read_at(f, 8 + 3 * sizeof(int), back, 4, MPI_INT, &st));
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == 1 && back[0] == 40);
  /* The individual file pointer. */
  MPI_Offset pos;
  OK(MPI_File_seek(f, 8, MPI_SEEK_SET));
  OK(MPI_File_read(f, back, 2, MPI_INT, &st));
  OK(MPI_File_get_position(f, &pos));
  CHECK(back[0] == 10 && back[1] == 20 && pos == 8 + 2 * sizeof(int));
  OK(MPI_File_set_size(f, 4));
  OK(MPI_File_get_size(f, &sz));
  CHECK(sz == 4);
  CHECK(access(path, F_OK) == 0);

  /* Error handlers: a user one is called with the file; errors of this file go to it. */
  MPI_Errhandler mine;
  OK(MPI_File_create_errhandler(file_handler, &mine));
  OK(MPI_File_set_errhandler(f, mine));
  OK(MPI_File_call_errhandler(f, MPI_ERR_IO));
  CHECK(eh_calls == 1 && eh_class == MPI_ERR_IO && eh_file == f);
  (void)MPI_File_read_at(f, -1, back, 1, MPI_INT, &st);
  CHECK(eh_calls == 2 && eh_file == f);
  OK(MPI_File_set_errhandler(f, MPI_ERRORS_RETURN));
  OK(MPI_Errhandler_free(&mine));
  OK(MPI_File_call_errhandler(f, MPI_ERR_IO));
  OK(MPI_File_close(&f));
  CHECK(f == MPI_FILE_NULL);
  CHECK(access(path, F_OK) != 0);

  /* A write-only file refuses reads; MPI_File_delete removes a closed file. */
  OK(MPI_File_open(MPI_COMM_SELF, path, MPI_MODE_WRONLY | MPI_MODE_CREATE, MPI_INFO_NULL, &f));
  CHECK(MPI_File_read_at(f, 0, back, 1, MPI_INT, &st) != MPI_SUCCESS);
  OK(MPI_File_close(&f));
  OK(MPI_File_delete(path, MPI_INFO_NULL));
  CHECK(access(path, F_OK) != 0);
  FAILS(MPI_File_delete(path, MPI_INFO_NULL), MPI_ERR_NO_SUCH_FILE);

  /* One file of the world's processes: each writes its rank at its own offset; after the
   * collective close every process reads them all. */
  int pid = (int)getpid();
  OK(MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD));
  snprintf(path, sizeof path, "/tmp/t_file-%d-shared", pid);
  OK(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_WRONLY | MPI_MODE_CREATE | MPI_MODE_EXCL, MPI_INFO_NULL, &f));
  OK(MPI_File_get_group(f, &g));
  OK(MPI_Group_size(g, &gs));
  CHECK(gs == size);
  OK(MPI_Group_free(&g));
  OK(MPI_File_write_at(f, rank * sizeof(int), &rank, 1, MPI_INT, &st));
  OK(MPI_File_close(&f));
  /* MPI_MODE_EXCL: the file exists now, so the open fails everywhere. */
  CHECK(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_WRONLY | MPI_MODE_CREATE | MPI_MODE_EXCL, MPI_INFO_NULL, &f) != MPI_SUCCESS);
  OK(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDONLY | MPI_MODE_DELETE_ON_CLOSE, MPI_INFO_NULL, &f));
  int *all = calloc(size, sizeof(int));
  OK(MPI_File_read_at(f, 0, all, size, MPI_INT, &st));
  for (int i = 0; i < size; i++) CHECK(all[i] == i);
  free(all);
  OK(MPI_File_close(&f));
  OK(MPI_Barrier(MPI_COMM_WORLD));
  CHECK(access(path, F_OK) != 0);

  t_done("t_file");
  OK(MPI_Finalize());
  return 0;
}
