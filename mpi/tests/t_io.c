/* MPI-IO through views: an interleaved view (displacement, etype, filetype) written and read
 * collectively, independently, through the individual pointer and at explicit offsets, with a
 * non-contiguous memory type; the view's queries (get_view, get_byte_offset, seek to its end);
 * the shared file pointer (independent and in rank order); non-blocking and split collective
 * access; external32; atomic mode; preallocate; and the errors of bad views. */
#include "common.h"
#include <unistd.h>

#define TILES 4

static char path[256];

/* The value rank r writes as the j-th int of its t-th block. */
static int value(int r, int t, int j) { return r * 1000 + t * 2 + j; }

/* A data representation of the test's: ints stored negated. */
static int negate_write(void *userbuf, MPI_Datatype dt, int count, void *filebuf, MPI_Offset position, void *extra) {
  (void)dt;
  (*(int *)extra)++;
  for (int i = 0; i < count; i++) ((int *)filebuf)[i] = -((int *)userbuf)[position + i];
  return MPI_SUCCESS;
}
static int negate_read(void *userbuf, MPI_Datatype dt, int count, void *filebuf, MPI_Offset position, void *extra) {
  (void)dt;
  (*(int *)extra)++;
  for (int i = 0; i < count; i++) ((int *)userbuf)[position + i] = -((int *)filebuf)[i];
  return MPI_SUCCESS;
}
static int native_extent(MPI_Datatype dt, MPI_Aint *extent, void *extra) {
  (void)extra;
  MPI_Aint lb;
  return MPI_Type_get_extent(dt, &lb, extent);
}
static int wide_extent(MPI_Datatype dt, MPI_Aint *extent, void *extra) {
  (void)extra;
  MPI_Aint lb;
  int rc = MPI_Type_get_extent(dt, &lb, extent);
  *extent *= 2;
  return rc;
}

static MPI_Offset file_size(MPI_File f) {
  MPI_Offset sz = -1;
  OK(MPI_File_get_size(f, &sz));
  return sz;
}

int main(int argc, char **argv) {
  int rank, size, count;
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int pid = (int)getpid();
  OK(MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD));
  snprintf(path, sizeof path, "/tmp/t_io-%d", pid);
  /* A file of that name left by a run that died (its pid reused now) would not start empty. */
  if (rank == 0) (void)MPI_File_delete(path, MPI_INFO_NULL);
  OK(MPI_Barrier(MPI_COMM_WORLD));
  MPI_File f;
  MPI_Status st;
  OK(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDWR | MPI_MODE_CREATE | MPI_MODE_DELETE_ON_CLOSE, MPI_INFO_NULL, &f));

  /* The view: after a 16-byte header, tiles of `size` blocks of 2 ints; rank r sees block r of
   * every tile (filetype: 2 ints, extent 2 * size ints; displacement 16 + 8 r). */
  MPI_Datatype pair, filetype;
  OK(MPI_Type_contiguous(2, MPI_INT, &pair));
  OK(MPI_Type_create_resized(pair, 0, (MPI_Aint)(2 * size * sizeof(int)), &filetype));
  OK(MPI_Type_commit(&filetype));
  MPI_Offset disp = 16 + rank * 2 * sizeof(int);
  OK(MPI_File_set_view(f, disp, MPI_INT, filetype, "native", MPI_INFO_NULL));

  /* The view's queries. */
  MPI_Offset got_disp, pos;
  MPI_Datatype got_etype, got_filetype;
  char rep[MPI_MAX_DATAREP_STRING];
  OK(MPI_File_get_view(f, &got_disp, &got_etype, &got_filetype, rep));
  CHECK(got_disp == disp && got_etype == MPI_INT && strcmp(rep, "native") == 0);
  MPI_Aint lb, ext;
  int tsize;
  OK(MPI_Type_get_extent(got_filetype, &lb, &ext));
  OK(MPI_Type_size(got_filetype, &tsize));
  CHECK(ext == (MPI_Aint)(2 * size * sizeof(int)) && tsize == 2 * (int)sizeof(int));
  OK(MPI_Type_free(&got_filetype));
  MPI_Offset byte;
  OK(MPI_File_get_byte_offset(f, 3, &byte)); /* int 3: the second int of tile 1 */
  CHECK(byte == disp + 2 * size * (MPI_Offset)sizeof(int) + (MPI_Offset)sizeof(int));
  MPI_Aint fext;
  OK(MPI_File_get_type_extent(f, MPI_INT, &fext));
  CHECK(fext == sizeof(int));

  /* Collective write through the individual pointer, from every other int of memory (a
   * non-contiguous memory type). */
  int mem[4 * TILES], back[2 * TILES];
  for (int t = 0; t < TILES; t++)
    for (int j = 0; j < 2; j++) mem[2 * (2 * t + j)] = value(rank, t, j);
  MPI_Datatype every_other;
  OK(MPI_Type_vector(2 * TILES, 1, 2, MPI_INT, &every_other));
  OK(MPI_Type_commit(&every_other));
  OK(MPI_File_write_all(f, mem, 1, every_other, &st));
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == 2 * TILES);
  OK(MPI_File_get_position(f, &pos));
  CHECK(pos == 2 * TILES);
  CHECK(file_size(f) == 16 + TILES * 2 * size * (MPI_Offset)sizeof(int));
  /* The end of the view's data is where the pointer is. */
  OK(MPI_File_seek(f, 0, MPI_SEEK_END));
  OK(MPI_File_get_position(f, &pos));
  CHECK(pos == 2 * TILES);
  OK(MPI_File_seek(f, -3, MPI_SEEK_CUR));
  OK(MPI_File_read(f, back, 2, MPI_INT, &st));
  CHECK(back[0] == value(rank, 2, 1) && back[1] == value(rank, 3, 0));

  /* Collective read at an explicit offset (in etypes of the view). */
  memset(back, 0, sizeof back);
  OK(MPI_File_read_at_all(f, 2, back, 4, MPI_INT, &st));
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == 4);
  for (int i = 0; i < 4; i++) CHECK(back[i] == value(rank, 1 + i / 2, i % 2));

  /* The whole file through the byte view: the blocks interleave by rank. */
  OK(MPI_File_set_view(f, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL));
  int n = 2 * TILES * size;
  int *all = calloc(n, sizeof(int));
  OK(MPI_File_read_at(f, 16, all, n, MPI_INT, &st));
  for (int t = 0; t < TILES; t++)
    for (int r = 0; r < size; r++)
      for (int j = 0; j < 2; j++) CHECK(all[(t * size + r) * 2 + j] == value(r, t, j));
  OK(MPI_Barrier(MPI_COMM_WORLD)); /* all have read before the start of the file is written */

  /* Non-blocking access, independent and collective: complete requests with their counts. */
  MPI_Request req;
  int mine[2] = {rank, -rank};
  OK(MPI_File_iwrite_at(f, rank * 2 * sizeof(int), mine, 2, MPI_INT, &req));
  OK(MPI_Wait(&req, &st));
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == 2);
  OK(MPI_Barrier(MPI_COMM_WORLD));
  OK(MPI_File_iread_at_all(f, 0, all, 2 * size, MPI_INT, &req));
  OK(MPI_Wait(&req, &st));
  for (int r = 0; r < size; r++) CHECK(all[2 * r] == r && all[2 * r + 1] == -r);
  OK(MPI_File_seek(f, 0, MPI_SEEK_SET));
  OK(MPI_File_iread(f, back, 1, MPI_INT, &req));
  OK(MPI_Wait(&req, &st));
  CHECK(back[0] == 0);

  /* Split collectives: the end call gives the begin call's status; one open at a time. */
  OK(MPI_File_read_at_all_begin(f, (size - 1) * 2 * sizeof(int), back, 2, MPI_INT));
  if (expect_distcomm()) FAILS(MPI_File_read_all_begin(f, back, 1, MPI_INT), MPI_ERR_OTHER);
  OK(MPI_File_read_at_all_end(f, back, &st));
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == 2 && back[0] == size - 1 && back[1] == 1 - size);

  /* The shared file pointer, over a view of ints from byte 0. */
  OK(MPI_File_set_view(f, 0, MPI_INT, MPI_INT, "native", MPI_INFO_NULL));
  OK(MPI_File_get_position_shared(f, &pos));
  CHECK(pos == 0);
  OK(MPI_Barrier(MPI_COMM_WORLD)); /* nobody moves the pointer before all have looked */
  for (int i = 0; i < 3; i++) OK(MPI_File_write_shared(f, &rank, 1, MPI_INT, &st));
  OK(MPI_Barrier(MPI_COMM_WORLD));
  OK(MPI_File_get_position_shared(f, &pos));
  CHECK(pos == 3 * size);
  OK(MPI_File_read_at(f, 0, all, 3 * size, MPI_INT, &st));
  int *seen = calloc(size, sizeof(int));
  for (int i = 0; i < 3 * size; i++) {
    CHECK(all[i] >= 0 && all[i] < size);
    seen[all[i]]++;
  }
  for (int r = 0; r < size; r++) CHECK(seen[r] == 3);
  OK(MPI_Barrier(MPI_COMM_WORLD));
  /* In rank order: rank r writes r + 1 ints after those of the ranks before it. */
  OK(MPI_File_seek_shared(f, 0, MPI_SEEK_SET));
  for (int i = 0; i <= rank; i++) all[i] = rank;
  OK(MPI_File_write_ordered(f, all, rank + 1, MPI_INT, &st));
  OK(MPI_File_get_position_shared(f, &pos));
  CHECK(pos == size * (size + 1) / 2);
  OK(MPI_Barrier(MPI_COMM_WORLD));
  OK(MPI_File_seek_shared(f, 0, MPI_SEEK_SET));
  memset(all, 0xff, n * sizeof(int));
  OK(MPI_File_read_ordered(f, all, rank + 1, MPI_INT, &st));
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == rank + 1);
  for (int i = 0; i <= rank; i++) CHECK(all[i] == rank);
  OK(MPI_File_seek_shared(f, 0, MPI_SEEK_SET));
  memset(all, 0xff, n * sizeof(int));
  OK(MPI_File_read_ordered_begin(f, all, rank + 1, MPI_INT));
  OK(MPI_File_read_ordered_end(f, all, &st));
  OK(MPI_Get_count(&st, MPI_INT, &count));
  CHECK(count == rank + 1);
  for (int i = 0; i <= rank; i++) CHECK(all[i] == rank);
  free(seen);

  /* external32: ints big-endian in the file. */
  OK(MPI_File_set_view(f, 4096, MPI_INT, MPI_INT, "external32", MPI_INFO_NULL));
  int word = 0x01020304 + rank;
  OK(MPI_File_write_at_all(f, rank, &word, 1, MPI_INT, &st));
  OK(MPI_File_read_at(f, rank, &back[0], 1, MPI_INT, &st));
  CHECK(back[0] == word);
  OK(MPI_File_set_view(f, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL));
  unsigned char raw[4];
  OK(MPI_File_read_at(f, 4096 + 4 * rank, raw, 4, MPI_BYTE, &st));
  CHECK(raw[0] == 1 && raw[1] == 2 && raw[2] == 3 && raw[3] == 4 + rank);

  /* Registered data representations, without conversions (the data as in memory) and with
   * them (MPICH registers the first kind but uses neither in a view). */
  OK(MPI_Register_datarep("t_io-plain", MPI_CONVERSION_FN_NULL, MPI_CONVERSION_FN_NULL, native_extent, NULL));
  FAILS(MPI_Register_datarep("t_io-plain", MPI_CONVERSION_FN_NULL, MPI_CONVERSION_FN_NULL, native_extent, NULL), MPI_ERR_DUP_DATAREP);
  int two[2] = {rank + 5, 7};
  if (expect_distcomm()) {
    OK(MPI_File_set_view(f, 12288, MPI_INT, MPI_INT, "t_io-plain", MPI_INFO_NULL));
    OK(MPI_File_get_view(f, &got_disp, &got_etype, &got_filetype, rep));
    CHECK(strcmp(rep, "t_io-plain") == 0 && got_disp == 12288);
    OK(MPI_File_write_at_all(f, 2 * rank, two, 2, MPI_INT, &st));
    memset(back, 0, sizeof back);
    OK(MPI_File_read_at(f, 2 * rank, back, 2, MPI_INT, &st));
    CHECK(back[0] == rank + 5 && back[1] == 7);
    int conversions = 0;
    OK(MPI_Register_datarep("t_io-negated", negate_read, negate_write, native_extent, &conversions));
    OK(MPI_File_set_view(f, 12288, MPI_INT, MPI_INT, "t_io-negated", MPI_INFO_NULL));
    OK(MPI_File_write_at_all(f, 2 * rank, two, 2, MPI_INT, &st));
    memset(back, 0, sizeof back);
    OK(MPI_File_read_at(f, 2 * rank, back, 2, MPI_INT, &st));
    CHECK(back[0] == rank + 5 && back[1] == 7 && conversions == 2);
    OK(MPI_File_set_view(f, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL));
    OK(MPI_File_read_at(f, 12288 + 8 * rank, back, 2, MPI_INT, &st));
    CHECK(back[0] == -(rank + 5) && back[1] == -7);
    /* Only the native layout is stored: a representation of other extents is refused. */
    OK(MPI_Register_datarep("t_io-wide", MPI_CONVERSION_FN_NULL, MPI_CONVERSION_FN_NULL, wide_extent, NULL));
    FAILS(MPI_File_set_view(f, 0, MPI_INT, MPI_INT, "t_io-wide", MPI_INFO_NULL), MPI_ERR_UNSUPPORTED_DATAREP);
  }
  OK(MPI_File_set_view(f, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL));

  /* Atomic mode; preallocate. */
  OK(MPI_File_set_atomicity(f, 1));
  int flag;
  OK(MPI_File_get_atomicity(f, &flag));
  CHECK(flag == 1);
  OK(MPI_File_write_at_all(f, 8192 + rank * sizeof(int), &rank, 1, MPI_INT, &st));
  OK(MPI_File_read_at(f, 8192 + rank * sizeof(int), &back[0], 1, MPI_INT, &st));
  CHECK(back[0] == rank);
  OK(MPI_File_set_atomicity(f, 0));
  OK(MPI_File_preallocate(f, 1 << 16));
  CHECK(file_size(f) >= 1 << 16);

  /* Bad views are refused before anything moves. */
  MPI_Datatype three;
  OK(MPI_Type_contiguous(3, MPI_BYTE, &three));
  OK(MPI_Type_commit(&three));
  CHECK(MPI_File_set_view(f, 0, MPI_INT, three, "native", MPI_INFO_NULL) != MPI_SUCCESS);
  CHECK(MPI_File_set_view(f, 0, MPI_INT, MPI_INT, "no-such-rep", MPI_INFO_NULL) != MPI_SUCCESS);
  /* Displacements that go back, or overlap on a file open for writing: MPI_ERR_IO. */
  MPI_Datatype backwards, overlapping;
  int bl[2] = {1, 1}, dsp[2] = {3, 0}, bl2[2] = {3, 1}, dsp2[2] = {0, 1};
  OK(MPI_Type_indexed(2, bl, dsp, MPI_INT, &backwards));
  OK(MPI_Type_indexed(2, bl2, dsp2, MPI_INT, &overlapping));
  OK(MPI_Type_commit(&backwards));
  OK(MPI_Type_commit(&overlapping));
  FAILS(MPI_File_set_view(f, 0, MPI_INT, backwards, "native", MPI_INFO_NULL), MPI_ERR_IO);
  FAILS(MPI_File_set_view(f, 0, MPI_INT, overlapping, "native", MPI_INFO_NULL), MPI_ERR_IO);
  OK(MPI_Type_free(&backwards));
  OK(MPI_Type_free(&overlapping));
  if (expect_distcomm()) {
    FAILS(MPI_File_set_view(f, 0, MPI_INT, three, "native", MPI_INFO_NULL), MPI_ERR_TYPE);
    FAILS(MPI_File_set_view(f, 0, MPI_INT, MPI_INT, "no-such-rep", MPI_INFO_NULL), MPI_ERR_UNSUPPORTED_DATAREP);
    FAILS(MPI_File_set_view(f, -5, MPI_INT, MPI_INT, "native", MPI_INFO_NULL), MPI_ERR_ARG);
    FAILS(MPI_File_read_at_all_end(f, back, &st), MPI_ERR_OTHER);
  }
  OK(MPI_Type_free(&three));

  OK(MPI_File_close(&f));
  OK(MPI_Barrier(MPI_COMM_WORLD));
  CHECK(access(path, F_OK) != 0);
  OK(MPI_Type_free(&every_other));
  OK(MPI_Type_free(&filetype));
  OK(MPI_Type_free(&pair));
  free(all);
  t_done("t_io");
  OK(MPI_Finalize());
  return 0;
}
