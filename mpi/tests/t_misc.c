/* Groups, Comm_create, Comm_split_type, names, Alloc_mem, Sendrecv_replace, Waitsome/Testsome,
 * Request_get_status, extents, status helpers, attributes (their callbacks' failures, keyvals
 * freed while in use, MPI-1's names). */
#include "common.h"

static int deleted = 0, copied = 0;
static int copy_fn(MPI_Comm c, int k, void *extra, void *in, void *out, int *flag) {
  (void)c; (void)k; (void)extra;
  copied++;
  *(void **)out = (char *)in + 1;
  *flag = 1;
  return MPI_SUCCESS;
}
static int delete_fn(MPI_Comm c, int k, void *val, void *extra) {
  (void)c; (void)k; (void)val;
  deleted += *(int *)extra;
  return MPI_SUCCESS;
}

/* Callbacks that fail: a delete that refuses while `refuse` is set, a copy that always does. */
static int refuse = 1;
static int refusing_delete(MPI_Comm c, int k, void *val, void *extra) {
  (void)c; (void)k; (void)val; (void)extra;
  return refuse ? MPI_ERR_OTHER : MPI_SUCCESS;
}
static int failing_copy(MPI_Comm c, int k, void *extra, void *in, void *out, int *flag) {
  (void)c; (void)k; (void)extra; (void)in; (void)out;
  *flag = 1;
  return MPI_ERR_OTHER;
}
static int type_deletes = 0;
static int refusing_type_delete(MPI_Datatype t, int k, void *val, void *extra) {
  (void)t; (void)k; (void)val; (void)extra;
  type_deletes++;
  return refuse ? MPI_ERR_OTHER : MPI_SUCCESS;
}

int main(int argc, char **argv) {
  int rank, size, r, s, res, flag;
  t_init(&argc, &argv, &rank, &size);

  /* A datatype's error goes to MPI_COMM_SELF's handler, or, where the program set none there,
   * to MPI_COMM_WORLD's (MPI 3's rule, which MPICH keeps): with only the world's set to
   * return (first thing here: nothing has set MPI_COMM_SELF's yet), the failing delete
   * callback's error comes back instead of ending the job, and the attribute stays. */
  static char tval[2];
  void *tgot = NULL;
  MPI_Datatype td, td2;
  int tkv;
  OK(MPI_Type_dup(MPI_DOUBLE, &td));
  OK(MPI_Type_create_keyval(MPI_TYPE_NULL_COPY_FN, refusing_type_delete, &tkv, NULL));
  OK(MPI_Type_set_attr(td, tkv, tval));
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  FAILS(MPI_Type_set_attr(td, tkv, tval + 1), MPI_ERR_OTHER);
  FAILS(MPI_Type_delete_attr(td, tkv), MPI_ERR_OTHER);
  CHECK(type_deletes == 2);
  OK(MPI_Type_get_attr(td, tkv, &tgot, &flag));
  CHECK(flag == 1 && tgot == tval);
  OK(MPI_Type_dup(td, &td2));
  OK(MPI_Type_get_attr(td2, tkv, &tgot, &flag));
  CHECK(flag == 0);
  OK(MPI_Type_free(&td2));
  refuse = 0;
  OK(MPI_Type_free(&td));
  refuse = 1;
  CHECK(type_deletes == 3);
  OK(MPI_Type_free_keyval(&tkv));
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL));

  /* Groups: the world's, reversed, the even ranks; translation and comparison. */
  MPI_Group world, rev, even, empty;
  OK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  OK(MPI_Group_size(world, &s));
  OK(MPI_Group_rank(world, &r));
  CHECK(s == size && r == rank);
  int *ranks = malloc(sizeof(int) * size), *out = malloc(sizeof(int) * size);
  for (int i = 0; i < size; i++) ranks[i] = size - 1 - i;
  OK(MPI_Group_incl(world, size, ranks, &rev));
  OK(MPI_Group_rank(rev, &r));
  CHECK(r == size - 1 - rank);
  OK(MPI_Group_compare(world, rev, &res));
  CHECK(res == (size == 1 ? MPI_IDENT : MPI_SIMILAR));
  OK(MPI_Group_compare(world, world, &res));
  CHECK(res == MPI_IDENT);
  for (int i = 0; i < size; i++) ranks[i] = i;
  OK(MPI_Group_translate_ranks(world, size, ranks, rev, out));
  for (int i = 0; i < size; i++) CHECK(out[i] == size - 1 - i);
  int ne = 0;
  for (int i = 1; i < size; i += 2) ranks[ne++] = i;
  OK(MPI_Group_excl(world, ne, ranks, &even));
  OK(MPI_Group_size(even, &s));
  CHECK(s == (size + 1) / 2);
  OK(MPI_Group_rank(even, &r));
  CHECK(r == (rank % 2 ? MPI_UNDEFINED : rank / 2));
  OK(MPI_Group_incl(world, 0, NULL, &empty));
  OK(MPI_Group_size(empty, &s));
  CHECK(s == 0);

  /* Set operations and rank ranges: odd = world \ even; even u odd has world's members with
   * the even ones first; ranges name the even ranks upwards and the odd ones downwards. */
  MPI_Group odd, both, none, evens, odds_down, rest;
  OK(MPI_Group_difference(world, even, &odd));
  OK(MPI_Group_size(odd, &s));
  CHECK(s == size / 2);
  OK(MPI_Group_union(even, odd, &both));
  OK(MPI_Group_size(both, &s));
  CHECK(s == size);
  OK(MPI_Group_rank(both, &r));
  CHECK(r == (rank % 2 ? (size + 1) / 2 + rank / 2 : rank / 2));
  OK(MPI_Group_compare(both, world, &res));
  CHECK(res == (size <= 2 ? MPI_IDENT : MPI_SIMILAR));
  OK(MPI_Group_intersection(even, odd, &none));
  OK(MPI_Group_size(none, &s));
  CHECK(s == 0);
  int rg[2][3] = {{0, size - 1, 2}, {0, 1, -2}};
  rg[1][0] = (size - 1) % 2 ? size - 1 : size - 2; /* the largest odd rank */
  OK(MPI_Group_range_incl(world, 1, rg, &evens));
  OK(MPI_Group_compare(evens, even, &res));
  CHECK(res == MPI_IDENT);
  if (size > 1) {
    OK(MPI_Group_range_incl(world, 1, &rg[1], &odds_down));
    OK(MPI_Group_size(odds_down, &s));
    CHECK(s == size / 2);
    OK(MPI_Group_rank(odds_down, &r));
    CHECK(r == (rank % 2 ? (rg[1][0] - rank) / 2 : MPI_UNDEFINED));
    OK(MPI_Group_free(&odds_down));
  }
  OK(MPI_Group_range_excl(world, 1, rg, &rest));
  OK(MPI_Group_compare(rest, odd, &res));
  CHECK(res == MPI_IDENT);
  int bad[1][3] = {{0, size, 1}};
  MPI_Group unchanged = rest;
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN)); /* groups report there */
  /* (We say MPI_ERR_RANK, MPICH says MPI_ERR_ARG.) */
  int cls = -1, rc = MPI_Group_range_incl(world, 1, bad, &unchanged);
  if (rc != MPI_SUCCESS) MPI_Error_class(rc, &cls);
  CHECK(cls == (expect_distcomm() ? MPI_ERR_RANK : cls) && (cls == MPI_ERR_RANK || cls == MPI_ERR_ARG));
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_ARE_FATAL));
  MPI_Group made[] = {rest, evens, none, both, odd};
  for (int i = 0; i < 5; i++)
    if (made[i] != MPI_GROUP_EMPTY) OK(MPI_Group_free(&made[i]));

  /* Comm_create from the even group: members get a comm, the others MPI_COMM_NULL. */
  MPI_Comm ce;
  OK(MPI_Comm_create(MPI_COMM_WORLD, even, &ce));
  if (rank % 2 == 0) {
    OK(MPI_Comm_rank(ce, &r));
    OK(MPI_Comm_size(ce, &s));
    CHECK(r == rank / 2 && s == (size + 1) / 2);
    int sum = 0;
    OK(MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, ce));
    int want = 0;
    for (int i = 0; i < size; i += 2) want += i;
    CHECK(sum == want);
    OK(MPI_Comm_free(&ce));
  } else {
    CHECK(ce == MPI_COMM_NULL);
  }
  OK(MPI_Group_free(&rev));
  OK(MPI_Group_free(&even));
  OK(MPI_Group_free(&world));
  CHECK(world == MPI_GROUP_NULL);

  /* Split by shared memory: every rank of this test is on one host. */
  MPI_Comm node;
  OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  OK(MPI_Comm_size(node, &s));
  OK(MPI_Comm_rank(node, &r));
  CHECK(s == size && r == rank);
  OK(MPI_Comm_free(&node));

  /* Names. */
  char name[MPI_MAX_OBJECT_NAME];
  int len;
  OK(MPI_Comm_get_name(MPI_COMM_WORLD, name, &len));
  CHECK(strcmp(name, "MPI_COMM_WORLD") == 0 && len == 14);
  MPI_Comm d;
  OK(MPI_Comm_dup(MPI_COMM_WORLD, &d));
  OK(MPI_Comm_set_name(d, "my dup"));
  OK(MPI_Comm_get_name(d, name, &len));
  CHECK(strcmp(name, "my dup") == 0 && len == 6);
  OK(MPI_Comm_test_inter(d, &flag));
  CHECK(flag == 0);
  OK(MPI_Type_get_name(MPI_DOUBLE, name, &len));
  CHECK(strcmp(name, "MPI_DOUBLE") == 0);

  /* Alloc_mem and Sendrecv_replace on it. */
  int *buf = NULL;
  OK(MPI_Alloc_mem(4 * sizeof(int), MPI_INFO_NULL, &buf));
  CHECK(buf != NULL);
  for (int i = 0; i < 4; i++) buf[i] = rank * 10 + i;
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  MPI_Status st;
  OK(MPI_Sendrecv_replace(buf, 4, MPI_INT, next, 1, prev, 1, d, &st));
  for (int i = 0; i < 4; i++) CHECK(buf[i] == prev * 10 + i);
  CHECK(st.MPI_SOURCE == prev && st.MPI_TAG == 1);
  OK(MPI_Free_mem(buf));

  /* Request_get_status leaves the request; Waitsome/Testsome complete what is done. */
  int a[3] = {1, 2, 3}, b[3] = {0, 0, 0};
  MPI_Request rq[3];
  for (int i = 0; i < 3; i++) OK(MPI_Irecv(&b[i], 1, MPI_INT, prev, 30 + i, d, &rq[i]));
  OK(MPI_Send(&a[0], 1, MPI_INT, next, 30, d));
  flag = 0;
  while (!flag) OK(MPI_Request_get_status(rq[0], &flag, &st));
  CHECK(rq[0] != MPI_REQUEST_NULL && st.MPI_TAG == 30 && b[0] == 1);
  int outcount = 0, idx[3];
  OK(MPI_Waitsome(1, rq, &outcount, idx, MPI_STATUSES_IGNORE));
  CHECK(outcount == 1 && idx[0] == 0 && rq[0] == MPI_REQUEST_NULL);
  OK(MPI_Send(&a[1], 1, MPI_INT, next, 31, d));
  OK(MPI_Send(&a[2], 1, MPI_INT, next, 32, d));
  int got = 0, tested = 0;
  while (got < 2) {
    MPI_Status sts[3];
    /* Testsome until it finds something, then Waitsome for the rest. */
    if (!tested) {
      OK(MPI_Testsome(3, rq, &outcount, idx, sts));
      if (outcount > 0) tested = 1;
    } else {
      OK(MPI_Waitsome(3, rq, &outcount, idx, sts));
      CHECK(outcount >= 1);
    }
    for (int k = 0; k < outcount; k++) CHECK(sts[k].MPI_TAG == 30 + idx[k] && b[idx[k]] == 1 + idx[k] && rq[idx[k]] == MPI_REQUEST_NULL);
    got += outcount;
  }
  CHECK(got == 2);
  OK(MPI_Waitsome(3, rq, &outcount, idx, MPI_STATUSES_IGNORE));
  CHECK(outcount == MPI_UNDEFINED);

  /* Extents and status helpers. */
  MPI_Aint lb, ext;
  OK(MPI_Type_get_extent(MPI_DOUBLE_INT, &lb, &ext));
  CHECK(lb == 0 && ext == 16);
  OK(MPI_Type_get_true_extent(MPI_INT, &lb, &ext));
  CHECK(lb == 0 && ext == 4);
  OK(MPI_Status_set_elements(&st, MPI_INT, 5));
  int cnt;
  OK(MPI_Get_elements(&st, MPI_INT, &cnt));
  CHECK(cnt == 5);
  OK(MPI_Status_set_cancelled(&st, 1));
  OK(MPI_Test_cancelled(&st, &flag));
  CHECK(flag == 1);
  /* Derived datatypes: contiguous ones move and reduce like their elements. */
  MPI_Datatype tri, tri2, sent;
  OK(MPI_Type_contiguous(3, MPI_INT, &tri));
  OK(MPI_Type_size(tri, &s));
  CHECK(s == 12);
  OK(MPI_Type_get_extent(tri, &lb, &ext));
  CHECK(lb == 0 && ext == 12);
  OK(MPI_Type_commit(&tri));
  int six[6] = {rank, rank + 1, rank + 2, rank + 3, rank + 4, rank + 5}, back[7];
  OK(MPI_Sendrecv(six, 2, tri, next, 50, back, 2, tri, prev, 50, d, &st));
  OK(MPI_Get_count(&st, tri, &cnt));
  CHECK(cnt == 2 && back[5] == prev + 5);
  OK(MPI_Get_elements(&st, tri, &cnt));
  CHECK(cnt == 6);
  OK(MPI_Sendrecv(six, 4, MPI_INT, next, 51, back, 2, tri, prev, 51, d, &st));
  OK(MPI_Get_count(&st, tri, &cnt));
  CHECK(cnt == MPI_UNDEFINED);
  OK(MPI_Get_elements(&st, tri, &cnt));
  CHECK(cnt == 4);
  if (expect_distcomm()) { /* predefined ops on a contiguous type of one predefined type:
                              an extension (MPICH refuses it) */
    int sums[6];
    OK(MPI_Allreduce(six, sums, 2, tri, MPI_SUM, d));
    for (int i = 0; i < 6; i++) CHECK(sums[i] == size * (size - 1) / 2 + size * i);
  }
  OK(MPI_Type_dup(tri, &tri2));
  OK(MPI_Bcast(six, 2, tri2, 0, d));
  for (int i = 0; i < 6; i++) CHECK(six[i] == i);
  OK(MPI_Type_contiguous(2, tri, &sent));
  OK(MPI_Type_size(sent, &s));
  CHECK(s == 24);
  OK(MPI_Type_free(&sent));
  CHECK(sent == MPI_DATATYPE_NULL);
  OK(MPI_Type_free(&tri2));
  OK(MPI_Type_free(&tri));
  /* Info objects. */
  MPI_Info info, info2;
  OK(MPI_Info_create(&info));
  OK(MPI_Info_set(info, "alpha", "1"));
  OK(MPI_Info_set(info, "beta", "two"));
  OK(MPI_Info_set(info, "alpha", "one"));
  int nkeys = -1, vlen = 0;
  OK(MPI_Info_get_nkeys(info, &nkeys));
  CHECK(nkeys == 2);
  char key[MPI_MAX_INFO_KEY], val[MPI_MAX_INFO_VAL];
  OK(MPI_Info_get_nthkey(info, 1, key));
  CHECK(strcmp(key, "beta") == 0);
  int buflen = sizeof val;
  OK(MPI_Info_get_string(info, "alpha", &buflen, val, &flag));
  CHECK(flag == 1 && strcmp(val, "one") == 0 && buflen == 4);
  OK(MPI_Info_get_valuelen(info, "beta", &vlen, &flag));
  CHECK(flag == 1 && vlen == 3);
  OK(MPI_Info_dup(info, &info2));
  OK(MPI_Info_delete(info, "beta"));
  buflen = sizeof val;
  OK(MPI_Info_get_string(info, "beta", &buflen, val, &flag));
  CHECK(flag == 0);
  OK(MPI_Info_get_string(info2, "beta", &buflen, val, &flag));
  CHECK(flag == 1 && strcmp(val, "two") == 0);
  OK(MPI_Comm_set_info(d, info));
  MPI_Info used;
  OK(MPI_Comm_get_info(d, &used));
  OK(MPI_Info_free(&used));
  OK(MPI_Pcontrol(1));
  OK(MPI_Info_free(&info));
  OK(MPI_Info_free(&info2));
  CHECK(info == MPI_INFO_NULL);

  /* Attributes: set, get, copied on dup by the copy callback, deleted on free. */
  int kv1, kv2, extra = 1;
  static char payload[4];
  OK(MPI_Comm_create_keyval(copy_fn, delete_fn, &kv1, &extra));
  OK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &kv2, NULL));
  OK(MPI_Comm_set_attr(d, kv1, payload));
  OK(MPI_Comm_set_attr(d, kv2, payload + 2));
  void *got_attr = NULL;
  OK(MPI_Comm_get_attr(d, kv1, &got_attr, &flag));
  CHECK(flag == 1 && got_attr == payload);
  MPI_Comm d2;
  OK(MPI_Comm_dup(d, &d2));
  CHECK(copied == 1);
  OK(MPI_Comm_get_attr(d2, kv1, &got_attr, &flag));
  CHECK(flag == 1 && got_attr == payload + 1);
  OK(MPI_Comm_get_attr(d2, kv2, &got_attr, &flag));
  CHECK(flag == 0);
  OK(MPI_Comm_free(&d2));
  CHECK(deleted == 1);
  OK(MPI_Comm_delete_attr(d, kv1));
  CHECK(deleted == 2);
  OK(MPI_Comm_get_attr(d, kv1, &got_attr, &flag));
  CHECK(flag == 0);
  OK(MPI_Comm_free_keyval(&kv1));
  OK(MPI_Comm_free_keyval(&kv2));
  CHECK(kv1 == MPI_KEYVAL_INVALID);

  /* A keyval freed while an attribute uses it keeps working for that attribute: its copy and
   * delete callbacks run, the attribute can be read and deleted by the old value, and freeing
   * it again meanwhile is no error (MPICH's attr tests do all of these). */
  int kv3, kv3_value;
  copied = deleted = 0;
  OK(MPI_Comm_create_keyval(copy_fn, delete_fn, &kv3, &extra));
  kv3_value = kv3;
  OK(MPI_Comm_set_attr(d, kv3, payload));
  OK(MPI_Comm_free_keyval(&kv3));
  CHECK(kv3 == MPI_KEYVAL_INVALID);
  OK(MPI_Comm_dup(d, &d2));
  CHECK(copied == 1);
  OK(MPI_Comm_get_attr(d2, kv3_value, &got_attr, &flag));
  CHECK(flag == 1 && got_attr == payload + 1);
  OK(MPI_Comm_free(&d2));
  CHECK(deleted == 1);
  kv3 = kv3_value;
  OK(MPI_Comm_free_keyval(&kv3));
  OK(MPI_Comm_delete_attr(d, kv3_value));
  CHECK(deleted == 2);

  /* Failing callbacks: a delete callback that fails leaves the attribute where it was (set,
   * delete), a copy callback that fails fails the dup, whose new handle is then the null one. */
  OK(MPI_Comm_set_errhandler(d, MPI_ERRORS_RETURN));
  int kv4;
  OK(MPI_Comm_create_keyval(failing_copy, refusing_delete, &kv4, NULL));
  OK(MPI_Comm_set_attr(d, kv4, payload));
  FAILS(MPI_Comm_set_attr(d, kv4, payload + 1), MPI_ERR_OTHER);
  OK(MPI_Comm_get_attr(d, kv4, &got_attr, &flag));
  CHECK(flag == 1 && got_attr == payload);
  FAILS(MPI_Comm_delete_attr(d, kv4), MPI_ERR_OTHER);
  OK(MPI_Comm_get_attr(d, kv4, &got_attr, &flag));
  CHECK(flag == 1 && got_attr == payload);
  d2 = MPI_COMM_WORLD;
  FAILS(MPI_Comm_dup(d, &d2), MPI_ERR_OTHER);
  CHECK(d2 == MPI_COMM_NULL);
  refuse = 0;
  OK(MPI_Comm_delete_attr(d, kv4));
  OK(MPI_Comm_get_attr(d, kv4, &got_attr, &flag));
  CHECK(flag == 0);
  OK(MPI_Comm_free_keyval(&kv4));

  /* MPI-1's names of the same functions (deprecated, still in the ABI). */
  int kv5, *tag_ub = NULL;
  OK(MPI_Keyval_create(MPI_NULL_COPY_FN, MPI_NULL_DELETE_FN, &kv5, NULL));
  OK(MPI_Attr_put(d, kv5, payload + 3));
  OK(MPI_Attr_get(d, kv5, &got_attr, &flag));
  CHECK(flag == 1 && got_attr == payload + 3);
  OK(MPI_Attr_delete(d, kv5));
  OK(MPI_Attr_get(d, kv5, &got_attr, &flag));
  CHECK(flag == 0);
  OK(MPI_Keyval_free(&kv5));
  CHECK(kv5 == MPI_KEYVAL_INVALID);
  OK(MPI_Attr_get(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag));
  CHECK(flag == 1 && tag_ub && *tag_ub >= 32767);

  OK(MPI_Comm_free(&d));
  free(ranks);
  free(out);
  t_done("t_misc");
  OK(MPI_Finalize());
  return 0;
}
