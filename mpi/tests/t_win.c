/* RMA windows: allocate and create, fences, Put / Get / Accumulate / Get_accumulate /
 * Fetch_and_op / Compare_and_swap on the calling process's own window (on COMM_SELF and on the
 * world), the same to other processes in fence epochs, post/start/complete/wait epochs and under locks (passive target), the window attributes, names, groups, keyvals with callbacks, and error
 * handlers. Datatype keyvals at the end (the same attribute machinery). */
#include "common.h"
#include <stddef.h>

static int win_deleted = 0, type_deleted = 0, type_copied = 0, eh_calls = 0, eh_class = -1;
static MPI_Win eh_win = MPI_WIN_NULL;

static int win_delete(MPI_Win w, int k, void *val, void *extra) {
  (void)w; (void)k; (void)extra;
  win_deleted += *(int *)val;
  return MPI_SUCCESS;
}
static int type_copy(MPI_Datatype t, int k, void *extra, void *in, void *out, int *flag) {
  (void)t; (void)k; (void)extra;
  type_copied++;
  *(void **)out = in;
  *flag = 1;
  return MPI_SUCCESS;
}
static int type_delete(MPI_Datatype t, int k, void *val, void *extra) {
  (void)t; (void)k; (void)val; (void)extra;
  type_deleted++;
  return MPI_SUCCESS;
}
static int type_delete_refuses = 1;
static int type_delete_fails(MPI_Datatype t, int k, void *val, void *extra) {
  (void)t; (void)k; (void)val; (void)extra;
  return type_delete_refuses ? MPI_ERR_OTHER : MPI_SUCCESS;
}
static void win_handler(MPI_Win *w, int *code, ...) {
  eh_calls++;
  eh_win = *w;
  MPI_Error_class(*code, &eh_class);
}

int main(int argc, char **argv) {
  int rank, size, flag;
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));

  /* A window of 16 ints on COMM_SELF: Put, Get and the accumulate family in fence epochs. */
  int *base = NULL;
  MPI_Win w;
  OK(MPI_Win_allocate(16 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_SELF, &base, &w));
  CHECK(base != NULL);
  OK(MPI_Win_set_errhandler(w, MPI_ERRORS_RETURN));
  for (int i = 0; i < 16; i++) base[i] = -1;
  int src[4] = {1, 2, 3, 4}, dst[4] = {0, 0, 0, 0};
  OK(MPI_Win_fence(0, w));
  OK(MPI_Put(src, 4, MPI_INT, 0, 2, 4, MPI_INT, w));
  OK(MPI_Win_fence(0, w));
  CHECK(base[1] == -1 && base[2] == 1 && base[5] == 4 && base[6] == -1);
  OK(MPI_Get(dst, 4, MPI_INT, 0, 2, 4, MPI_INT, w));
  OK(MPI_Win_fence(0, w));
  CHECK(dst[0] == 1 && dst[3] == 4);
  OK(MPI_Accumulate(src, 4, MPI_INT, 0, 2, 4, MPI_INT, MPI_SUM, w));
  OK(MPI_Win_fence(0, w));
  CHECK(base[2] == 2 && base[5] == 8);
  /* A strided target: every other int of the window. */
  MPI_Datatype every2;
  OK(MPI_Type_vector(4, 1, 2, MPI_INT, &every2));
  OK(MPI_Type_commit(&every2));
  OK(MPI_Put(src, 4, MPI_INT, 0, 8, 1, every2, w));
  OK(MPI_Win_fence(0, w));
  CHECK(base[8] == 1 && base[9] == -1 && base[10] == 2 && base[14] == 4);
  int res[4] = {0};
  OK(MPI_Get_accumulate(src, 4, MPI_INT, res, 4, MPI_INT, 0, 8, 1, every2, MPI_MAX, w));
  OK(MPI_Win_fence(0, w));
  CHECK(res[0] == 1 && res[3] == 4 && base[8] == 1 && base[14] == 4);
  OK(MPI_Type_free(&every2));
  int one = 10, old = 0, cmp = 12, neu = 99;
  OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w));
  OK(MPI_Fetch_and_op(&one, &old, MPI_INT, 0, 0, MPI_REPLACE, w));
  OK(MPI_Fetch_and_op(&one, &old, MPI_INT, 0, 0, MPI_SUM, w));
  OK(MPI_Win_flush(0, w));
  CHECK(old == 10 && base[0] == 20);
  OK(MPI_Compare_and_swap(&neu, &cmp, &old, MPI_INT, 0, 0, w));
  OK(MPI_Win_flush(0, w));
  CHECK(old == 20 && base[0] == 20);
  cmp = 20;
  OK(MPI_Compare_and_swap(&neu, &cmp, &old, MPI_INT, 0, 0, w));
  OK(MPI_Win_unlock(0, w));
  CHECK(old == 20 && base[0] == 99);

  /* The window's attributes. */
  void *vbase;
  MPI_Aint *psize;
  int *pint;
  OK(MPI_Win_get_attr(w, MPI_WIN_BASE, &vbase, &flag));
  CHECK(flag && vbase == base);
  OK(MPI_Win_get_attr(w, MPI_WIN_SIZE, &psize, &flag));
  CHECK(flag && *psize == 16 * sizeof(int));
  OK(MPI_Win_get_attr(w, MPI_WIN_DISP_UNIT, &pint, &flag));
  CHECK(flag && *pint == sizeof(int));
  OK(MPI_Win_get_attr(w, MPI_WIN_CREATE_FLAVOR, &pint, &flag));
  CHECK(flag && *pint == MPI_WIN_FLAVOR_ALLOCATE);
  OK(MPI_Win_get_attr(w, MPI_WIN_MODEL, &pint, &flag));
  CHECK(flag && (*pint == MPI_WIN_UNIFIED || *pint == MPI_WIN_SEPARATE));
  FAILS(MPI_Win_get_attr(w, MPI_KEYVAL_INVALID, &pint, &flag), MPI_ERR_KEYVAL);

  /* Names, groups. */
  char name[MPI_MAX_OBJECT_NAME];
  int len;
  OK(MPI_Win_set_name(w, "my window"));
  OK(MPI_Win_get_name(w, name, &len));
  CHECK(strcmp(name, "my window") == 0 && len == 9);
  OK(MPI_Win_get_name(MPI_WIN_NULL, name, &len));
  CHECK(strcmp(name, "MPI_WIN_NULL") == 0);
  MPI_Group g;
  int gs;
  OK(MPI_Win_get_group(w, &g));
  OK(MPI_Group_size(g, &gs));
  CHECK(gs == 1);
  OK(MPI_Group_free(&g));

  /* Bad arguments: a rank outside the group, a negative count, a bad window. */
  FAILS(MPI_Put(src, 1, MPI_INT, 1, 0, 1, MPI_INT, w), MPI_ERR_RANK);
  /* (MPICH says MPI_ERR_ARG for a bad lock type) */
  if (expect_distcomm()) FAILS(MPI_Win_lock(12345, 0, 0, w), MPI_ERR_LOCKTYPE);
  else CHECK(MPI_Win_lock(12345, 0, 0, w) != MPI_SUCCESS);
  FAILS(MPI_Win_fence(0, MPI_WIN_NULL), MPI_ERR_WIN);
  if (expect_distcomm()) FAILS(MPI_Put(src, 4, MPI_INT, 0, 14, 4, MPI_INT, w), MPI_ERR_RMA_RANGE);

  /* Error handlers: a user one is called with the window; Call_errhandler returns success. */
  MPI_Errhandler eh, got;
  OK(MPI_Win_create_errhandler(win_handler, &eh));
  OK(MPI_Win_set_errhandler(w, eh));
  OK(MPI_Win_get_errhandler(w, &got));
  CHECK(got == eh);
  OK(MPI_Errhandler_free(&got));
  OK(MPI_Win_call_errhandler(w, MPI_ERR_OTHER));
  CHECK(eh_calls == 1 && eh_class == MPI_ERR_OTHER && eh_win == w);
  (void)MPI_Put(src, 1, MPI_INT, 7, 0, 1, MPI_INT, w);
  CHECK(eh_calls == 2 && eh_class == MPI_ERR_RANK);
  OK(MPI_Win_set_errhandler(w, MPI_ERRORS_RETURN));
  OK(MPI_Errhandler_free(&eh));
  OK(MPI_Win_call_errhandler(w, MPI_ERR_OTHER));

  /* Keyvals: a value set, read, replaced (its delete callback runs) and deleted at the free. */
  int kv, v1 = 1, v2 = 100, *pv;
  OK(MPI_Win_create_keyval(MPI_WIN_NULL_COPY_FN, win_delete, &kv, NULL));
  OK(MPI_Win_get_attr(w, kv, &pv, &flag));
  CHECK(!flag);
  OK(MPI_Win_set_attr(w, kv, &v1));
  OK(MPI_Win_get_attr(w, kv, &pv, &flag));
  CHECK(flag && pv == &v1);
  OK(MPI_Win_set_attr(w, kv, &v2));
  CHECK(win_deleted == 1);
  OK(MPI_Win_free(&w));
  CHECK(w == MPI_WIN_NULL && win_deleted == 101);
  OK(MPI_Win_free_keyval(&kv));
  CHECK(kv == MPI_KEYVAL_INVALID);

  /* A window of the world's processes over memory of each: each process reaches its own. */
  int mine[2] = {0, 0};
  OK(MPI_Win_create(mine, sizeof mine, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &w));
  OK(MPI_Win_set_errhandler(w, MPI_ERRORS_RETURN));
  OK(MPI_Win_get_group(w, &g));
  OK(MPI_Group_size(g, &gs));
  CHECK(gs == size);
  OK(MPI_Group_free(&g));
  OK(MPI_Win_get_attr(w, MPI_WIN_CREATE_FLAVOR, &pint, &flag));
  CHECK(flag && *pint == MPI_WIN_FLAVOR_CREATE);
  int val = 7 + rank;
  OK(MPI_Win_fence(0, w));
  OK(MPI_Put(&val, 1, MPI_INT, rank, 1, 1, MPI_INT, w));
  OK(MPI_Win_fence(0, w));
  CHECK(mine[0] == 0 && mine[1] == 7 + rank);
  OK(MPI_Win_free(&w));
  /* Transfers to other processes in fence epochs: to the right neighbour, from it, and
   * accumulates into rank 0's memory from everyone. */
  int wbuf[4] = {0, 0, 0, 0};
  int right = (rank + 1) % size, left = (rank + size - 1) % size, me = 100 + rank, add = 1, fetched = -1;
  OK(MPI_Win_create(wbuf, sizeof wbuf, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &w));
  OK(MPI_Win_set_errhandler(w, MPI_ERRORS_RETURN));
  OK(MPI_Win_fence(MPI_MODE_NOPRECEDE, w));
  OK(MPI_Put(&me, 1, MPI_INT, right, 0, 1, MPI_INT, w));
  OK(MPI_Accumulate(&add, 1, MPI_INT, 0, 1, 1, MPI_INT, MPI_SUM, w));
  if (expect_distcomm()) FAILS(MPI_Put(&me, 1, MPI_INT, right, 4, 1, MPI_INT, w), MPI_ERR_RMA_RANGE);
  OK(MPI_Win_fence(0, w));
  CHECK(wbuf[0] == 100 + left);
  if (rank == 0) CHECK(wbuf[1] == size);
  old = -1;
  OK(MPI_Get(&fetched, 1, MPI_INT, right, 0, 1, MPI_INT, w));
  OK(MPI_Fetch_and_op(&add, &old, MPI_INT, 0, 2, MPI_SUM, w));
  OK(MPI_Win_fence(0, w));
  CHECK(fetched == 100 + rank && old >= 0 && old < size);
  if (rank == 0) CHECK(wbuf[2] == size);
  int pair[2] = {7, 8}, before[2] = {-1, -1};
  OK(MPI_Get_accumulate(pair, 2, MPI_INT, before, 2, MPI_INT, left, 2, 2, MPI_INT, MPI_REPLACE, w));
  /* Every process tries to swap rank 0's first int (100 + its left neighbour, from the put
   * above): exactly one finds that value and swaps in its own; the others see the winner's. */
  int cmp0 = 100 + (size - 1), mine0 = 500 + rank, seen = -1;
  OK(MPI_Compare_and_swap(&mine0, &cmp0, &seen, MPI_INT, 0, 0, w));
  OK(MPI_Win_fence(MPI_MODE_NOSUCCEED, w));
  CHECK(before[1] == 0 && wbuf[2] == 7 && wbuf[3] == 8);
  int won = seen == cmp0, winners = 0, final0 = rank == 0 ? wbuf[0] : -1;
  OK(MPI_Allreduce(&won, &winners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  OK(MPI_Bcast(&final0, 1, MPI_INT, 0, MPI_COMM_WORLD));
  CHECK(winners == 1 && final0 >= 500 && final0 < 500 + size);
  CHECK(won ? final0 == 500 + rank : seen == final0);
  /* A strided target datatype on another process: every other int of the right's window. */
  MPI_Datatype stride2;
  int two[2] = {me, me + 1}, back2[2] = {-1, -1};
  OK(MPI_Type_vector(2, 1, 2, MPI_INT, &stride2));
  OK(MPI_Type_commit(&stride2));
  OK(MPI_Win_fence(MPI_MODE_NOPRECEDE, w));
  OK(MPI_Put(two, 2, MPI_INT, right, 1, 1, stride2, w));
  OK(MPI_Win_fence(0, w));
  CHECK(wbuf[1] == 100 + left && wbuf[3] == 101 + left && wbuf[2] == 7);
  OK(MPI_Get(back2, 2, MPI_INT, right, 1, 1, stride2, w));
  OK(MPI_Win_fence(MPI_MODE_NOSUCCEED, w));
  CHECK(back2[0] == me && back2[1] == me + 1);
  OK(MPI_Type_free(&stride2));
  {
    /* Post/start/complete/wait: each process exposes its window to its left neighbour and
     * accesses its right one, so each is origin and target at once (neither may wait for the
     * other's MPI_Win_wait before its own MPI_Win_complete returns). */
    int pbuf[2] = {0, 40 + rank}, v = 300 + rank, got = -1, flag = 0, one_ = 1;
    MPI_Win pw;
    MPI_Group wg, lg, rg;
    OK(MPI_Win_create(pbuf, sizeof pbuf, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &pw));
    OK(MPI_Win_set_errhandler(pw, MPI_ERRORS_RETURN));
    OK(MPI_Win_get_group(pw, &wg));
    OK(MPI_Group_incl(wg, 1, &left, &lg));
    OK(MPI_Group_incl(wg, 1, &right, &rg));
    OK(MPI_Win_post(lg, 0, pw));
    OK(MPI_Win_start(rg, 0, pw));
    OK(MPI_Put(&v, 1, MPI_INT, right, 0, 1, MPI_INT, pw));
    OK(MPI_Get(&got, 1, MPI_INT, right, 1, 1, MPI_INT, pw));
    OK(MPI_Win_complete(pw));
    OK(MPI_Win_wait(pw));
    CHECK(pbuf[0] == 300 + left && got == 40 + right);
    /* Again with an accumulate, the target polling with MPI_Win_test. */
    OK(MPI_Win_post(lg, 0, pw));
    OK(MPI_Win_start(rg, 0, pw));
    OK(MPI_Accumulate(&one_, 1, MPI_INT, right, 1, 1, MPI_INT, MPI_SUM, pw));
    OK(MPI_Win_complete(pw));
    while (!flag) OK(MPI_Win_test(pw, &flag));
    CHECK(pbuf[1] == 41 + rank);
    if (expect_distcomm()) FAILS(MPI_Win_complete(pw), MPI_ERR_RMA_SYNC);
    OK(MPI_Group_free(&lg));
    OK(MPI_Group_free(&rg));
    OK(MPI_Group_free(&wg));
    OK(MPI_Win_free(&pw));
  }
  OK(MPI_Win_free(&w));
  {
    /* Passive target: the target calls nothing while the others lock, put, get, accumulate,
     * flush and unlock; a barrier afterwards, and every transfer is in place. */
    int mem[3] = {0, 50 + rank, 0}, v = 700 + rank, got = -1, one_ = 1, sum = -1;
    MPI_Win lw;
    OK(MPI_Win_create(mem, sizeof mem, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &lw));
    OK(MPI_Win_set_errhandler(lw, MPI_ERRORS_RETURN));
    OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, right, 0, lw));
    OK(MPI_Put(&v, 1, MPI_INT, right, 0, 1, MPI_INT, lw));
    OK(MPI_Get(&got, 1, MPI_INT, right, 1, 1, MPI_INT, lw));
    OK(MPI_Win_flush(right, lw));
    CHECK(got == 50 + right);
    OK(MPI_Win_unlock(right, lw));
    /* Request-based forms: complete when their request does. */
    int rv = 900 + rank, rgot = -1;
    MPI_Request rq[2];
    OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, right, 0, lw));
    OK(MPI_Rput(&rv, 1, MPI_INT, right, 0, 1, MPI_INT, lw, &rq[0]));
    OK(MPI_Wait(&rq[0], MPI_STATUS_IGNORE));
    OK(MPI_Rget(&rgot, 1, MPI_INT, right, 0, 1, MPI_INT, lw, &rq[1]));
    OK(MPI_Wait(&rq[1], MPI_STATUS_IGNORE));
    CHECK(rgot == 900 + rank);
    OK(MPI_Win_unlock(right, lw));
    if (expect_distcomm() && size > 1) FAILS(MPI_Rput(&rv, 1, MPI_INT, right, 0, 1, MPI_INT, lw, &rq[0]), MPI_ERR_RMA_SYNC);
    OK(MPI_Barrier(MPI_COMM_WORLD));
    OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, right, 0, lw));
    OK(MPI_Put(&v, 1, MPI_INT, right, 0, 1, MPI_INT, lw));
    OK(MPI_Win_unlock(right, lw));
    /* Everyone adds one to rank 0's third int under a shared lock_all. */
    OK(MPI_Win_lock_all(0, lw));
    OK(MPI_Accumulate(&one_, 1, MPI_INT, 0, 2, 1, MPI_INT, MPI_SUM, lw));
    OK(MPI_Win_unlock_all(lw));
    OK(MPI_Barrier(MPI_COMM_WORLD));
    if (size > 1) {
      /* A token passed around the ring through window flags, with no flush before each wait:
       * a transfer under a lock progresses without a flush of its target (each waits flushing
       * only itself, as mpi4py's util.sync does). */
      int flag[1] = {0}, token = 1, seen_ = 0;
      MPI_Win fw;
      OK(MPI_Win_create(flag, sizeof flag, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &fw));
      OK(MPI_Win_lock_all(0, fw));
      if (rank == 0) OK(MPI_Accumulate(&token, 1, MPI_INT, right, 0, 1, MPI_INT, MPI_REPLACE, fw));
      double until = MPI_Wtime() + 20;
      while (!(seen_ = __atomic_load_n(&flag[0], __ATOMIC_ACQUIRE)) && MPI_Wtime() < until) {
        if (MPI_Win_flush(rank, fw) != MPI_SUCCESS || MPI_Win_sync(fw) != MPI_SUCCESS) break;
      }
      CHECK(seen_ == 1);
      if (rank != 0) OK(MPI_Accumulate(&token, 1, MPI_INT, right, 0, 1, MPI_INT, MPI_REPLACE, fw));
      OK(MPI_Win_unlock_all(fw));
      OK(MPI_Barrier(MPI_COMM_WORLD));
      OK(MPI_Win_free(&fw));
    }
    OK(MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, lw));
    OK(MPI_Get(&sum, 1, MPI_INT, 0, 2, 1, MPI_INT, lw));
    OK(MPI_Win_unlock(0, lw));
    CHECK(sum == size);
    OK(MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, lw));
    CHECK(mem[0] == 700 + left);
    OK(MPI_Win_unlock(rank, lw));
    /* Exclusive locks serialise read-modify-write cycles: each process increments rank 0's
     * first int 20 times through get, flush, put. */
    OK(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0) mem[0] = 0;
    OK(MPI_Barrier(MPI_COMM_WORLD));
    for (int i = 0; i < 20; i++) {
      int cur = -1;
      OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, lw));
      OK(MPI_Get(&cur, 1, MPI_INT, 0, 0, 1, MPI_INT, lw));
      OK(MPI_Win_flush(0, lw));
      cur += 1;
      OK(MPI_Put(&cur, 1, MPI_INT, 0, 0, 1, MPI_INT, lw));
      OK(MPI_Win_unlock(0, lw));
    }
    OK(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0) CHECK(mem[0] == 20 * size);
    /* Accumulates are atomic per element, also between the target's own accumulates to itself
     * and the others' arriving at the same time: each process adds one 300 times to rank 0's
     * third int under a shared lock_all, flushing each (a lost update shows in the sum). */
    OK(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0) mem[2] = 0;
    OK(MPI_Barrier(MPI_COMM_WORLD));
    OK(MPI_Win_lock_all(0, lw));
    for (int i = 0; i < 300; i++) {
      OK(MPI_Accumulate(&one_, 1, MPI_INT, 0, 2, 1, MPI_INT, MPI_SUM, lw));
      OK(MPI_Win_flush(0, lw));
    }
    OK(MPI_Win_unlock_all(lw));
    OK(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0) CHECK(mem[2] == 300 * size);
    if (expect_distcomm() && size > 1) FAILS(MPI_Put(&v, 1, MPI_INT, right, 0, 1, MPI_INT, lw), MPI_ERR_RMA_SYNC);
    OK(MPI_Win_free(&lw));
  }
  /* A dynamic window: each rank attaches two buffers of its own and tells the others their
   * addresses; transfers name target memory by address: puts to the right neighbour in a fence
   * epoch, an accumulate under a lock, a get back; then detached. */
  {
    MPI_Win dw;
    int got_flavor = 0, *pflavor = NULL;
    int a[4] = {0, 0, 0, 0}, b[2] = {0, 0}, mine[2] = {rank, rank * 10};
    OK(MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &dw));
    OK(MPI_Win_get_attr(dw, MPI_WIN_CREATE_FLAVOR, &pflavor, &got_flavor));
    CHECK(got_flavor && *pflavor == MPI_WIN_FLAVOR_DYNAMIC);
    OK(MPI_Win_attach(dw, a, sizeof a));
    OK(MPI_Win_attach(dw, b, sizeof b));
    MPI_Aint addrs[2], all[2 * 64];
    OK(MPI_Get_address(a, &addrs[0]));
    OK(MPI_Get_address(b, &addrs[1]));
    CHECK(size <= 64);
    OK(MPI_Allgather(addrs, 2, MPI_AINT, all, 2, MPI_AINT, MPI_COMM_WORLD));
    int dright = (rank + 1) % size, dleft = (rank + size - 1) % size;
    OK(MPI_Win_fence(0, dw));
    OK(MPI_Put(mine, 2, MPI_INT, dright, MPI_Aint_add(all[2 * dright], sizeof(int)), 2, MPI_INT, dw));
    OK(MPI_Win_fence(0, dw));
    CHECK(a[0] == 0 && a[1] == dleft && a[2] == dleft * 10 && a[3] == 0);
    int one = 1, back[2] = {-1, -1};
    OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, dright, 0, dw));
    OK(MPI_Accumulate(&one, 1, MPI_INT, dright, all[2 * dright + 1], 1, MPI_INT, MPI_SUM, dw));
    OK(MPI_Win_unlock(dright, dw));
    OK(MPI_Barrier(MPI_COMM_WORLD));
    CHECK(b[0] == 1 && b[1] == 0);
    OK(MPI_Win_lock(MPI_LOCK_SHARED, dleft, 0, dw));
    OK(MPI_Get(back, 2, MPI_INT, dleft, MPI_Aint_add(all[2 * dleft], sizeof(int)), 2, MPI_INT, dw));
    OK(MPI_Win_unlock(dleft, dw));
    int lleft = (dleft + size - 1) % size;
    CHECK(back[0] == lleft && back[1] == lleft * 10);
    OK(MPI_Barrier(MPI_COMM_WORLD));
    if (expect_distcomm()) {
      /* Bad attachments and transfers to memory not attached (to ourselves: checked at once). */
      OK(MPI_Win_set_errhandler(dw, MPI_ERRORS_RETURN));
      FAILS(MPI_Win_attach(dw, &a[2], sizeof(int)), MPI_ERR_RMA_ATTACH);
      FAILS(MPI_Win_detach(dw, &a[1]), MPI_ERR_RMA_ATTACH);
      OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, dw));
      FAILS(MPI_Put(mine, 2, MPI_INT, rank, MPI_Aint_add(addrs[0], 3 * sizeof(int)), 2, MPI_INT, dw), MPI_ERR_RMA_RANGE);
      OK(MPI_Put(mine, 1, MPI_INT, rank, addrs[1], 1, MPI_INT, dw));
      OK(MPI_Win_unlock(rank, dw));
      CHECK(b[0] == rank);
      MPI_Win cw;
      OK(MPI_Win_create(a, sizeof a, 1, MPI_INFO_NULL, MPI_COMM_SELF, &cw));
      OK(MPI_Win_set_errhandler(cw, MPI_ERRORS_RETURN));
      FAILS(MPI_Win_attach(cw, b, sizeof b), MPI_ERR_RMA_FLAVOR);
      OK(MPI_Win_free(&cw));
      if (size > 1) {
        /* To another process's memory it has not attached (address 64): refused there, and
         * the origin told, under a lock (given back all the same) and in a fence epoch. */
        OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, dright, 0, dw));
        OK(MPI_Put(mine, 1, MPI_INT, dright, 64, 1, MPI_INT, dw));
        FAILS(MPI_Win_unlock(dright, dw), MPI_ERR_RMA_RANGE);
        OK(MPI_Win_fence(0, dw));
        OK(MPI_Put(mine, 1, MPI_INT, dright, 64, 1, MPI_INT, dw));
        FAILS(MPI_Win_fence(0, dw), MPI_ERR_RMA_RANGE);
        OK(MPI_Win_fence(0, dw));
      }
    }
    OK(MPI_Win_detach(dw, a));
    OK(MPI_Win_detach(dw, b));
    if (expect_distcomm()) {
      OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, dw));
      FAILS(MPI_Put(mine, 1, MPI_INT, rank, addrs[1], 1, MPI_INT, dw), MPI_ERR_RMA_RANGE);
      OK(MPI_Win_unlock(rank, dw));
    }
    OK(MPI_Win_free(&dw));
  }

  /* A shared window: every process's part in one segment, rank after rank; each reads the
   * others' parts by load, and a put to the right neighbour in a fence epoch lands where the
   * neighbour's pointer sees it. */
  {
    MPI_Win sw;
    int *mine_part = NULL, *p0 = NULL, du = 0;
    MPI_Aint n_me = (rank + 1) * (MPI_Aint)sizeof(int), qsize = 0;
    OK(MPI_Win_allocate_shared(n_me, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &mine_part, &sw));
    /* The standard's idiom for loads and stores of the others' parts: a passive epoch, sync,
     * barrier, sync (a fence that ends no epoch need not be a barrier, and MPICH's is not). */
    OK(MPI_Win_lock_all(MPI_MODE_NOCHECK, sw));
    for (int i = 0; i <= rank; i++) mine_part[i] = 1000 * rank + i;
    OK(MPI_Win_sync(sw));
    OK(MPI_Barrier(MPI_COMM_WORLD));
    OK(MPI_Win_sync(sw));
    for (int r = 0; r < size; r++) {
      int *pr = NULL;
      OK(MPI_Win_shared_query(sw, r, &qsize, &du, &pr));
      CHECK(qsize == (r + 1) * (MPI_Aint)sizeof(int) && du == (int)sizeof(int));
      for (int i = 0; i <= r; i++) CHECK(pr[i] == 1000 * r + i);
      if (r == 0) p0 = pr;
      /* Contiguous, as MPICH lays them out by default. */
      CHECK(pr == p0 + r * (r + 1) / 2);
      if (r == rank) CHECK(pr == mine_part);
    }
    int *pn = NULL;
    OK(MPI_Win_shared_query(sw, MPI_PROC_NULL, &qsize, &du, &pn));
    CHECK(pn == p0 && qsize == (MPI_Aint)sizeof(int));
    OK(MPI_Win_unlock_all(sw));
    OK(MPI_Win_fence(0, sw));
    int sright = (rank + 1) % size, sleft = (rank + size - 1) % size, v = -rank - 1;
    OK(MPI_Put(&v, 1, MPI_INT, sright, 0, 1, MPI_INT, sw));
    OK(MPI_Win_fence(0, sw));
    CHECK(mine_part[0] == -sleft - 1);
    OK(MPI_Win_free(&sw));
  }

  /* A window made by MPI_Win_create at MPI_BOTTOM (mpi4py's test objects). */
  OK(MPI_Win_create(MPI_BOTTOM, 0, 1, MPI_INFO_NULL, MPI_COMM_SELF, &w));
  OK(MPI_Win_free(&w));

  /* Datatype keyvals: copied by Type_dup through the callback, deleted by Type_free; a delete
   * callback's error comes back from Type_delete_attr. */
  MPI_Datatype t, t2;
  int tk, tk2, tv = 5;
  void *tp;
  OK(MPI_Type_contiguous(2, MPI_INT, &t));
  OK(MPI_Type_create_keyval(type_copy, type_delete, &tk, NULL));
  OK(MPI_Type_get_attr(t, tk, &tp, &flag));
  CHECK(!flag);
  OK(MPI_Type_set_attr(t, tk, &tv));
  OK(MPI_Type_dup(t, &t2));
  CHECK(type_copied == 1);
  OK(MPI_Type_get_attr(t2, tk, &tp, &flag));
  CHECK(flag && tp == &tv);
  OK(MPI_Type_free(&t2));
  CHECK(type_deleted == 1);
  OK(MPI_Type_delete_attr(t, tk));
  CHECK(type_deleted == 2);
  OK(MPI_Type_get_attr(t, tk, &tp, &flag));
  CHECK(!flag);
  OK(MPI_Type_create_keyval(MPI_TYPE_NULL_COPY_FN, type_delete_fails, &tk2, NULL));
  OK(MPI_Type_set_attr(t, tk2, &tv));
  FAILS(MPI_Type_delete_attr(t, tk2), MPI_ERR_OTHER);
  /* The attribute whose delete failed is still there. */
  OK(MPI_Type_get_attr(t, tk2, &tp, &flag));
  CHECK(flag && tp == &tv);
  type_delete_refuses = 0;
  OK(MPI_Type_delete_attr(t, tk2));
  /* Attributes on a predefined type too. */
  OK(MPI_Type_set_attr(MPI_INT, tk, &tv));
  OK(MPI_Type_get_attr(MPI_INT, tk, &tp, &flag));
  CHECK(flag && tp == &tv);
  OK(MPI_Type_delete_attr(MPI_INT, tk));
  FAILS(MPI_Type_get_attr(t, MPI_KEYVAL_INVALID, &tp, &flag), MPI_ERR_KEYVAL);
  OK(MPI_Type_free(&t));
  OK(MPI_Type_free_keyval(&tk));
  OK(MPI_Type_free_keyval(&tk2));
  CHECK(tk == MPI_KEYVAL_INVALID);

  {
    /* Accumulate on padded pair types (their packed bytes are not their memory layout):
     * MINLOC of (value, rank) pairs from every process into rank 0's, two at once and one. */
    struct dpair { double v; int i; };
    struct ldpair { long double v; int i; };
    struct pairs { struct dpair d[2]; struct ldpair ld; } pm;
    memset(&pm, 0, sizeof pm);
    pm.d[0] = (struct dpair){1e9, -1};
    pm.d[1] = (struct dpair){1e9, -1};
    pm.ld = (struct ldpair){1e9L, -1};
    MPI_Win pw2;
    OK(MPI_Win_create(&pm, sizeof pm, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &pw2));
    OK(MPI_Win_fence(0, pw2));
    struct dpair two[2] = {{100.0 - rank, rank}, {rank, rank}};
    struct ldpair one = {(long double)rank + 5, rank};
    OK(MPI_Accumulate(two, 2, MPI_DOUBLE_INT, 0, offsetof(struct pairs, d), 2, MPI_DOUBLE_INT, MPI_MINLOC, pw2));
    OK(MPI_Accumulate(&one, 1, MPI_LONG_DOUBLE_INT, 0, offsetof(struct pairs, ld), 1, MPI_LONG_DOUBLE_INT, MPI_MINLOC, pw2));
    OK(MPI_Win_fence(0, pw2));
    if (rank == 0) {
      CHECK(pm.d[0].v == 100.0 - (size - 1) && pm.d[0].i == size - 1);
      CHECK(pm.d[1].v == 0.0 && pm.d[1].i == 0);
      CHECK(pm.ld.v == 5.0L && pm.ld.i == 0);
    }
    OK(MPI_Win_free(&pw2));
  }
  t_done("t_win");
  OK(MPI_Finalize());
  return 0;
}
