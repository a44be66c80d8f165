/* Derived datatypes: every constructor (sizes, bounds, envelopes and contents), names, pack and
 * unpack (native and external32), point to point with different send and receive types of one
 * signature (blocking, non-blocking, persistent, probes), counts and elements of statuses,
 * collectives on non-contiguous types, reductions on them, Alltoallw, and bad arguments. */
#include "common.h"
#include <stddef.h>
#include <stdint.h>

static int rank, size, next, prev;

static void extent_is(MPI_Datatype t, MPI_Aint lb, MPI_Aint ext, int sz) {
  MPI_Aint l = -1, e = -1;
  int s = -1;
  OK(MPI_Type_get_extent(t, &l, &e));
  OK(MPI_Type_size(t, &s));
  if (l != lb || e != ext || s != sz)
    fprintf(stderr, "rank %d: lb %ld extent %ld size %d, expected %ld %ld %d\n", rank, (long)l, (long)e, s,
            (long)lb, (long)ext, sz);
  CHECK(l == lb && e == ext && s == sz);
}

static void true_extent_is(MPI_Datatype t, MPI_Aint lb, MPI_Aint ext) {
  MPI_Aint l = -1, e = -1;
  OK(MPI_Type_get_true_extent(t, &l, &e));
  CHECK(l == lb && e == ext);
}

static void constructors(void) {
  MPI_Datatype t;
  /* vector(3, 2, 4) of double: 2 doubles every 4. */
  OK(MPI_Type_vector(3, 2, 4, MPI_DOUBLE, &t));
  extent_is(t, 0, 80, 48);
  true_extent_is(t, 0, 80);
  int ni, na, nd, comb, ints[8];
  MPI_Aint addrs[4];
  MPI_Datatype types[2];
  OK(MPI_Type_get_envelope(t, &ni, &na, &nd, &comb));
  CHECK(comb == MPI_COMBINER_VECTOR && ni == 3 && na == 0 && nd == 1);
  OK(MPI_Type_get_contents(t, 3, 0, 1, ints, addrs, types));
  CHECK(ints[0] == 3 && ints[1] == 2 && ints[2] == 4 && types[0] == MPI_DOUBLE);
  OK(MPI_Type_free(&t));
  /* hvector with a negative stride: the lower bound moves below 0. */
  OK(MPI_Type_create_hvector(3, 1, -16, MPI_INT, &t));
  extent_is(t, -32, 36, 12);
  true_extent_is(t, -32, 36);
  OK(MPI_Type_get_envelope(t, &ni, &na, &nd, &comb));
  CHECK(comb == MPI_COMBINER_HVECTOR && ni == 2 && na == 1 && nd == 1);
  OK(MPI_Type_free(&t));
  /* indexed: blocks {2 at 0, 1 at 5, 3 at 8} of int. */
  int bls[3] = {2, 1, 3}, dis[3] = {0, 5, 8};
  OK(MPI_Type_indexed(3, bls, dis, MPI_INT, &t));
  extent_is(t, 0, 44, 24);
  OK(MPI_Type_free(&t));
  MPI_Aint hdis[3] = {4, 40, 20};
  OK(MPI_Type_create_hindexed(3, bls, hdis, MPI_INT, &t));
  extent_is(t, 4, 40, 24);
  OK(MPI_Type_free(&t));
  OK(MPI_Type_create_indexed_block(3, 2, dis, MPI_SHORT, &t));
  extent_is(t, 0, 20, 12);
  OK(MPI_Type_free(&t));
  OK(MPI_Type_create_hindexed_block(3, 2, hdis, MPI_SHORT, &t));
  extent_is(t, 4, 40, 12);
  OK(MPI_Type_free(&t));
  /* struct { char c; double d; }: padded to 16 like the C struct; { int; char }: 8. */
  struct cd { char c; double d; };
  int bl2[2] = {1, 1};
  MPI_Aint d2[2] = {offsetof(struct cd, c), offsetof(struct cd, d)};
  MPI_Datatype ty2[2] = {MPI_CHAR, MPI_DOUBLE};
  OK(MPI_Type_create_struct(2, bl2, d2, ty2, &t));
  extent_is(t, 0, (MPI_Aint)sizeof(struct cd), 9);
  true_extent_is(t, 0, 16);
  OK(MPI_Type_get_envelope(t, &ni, &na, &nd, &comb));
  CHECK(comb == MPI_COMBINER_STRUCT && ni == 3 && na == 2 && nd == 2);
  OK(MPI_Type_get_contents(t, 3, 2, 2, ints, addrs, types));
  CHECK(ints[0] == 2 && ints[1] == 1 && addrs[1] == 8 && types[0] == MPI_CHAR && types[1] == MPI_DOUBLE);
  OK(MPI_Type_free(&t));
  struct ic { int i; char c; };
  MPI_Aint d3[2] = {offsetof(struct ic, i), offsetof(struct ic, c)};
  MPI_Datatype ty3[2] = {MPI_INT, MPI_CHAR};
  OK(MPI_Type_create_struct(2, bl2, d3, ty3, &t));
  extent_is(t, 0, (MPI_Aint)sizeof(struct ic), 5);
  OK(MPI_Type_free(&t));
  /* subarray: a 2x3 block at (1, 1) of a 4x5 int array, in C and in Fortran order. */
  int sizes[2] = {4, 5}, subs[2] = {2, 3}, starts[2] = {1, 1};
  OK(MPI_Type_create_subarray(2, sizes, subs, starts, MPI_ORDER_C, MPI_INT, &t));
  extent_is(t, 0, 80, 24);
  true_extent_is(t, 24, 32);
  OK(MPI_Type_get_envelope(t, &ni, &na, &nd, &comb));
  CHECK(comb == MPI_COMBINER_SUBARRAY && ni == 8 && na == 0 && nd == 1);
  OK(MPI_Type_commit(&t));
  int grid[20], packed[6], pos = 0;
  for (int i = 0; i < 20; i++) grid[i] = i;
  OK(MPI_Pack(grid, 1, t, packed, sizeof packed, &pos, MPI_COMM_WORLD));
  CHECK(pos == 24 && packed[0] == 6 && packed[2] == 8 && packed[3] == 11 && packed[5] == 13);
  OK(MPI_Type_free(&t));
  OK(MPI_Type_create_subarray(2, sizes, subs, starts, MPI_ORDER_FORTRAN, MPI_INT, &t));
  OK(MPI_Type_commit(&t));
  pos = 0;
  OK(MPI_Pack(grid, 1, t, packed, sizeof packed, &pos, MPI_COMM_WORLD));
  /* Fortran order: element (i, j) at i + 4 j; the first dimension runs fastest. */
  CHECK(pos == 24 && packed[0] == 5 && packed[1] == 6 && packed[2] == 9 && packed[5] == 14);
  true_extent_is(t, 20, 40);
  OK(MPI_Type_free(&t));
  /* resized, and the extent of a vector of it. */
  MPI_Datatype r, v;
  OK(MPI_Type_create_resized(MPI_INT, -4, 12, &r));
  extent_is(r, -4, 12, 4);
  true_extent_is(r, 0, 4);
  OK(MPI_Type_contiguous(3, r, &v));
  extent_is(v, -4, 36, 12);
  true_extent_is(v, 0, 28);
  OK(MPI_Type_get_envelope(v, &ni, &na, &nd, &comb));
  CHECK(comb == MPI_COMBINER_CONTIGUOUS && ni == 1 && nd == 1);
  OK(MPI_Type_get_contents(v, 1, 0, 1, ints, addrs, types));
  CHECK(ints[0] == 3);
  /* A derived old type comes back as a handle the caller frees; it is the resized type. */
  MPI_Aint l, e;
  OK(MPI_Type_get_extent(types[0], &l, &e));
  CHECK(l == -4 && e == 12);
  OK(MPI_Type_free(&types[0]));
  OK(MPI_Type_free(&v));
  OK(MPI_Type_free(&r));
  /* Large-count forms. */
  OK(MPI_Type_vector_c(2, 1, 3, MPI_INT, &t));
  MPI_Count lc, ec, sc;
  OK(MPI_Type_get_extent_c(t, &lc, &ec));
  OK(MPI_Type_size_c(t, &sc));
  CHECK(lc == 0 && ec == 16 && sc == 8);
  MPI_Count cni, cna, cnc, cnd;
  OK(MPI_Type_get_envelope_c(t, &cni, &cna, &cnc, &cnd, &comb));
  CHECK(comb == MPI_COMBINER_VECTOR && cnd == 1 && cni + cnc == 3);
  OK(MPI_Type_free(&t));
  /* Names, and dup. */
  OK(MPI_Type_contiguous(2, MPI_INT, &t));
  OK(MPI_Type_set_name(t, "pair of ints"));
  char name[MPI_MAX_OBJECT_NAME];
  int len;
  OK(MPI_Type_get_name(t, name, &len));
  CHECK(strcmp(name, "pair of ints") == 0 && len == 12);
  MPI_Datatype u;
  OK(MPI_Type_dup(t, &u));
  OK(MPI_Type_get_envelope(u, &ni, &na, &nd, &comb));
  CHECK(comb == MPI_COMBINER_DUP && nd == 1);
  extent_is(u, 0, 8, 8);
  OK(MPI_Type_free(&u));
  OK(MPI_Type_free(&t));
  OK(MPI_Type_get_envelope(MPI_INT, &ni, &na, &nd, &comb));
  CHECK(comb == MPI_COMBINER_NAMED);
}

static void pack_unpack(void) {
  MPI_Datatype v;
  OK(MPI_Type_vector(3, 1, 2, MPI_INT, &v));
  OK(MPI_Type_commit(&v));
  int src[12], dst[12], buf[16], psize = -1, pos = 0;
  for (int i = 0; i < 12; i++) src[i] = 100 + i, dst[i] = -1;
  OK(MPI_Pack_size(2, v, MPI_COMM_WORLD, &psize));
  CHECK(psize >= 24);
  /* Two elements of extent 5 ints: 0, 2, 4 then 5, 7, 9; then one more int. */
  OK(MPI_Pack(src, 2, v, buf, sizeof buf, &pos, MPI_COMM_WORLD));
  CHECK(pos == 24 && buf[0] == 100 && buf[1] == 102 && buf[3] == 105 && buf[5] == 109);
  OK(MPI_Pack(&src[11], 1, MPI_INT, buf, sizeof buf, &pos, MPI_COMM_WORLD));
  CHECK(pos == 28);
  pos = 0;
  OK(MPI_Unpack(buf, sizeof buf, &pos, dst, 2, v, MPI_COMM_WORLD));
  CHECK(pos == 24);
  for (int i = 0; i < 10; i++) CHECK(dst[i] == ((i == 0 || i == 2 || i == 4 || i == 5 || i == 7 || i == 9) ? 100 + i : -1));
  int last = 0;
  OK(MPI_Unpack(buf, sizeof buf, &pos, &last, 1, MPI_INT, MPI_COMM_WORLD));
  CHECK(last == 111 && pos == 28);
  /* external32: big-endian ints. */
  MPI_Aint esize = 0, epos = 0;
  unsigned char ext[64];
  OK(MPI_Pack_external_size("external32", 2, v, &esize));
  CHECK(esize == 24);
  OK(MPI_Pack_external("external32", src, 2, v, ext, sizeof ext, &epos));
  CHECK(epos == 24 && ext[0] == 0 && ext[3] == 100 && ext[7] == 102);
  double dd = 1.5;
  OK(MPI_Pack_external("external32", &dd, 1, MPI_DOUBLE, ext, sizeof ext, &epos));
  CHECK(epos == 32 && ext[24] == 0x3f && ext[25] == 0xf8);
  for (int i = 0; i < 12; i++) dst[i] = -1;
  epos = 0;
  OK(MPI_Unpack_external("external32", ext, sizeof ext, &epos, dst, 2, v));
  CHECK(epos == 24 && dst[0] == 100 && dst[9] == 109 && dst[1] == -1);
  double back = 0;
  OK(MPI_Unpack_external("external32", ext, sizeof ext, &epos, &back, 1, MPI_DOUBLE));
  CHECK(back == 1.5);
  OK(MPI_Type_free(&v));
}

/* A vector of doubles sent, contiguous doubles received (one signature), and back. */
static void p2p(void) {
  MPI_Datatype vec, cont;
  OK(MPI_Type_vector(4, 1, 3, MPI_DOUBLE, &vec)); /* doubles 0, 3, 6, 9 */
  OK(MPI_Type_contiguous(4, MPI_DOUBLE, &cont));
  OK(MPI_Type_commit(&vec));
  OK(MPI_Type_commit(&cont));
  double out[20], in[8], grid[20];
  for (int i = 0; i < 20; i++) out[i] = rank * 100 + i, grid[i] = -1;
  MPI_Status st;
  /* Two vector elements (extent 10 doubles): 0 3 6 9 10 13 16 19. */
  OK(MPI_Sendrecv(out, 2, vec, next, 1, in, 2, cont, prev, 1, MPI_COMM_WORLD, &st));
  int cnt = -1;
  OK(MPI_Get_count(&st, cont, &cnt));
  CHECK(cnt == 2);
  OK(MPI_Get_count(&st, vec, &cnt));
  CHECK(cnt == 2);
  OK(MPI_Get_elements(&st, vec, &cnt));
  CHECK(cnt == 8);
  static const int idx[8] = {0, 3, 6, 9, 10, 13, 16, 19};
  for (int i = 0; i < 8; i++) CHECK(in[i] == prev * 100 + idx[i]);
  /* Contiguous sent, vector received, non-blocking; the receive type is freed before Wait. */
  MPI_Request rq[2];
  MPI_Datatype vec2;
  OK(MPI_Type_dup(vec, &vec2));
  OK(MPI_Irecv(grid, 2, vec2, prev, 2, MPI_COMM_WORLD, &rq[0]));
  OK(MPI_Type_free(&vec2));
  OK(MPI_Isend(in, 2, cont, next, 2, MPI_COMM_WORLD, &rq[1]));
  OK(MPI_Waitall(2, rq, MPI_STATUSES_IGNORE));
  int pprev = (prev + size - 1) % size; /* in[] of prev came from its prev */
  for (int i = 0; i < 20; i++) {
    int k = -1;
    for (int j = 0; j < 8; j++)
      if (idx[j] == i) k = j;
    CHECK(grid[i] == (k < 0 ? -1 : pprev * 100 + idx[k]));
  }
  /* A shorter message: 5 doubles into 2 vectors: Get_count undefined, Get_elements 5. */
  OK(MPI_Sendrecv(out, 5, MPI_DOUBLE, next, 3, grid, 2, vec, prev, 3, MPI_COMM_WORLD, &st));
  OK(MPI_Get_count(&st, vec, &cnt));
  CHECK(cnt == MPI_UNDEFINED);
  OK(MPI_Get_elements(&st, vec, &cnt));
  CHECK(cnt == 5);
  MPI_Count cc = -1;
  OK(MPI_Get_elements_c(&st, vec, &cc));
  CHECK(cc == 5);
  CHECK(grid[0] == prev * 100 + 0 && grid[3] == prev * 100 + 1 && grid[10] == prev * 100 + 4);
  /* A struct with mixed elements: Get_elements counts each basic element. */
  struct id { int i; double d; } sv[2] = {{rank, rank + 0.5}, {rank + 1, rank + 1.5}}, rv[2];
  int bl[2] = {1, 1};
  MPI_Aint ds[2] = {offsetof(struct id, i), offsetof(struct id, d)};
  MPI_Datatype ts[2] = {MPI_INT, MPI_DOUBLE}, sid;
  OK(MPI_Type_create_struct(2, bl, ds, ts, &sid));
  OK(MPI_Type_commit(&sid));
  OK(MPI_Sendrecv(sv, 2, sid, next, 4, rv, 2, sid, prev, 4, MPI_COMM_WORLD, &st));
  CHECK(rv[0].i == prev && rv[1].d == prev + 1.5);
  OK(MPI_Get_elements(&st, sid, &cnt));
  CHECK(cnt == 4);
  OK(MPI_Get_count(&st, sid, &cnt));
  CHECK(cnt == 2);
  /* A pair type is two basic elements: 3 of MPI_DOUBLE_INT are a pair and a double. */
  OK(MPI_Status_set_elements(&st, MPI_DOUBLE_INT, 3));
  OK(MPI_Get_elements(&st, MPI_DOUBLE_INT, &cnt));
  CHECK(cnt == 3);
  OK(MPI_Get_count(&st, MPI_DOUBLE_INT, &cnt));
  CHECK(cnt == MPI_UNDEFINED);
  /* MPI_BOTTOM with a struct of absolute addresses. */
  int ai = rank * 3, bi = -1;
  double ad = rank + 0.25, bd = -1;
  MPI_Aint abs_s[2], abs_r[2];
  OK(MPI_Get_address(&ai, &abs_s[0]));
  OK(MPI_Get_address(&ad, &abs_s[1]));
  OK(MPI_Get_address(&bi, &abs_r[0]));
  OK(MPI_Get_address(&bd, &abs_r[1]));
  MPI_Datatype as_t, ar_t;
  OK(MPI_Type_create_struct(2, bl, abs_s, ts, &as_t));
  OK(MPI_Type_create_struct(2, bl, abs_r, ts, &ar_t));
  OK(MPI_Type_commit(&as_t));
  OK(MPI_Type_commit(&ar_t));
  OK(MPI_Sendrecv(MPI_BOTTOM, 1, as_t, next, 10, MPI_BOTTOM, 1, ar_t, prev, 10, MPI_COMM_WORLD, &st));
  CHECK(bi == prev * 3 && bd == prev + 0.25);
  OK(MPI_Type_free(&as_t));
  OK(MPI_Type_free(&ar_t));
  /* Probe and mprobe/mrecv with a vector receive. */
  for (int i = 0; i < 20; i++) grid[i] = -1;
  OK(MPI_Isend(out, 4, MPI_DOUBLE, next, 5, MPI_COMM_WORLD, &rq[0]));
  MPI_Message msg;
  OK(MPI_Mprobe(prev, 5, MPI_COMM_WORLD, &msg, &st));
  OK(MPI_Get_count(&st, vec, &cnt));
  CHECK(cnt == 1);
  OK(MPI_Mrecv(grid, 1, vec, &msg, &st));
  OK(MPI_Wait(&rq[0], MPI_STATUS_IGNORE));
  CHECK(grid[0] == prev * 100 && grid[3] == prev * 100 + 1 && grid[9] == prev * 100 + 3 && grid[1] == -1);
  /* Persistent requests, started twice. */
  MPI_Request ps[2];
  OK(MPI_Recv_init(grid, 1, vec, prev, 6, MPI_COMM_WORLD, &ps[0]));
  OK(MPI_Send_init(out, 1, vec, next, 6, MPI_COMM_WORLD, &ps[1]));
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 20; i++) grid[i] = -1;
    out[3] = rank * 100 + 3 + round;
    OK(MPI_Startall(2, ps));
    OK(MPI_Waitall(2, ps, MPI_STATUSES_IGNORE));
    CHECK(grid[3] == prev * 100 + 3 + round && grid[6] == prev * 100 + 6 && grid[4] == -1);
  }
  OK(MPI_Request_free(&ps[0]));
  OK(MPI_Request_free(&ps[1]));
  out[3] = rank * 100 + 3;
  /* Sendrecv_replace on a vector. */
  double rep[10];
  for (int i = 0; i < 10; i++) rep[i] = rank * 100 + i;
  OK(MPI_Sendrecv_replace(rep, 1, vec, next, 7, prev, 7, MPI_COMM_WORLD, &st));
  CHECK(rep[0] == prev * 100 && rep[9] == prev * 100 + 9 && rep[1] == rank * 100 + 1);
  if (expect_distcomm()) { /* MPICH 5.0.2 unpacks a non-contiguous Isendrecv_replace wrongly */
    for (int i = 0; i < 10; i++) rep[i] = rank * 100 + i;
    MPI_Request rr;
    OK(MPI_Isendrecv_replace(rep, 1, vec, next, 8, prev, 8, MPI_COMM_WORLD, &rr));
    OK(MPI_Wait(&rr, &st));
    CHECK(rep[3] == prev * 100 + 3 && rep[4] == rank * 100 + 4);
    OK(MPI_Get_count(&st, vec, &cnt));
    CHECK(cnt == 1);
  }
  /* A buffered send of a vector: the attached buffer counts packed bytes. */
  int bsize = 0;
  OK(MPI_Pack_size(1, vec, MPI_COMM_WORLD, &bsize));
  bsize += MPI_BSEND_OVERHEAD;
  void *att = malloc(bsize);
  OK(MPI_Buffer_attach(att, bsize));
  OK(MPI_Bsend(out, 1, vec, next, 9, MPI_COMM_WORLD));
  OK(MPI_Recv(in, 4, MPI_DOUBLE, prev, 9, MPI_COMM_WORLD, &st));
  CHECK(in[0] == prev * 100 && in[1] == prev * 100 + 3 && in[3] == prev * 100 + 9);
  void *det;
  OK(MPI_Buffer_detach(&det, &bsize));
  free(att);
  OK(MPI_Type_free(&sid));
  OK(MPI_Type_free(&vec));
  OK(MPI_Type_free(&cont));
}

static void collectives(void) {
  MPI_Datatype col;
  /* One column of a 4x4 int matrix, resized to one int so that columns follow each other. */
  MPI_Datatype col0;
  OK(MPI_Type_vector(4, 1, 4, MPI_INT, &col0));
  OK(MPI_Type_create_resized(col0, 0, sizeof(int), &col));
  OK(MPI_Type_free(&col0));
  OK(MPI_Type_commit(&col));
  int m[16], t[16];
  for (int i = 0; i < 16; i++) m[i] = rank == 0 ? i : -1;
  OK(MPI_Bcast(m, 2, col, 0, MPI_COMM_WORLD)); /* columns 0 and 1 */
  for (int i = 0; i < 16; i++) CHECK(m[i] == ((i % 4 < 2 || rank == 0) ? i : -1));
  /* Gather: every rank sends 4 ints, the root receives them as column `rank` (a transpose). */
  int four[4], *all = malloc(sizeof(int) * 4 * 4 * (size > 4 ? size : 4));
  for (int i = 0; i < 4; i++) four[i] = rank * 10 + i;
  if (size <= 4) {
    for (int i = 0; i < 16; i++) t[i] = -7;
    OK(MPI_Gather(four, 4, MPI_INT, t, 1, col, 0, MPI_COMM_WORLD));
    if (rank == 0)
      for (int r = 0; r < size; r++)
        for (int i = 0; i < 4; i++) CHECK(t[i * 4 + r] == r * 10 + i);
    /* Allgather of columns, and back with Alltoall. */
    for (int i = 0; i < 16; i++) t[i] = -7;
    OK(MPI_Allgather(four, 4, MPI_INT, t, 1, col, MPI_COMM_WORLD));
    for (int r = 0; r < size; r++)
      for (int i = 0; i < 4; i++) CHECK(t[i * 4 + r] == r * 10 + i);
    /* Scatter columns of the root's matrix. */
    int got[4] = {-1, -1, -1, -1};
    OK(MPI_Scatter(m, 1, col, got, 4, MPI_INT, 0, MPI_COMM_WORLD));
    for (int i = 0; i < 4; i++) CHECK(got[i] == i * 4 + rank);
    /* Alltoall with columns on both sides: column r of mine goes to rank r's column `rank`. */
    int a[16], b[16];
    for (int i = 0; i < 16; i++) a[i] = rank * 100 + i, b[i] = -1;
    OK(MPI_Alltoall(a, 1, col, b, 1, col, MPI_COMM_WORLD));
    for (int r = 0; r < size; r++)
      for (int i = 0; i < 4; i++) CHECK(b[i * 4 + r] == r * 100 + i * 4 + rank);
    /* Non-blocking: Iallgather into columns, in place. */
    for (int i = 0; i < 16; i++) b[i] = (i % 4 == rank) ? rank * 1000 + i : -1;
    MPI_Request rq;
    OK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b, 1, col, MPI_COMM_WORLD, &rq));
    OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
    for (int i = 0; i < 4 * 4; i++) CHECK(i % 4 >= size ? b[i] == -1 : b[i] == (i % 4) * 1000 + i);
    /* Gatherv of one column per rank into the root's columns, in reverse order. */
    int rc[4], dp[4];
    for (int r = 0; r < size; r++) rc[r] = 1, dp[r] = size - 1 - r;
    for (int i = 0; i < 16; i++) t[i] = -7;
    OK(MPI_Gatherv(four, 4, MPI_INT, t, rc, dp, col, 0, MPI_COMM_WORLD));
    if (rank == 0)
      for (int r = 0; r < size; r++)
        for (int i = 0; i < 4; i++) CHECK(t[i * 4 + size - 1 - r] == r * 10 + i);
  }
  /* Ibcast of columns, and Alltoallv/Scatterv with column types. */
  for (int i = 0; i < 16; i++) m[i] = rank == 0 ? 50 + i : -1;
  MPI_Request rq;
  OK(MPI_Ibcast(m, 1, col, 0, MPI_COMM_WORLD, &rq));
  OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  for (int i = 0; i < 16; i++) CHECK(m[i] == ((i % 4 == 0 || rank == 0) ? 50 + i : -1));
  if (size <= 4) {
    int a[16], b[16], sc[4], sd[4], rc[4], rd[4];
    for (int i = 0; i < 16; i++) a[i] = rank * 100 + i, b[i] = -1;
    for (int r = 0; r < size; r++) sc[r] = 1, sd[r] = r, rc[r] = 4, rd[r] = 4 * r;
    OK(MPI_Alltoallv(a, sc, sd, col, b, rc, rd, MPI_INT, MPI_COMM_WORLD));
    for (int r = 0; r < size; r++)
      for (int i = 0; i < 4; i++) CHECK(b[4 * r + i] == r * 100 + i * 4 + rank);
    int got[4] = {-1, -1, -1, -1};
    for (int r = 0; r < size; r++) sc[r] = 1, sd[r] = size - 1 - r;
    OK(MPI_Scatterv(a, sc, sd, col, got, 4, MPI_INT, 0, MPI_COMM_WORLD));
    for (int i = 0; i < 4; i++) CHECK(got[i] == i * 4 + size - 1 - rank);
  }
  free(all);
  OK(MPI_Type_free(&col));
}

static void reductions(void) {
  /* A vector of doubles: every other double of 6 is reduced, the others left alone. */
  MPI_Datatype v;
  OK(MPI_Type_vector(3, 1, 2, MPI_DOUBLE, &v));
  OK(MPI_Type_commit(&v));
  double in[6], out[6];
  for (int i = 0; i < 6; i++) in[i] = rank + i, out[i] = -1;
  int rc = MPI_Allreduce(in, out, 1, v, MPI_SUM, MPI_COMM_WORLD);
  if (rc == MPI_SUCCESS) {
    for (int i = 0; i < 6; i++) CHECK(out[i] == (i % 2 ? -1 : size * (size - 1) / 2.0 + size * i));
    OK(MPI_Reduce(in, out, 1, v, MPI_MAX, 0, MPI_COMM_WORLD));
    if (rank == 0) CHECK(out[0] == size - 1 && out[4] == size + 3 && out[1] == -1);
    for (int i = 0; i < 6; i++) out[i] = in[i];
    OK(MPI_Allreduce(MPI_IN_PLACE, out, 1, v, MPI_MIN, MPI_COMM_WORLD));
    CHECK(out[0] == 0 && out[2] == 2 && out[1] == rank + 1);
    MPI_Request rq;
    OK(MPI_Iallreduce(in, out, 1, v, MPI_PROD, MPI_COMM_WORLD, &rq));
    OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
    double p = 1;
    for (int r = 0; r < size; r++) p *= r + 2;
    CHECK(out[2] == p);
    /* MINLOC on a contiguous type of MPI_DOUBLE_INT. */
    struct { double v; int i; } di[2] = {{(double)(rank % 2), rank}, {-(double)rank, rank}}, dr[2];
    MPI_Datatype pairs;
    OK(MPI_Type_contiguous(2, MPI_DOUBLE_INT, &pairs));
    OK(MPI_Type_commit(&pairs));
    OK(MPI_Allreduce(di, dr, 1, pairs, MPI_MINLOC, MPI_COMM_WORLD));
    CHECK(dr[0].v == 0 && dr[0].i == 0 && dr[1].v == -(size - 1) && dr[1].i == size - 1);
    OK(MPI_Type_free(&pairs));
    /* Scan, Exscan, Reduce_scatter_block and Reduce_local on the vector. */
    for (int i = 0; i < 6; i++) out[i] = -1;
    OK(MPI_Scan(in, out, 1, v, MPI_SUM, MPI_COMM_WORLD));
    CHECK(out[4] == rank * (rank + 1) / 2.0 + 4 * (rank + 1) && out[3] == -1);
    for (int i = 0; i < 6; i++) out[i] = -1;
    OK(MPI_Exscan(in, out, 1, v, MPI_SUM, MPI_COMM_WORLD));
    if (rank > 0) CHECK(out[2] == (rank - 1) * rank / 2.0 + 2 * rank);
    else CHECK(out[2] == -1);
    /* The vector's extent is 5 doubles: block r starts at 5 r. */
    double *big = malloc(sizeof(double) * (5 * size + 1));
    for (int i = 0; i < 5 * size + 1; i++) big[i] = i;
    for (int i = 0; i < 6; i++) out[i] = -1;
    OK(MPI_Reduce_scatter_block(big, out, 1, v, MPI_SUM, MPI_COMM_WORLD));
    CHECK(out[0] == size * 5.0 * rank && out[4] == size * (5.0 * rank + 4) && out[5] == -1);
    free(big);
    double io[6] = {1, 1, 1, 1, 1, 1};
    OK(MPI_Reduce_local(in, io, 1, v, MPI_SUM));
    CHECK(io[0] == rank + 1 && io[1] == 1 && io[2] == rank + 3);
  } else {
    /* MPICH refuses predefined ops on derived types; distcomm must not. */
    CHECK(!expect_distcomm());
  }
  OK(MPI_Type_free(&v));
}

static void alltoallw(void) {
  /* Rank r sends to rank j the int r*10+j (an MPI_INT) and receives from j one int placed
   * at byte 8*j, of type MPI_INT or a resized int alternately. */
  int *sb = malloc(sizeof(int) * size), *rb = malloc(sizeof(int) * 2 * size);
  int *sc = malloc(sizeof(int) * size), *sd = malloc(sizeof(int) * size), *rc = malloc(sizeof(int) * size),
      *rd = malloc(sizeof(int) * size);
  MPI_Datatype *st = malloc(sizeof(MPI_Datatype) * size), *rt = malloc(sizeof(MPI_Datatype) * size), ri;
  OK(MPI_Type_create_resized(MPI_INT, 0, 8, &ri));
  OK(MPI_Type_commit(&ri));
  for (int j = 0; j < size; j++) {
    sb[j] = rank * 10 + j;
    sc[j] = 1, sd[j] = j * sizeof(int), st[j] = MPI_INT;
    rc[j] = 1, rd[j] = 8 * j, rt[j] = (j % 2) ? ri : MPI_INT;
    rb[2 * j] = rb[2 * j + 1] = -1;
  }
  OK(MPI_Alltoallw(sb, sc, sd, st, rb, rc, rd, rt, MPI_COMM_WORLD));
  for (int j = 0; j < size; j++) CHECK(rb[2 * j] == j * 10 + rank && rb[2 * j + 1] == -1);
  MPI_Request rq;
  for (int j = 0; j < size; j++) rb[2 * j] = -1;
  OK(MPI_Ialltoallw(sb, sc, sd, st, rb, rc, rd, rt, MPI_COMM_WORLD, &rq));
  OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
  for (int j = 0; j < size; j++) CHECK(rb[2 * j] == j * 10 + rank);
  OK(MPI_Type_free(&ri));
  /* Dense types only (moved without packing): rank r sends j+1 values to rank j, as shorts to
   * even ranks and ints to odd ones, at byte displacements with gaps between the blocks. */
  int *sbuf = calloc(64 * size, 1), *rbuf = calloc(64 * size, 1);
  for (int j = 0; j < size; j++) {
    MPI_Datatype t = (j % 2) ? MPI_INT : MPI_SHORT;
    st[j] = t, sc[j] = j + 1, sd[j] = 64 * j;
    for (int e = 0; e <= j; e++) {
      if (j % 2) ((int *)((char *)sbuf + 64 * j))[e] = 1000 * rank + 10 * j + e;
      else ((short *)((char *)sbuf + 64 * j))[e] = (short)(1000 * rank + 10 * j + e);
    }
    MPI_Datatype u = (rank % 2) ? MPI_INT : MPI_SHORT;
    rt[j] = u, rc[j] = rank + 1, rd[j] = 64 * j + 4;
  }
  OK(MPI_Alltoallw(sbuf, sc, sd, st, rbuf, rc, rd, rt, MPI_COMM_WORLD));
  for (int j = 0; j < size; j++) {
    char *at = (char *)rbuf + 64 * j;
    CHECK(*(int *)at == 0); /* the gap before the block is left alone */
    for (int e = 0; e <= rank; e++) {
      int want = 1000 * j + 10 * rank + e;
      CHECK((rank % 2) ? ((int *)(at + 4))[e] == want : ((short *)(at + 4))[e] == (short)want);
    }
  }
  free(sbuf), free(rbuf);
  free(sb), free(rb), free(sc), free(sd), free(rc), free(rd), free(st), free(rt);
}

static void bad_arguments(void) {
  MPI_Datatype t = MPI_DATATYPE_NULL, v;
  int x[4] = {0}, pos = 0;
  FAILS(MPI_Type_vector(-1, 1, 1, MPI_INT, &t), MPI_ERR_COUNT);
  FAILS(MPI_Type_contiguous(2, MPI_DATATYPE_NULL, &t), MPI_ERR_TYPE);
  OK(MPI_Type_vector(2, 1, 2, MPI_INT, &v));
  /* Not committed: no communication with it. */
  FAILS(MPI_Send(x, 1, v, next, 9, MPI_COMM_WORLD), MPI_ERR_TYPE);
  FAILS(MPI_Bcast(x, 1, v, 0, MPI_COMM_WORLD), MPI_ERR_TYPE);
  FAILS(MPI_Pack(x, 1, v, x, sizeof x, &pos, MPI_COMM_WORLD), MPI_ERR_TYPE);
  FAILS(MPI_Send(x, 1, MPI_DATATYPE_NULL, next, 9, MPI_COMM_WORLD), MPI_ERR_TYPE);
  OK(MPI_Type_commit(&v));
  FAILS(MPI_Send(x, -1, v, next, 9, MPI_COMM_WORLD), MPI_ERR_COUNT);
  FAILS(MPI_Type_free(&(MPI_Datatype){MPI_INT}), MPI_ERR_TYPE);
  OK(MPI_Type_free(&v));
  if (expect_distcomm()) { /* classes MPICH words otherwise, or a freed handle it may not catch */
    FAILS(MPI_Send(x, 1, v, next, 9, MPI_COMM_WORLD), MPI_ERR_TYPE);
    FAILS(MPI_Type_vector(1, -1, 1, MPI_INT, &t), MPI_ERR_ARG);
    pos = 0;
    FAILS(MPI_Pack(x, 4, MPI_INT, x, 8, &pos, MPI_COMM_WORLD), MPI_ERR_TRUNCATE);
    int ints[4];
    MPI_Aint addrs[1];
    MPI_Datatype types[1];
    FAILS(MPI_Type_get_contents(MPI_INT, 4, 1, 1, ints, addrs, types), MPI_ERR_ARG);
    FAILS(MPI_Pack_external("native", x, 1, MPI_INT, x, 16, &(MPI_Aint){0}), MPI_ERR_ARG);
    int sizes[1] = {4}, subs[1] = {5}, starts[1] = {0};
    FAILS(MPI_Type_create_subarray(1, sizes, subs, starts, MPI_ORDER_C, MPI_INT, &t), MPI_ERR_ARG);
    /* Overflowing strides are refused, not wrapped. */
    FAILS(MPI_Type_create_hvector(3, 1, (MPI_Aint)1 << 62, MPI_INT, &t), MPI_ERR_ARG);
  }
}

/* Types of more blocks than any list should hold are kept compact (a repeat of the smaller
 * type): they are built, sent and counted exactly. */
static void large_types(void) {
  /* 5M blocks of one byte, every other byte: more than the 4M blocks a flat list was allowed. */
  const int n = 5 << 20;
  MPI_Datatype every_other;
  OK(MPI_Type_vector(n, 1, 2, MPI_CHAR, &every_other));
  OK(MPI_Type_commit(&every_other));
  unsigned char *out = malloc(2 * (size_t)n), *in = malloc(2 * (size_t)n);
  CHECK(out && in);
  for (size_t i = 0; i < 2 * (size_t)n; i++) out[i] = (unsigned char)(i * 7 + rank), in[i] = 0xee;
  MPI_Status st;
  OK(MPI_Sendrecv(out, 1, every_other, next, 5, in, 1, every_other, prev, 5, MPI_COMM_WORLD, &st));
  int bad = 0;
  for (size_t i = 0; i < 2 * (size_t)n; i++) bad += in[i] != (i % 2 ? 0xee : (unsigned char)(i * 7 + prev));
  CHECK(bad == 0);
  int cnt = -1;
  OK(MPI_Get_elements(&st, every_other, &cnt));
  CHECK(cnt == n);
  free(out);
  free(in);
  OK(MPI_Type_free(&every_other));

  /* 2^40 blocks of a struct { int; double } (two basic elements each): never written out. */
  MPI_Datatype pair, huge;
  int bl[2] = {1, 1};
  MPI_Aint disp[2] = {0, 8};
  MPI_Datatype types[2] = {MPI_INT, MPI_DOUBLE};
  OK(MPI_Type_create_struct(2, bl, disp, types, &pair));
  OK(MPI_Type_vector_c((MPI_Count)1 << 40, 1, 3, pair, &huge));
  OK(MPI_Type_commit(&huge));
  MPI_Count sz = 0, lb = -1, ext = 0;
  OK(MPI_Type_size_c(huge, &sz));
  CHECK(sz == (MPI_Count)12 << 40);
  OK(MPI_Type_get_extent_c(huge, &lb, &ext));
  CHECK(lb == 0 && ext == (((MPI_Count)1 << 40) - 1) * 48 + 16);
  if (expect_distcomm()) { /* MPICH 5.0.2 dies of SIGILL here */
    MPI_Aint xsz = 0;        /* external32: 4 + 8 bytes a pair */
    OK(MPI_Pack_external_size("external32", 1, huge, &xsz));
    CHECK(xsz == (MPI_Aint)12 << 40);
  }
  /* Elements counted into the middle of the type: 1001 basic elements, or 6004 bytes in (500 pairs and an int). */
  MPI_Count el = 0;
  OK(MPI_Status_set_elements_c(&st, huge, 1001));
  OK(MPI_Get_elements_c(&st, huge, &el));
  CHECK(el == 1001);
  OK(MPI_Get_count_c(&st, huge, &el));
  CHECK(el == MPI_UNDEFINED);
  OK(MPI_Status_set_elements_c(&st, MPI_BYTE, 6004));
  OK(MPI_Get_elements_c(&st, huge, &el));
  CHECK(el == 1001);
  OK(MPI_Status_set_elements_c(&st, MPI_BYTE, 6010));
  OK(MPI_Get_elements_c(&st, huge, &el));
  CHECK(el == MPI_UNDEFINED);
  OK(MPI_Type_free(&huge));
  OK(MPI_Type_free(&pair));

  /* An indexed list of 5M entries of uneven blocks (no repeat stands for them), each a vector
     of 2 ints 3 apart: a caller's list longer than 4M entries is stored, not refused. */
  const int m = 5 << 20;
  int *lens = malloc(sizeof(int) * (size_t)m), *offs = malloc(sizeof(int) * (size_t)m);
  CHECK(lens && offs);
  size_t span = 0; /* in units of the vector's extent (4 ints) */
  for (int i = 0; i < m; i++) lens[i] = 1 + (i % 3 == 0), offs[i] = (int)span, span += (size_t)lens[i] + 1;
  MPI_Datatype two, list;
  OK(MPI_Type_vector(2, 1, 3, MPI_INT, &two));
  OK(MPI_Type_indexed(m, lens, offs, two, &list));
  OK(MPI_Type_commit(&list));
  size_t ints = span * 4; /* extent of `two` is 4 ints: 16 bytes */
  int *src = malloc(sizeof(int) * ints), *dst = malloc(sizeof(int) * ints);
  CHECK(src && dst);
  for (size_t i = 0; i < ints; i++) src[i] = (int)(i * 3 + (size_t)rank), dst[i] = -1;
  OK(MPI_Sendrecv(src, 1, list, next, 6, dst, 1, list, prev, 6, MPI_COMM_WORLD, &st));
  size_t wrong = 0, got = 0;
  for (int i = 0; i < m; i++)
    for (int b = 0; b < lens[i]; b++) {
      size_t at = ((size_t)offs[i] + (size_t)b) * 4; /* each element of `two`: ints 0 and 3 */
      wrong += dst[at] != (int)(at * 3 + (size_t)prev) || dst[at + 3] != (int)((at + 3) * 3 + (size_t)prev);
      wrong += dst[at + 1] != -1 || dst[at + 2] != -1;
      got += 2;
    }
  CHECK(wrong == 0);
  int elems = -1;
  OK(MPI_Get_elements(&st, list, &elems));
  CHECK((size_t)elems == got);
  free(src);
  free(dst);
  free(lens);
  free(offs);
  OK(MPI_Type_free(&list));
  OK(MPI_Type_free(&two));
}

int main(int argc, char **argv) {
  t_init(&argc, &argv, &rank, &size);
  next = (rank + 1) % size, prev = (rank + size - 1) % size;
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
  constructors();
  pack_unpack();
  p2p();
  collectives();
  reductions();
  alltoallw();
  large_types();
  bad_arguments();
  OK(MPI_Barrier(MPI_COMM_WORLD));
  t_done("t_dtype");
  OK(MPI_Finalize());
  return 0;
}
