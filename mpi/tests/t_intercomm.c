/* Intercommunicators: Intercomm_create over halves of the world, point-to-point between the
 * groups (remote ranks, statuses, MPI_ANY_SOURCE), barrier, bcast, gather, allgather, alltoall,
 * reduce_scatter(_block), non-blocking collectives and Comm_idup, dup, split, create, merge,
 * Intercomm_create_from_groups, free. Needs 2 ranks or more (1: checks only that the world is
 * an intracommunicator and that there is no parent). */
#include "common.h"

int main(int argc, char **argv) {
  int rank, size, flag;
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

  OK(MPI_Comm_test_inter(MPI_COMM_WORLD, &flag));
  CHECK(flag == 0);
  MPI_Comm parent = MPI_COMM_WORLD;
  OK(MPI_Comm_get_parent(&parent));
  CHECK(parent == MPI_COMM_NULL);
  int rs;
  /* (MPICH answers an intracommunicator's remote size without an error.) */
  if (expect_distcomm()) FAILS(MPI_Comm_remote_size(MPI_COMM_WORLD, &rs), MPI_ERR_COMM);
  if (size < 2) {
    t_done("t_intercomm");
    OK(MPI_Finalize());
    return 0;
  }

  /* Low half: ranks [0, size/2), high half: the rest. */
  int half = size / 2, low = rank < half;
  int lsize = low ? half : size - half, rsize = size - lsize;
  int lrank = low ? rank : rank - half;
  int rbase = low ? half : 0; /* world rank of remote rank 0 */
  MPI_Comm local, inter;
  OK(MPI_Comm_split(MPI_COMM_WORLD, low, rank, &local));
  OK(MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, low ? half : 0, 7, &inter));
  OK(MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN));
  OK(MPI_Comm_test_inter(inter, &flag));
  CHECK(flag == 1);
  int s, r;
  OK(MPI_Comm_size(inter, &s));
  OK(MPI_Comm_rank(inter, &r));
  OK(MPI_Comm_remote_size(inter, &rs));
  CHECK(s == lsize && r == lrank && rs == rsize);
  MPI_Group lg, rg, wg;
  OK(MPI_Comm_group(inter, &lg));
  OK(MPI_Comm_remote_group(inter, &rg));
  OK(MPI_Comm_group(MPI_COMM_WORLD, &wg));
  OK(MPI_Group_size(rg, &s));
  CHECK(s == rsize);
  int zero = 0, w0 = -1;
  OK(MPI_Group_translate_ranks(rg, 1, &zero, wg, &w0));
  CHECK(w0 == rbase);
  OK(MPI_Group_translate_ranks(lg, 1, &lrank, wg, &w0));
  CHECK(w0 == rank);

  /* Point to point: each rank sends its world rank to every remote rank; the receives of any
   * source get exactly the remote group's, with remote ranks as sources. */
  MPI_Request *rq = malloc(sizeof(MPI_Request) * rsize);
  for (int j = 0; j < rsize; j++) OK(MPI_Isend(&rank, 1, MPI_INT, j, 3, inter, &rq[j]));
  int seen = 0;
  for (int j = 0; j < rsize; j++) {
    int v = -1;
    MPI_Status st;
    OK(MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, 3, inter, &st));
    CHECK(st.MPI_SOURCE >= 0 && st.MPI_SOURCE < rsize && st.MPI_TAG == 3);
    CHECK(v == rbase + st.MPI_SOURCE);
    seen |= 1 << st.MPI_SOURCE;
  }
  CHECK(seen == (1 << rsize) - 1);
  OK(MPI_Waitall(rsize, rq, MPI_STATUSES_IGNORE));
  free(rq);
  /* A destination is a remote rank: one past the remote group is MPI_ERR_RANK. */
  FAILS(MPI_Send(&rank, 1, MPI_INT, rsize, 3, inter), MPI_ERR_RANK);
  /* Probe names the remote rank too. */
  if (lrank == 0) OK(MPI_Send(&rank, 1, MPI_INT, rsize - 1, 4, inter));
  if (lrank == lsize - 1) {
    MPI_Status st;
    int v;
    OK(MPI_Probe(MPI_ANY_SOURCE, 4, inter, &st));
    CHECK(st.MPI_SOURCE == 0);
    OK(MPI_Recv(&v, 1, MPI_INT, 0, 4, inter, MPI_STATUS_IGNORE));
    CHECK(v == rbase);
  }

  OK(MPI_Barrier(inter));

  /* Bcast from low rank 0 to the high group, then from high's last rank to the low group. */
  for (int from_low = 1; from_low >= 0; from_low--) {
    int root_local = from_low ? 0 : (size - half) - 1;
    int v = -1;
    if (low == from_low) {
      if (lrank == root_local) {
        v = 1234 + from_low;
        OK(MPI_Bcast(&v, 1, MPI_INT, MPI_ROOT, inter));
      } else {
        OK(MPI_Bcast(&v, 1, MPI_INT, MPI_PROC_NULL, inter));
        CHECK(v == -1);
      }
    } else {
      OK(MPI_Bcast(&v, 1, MPI_INT, root_local, inter));
      CHECK(v == 1234 + from_low);
    }
  }
  int v = 0;
  FAILS(MPI_Bcast(&v, 1, MPI_INT, rsize, inter), MPI_ERR_ROOT);

  /* Gather to low rank 0 from the high group. */
  int *all = malloc(sizeof(int) * 2 * size);
  for (int i = 0; i < 2 * size; i++) all[i] = -1;
  if (low) {
    OK(MPI_Gather(NULL, 0, MPI_INT, all, 1, MPI_INT, lrank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter));
    if (lrank == 0)
      for (int j = 0; j < rsize; j++) CHECK(all[j] == rbase + j);
  } else {
    OK(MPI_Gather(&rank, 1, MPI_INT, NULL, 0, MPI_INT, 0, inter));
  }
  /* Allgather: every rank gets the remote group's world ranks. */
  OK(MPI_Allgather(&rank, 1, MPI_INT, all, 1, MPI_INT, inter));
  for (int j = 0; j < rsize; j++) CHECK(all[j] == rbase + j);
  /* Alltoall: block j goes to remote rank j. */
  int *sb = malloc(sizeof(int) * rsize);
  for (int j = 0; j < rsize; j++) sb[j] = 1000 * rank + j;
  OK(MPI_Alltoall(sb, 1, MPI_INT, all, 1, MPI_INT, inter));
  for (int j = 0; j < rsize; j++) CHECK(all[j] == 1000 * (rbase + j) + lrank);
  free(sb);
  /* Allreduce: each group gets the sum of the other group's world ranks. */
  int got = -1, rsum = 0;
  for (int j = 0; j < rsize; j++) rsum += rbase + j;
  OK(MPI_Allreduce(&rank, &got, 1, MPI_INT, MPI_SUM, inter));
  CHECK(got == rsum);
  /* Reduce to low rank 0; the low group's others pass MPI_PROC_NULL with arguments that do
   * not matter (NULL buffers, MPI_BYTE). */
  got = -1;
  if (low) {
    if (lrank == 0) {
      OK(MPI_Reduce(NULL, &got, 1, MPI_INT, MPI_MAX, MPI_ROOT, inter));
      CHECK(got == size - 1);
    } else {
      OK(MPI_Reduce(NULL, NULL, 0, MPI_BYTE, MPI_MAX, MPI_PROC_NULL, inter));
    }
  } else {
    OK(MPI_Reduce(&rank, NULL, 1, MPI_INT, MPI_MAX, 0, inter));
  }

  /* Dup: congruent, and its messages are its own. */
  MPI_Comm dup;
  int res;
  OK(MPI_Comm_dup(inter, &dup));
  OK(MPI_Comm_compare(inter, dup, &res));
  CHECK(res == MPI_CONGRUENT);
  OK(MPI_Comm_compare(inter, MPI_COMM_WORLD, &res));
  CHECK(res == MPI_UNEQUAL);
  OK(MPI_Comm_test_inter(dup, &flag));
  CHECK(flag == 1);
  if (lrank == 0) {
    int a = 5, b = 6, x = 0, y = 0;
    MPI_Request q[2];
    OK(MPI_Irecv(&x, 1, MPI_INT, 0, 9, inter, &q[0]));
    OK(MPI_Irecv(&y, 1, MPI_INT, 0, 9, dup, &q[1]));
    OK(MPI_Send(&b, 1, MPI_INT, 0, 9, dup));
    OK(MPI_Send(&a, 1, MPI_INT, 0, 9, inter));
    OK(MPI_Waitall(2, q, MPI_STATUSES_IGNORE));
    CHECK(x == 5 && y == 6);
  }

  /* Merge: the low group passes high = 0, so the merged ranks are the world's. */
  MPI_Comm merged;
  OK(MPI_Intercomm_merge(dup, !low, &merged));
  OK(MPI_Comm_test_inter(merged, &flag));
  CHECK(flag == 0);
  OK(MPI_Comm_rank(merged, &r));
  OK(MPI_Comm_size(merged, &s));
  CHECK(r == rank && s == size);
  int sum = 0;
  OK(MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, merged));
  CHECK(sum == size * (size - 1) / 2);
  /* Both groups passing the same high still merge (one group first). */
  MPI_Comm merged2;
  OK(MPI_Intercomm_merge(inter, 0, &merged2));
  OK(MPI_Comm_size(merged2, &s));
  CHECK(s == size);
  OK(MPI_Comm_free(&merged2));

  /* Split: color 0 for local rank 0 only; the others get MPI_COMM_NULL. */
  MPI_Comm part;
  OK(MPI_Comm_split(inter, lrank == 0 ? 0 : MPI_UNDEFINED, 0, &part));
  if (lrank == 0) {
    CHECK(part != MPI_COMM_NULL);
    OK(MPI_Comm_size(part, &s));
    OK(MPI_Comm_remote_size(part, &rs));
    CHECK(s == 1 && rs == 1);
    int a = rank, b = -1;
    OK(MPI_Sendrecv(&a, 1, MPI_INT, 0, 1, &b, 1, MPI_INT, 0, 1, part, MPI_STATUS_IGNORE));
    CHECK(b == rbase);
    OK(MPI_Comm_free(&part));
  } else {
    CHECK(part == MPI_COMM_NULL);
  }

  /* From groups, with no parent: congruent to the first one. */
  MPI_Comm fg;
  OK(MPI_Intercomm_create_from_groups(lg, 0, rg, 0, "t_intercomm", MPI_INFO_NULL, MPI_ERRORS_RETURN, &fg));
  OK(MPI_Comm_compare(inter, fg, &res));
  CHECK(res == MPI_CONGRUENT);
  OK(MPI_Barrier(fg));
  OK(MPI_Comm_free(&fg));

  /* An intracommunicator is needed for Intercomm_create's local_comm. */
  MPI_Comm bad;
  FAILS(MPI_Intercomm_create(inter, 0, MPI_COMM_WORLD, 0, 7, &bad), MPI_ERR_COMM);

  free(all);
  /* Comm_create of an intercommunicator: each side names a subset of its local group (here
   * all but its local rank 0 where it has 2 or more, in reverse order); the new one joins the
   * two subsets, the others get MPI_COMM_NULL. A group with a remote rank is MPI_ERR_GROUP. */
  {
    int n = lsize > 1 ? lsize - 1 : 1, *ranks = malloc(sizeof(int) * n);
    for (int j = 0; j < n; j++) ranks[j] = lsize - 1 - j; /* the last n local ranks, reversed */
    MPI_Group sub, bad;
    OK(MPI_Group_incl(lg, n, ranks, &sub));
    MPI_Comm made = MPI_COMM_WORLD;
    OK(MPI_Comm_create(inter, sub, &made));
    int in = lrank >= lsize - n, rn = rsize > 1 ? rsize - 1 : 1;
    if (!in) {
      CHECK(made == MPI_COMM_NULL);
    } else {
      CHECK(made != MPI_COMM_NULL);
      OK(MPI_Comm_test_inter(made, &flag));
      CHECK(flag == 1);
      int ms, mr, mrs;
      OK(MPI_Comm_size(made, &ms));
      OK(MPI_Comm_rank(made, &mr));
      OK(MPI_Comm_remote_size(made, &mrs));
      CHECK(ms == n && mr == lsize - 1 - lrank && mrs == rn);
      /* Remote rank 0 of the new one is the other side's last local rank. */
      int v = -1, mine = rank;
      OK(MPI_Sendrecv(&mine, 1, MPI_INT, 0, 5, &v, 1, MPI_INT, 0, 5, made, MPI_STATUS_IGNORE));
      if (mr == 0) CHECK(v == rbase + rsize - 1);
      OK(MPI_Barrier(made));
      OK(MPI_Comm_free(&made));
    }
    OK(MPI_Group_free(&sub));
    free(ranks);
    OK(MPI_Group_incl(rg, 1, &zero, &bad));
    if (expect_distcomm()) FAILS(MPI_Comm_create(inter, bad, &made), MPI_ERR_GROUP);
    OK(MPI_Group_free(&bad));
  }

  /* Reduce_scatter(_block): local rank l gets elements [l*rsize, (l+1)*rsize) of the sum of
   * the remote group's vectors (element i of world rank w's vector: 100*w + i); the totals of
   * the two groups agree (lsize*rsize elements). Reduce_scatter gives all to local rank 0. */
  {
    int total = lsize * rsize;
    int *vec = malloc(sizeof(int) * total), *blk = malloc(sizeof(int) * total);
    int *rc = malloc(sizeof(int) * lsize);
    for (int i = 0; i < total; i++) vec[i] = 100 * rank + i;
    for (int i = 0; i < total; i++) blk[i] = -1;
    OK(MPI_Reduce_scatter_block(vec, blk, rsize, MPI_INT, MPI_SUM, inter));
    for (int i = 0; i < rsize; i++) CHECK(blk[i] == 100 * rsum + rsize * (lrank * rsize + i));
    for (int l = 0; l < lsize; l++) rc[l] = l == 0 ? total : 0;
    for (int i = 0; i < total; i++) blk[i] = -1;
    OK(MPI_Reduce_scatter(vec, blk, rc, MPI_INT, MPI_SUM, inter));
    if (lrank == 0)
      for (int i = 0; i < total; i++) CHECK(blk[i] == 100 * rsum + rsize * i);
    else
      CHECK(blk[0] == -1);
    free(rc);
    free(blk);
    free(vec);
  }

  /* Non-blocking collectives on the intercommunicator: several started at once, a blocking
   * one among them, an idup, then completed in reverse order (they match in call order). */
  {
    int bv = low ? -1 : 77, ag[64], ar = -1, rsb[64], tb = -1;
    int *vec = malloc(sizeof(int) * lsize * rsize);
    for (int i = 0; i < lsize * rsize; i++) vec[i] = 100 * rank + i;
    MPI_Request q[7];
    MPI_Comm idup = MPI_COMM_NULL;
    int broot = low ? 0 : (lrank == 0 ? MPI_ROOT : MPI_PROC_NULL);
    OK(MPI_Ibarrier(inter, &q[0]));
    OK(MPI_Ibcast(&bv, 1, MPI_INT, broot, inter, &q[1]));
    OK(MPI_Iallgather(&rank, 1, MPI_INT, ag, 1, MPI_INT, inter, &q[2]));
    OK(MPI_Iallreduce(&rank, &ar, 1, MPI_INT, MPI_SUM, inter, &q[3]));
    OK(MPI_Comm_idup(inter, &idup, &q[4]));
    OK(MPI_Ireduce_scatter_block(vec, rsb, rsize, MPI_INT, MPI_SUM, inter, &q[5]));
    int br = -1;
    OK(MPI_Allreduce(&rank, &br, 1, MPI_INT, MPI_MAX, inter)); /* blocking, behind the above */
    CHECK(br == rbase + rsize - 1);
    if (low && lrank == 0) tb = 5;
    OK(MPI_Ibcast(&tb, 1, MPI_INT, low ? (lrank == 0 ? MPI_ROOT : MPI_PROC_NULL) : 0, inter, &q[6]));
    for (int i = 6; i >= 0; i--) OK(MPI_Wait(&q[i], MPI_STATUS_IGNORE));
    if (low) CHECK(bv == 77);
    if (!low) CHECK(tb == 5);
    for (int j = 0; j < rsize; j++) CHECK(ag[j] == rbase + j);
    CHECK(ar == rsum);
    for (int i = 0; i < rsize; i++) CHECK(rsb[i] == 100 * rsum + rsize * (lrank * rsize + i));
    CHECK(idup != MPI_COMM_NULL);
    OK(MPI_Comm_test_inter(idup, &flag));
    CHECK(flag == 1);
    OK(MPI_Comm_remote_size(idup, &rs));
    CHECK(rs == rsize);
    int iv = low ? rank : -1;
    OK(MPI_Bcast(&iv, 1, MPI_INT, low ? (lrank == 0 ? MPI_ROOT : MPI_PROC_NULL) : 0, idup));
    if (!low) CHECK(iv == 0);
    OK(MPI_Comm_free(&idup));
    free(vec);
  }

  OK(MPI_Group_free(&lg));
  OK(MPI_Group_free(&rg));
  OK(MPI_Group_free(&wg));
  OK(MPI_Comm_free(&merged));
  OK(MPI_Comm_free(&dup));
  OK(MPI_Comm_free(&inter));
  CHECK(inter == MPI_COMM_NULL);
  OK(MPI_Comm_free(&local));
  t_done("t_intercomm");
  OK(MPI_Finalize());
  return 0;
}
