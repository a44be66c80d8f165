//! Process topologies (MPI 4.1 chapter 8): Cartesian, graph and distributed graph
//! communicators, their queries, and the neighbour lists the neighbourhood collectives use
//! (`neighbor.rs`).
//!
//! A topology communicator is a new communicator (a split of the old one for Cartesian and
//! graph topologies, whose processes beyond the shape get MPI_COMM_NULL; a duplicate for
//! distributed graphs) with its shape attached. `reorder` is accepted and ranks are kept (the
//! standard allows it). Neighbourhood messages go over an engine comm of the topology's own,
//! so they never match the program's point-to-point messages on the communicator.

use crate::abi_gen::*;
use crate::api::out;
use crate::err::{MpiErr, Res};
use crate::state::{self, CommRef, MpiComm};
use std::ffi::c_int;
use std::sync::atomic::Ordering;

#[derive(Clone)]
pub enum Shape {
    /// Row-major: the last dimension varies fastest.
    Cart { dims: Vec<c_int>, periods: Vec<bool> },
    /// MPI_Graph_create's arrays: the neighbours of node i are edges[index[i-1]..index[i]].
    Graph { index: Vec<c_int>, edges: Vec<c_int> },
    /// This process's edges: in from `sources`, out to `dests` (weights when given).
    Dist { sources: Vec<c_int>, sweights: Option<Vec<c_int>>, dests: Vec<c_int>, dweights: Option<Vec<c_int>> },
}

pub struct Topo {
    pub shape: Shape,
    neighbors: CommRef,
}

impl Topo {
    pub fn neighbors_comm(&self) -> &CommRef {
        &self.neighbors
    }
}

/// One neighbour of a neighbourhood collective: its rank (or MPI_PROC_NULL) and the tag that
/// pairs this edge with the same edge seen from the other end (see `Shape::edges`).
#[derive(Clone, Copy)]
pub struct Edge {
    pub rank: c_int,
    pub tag: c_int,
}

impl Shape {
    /// The in and out neighbours in the standard's order, with the tags that pair them: a
    /// Cartesian edge by its dimension and side (the message a rank sends to its +1 neighbour
    /// of dimension d is the one that neighbour receives from its -1 side, which matters where
    /// both sides are the same rank: a periodic dimension of 1 or 2); a graph edge by its
    /// occurrence among the edges between the same two ranks.
    pub fn edges(&self, me: c_int) -> (Vec<Edge>, Vec<Edge>) {
        match self {
            Shape::Cart { dims, periods } => {
                let (mut ins, mut outs) = (Vec::new(), Vec::new());
                for d in 0..dims.len() {
                    let (src, dst) = cart_shift_of(dims, periods, me, d, 1);
                    let side = 2 * d as c_int;
                    // The -1 neighbour (src of a +1 shift) and the +1 neighbour (dst).
                    ins.push(Edge { rank: src, tag: side });
                    ins.push(Edge { rank: dst, tag: side + 1 });
                    outs.push(Edge { rank: src, tag: side + 1 });
                    outs.push(Edge { rank: dst, tag: side });
                }
                (ins, outs)
            }
            Shape::Graph { index, edges } => {
                let list = graph_neighbors_of(index, edges, me);
                (by_occurrence(&list), by_occurrence(&list))
            }
            Shape::Dist { sources, dests, .. } => (by_occurrence(sources), by_occurrence(dests)),
        }
    }
}

fn by_occurrence(ranks: &[c_int]) -> Vec<Edge> {
    ranks.iter().enumerate().map(|(i, &r)| Edge { rank: r, tag: ranks[..i].iter().filter(|&&x| x == r).count() as c_int }).collect()
}

fn graph_neighbors_of(index: &[c_int], edges: &[c_int], node: c_int) -> Vec<c_int> {
    let n = node as usize;
    let from = if n == 0 { 0 } else { index[n - 1] as usize };
    edges[from..index[n] as usize].to_vec()
}

/// Row-major coordinates of `rank`.
fn coords_of(dims: &[c_int], rank: c_int) -> Vec<c_int> {
    let mut c = vec![0; dims.len()];
    let mut r = rank;
    for i in (0..dims.len()).rev() {
        c[i] = r % dims[i];
        r /= dims[i];
    }
    c
}

/// The rank at `coords`, periodic dimensions wrapped; None off a non-periodic edge.
fn rank_at(dims: &[c_int], periods: &[bool], coords: &[c_int]) -> Option<c_int> {
    let mut r = 0;
    for i in 0..dims.len() {
        let mut c = coords[i];
        if periods[i] {
            c = c.rem_euclid(dims[i]);
        } else if c < 0 || c >= dims[i] {
            return None;
        }
        r = r * dims[i] + c;
    }
    Some(r)
}

fn cart_shift_of(dims: &[c_int], periods: &[bool], me: c_int, d: usize, disp: c_int) -> (c_int, c_int) {
    let c = coords_of(dims, me);
    let at = |delta: c_int| {
        let mut x = c.clone();
        x[d] = x[d].saturating_add(delta);
        rank_at(dims, periods, &x).unwrap_or(MPI_PROC_NULL)
    };
    (at(disp.saturating_neg()), at(disp))
}

/// `n` ints from the caller (NULL is MPI_ERR_ARG unless `n` is 0).
fn ints(p: *const c_int, n: c_int, what: &str) -> Result<Vec<c_int>, MpiErr> {
    if n <= 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    // SAFETY: the caller's array holds `n` ints.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) }.to_vec())
}

/// Writes `v` into the caller's array of at least `max` ints (the first `max` of `v`).
fn put_ints(p: *mut c_int, max: c_int, v: &[c_int], what: &str) -> Res {
    let n = v.len().min(max.max(0) as usize);
    if n == 0 {
        return Ok(());
    }
    if p.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    // SAFETY: the caller's array holds at least `max` ints.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p, n) };
    Ok(())
}

/// An intracommunicator for a topology's creation (MPI_ERR_COMM otherwise).
fn intra(c: MPI_Comm) -> Result<CommRef, MpiErr> {
    state::intra_comm(c, "a topology")
}

/// The topology of `c`, or MPI_ERR_TOPOLOGY.
fn topo_of(c: MPI_Comm) -> Result<CommRef, MpiErr> {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    if mc.topo.get().is_none() {
        return Err(MpiErr::new(MPI_ERR_TOPOLOGY, "the communicator has no process topology").on(c));
    }
    Ok(mc)
}

fn cart(mc: &MpiComm) -> Result<(&[c_int], &[bool]), MpiErr> {
    match mc.topo.get().map(|t| &t.shape) {
        Some(Shape::Cart { dims, periods }) => Ok((dims, periods)),
        _ => Err(MpiErr::new(MPI_ERR_TOPOLOGY, "the communicator has no Cartesian topology").on(mc.handle)),
    }
}

/// The members of `mc` with `color` (others: MPI_COMM_NULL), ordered by `key`, with `shape`.
/// Collective over `mc`.
fn make(mc: &MpiComm, color: c_int, key: c_int, shape: impl FnOnce() -> Shape) -> Result<MPI_Comm, MpiErr> {
    let errh = mc.errhandler.load(Ordering::Relaxed);
    let Some(child) = mc.comm.split(color, key).map_err(|e| MpiErr::from(e).on(mc.handle))? else {
        return Ok(MPI_COMM_NULL);
    };
    let h = state::add_comm(child, errh);
    attach(h, shape())?;
    Ok(h)
}

/// Attaches `shape` to the new communicator `h`, with its neighbourhood comm (collective).
pub fn attach(h: MPI_Comm, shape: Shape) -> Res {
    let mc = state::get_comm(h)?;
    let all: Vec<usize> = (0..mc.size()).collect();
    let nbr = mc.comm.new_group(&all).map_err(|e| MpiErr::from(e).on(h))?.expect("every rank is a member");
    let neighbors = state::unlisted(nbr, h, mc.errhandler.load(Ordering::Relaxed));
    let _ = mc.topo.set(Topo { shape, neighbors });
    Ok(())
}

/// The same shape for a duplicate (MPI_Comm_dup keeps the topology).
pub fn copy_to(from: &MpiComm, h: MPI_Comm) -> Res {
    match from.topo.get() {
        Some(t) => attach(h, t.shape.clone()),
        None => Ok(()),
    }
}

// ---- Cartesian -------------------------------------------------------------------------------

/// Balanced factors of `nnodes` in the zero entries of `dims` (non-increasing), as the standard
/// asks; the non-zero entries stay and must divide it.
pub unsafe fn dims_create(nnodes: c_int, ndims: c_int, dims: *mut c_int) -> Res {
    if nnodes <= 0 {
        return crate::mpi_err!(MPI_ERR_ARG, "nnodes {nnodes} is not positive");
    }
    if ndims < 0 {
        return crate::mpi_err!(MPI_ERR_DIMS, "ndims {ndims} is negative");
    }
    let mut d = ints(dims, ndims, "dims")?;
    let mut rest = nnodes;
    for &x in &d {
        if x < 0 {
            return crate::mpi_err!(MPI_ERR_DIMS, "dims has a negative entry ({x})");
        }
        if x > 0 {
            if rest % x != 0 {
                return crate::mpi_err!(MPI_ERR_DIMS, "the given dims do not divide nnodes {nnodes}");
            }
            rest /= x;
        }
    }
    let free: Vec<usize> = (0..d.len()).filter(|&i| d[i] == 0).collect();
    if free.is_empty() {
        if rest != 1 {
            return crate::mpi_err!(MPI_ERR_DIMS, "the product of dims is not nnodes {nnodes}");
        }
        return Ok(());
    }
    let mut vals = balanced(rest as i64, free.len()).into_iter().map(|x| x as c_int).collect::<Vec<_>>();
    vals.sort_unstable_by(|a, b| b.cmp(a));
    for (k, &i) in free.iter().enumerate() {
        d[i] = vals[k];
    }
    put_ints(dims, ndims, &d, "dims")
}

/// The `k` factors of `n`, non-increasing, whose largest and smallest are closest (ties: the
/// largest last factor, then the largest one before it, and so on). This is what MPICH's own
/// `topo/dims5` test expects (its table of 75,000 cases in up to 17 dimensions).
fn balanced(n: i64, k: usize) -> Vec<i64> {
    let mut divisors: Vec<i64> = (1..).take_while(|d| d * d <= n).filter(|d| n % d == 0).flat_map(|d| [d, n / d]).collect();
    divisors.sort_unstable_by(|a, b| b.cmp(a));
    divisors.dedup();
    fn search(n: i64, k: usize, max: i64, divisors: &[i64], acc: &mut Vec<i64>, best: &mut Option<Vec<i64>>) {
        if k == 1 {
            if n <= max {
                acc.push(n);
                // Closest first; among those, the largest last factor, then the one before it...
                let better = best.as_ref().is_none_or(|b| {
                    let (spread, best_spread) = (acc[0] - n, b[0] - b[b.len() - 1]);
                    spread < best_spread || (spread == best_spread && acc.iter().rev().gt(b.iter().rev()))
                });
                if better {
                    *best = Some(acc.clone());
                }
                acc.pop();
            }
            return;
        }
        for &d in divisors.iter().filter(|&&d| d <= max && n % d == 0) {
            // The rest must fit in k-1 factors of at most d.
            if (d as f64).powi(k as i32) < n as f64 * (1.0 - 1e-12) {
                break;
            }
            acc.push(d);
            search(n / d, k - 1, d, divisors, acc, best);
            acc.pop();
        }
    }
    let mut best = None;
    search(n, k, n, &divisors, &mut Vec::with_capacity(k), &mut best);
    best.expect("1s always factor n")
}

fn cart_args(ndims: c_int, dims: *const c_int, periods: *const c_int, size: usize) -> Result<(Vec<c_int>, Vec<bool>, c_int), MpiErr> {
    if ndims < 0 {
        return crate::mpi_err!(MPI_ERR_DIMS, "ndims {ndims} is negative");
    }
    let d = ints(dims, ndims, "dims")?;
    let p: Vec<bool> = ints(periods, ndims, "periods")?.into_iter().map(|x| x != 0).collect();
    let mut n: i64 = 1;
    for &x in &d {
        if x <= 0 {
            return crate::mpi_err!(MPI_ERR_DIMS, "dims has an entry below 1 ({x})");
        }
        n = n.saturating_mul(x as i64);
    }
    if n > size as i64 {
        return crate::mpi_err!(MPI_ERR_DIMS, "the grid has {n} processes, more than the communicator's {size}");
    }
    Ok((d, p, n as c_int))
}

pub unsafe fn cart_create(comm_old: MPI_Comm, ndims: c_int, dims: *const c_int, periods: *const c_int, _reorder: c_int, comm_cart: *mut MPI_Comm) -> Res {
    let mc = intra(comm_old)?;
    let o = out(comm_cart, "comm_cart").map_err(|e| e.on(comm_old))?;
    let (d, p, n) = cart_args(ndims, dims, periods, mc.size()).map_err(|e| e.on(comm_old))?;
    let rank = mc.rank() as c_int;
    *o = make(&mc, if rank < n { 0 } else { -1 }, rank, || Shape::Cart { dims: d, periods: p })?;
    Ok(())
}

pub unsafe fn cart_map(comm: MPI_Comm, ndims: c_int, dims: *const c_int, periods: *const c_int, newrank: *mut c_int) -> Res {
    let mc = intra(comm)?;
    let o = out(newrank, "newrank").map_err(|e| e.on(comm))?;
    let (_, _, n) = cart_args(ndims, dims, periods, mc.size()).map_err(|e| e.on(comm))?;
    let rank = mc.rank() as c_int;
    *o = if rank < n { rank } else { MPI_UNDEFINED };
    Ok(())
}

pub unsafe fn cartdim_get(comm: MPI_Comm, ndims: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let (d, _) = cart(&mc)?;
    *out(ndims, "ndims").map_err(|e| e.on(comm))? = d.len() as c_int;
    Ok(())
}

pub unsafe fn cart_get(comm: MPI_Comm, maxdims: c_int, dims: *mut c_int, periods: *mut c_int, coords: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let (d, p) = cart(&mc)?;
    let on = |e: MpiErr| e.on(comm);
    put_ints(dims, maxdims, d, "dims").map_err(on)?;
    put_ints(periods, maxdims, &p.iter().map(|&x| x as c_int).collect::<Vec<_>>(), "periods").map_err(on)?;
    put_ints(coords, maxdims, &coords_of(d, mc.rank() as c_int), "coords").map_err(on)
}

pub unsafe fn cart_rank(comm: MPI_Comm, coords: *const c_int, rank: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let (d, p) = cart(&mc)?;
    let c = ints(coords, d.len() as c_int, "coords").map_err(|e| e.on(comm))?;
    let o = out(rank, "rank").map_err(|e| e.on(comm))?;
    *o = rank_at(d, p, &c).ok_or_else(|| MpiErr::new(MPI_ERR_ARG, format!("coords {c:?} are off the grid {d:?} in a non-periodic dimension")).on(comm))?;
    Ok(())
}

pub unsafe fn cart_coords(comm: MPI_Comm, rank: c_int, maxdims: c_int, coords: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let (d, _) = cart(&mc)?;
    if rank < 0 || rank as usize >= mc.size() {
        return Err(MpiErr::new(MPI_ERR_RANK, format!("rank {rank} is not a rank of the communicator (size {})", mc.size())).on(comm));
    }
    if (maxdims as usize) < d.len() {
        return Err(MpiErr::new(MPI_ERR_ARG, format!("maxdims {maxdims} is below the grid's {} dimensions", d.len())).on(comm));
    }
    put_ints(coords, maxdims, &coords_of(d, rank), "coords").map_err(|e| e.on(comm))
}

pub unsafe fn cart_shift(comm: MPI_Comm, direction: c_int, disp: c_int, rank_source: *mut c_int, rank_dest: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let (d, p) = cart(&mc)?;
    if direction < 0 || direction as usize >= d.len() {
        return Err(MpiErr::new(MPI_ERR_ARG, format!("direction {direction} is not a dimension of the {}-dimensional grid", d.len())).on(comm));
    }
    let (s, t) = cart_shift_of(d, p, mc.rank() as c_int, direction as usize, disp);
    *out(rank_source, "rank_source").map_err(|e| e.on(comm))? = s;
    *out(rank_dest, "rank_dest").map_err(|e| e.on(comm))? = t;
    Ok(())
}

/// The sub-grids that keep the dimensions `remain_dims` marks: the ranks that agree on the
/// coordinates of the others form one, in the old rank order.
pub unsafe fn cart_sub(comm: MPI_Comm, remain_dims: *const c_int, newcomm: *mut MPI_Comm) -> Res {
    let mc = topo_of(comm)?;
    let (d, p) = cart(&mc)?;
    let keep: Vec<bool> = ints(remain_dims, d.len() as c_int, "remain_dims").map_err(|e| e.on(comm))?.into_iter().map(|x| x != 0).collect();
    let o = out(newcomm, "newcomm").map_err(|e| e.on(comm))?;
    let c = coords_of(d, mc.rank() as c_int);
    let color = (0..d.len()).filter(|&i| !keep[i]).fold(0, |acc, i| acc * d[i] + c[i]);
    let dims = (0..d.len()).filter(|&i| keep[i]).map(|i| d[i]).collect();
    let periods = (0..d.len()).filter(|&i| keep[i]).map(|i| p[i]).collect();
    *o = make(&mc, color, mc.rank() as c_int, || Shape::Cart { dims, periods })?;
    Ok(())
}

pub unsafe fn topo_test(comm: MPI_Comm, status: *mut c_int) -> Res {
    state::check_active()?;
    let mc = state::get_comm(comm)?;
    *out(status, "status").map_err(|e| e.on(comm))? = match mc.topo.get().map(|t| &t.shape) {
        Some(Shape::Cart { .. }) => MPI_CART,
        Some(Shape::Graph { .. }) => MPI_GRAPH,
        Some(Shape::Dist { .. }) => MPI_DIST_GRAPH,
        None => MPI_UNDEFINED,
    };
    Ok(())
}

// ---- graphs ----------------------------------------------------------------------------------

fn graph_args(nnodes: c_int, indx: *const c_int, edges: *const c_int, size: usize) -> Result<(Vec<c_int>, Vec<c_int>), MpiErr> {
    if nnodes < 0 || nnodes as usize > size {
        return crate::mpi_err!(MPI_ERR_ARG, "nnodes {nnodes} is not in [0, the communicator's size {size}]");
    }
    let index = ints(indx, nnodes, "index")?;
    if index.windows(2).any(|w| w[1] < w[0]) || index.first().is_some_and(|&x| x < 0) {
        return crate::mpi_err!(MPI_ERR_ARG, "index is not non-decreasing from 0");
    }
    let e = ints(edges, index.last().copied().unwrap_or(0), "edges")?;
    if let Some(x) = e.iter().find(|&&x| x < 0 || x >= nnodes) {
        return crate::mpi_err!(MPI_ERR_ARG, "edge to {x} is not a node of the graph ({nnodes} nodes)");
    }
    Ok((index, e))
}

fn graph(mc: &MpiComm) -> Result<(&[c_int], &[c_int]), MpiErr> {
    match mc.topo.get().map(|t| &t.shape) {
        Some(Shape::Graph { index, edges }) => Ok((index, edges)),
        _ => Err(MpiErr::new(MPI_ERR_TOPOLOGY, "the communicator has no graph topology").on(mc.handle)),
    }
}

pub unsafe fn graph_create(comm_old: MPI_Comm, nnodes: c_int, indx: *const c_int, edges: *const c_int, _reorder: c_int, comm_graph: *mut MPI_Comm) -> Res {
    let mc = intra(comm_old)?;
    let o = out(comm_graph, "comm_graph").map_err(|e| e.on(comm_old))?;
    let (index, e) = graph_args(nnodes, indx, edges, mc.size()).map_err(|e| e.on(comm_old))?;
    let rank = mc.rank() as c_int;
    *o = make(&mc, if rank < nnodes { 0 } else { -1 }, rank, || Shape::Graph { index, edges: e })?;
    Ok(())
}

pub unsafe fn graph_map(comm: MPI_Comm, nnodes: c_int, indx: *const c_int, edges: *const c_int, newrank: *mut c_int) -> Res {
    let mc = intra(comm)?;
    let o = out(newrank, "newrank").map_err(|e| e.on(comm))?;
    graph_args(nnodes, indx, edges, mc.size()).map_err(|e| e.on(comm))?;
    let rank = mc.rank() as c_int;
    *o = if rank < nnodes { rank } else { MPI_UNDEFINED };
    Ok(())
}

pub unsafe fn graphdims_get(comm: MPI_Comm, nnodes: *mut c_int, nedges: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let (index, edges) = graph(&mc)?;
    *out(nnodes, "nnodes").map_err(|e| e.on(comm))? = index.len() as c_int;
    *out(nedges, "nedges").map_err(|e| e.on(comm))? = edges.len() as c_int;
    Ok(())
}

pub unsafe fn graph_get(comm: MPI_Comm, maxindex: c_int, maxedges: c_int, indx: *mut c_int, edges: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let (index, e) = graph(&mc)?;
    put_ints(indx, maxindex, index, "index").map_err(|x| x.on(comm))?;
    put_ints(edges, maxedges, e, "edges").map_err(|x| x.on(comm))
}

fn graph_node(mc: &MpiComm, rank: c_int) -> Result<Vec<c_int>, MpiErr> {
    let (index, edges) = graph(mc)?;
    if rank < 0 || rank as usize >= index.len() {
        return Err(MpiErr::new(MPI_ERR_RANK, format!("rank {rank} is not a node of the graph ({} nodes)", index.len())).on(mc.handle));
    }
    Ok(graph_neighbors_of(index, edges, rank))
}

pub unsafe fn graph_neighbors_count(comm: MPI_Comm, rank: c_int, nneighbors: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let n = graph_node(&mc, rank)?.len();
    *out(nneighbors, "nneighbors").map_err(|e| e.on(comm))? = n as c_int;
    Ok(())
}

pub unsafe fn graph_neighbors(comm: MPI_Comm, rank: c_int, maxneighbors: c_int, neighbors: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let v = graph_node(&mc, rank)?;
    put_ints(neighbors, maxneighbors, &v, "neighbors").map_err(|e| e.on(comm))
}

// ---- distributed graphs ----------------------------------------------------------------------

/// Weights as given: None for MPI_UNWEIGHTED; MPI_WEIGHTS_EMPTY is weighted with none.
fn weights(p: *const c_int, n: c_int, what: &str) -> Result<Option<Vec<c_int>>, MpiErr> {
    match p as usize {
        MPI_UNWEIGHTED => Ok(None),
        MPI_WEIGHTS_EMPTY => Ok(Some(vec![0; n.max(0) as usize])),
        _ => ints(p, n, what).map(Some),
    }
}

fn check_ranks(v: &[c_int], size: usize, what: &str) -> Res {
    match v.iter().find(|&&r| r < 0 || r as usize >= size) {
        Some(r) => crate::mpi_err!(MPI_ERR_RANK, "{what} names {r}, not a rank of the communicator (size {size})"),
        None => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)] // the standard's signature
pub unsafe fn dist_graph_create_adjacent(
    comm_old: MPI_Comm,
    indegree: c_int,
    sources: *const c_int,
    sourceweights: *const c_int,
    outdegree: c_int,
    destinations: *const c_int,
    destweights: *const c_int,
    _info: MPI_Info,
    _reorder: c_int,
    comm_dist_graph: *mut MPI_Comm,
) -> Res {
    let mc = intra(comm_old)?;
    let o = out(comm_dist_graph, "comm_dist_graph").map_err(|e| e.on(comm_old))?;
    let on = |e: MpiErr| e.on(comm_old);
    if indegree < 0 || outdegree < 0 {
        return Err(on(MpiErr::new(MPI_ERR_ARG, format!("a degree is negative (in {indegree}, out {outdegree})"))));
    }
    let s = ints(sources, indegree, "sources").map_err(on)?;
    let d = ints(destinations, outdegree, "destinations").map_err(on)?;
    check_ranks(&s, mc.size(), "sources").map_err(on)?;
    check_ranks(&d, mc.size(), "destinations").map_err(on)?;
    let (sw, dw) = (weights(sourceweights, indegree, "sourceweights").map_err(on)?, weights(destweights, outdegree, "destweights").map_err(on)?);
    *o = make(&mc, 0, mc.rank() as c_int, || Shape::Dist { sources: s, sweights: sw, dests: d, dweights: dw })?;
    Ok(())
}

/// Every member's edges, gathered: each rank then keeps those that start or end at it (in the
/// order of the givers' ranks, then of their arrays).
#[allow(clippy::too_many_arguments)] // the standard's signature
pub unsafe fn dist_graph_create(comm_old: MPI_Comm, n: c_int, sources: *const c_int, degrees: *const c_int, destinations: *const c_int, weights_: *const c_int, _info: MPI_Info, _reorder: c_int, comm_dist_graph: *mut MPI_Comm) -> Res {
    let mc = intra(comm_old)?;
    let o = out(comm_dist_graph, "comm_dist_graph").map_err(|e| e.on(comm_old))?;
    let on = |e: MpiErr| e.on(comm_old);
    if n < 0 {
        return Err(on(MpiErr::new(MPI_ERR_ARG, format!("n {n} is negative"))));
    }
    let src = ints(sources, n, "sources").map_err(on)?;
    let deg = ints(degrees, n, "degrees").map_err(on)?;
    if deg.iter().any(|&x| x < 0) {
        return Err(on(MpiErr::new(MPI_ERR_ARG, "degrees has a negative entry")));
    }
    let total: c_int = deg.iter().sum();
    let dst = ints(destinations, total, "destinations").map_err(on)?;
    check_ranks(&src, mc.size(), "sources").map_err(on)?;
    check_ranks(&dst, mc.size(), "destinations").map_err(on)?;
    let w = weights(weights_, total, "weights").map_err(on)?;
    let weighted = w.is_some();
    // (source, destination, weight) of every edge given here.
    let mut mine = Vec::with_capacity(3 * total as usize);
    let mut k = 0;
    for (i, &s) in src.iter().enumerate() {
        for _ in 0..deg[i] {
            mine.extend([s as i64 as u64, dst[k] as i64 as u64, w.as_ref().map_or(0, |w| w[k]) as i64 as u64]);
            k += 1;
        }
    }
    let all = crate::words::allgather_any(&mc.comm, &mine).map_err(|e| e.on(mc.handle))?;
    let me = mc.rank() as c_int;
    let (mut s, mut sw, mut d, mut dw) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for e in all.chunks_exact(3) {
        let (a, b, wt) = (e[0] as i64 as c_int, e[1] as i64 as c_int, e[2] as i64 as c_int);
        if b == me {
            s.push(a);
            sw.push(wt);
        }
        if a == me {
            d.push(b);
            dw.push(wt);
        }
    }
    let (sw, dw) = if weighted { (Some(sw), Some(dw)) } else { (None, None) };
    *o = make(&mc, 0, me, || Shape::Dist { sources: s, sweights: sw, dests: d, dweights: dw })?;
    Ok(())
}

fn dist(mc: &MpiComm) -> Result<&Shape, MpiErr> {
    match mc.topo.get().map(|t| &t.shape) {
        Some(s @ Shape::Dist { .. }) => Ok(s),
        _ => Err(MpiErr::new(MPI_ERR_TOPOLOGY, "the communicator has no distributed graph topology").on(mc.handle)),
    }
}

pub unsafe fn dist_graph_neighbors_count(comm: MPI_Comm, indegree: *mut c_int, outdegree: *mut c_int, weighted: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let Shape::Dist { sources, sweights, dests, .. } = dist(&mc)? else { unreachable!("dist() gives a Dist") };
    let on = |e: MpiErr| e.on(comm);
    *out(indegree, "indegree").map_err(on)? = sources.len() as c_int;
    *out(outdegree, "outdegree").map_err(on)? = dests.len() as c_int;
    *out(weighted, "weighted").map_err(on)? = sweights.is_some() as c_int;
    Ok(())
}

#[allow(clippy::too_many_arguments)] // the standard's signature
pub unsafe fn dist_graph_neighbors(comm: MPI_Comm, maxindegree: c_int, sources: *mut c_int, sourceweights: *mut c_int, maxoutdegree: c_int, destinations: *mut c_int, destweights: *mut c_int) -> Res {
    let mc = topo_of(comm)?;
    let Shape::Dist { sources: s, sweights, dests, dweights } = dist(&mc)? else { unreachable!("dist() gives a Dist") };
    let on = |e: MpiErr| e.on(comm);
    put_ints(sources, maxindegree, s, "sources").map_err(on)?;
    put_ints(destinations, maxoutdegree, dests, "destinations").map_err(on)?;
    if let (Some(w), false) = (sweights, sourceweights as usize == MPI_UNWEIGHTED) {
        put_ints(sourceweights, maxindegree, w, "sourceweights").map_err(on)?;
    }
    if let (Some(w), false) = (dweights, destweights as usize == MPI_UNWEIGHTED) {
        put_ints(destweights, maxoutdegree, w, "destweights").map_err(on)?;
    }
    Ok(())
}

/// The neighbourhood of `c` for a neighbourhood collective: its comm of neighbour traffic, the
/// in and the out edges.
pub fn neighborhood(c: MPI_Comm) -> Result<(CommRef, Vec<Edge>, Vec<Edge>), MpiErr> {
    let mc = topo_of(c)?;
    let t = mc.topo.get().expect("topo_of checked");
    let (ins, outs) = t.shape.edges(mc.rank() as c_int);
    Ok((t.neighbors.clone(), ins, outs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_factors_are_closest_and_non_increasing() {
        // From MPICH's topo/baddims.h (ties in 3 and 4 dimensions among them) and small cases.
        let cases = [
            (504, 2, vec![24, 21]),
            (72, 2, vec![9, 8]),
            (960, 2, vec![32, 30]),
            (71400, 3, vec![51, 40, 35]),
            (100320, 3, vec![57, 44, 40]),
            (807840, 3, vec![102, 90, 88]),
            (711900, 4, vec![113, 21, 20, 15]),
            (12, 3, vec![3, 2, 2]),
            (7, 2, vec![7, 1]),
            (1, 3, vec![1, 1, 1]),
            (16, 4, vec![2, 2, 2, 2]),
        ];
        for (n, k, want) in cases {
            assert_eq!(balanced(n, k), want, "{n} in {k} dimensions");
        }
    }

    #[test]
    fn cartesian_edges_pair_the_two_sides_of_a_dimension() {
        // A periodic dimension of 2: both neighbours are the other rank; what rank 0 sends to its
        // +1 side (out tag) is what rank 1 receives from its -1 side (in tag).
        let s = Shape::Cart { dims: vec![2], periods: vec![true] };
        let (ins1, _) = s.edges(1);
        let (_, outs0) = s.edges(0);
        assert_eq!((ins1[0].rank, ins1[0].tag), (0, outs0[1].tag));
        assert_eq!((ins1[1].rank, ins1[1].tag), (0, outs0[0].tag));
        // Off a non-periodic edge: MPI_PROC_NULL.
        let line = Shape::Cart { dims: vec![3], periods: vec![false] };
        assert_eq!(line.edges(0).0[0].rank, MPI_PROC_NULL);
        assert_eq!(line.edges(2).1[1].rank, MPI_PROC_NULL);
    }

    #[test]
    fn graph_edges_between_the_same_ranks_are_told_apart_by_occurrence() {
        let e = by_occurrence(&[3, 1, 3, 3]);
        assert_eq!(e.iter().map(|x| x.tag).collect::<Vec<_>>(), vec![0, 0, 1, 2]);
    }
}
