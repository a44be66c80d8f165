/* Process topologies and neighbourhood collectives: Dims_create, Cartesian grids (periodic and
 * not: coordinates, ranks, shifts, sub-grids, Comm_dup keeping the topology), graphs,
 * distributed graphs (adjacent and from edge lists), Neighbor_allgather(v) and
 * Neighbor_alltoall(v/w) on each (non-blocking and persistent on the grid), and the errors of
 * calls without a topology. */
#include "common.h"

/* What rank `from` sends to out-edge `j` in the neighbour tests: tells sender and edge apart. */
static int sent(int from, int j) { return from * 100 + j; }

int main(int argc, char **argv) {
  int rank, size, st;
  t_init(&argc, &argv, &rank, &size);
  OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  OK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN)); /* Dims_create's handler */

  /* Dims_create: balanced, non-increasing; given entries kept; impossible ones refused. */
  int d2[2] = {0, 0}, d3[3] = {0, 2, 0}, bad[2] = {4, 0};
  OK(MPI_Dims_create(6, 2, d2));
  CHECK(d2[0] == 3 && d2[1] == 2);
  OK(MPI_Dims_create(12, 3, d3));
  CHECK(d3[0] == 3 && d3[1] == 2 && d3[2] == 2);
  FAILS(MPI_Dims_create(6, 2, bad), MPI_ERR_DIMS);
  OK(MPI_Topo_test(MPI_COMM_WORLD, &st));
  CHECK(st == MPI_UNDEFINED);
  int src, dst;
  FAILS(MPI_Cart_shift(MPI_COMM_WORLD, 0, 1, &src, &dst), MPI_ERR_TOPOLOGY);

  /* A periodic 2-D grid of every rank (dims from Dims_create: 1x1, 2x1, 3x1, 2x2 ...). */
  int dims[2] = {0, 0}, periods[2] = {1, 1};
  OK(MPI_Dims_create(size, 2, dims));
  MPI_Comm grid;
  OK(MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, 0, &grid));
  OK(MPI_Comm_set_errhandler(grid, MPI_ERRORS_RETURN));
  OK(MPI_Topo_test(grid, &st));
  CHECK(st == MPI_CART);
  int nd = -1, gd[2], gp[2], gc[2], cc[2], r = -1, grank;
  OK(MPI_Comm_rank(grid, &grank));
  OK(MPI_Cartdim_get(grid, &nd));
  CHECK(nd == 2);
  OK(MPI_Cart_get(grid, 2, gd, gp, gc));
  CHECK(gd[0] == dims[0] && gd[1] == dims[1] && gp[0] == 1 && gp[1] == 1);
  OK(MPI_Cart_coords(grid, grank, 2, cc));
  CHECK(cc[0] == gc[0] && cc[1] == gc[1] && grank == cc[0] * dims[1] + cc[1]); /* row-major */
  OK(MPI_Cart_rank(grid, cc, &r));
  CHECK(r == grank);
  int wrap[2] = {cc[0] + dims[0], cc[1] - dims[1]};
  OK(MPI_Cart_rank(grid, wrap, &r));
  CHECK(r == grank);
  OK(MPI_Cart_shift(grid, 1, 1, &src, &dst));
  CHECK(dst == cc[0] * dims[1] + (cc[1] + 1) % dims[1] && src == cc[0] * dims[1] + (cc[1] + dims[1] - 1) % dims[1]);
  FAILS(MPI_Cart_shift(grid, 2, 1, &src, &dst), MPI_ERR_ARG);

  /* Neighbor_alltoall: out-edge order is dim 0 -1, dim 0 +1, dim 1 -1, dim 1 +1; what comes
   * from the -1 neighbour of a dimension is what it sent to its +1 side, also where both
   * sides are the same rank (a periodic dimension of 1 or 2). */
  int out4[4], in4[4] = {-1, -1, -1, -1}, nb[4];
  for (int j = 0; j < 4; j++) out4[j] = sent(grank, j);
  OK(MPI_Neighbor_alltoall(out4, 1, MPI_INT, in4, 1, MPI_INT, grid));
  for (int dim = 0; dim < 2; dim++) {
    OK(MPI_Cart_shift(grid, dim, 1, &nb[2 * dim], &nb[2 * dim + 1]));
    CHECK(in4[2 * dim] == sent(nb[2 * dim], 2 * dim + 1));
    CHECK(in4[2 * dim + 1] == sent(nb[2 * dim + 1], 2 * dim));
  }
  int all4[4] = {-1, -1, -1, -1};
  OK(MPI_Neighbor_allgather(&grank, 1, MPI_INT, all4, 1, MPI_INT, grid));
  for (int j = 0; j < 4; j++) CHECK(all4[j] == nb[j]);
  /* Comm_dup keeps the grid. */
  MPI_Comm gdup;
  OK(MPI_Comm_dup(grid, &gdup));
  OK(MPI_Topo_test(gdup, &st));
  CHECK(st == MPI_CART);
  OK(MPI_Neighbor_allgather_c(&grank, 1, MPI_INT, all4, 1, MPI_INT, gdup));
  for (int j = 0; j < 4; j++) CHECK(all4[j] == nb[j]);
  OK(MPI_Comm_free(&gdup));
  /* Non-blocking: two started at once (they match in call order, the second with a blocking
   * one between), completed in reverse; then a persistent one started twice. */
  {
    int in_a[4] = {-1, -1, -1, -1}, all_b[4] = {-1, -1, -1, -1}, all_c[4] = {-1, -1, -1, -1};
    MPI_Request q[2];
    OK(MPI_Ineighbor_alltoall(out4, 1, MPI_INT, in_a, 1, MPI_INT, grid, &q[0]));
    OK(MPI_Ineighbor_allgather(&grank, 1, MPI_INT, all_b, 1, MPI_INT, grid, &q[1]));
    OK(MPI_Neighbor_allgather(&grank, 1, MPI_INT, all_c, 1, MPI_INT, grid));
    OK(MPI_Wait(&q[1], MPI_STATUS_IGNORE));
    OK(MPI_Wait(&q[0], MPI_STATUS_IGNORE));
    for (int j = 0; j < 4; j++) CHECK(in_a[j] == in4[j] && all_b[j] == nb[j] && all_c[j] == nb[j]);
    MPI_Request p;
    int pin[4];
    OK(MPI_Neighbor_alltoall_init(out4, 1, MPI_INT, pin, 1, MPI_INT, grid, MPI_INFO_NULL, &p));
    for (int round = 0; round < 2; round++) {
      for (int j = 0; j < 4; j++) pin[j] = -1;
      OK(MPI_Start(&p));
      OK(MPI_Wait(&p, MPI_STATUS_IGNORE));
      for (int j = 0; j < 4; j++) CHECK(pin[j] == in4[j]);
    }
    OK(MPI_Request_free(&p));
  }
  /* A sub-grid of the rows: ranks of one row, ordered by their column. */
  int keep[2] = {0, 1}, rs, rr;
  MPI_Comm row;
  OK(MPI_Cart_sub(grid, keep, &row));
  OK(MPI_Comm_size(row, &rs));
  OK(MPI_Comm_rank(row, &rr));
  CHECK(rs == dims[1] && rr == cc[1]);
  OK(MPI_Cartdim_get(row, &nd));
  CHECK(nd == 1);
  OK(MPI_Comm_free(&row));
  OK(MPI_Comm_free(&grid));

  /* A line without wrap, one rank short where there are 3 or more: the last gets COMM_NULL;
   * the ends' outer neighbours are MPI_PROC_NULL and leave their blocks alone. */
  int n1 = size > 2 ? size - 1 : size, np = 0;
  MPI_Comm line;
  OK(MPI_Cart_create(MPI_COMM_WORLD, 1, &n1, &np, 1, &line));
  if (rank >= n1) {
    CHECK(line == MPI_COMM_NULL);
  } else {
    int lr, two[2] = {-7, -7};
    OK(MPI_Comm_rank(line, &lr));
    OK(MPI_Cart_shift(line, 0, 1, &src, &dst));
    CHECK(src == (lr > 0 ? lr - 1 : MPI_PROC_NULL) && dst == (lr < n1 - 1 ? lr + 1 : MPI_PROC_NULL));
    OK(MPI_Neighbor_allgather(&lr, 1, MPI_INT, two, 1, MPI_INT, line));
    CHECK(two[0] == (lr > 0 ? lr - 1 : -7) && two[1] == (lr < n1 - 1 ? lr + 1 : -7));
    OK(MPI_Comm_free(&line));
  }
  if (size > 1) {
    int toomany = size + 1;
    /* (MPICH's class is MPI_ERR_ARG; the standard names none.) */
    if (expect_distcomm()) FAILS(MPI_Cart_create(MPI_COMM_WORLD, 1, &toomany, &np, 0, &line), MPI_ERR_DIMS);
    else CHECK(MPI_Cart_create(MPI_COMM_WORLD, 1, &toomany, &np, 0, &line) != MPI_SUCCESS);
  }

  /* A ring graph: node i's neighbours are i-1 and i+1 (mod size). */
  int *index = malloc(sizeof(int) * size), *edges = malloc(sizeof(int) * 2 * size);
  for (int i = 0; i < size; i++) {
    index[i] = 2 * (i + 1);
    edges[2 * i] = (i + size - 1) % size;
    edges[2 * i + 1] = (i + 1) % size;
  }
  MPI_Comm ring;
  OK(MPI_Graph_create(MPI_COMM_WORLD, size, index, edges, 0, &ring));
  OK(MPI_Topo_test(ring, &st));
  CHECK(st == MPI_GRAPH);
  int nn, ne, cnt, nbs[2];
  OK(MPI_Graphdims_get(ring, &nn, &ne));
  CHECK(nn == size && ne == 2 * size);
  OK(MPI_Graph_neighbors_count(ring, rank, &cnt));
  CHECK(cnt == 2);
  OK(MPI_Graph_neighbors(ring, rank, 2, nbs));
  CHECK(nbs[0] == (rank + size - 1) % size && nbs[1] == (rank + 1) % size);
  int got[2] = {-1, -1};
  OK(MPI_Neighbor_allgather(&rank, 1, MPI_INT, got, 1, MPI_INT, ring));
  CHECK(got[0] == nbs[0] && got[1] == nbs[1]);
  OK(MPI_Comm_free(&ring));
  free(index);
  free(edges);

  /* Distributed graphs: a directed ring, given as adjacency (weighted), then as an edge list
   * that rank 0 gives alone. */
  int left = (rank + size - 1) % size, right = (rank + 1) % size, w1 = 5, w2 = 6;
  MPI_Comm dg;
  OK(MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 1, &left, &w1, 1, &right, &w2, MPI_INFO_NULL, 0, &dg));
  OK(MPI_Topo_test(dg, &st));
  CHECK(st == MPI_DIST_GRAPH);
  int indeg, outdeg, weighted, s1 = -1, sw = -1, d1 = -1, dw = -1;
  OK(MPI_Dist_graph_neighbors_count(dg, &indeg, &outdeg, &weighted));
  CHECK(indeg == 1 && outdeg == 1 && weighted);
  OK(MPI_Dist_graph_neighbors(dg, 1, &s1, &sw, 1, &d1, &dw));
  CHECK(s1 == left && sw == 5 && d1 == right && dw == 6);
  int one = 1, zero = 0, v = -1, mine = sent(rank, 0);
  OK(MPI_Neighbor_alltoallv(&mine, &one, &zero, MPI_INT, &v, &one, &zero, MPI_INT, dg));
  CHECK(v == sent(left, 0));
  OK(MPI_Comm_free(&dg));

  int n = rank == 0 ? size : 0, *srcs = malloc(sizeof(int) * size), *degs = malloc(sizeof(int) * size), *dsts = malloc(sizeof(int) * size);
  for (int i = 0; i < size; i++) {
    srcs[i] = i;
    degs[i] = 1;
    dsts[i] = (i + 1) % size;
  }
  OK(MPI_Dist_graph_create(MPI_COMM_WORLD, n, srcs, degs, dsts, MPI_UNWEIGHTED, MPI_INFO_NULL, 0, &dg));
  OK(MPI_Dist_graph_neighbors_count(dg, &indeg, &outdeg, &weighted));
  CHECK(indeg == 1 && outdeg == 1 && !weighted);
  OK(MPI_Dist_graph_neighbors(dg, 1, &s1, MPI_UNWEIGHTED, 1, &d1, MPI_UNWEIGHTED));
  CHECK(s1 == left && d1 == right);
  MPI_Aint disp0 = 0;
  MPI_Datatype ty = MPI_INT;
  v = -1;
  OK(MPI_Neighbor_alltoallw(&mine, &one, &disp0, &ty, &v, &one, &disp0, &ty, dg));
  CHECK(v == sent(left, 0));
  OK(MPI_Comm_free(&dg));
  free(srcs);
  free(degs);
  free(dsts);

  t_done("t_topo");
  OK(MPI_Finalize());
  return 0;
}
