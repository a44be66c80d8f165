//! Collectives, blocking and non-blocking, on the engine's collectives.
//!
//! Each call is first built: checked, turned into one engine `CollArgs` (buffers it needs of
//! its own are owned by the build) plus an optional step to run after it succeeded (a fold of
//! gathered contributions, a copy into place). The blocking form runs the engine call on the
//! caller's thread; the non-blocking form queues it (`Comm::start_collective`) and the request
//! runs the step when it completes. Reductions the engine lacks (an op or type it does not
//! have, user ops) gather every contribution and fold them here in rank order, so every rank
//! gets the same bytes.

use crate::abi_gen::*;
use crate::colltypes::*;
use crate::datatype::{self, Dt};
use crate::err::{MpiErr, Res};
use crate::op::{self, Local, Plan};
use crate::request::{self, Req};
use crate::state::{CommRef, MpiComm};
use crate::task;
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::DType;
use std::ffi::{c_int, c_void};

pub(crate) type After = Box<dyn FnOnce() + Send>;

/// One collective, ready to run.
pub(crate) struct Built {
    pub(crate) args: CollArgs,
    pub(crate) after: Option<After>,
}

impl Built {
    pub(crate) fn plain(args: CollArgs) -> Built {
        Built { args, after: None }
    }
}

/// A caller's address moved into a later step (the caller keeps the memory valid until the
/// collective completes: MPI's rule for every buffer of a non-blocking call).
#[derive(Clone, Copy)]
struct P(usize);

impl P {
    fn of(p: *const c_void) -> P {
        P(p as usize)
    }
    /// # Safety
    /// The memory is the caller's buffer of `n` bytes, valid and not otherwise used now.
    unsafe fn bytes<'a>(self, n: usize) -> &'a mut [u8] {
        if n == 0 {
            return &mut [];
        }
        unsafe { std::slice::from_raw_parts_mut(self.0 as *mut u8, n) }
    }
}

pub(crate) fn in_place(p: *const c_void) -> bool {
    p as usize == MPI_IN_PLACE
}

pub(crate) fn cb(p: *const c_void, n: usize) -> ConstBuf {
    // SAFETY: the caller's buffer holds `n` bytes (checked non-NULL where n > 0).
    unsafe { ConstBuf::new(p as *const u8, n) }
}

pub(crate) fn mb(p: *mut c_void, n: usize) -> MutBuf {
    // SAFETY: the caller's buffer holds `n` writable bytes.
    unsafe { MutBuf::new(p as *mut u8, n) }
}

pub(crate) fn copy_of(p: *const c_void, n: usize) -> Vec<u8> {
    if n == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's buffer holds `n` bytes.
    unsafe { std::slice::from_raw_parts(p as *const u8, n) }.to_vec()
}

/// Owned memory whose heap block the engine reads or writes; the Vec itself moves into the
/// step that runs after the collective (moving a Vec does not move its heap block).
pub(crate) fn own_mut(v: &mut Vec<u8>) -> MutBuf {
    MutBuf::from_slice(v.as_mut_slice())
}

pub(crate) struct Coll {
    pub(crate) mc: CommRef,
}

impl Coll {
    /// An intracommunicator's (an intercommunicator's engine comm is for point-to-point only,
    /// see inter.rs).
    pub(crate) fn new(c: MPI_Comm) -> Result<Coll, MpiErr> {
        Ok(Coll { mc: crate::state::intra_comm(c, "this collective")? })
    }
    /// `new`, or the intercommunicator behind `c` (looked up once: the small collectives
    /// feel every lookup).
    pub(crate) fn or_inter(c: MPI_Comm) -> Result<Result<Coll, CommRef>, MpiErr> {
        let mc = crate::api::comm(c)?;
        Ok(if mc.inter.get().is_some() { Err(mc) } else { Ok(Coll { mc }) })
    }
    pub(crate) fn err(&self, class: c_int, msg: String) -> MpiErr {
        MpiErr::new(class, msg).on(self.mc.handle)
    }
    fn dt(&self, h: MPI_Datatype) -> Result<Dt, MpiErr> {
        datatype::get(h).map_err(|e| e.on(self.mc.handle))
    }
    fn bytes(&self, d: &Dt, count: i64) -> Result<usize, MpiErr> {
        d.bytes(count).map_err(|e| e.on(self.mc.handle))
    }
    pub(crate) fn buf(&self, p: *const c_void, n: usize, what: &str) -> Res {
        if p.is_null() && n > 0 {
            return Err(self.err(MPI_ERR_BUFFER, format!("{what} is NULL with a non-zero count")));
        }
        Ok(())
    }
    pub(crate) fn root(&self, root: c_int) -> Result<usize, MpiErr> {
        if root < 0 || root as usize >= self.size() {
            return Err(self.err(MPI_ERR_ROOT, format!("root {root} is not a rank of the communicator (size {})", self.size())));
        }
        Ok(root as usize)
    }
    fn plan(&self, o: MPI_Op, d: &Dt) -> Result<Plan, MpiErr> {
        op::plan(o, d).map_err(|e| e.on(self.mc.handle))
    }
    pub(crate) fn size(&self) -> usize {
        self.mc.size()
    }
    pub(crate) fn rank(&self) -> usize {
        self.mc.rank()
    }

    /// Runs `b` now (req None) or starts it and hands out a request.
    pub(crate) fn go(self, b: Built, req: Option<&mut MPI_Request>) -> Res {
        let h = self.mc.handle;
        match req {
            None => {
                self.mc.comm.collective(b.args).map_err(|e| coll_err(e, h))?;
                if let Some(f) = b.after {
                    f();
                }
                Ok(())
            }
            Some(r) => {
                let q = self.mc.comm.start_collective(b.args).map_err(|e| coll_err(e, h))?;
                *r = request::add(Req::Coll { comm: self.mc, req: q, after: b.after, err: None });
                Ok(())
            }
        }
    }
}

/// The engine's error of a collective on `h`. A send buffer that overlaps the receive buffer
/// (not `MPI_IN_PLACE`; the engine refuses it before anything is sent) is the standard's
/// aliasing error, `MPI_ERR_BUFFER` as MPICH answers it. Told by the message, so that the
/// calls that succeed pay for no second check.
fn coll_err(e: distcomm::Error, h: MPI_Comm) -> MpiErr {
    if e.status == distcomm::Status::InvalidArgument && e.msg.ends_with(distcomm::collective::OVERLAP) {
        return MpiErr::new(MPI_ERR_BUFFER, e.msg).on(h);
    }
    MpiErr::from(e).on(h)
}

/// An intercommunicator's blocking collective (`f`, inter.rs's form), run here once the
/// comm's non-blocking ones started before it are done (every member runs them in that order).
pub(crate) fn inter_now(mc: &CommRef, f: impl FnOnce(&CommRef) -> Res) -> Res {
    crate::inter::of(mc)?.union.finish_queued();
    f(mc)
}

/// An intercommunicator's non-blocking collective: `f` (inter.rs's blocking form) queued as a
/// task behind the comm's other non-blocking work, its request handed out in `*r`.
pub(crate) fn inter_start(mc: &CommRef, r: *mut MPI_Request, name: &str, f: impl FnOnce(&MpiComm) -> Res + 'static) -> Res {
    let x = crate::inter::of(mc)?;
    let r = req_out(r, mc.handle)?;
    let me = mc.clone();
    task::start_with_caller_args(r, mc, &x.union, name, move || f(&me))
}

/// A non-blocking collective on `c`: an intracommunicator's `Coll` and request slot, or None
/// once an intercommunicator's (`inter`) has been started.
fn nb_start<'a>(c: MPI_Comm, r: *mut MPI_Request, name: &str, inter: impl FnOnce(&MpiComm) -> Res + 'static) -> Result<Option<(Coll, &'a mut MPI_Request)>, MpiErr> {
    match Coll::or_inter(c)? {
        Ok(k) => Ok(Some((k, req_out(r, c)?))),
        Err(mc) => inter_start(&mc, r, name, inter).map(|_| None),
    }
}

pub(crate) fn req_out<'a>(r: *mut MPI_Request, c: MPI_Comm) -> Result<&'a mut MPI_Request, MpiErr> {
    // SAFETY: a non-NULL request pointer from the caller is writable.
    unsafe { r.as_mut() }.ok_or_else(|| MpiErr::new(MPI_ERR_ARG, "request is NULL").on(c))
}

/// A count array of the caller as i64s (`n` entries; NULL is an error where entries are read).
pub(crate) fn counts<T: Copy + Into<i64>>(p: *const T, n: usize, what: &str) -> Result<Vec<i64>, MpiErr> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    // SAFETY: the caller's array has one entry per rank.
    Ok(unsafe { std::slice::from_raw_parts(p, n) }.iter().map(|&v| v.into()).collect())
}

pub(crate) fn aints(p: *const MPI_Aint, n: usize, what: &str) -> Result<Vec<i64>, MpiErr> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    // SAFETY: as in `counts`.
    Ok(unsafe { std::slice::from_raw_parts(p, n) }.iter().map(|&v| v as i64).collect())
}

/// Counts and displacements in elements of `d` -> bytes; the bytes the buffer must span.
fn to_bytes(k: &Coll, d: &Dt, cs: &[i64], ds: &[i64]) -> Result<(Vec<usize>, Vec<usize>, usize), MpiErr> {
    let mut bc = Vec::with_capacity(cs.len());
    let mut bd = Vec::with_capacity(cs.len());
    let mut span = 0usize;
    for (i, (&c, &dd)) in cs.iter().zip(ds).enumerate() {
        let b = k.bytes(d, c)?;
        if dd < 0 {
            return Err(k.err(MPI_ERR_ARG, format!("displacement {dd} of rank {i} is negative")));
        }
        let off = k.bytes(d, dd)?;
        span = span.max(off + b);
        bc.push(b);
        bd.push(off);
    }
    Ok((bc, bd, span))
}

// ---- barrier, bcast -----------------------------------------------------------------------------

pub unsafe fn barrier(c: MPI_Comm) -> Res {
    match Coll::or_inter(c)? {
        Ok(k) => k.go(Built::plain(CollArgs::Barrier), None),
        Err(mc) => inter_now(&mc, |mc| crate::inter::barrier(mc)),
    }
}

pub unsafe fn ibarrier(c: MPI_Comm, r: *mut MPI_Request) -> Res {
    let Some((k, r)) = nb_start(c, r, "MPI_Ibarrier", crate::inter::barrier)? else { return Ok(()) };
    k.go(Built::plain(CollArgs::Barrier), Some(r))
}

pub(crate) fn build_bcast(k: &Coll, buf: *mut c_void, count: i64, dt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let d = k.dt(dt)?;
    let n = k.bytes(&d, count)?;
    let root = k.root(root)?;
    k.buf(buf, n, "buffer")?;
    Ok(Built::plain(CollArgs::Broadcast { buf: mb(buf, n), dt: DType::Uint8, root }))
}

pub unsafe fn bcast_c(buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, root: c_int, c: MPI_Comm) -> Res {
    let k = match Coll::or_inter(c)? {
        Ok(k) => k,
        Err(mc) => {
            return inter_now(&mc, |mc| crate::inter::bcast(mc, buf, count, dt, root));
        }
    };
    if let Some(r) = direct::bcast(&k, buf, count, dt, root) {
        return r;
    }
    let b = w_bcast(&k, buf, count, dt, root)?;
    k.go(b, None)
}
pub unsafe fn bcast(buf: *mut c_void, count: c_int, dt: MPI_Datatype, root: c_int, c: MPI_Comm) -> Res {
    bcast_c(buf, count as MPI_Count, dt, root, c)
}
pub unsafe fn ibcast_c(buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, root: c_int, c: MPI_Comm, r: *mut MPI_Request) -> Res {
    let Some((k, r)) = nb_start(c, r, "MPI_Ibcast", move |mc| crate::inter::bcast(mc, buf, count, dt, root))? else { return Ok(()) };
    let b = w_bcast(&k, buf, count, dt, root)?;
    k.go(b, Some(r))
}
pub unsafe fn ibcast(buf: *mut c_void, count: c_int, dt: MPI_Datatype, root: c_int, c: MPI_Comm, r: *mut MPI_Request) -> Res {
    ibcast_c(buf, count as MPI_Count, dt, root, c, r)
}

// ---- reductions ------------------------------------------------------------------------------------

/// Every rank's `mine` gathered (at `root`, or everywhere when root is None) for a fold here.
fn gather_all(k: &Coll, mine: Vec<u8>, root: Option<usize>) -> (CollArgs, Vec<u8>, Vec<u8>) {
    let here = root.is_none_or(|r| r == k.rank());
    let mut all = if here { vec![0u8; mine.len() * k.size()] } else { Vec::new() };
    let send = ConstBuf::from_slice(&mine);
    let args = match root {
        Some(root) => CollArgs::Gather { send, recv: here.then(|| own_mut(&mut all)), dt: DType::Uint8, root },
        None => CollArgs::Allgather { send: Some(send), recv: own_mut(&mut all), dt: DType::Uint8 },
    };
    (args, mine, all)
}

pub(crate) fn build_reduce(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op, root: c_int) -> Result<Built, MpiErr> {
    let d = k.dt(dt)?;
    let n = k.bytes(&d, count)?;
    let root = k.root(root)?;
    let plan = k.plan(o, &d)?;
    let is_root = k.rank() == root;
    let inplace = in_place(sbuf);
    if inplace && !is_root {
        return Err(k.err(MPI_ERR_BUFFER, "MPI_IN_PLACE is only allowed at the root".into()));
    }
    if !inplace {
        k.buf(sbuf, n, "sendbuf")?;
    }
    if is_root {
        k.buf(rbuf, n, "recvbuf")?;
    }
    Ok(match plan {
        Plan::Engine(edt, eop) => Built::plain(CollArgs::Reduce {
            send: (!inplace).then(|| cb(sbuf, n)),
            recv: is_root.then(|| mb(rbuf, n)),
            bytes: n,
            dt: edt,
            op: eop,
            root,
        }),
        Plan::Local(l) => {
            let mine = copy_of(if inplace { rbuf } else { sbuf }, n);
            let (args, mine, all) = gather_all(k, mine, Some(root));
            let out = P::of(rbuf);
            let cnt = count as usize;
            Built {
                args,
                after: Some(Box::new(move || {
                    drop(mine);
                    if is_root {
                        op::fold_ranks(&l, cnt, n, &all, unsafe { out.bytes(n) });
                    }
                })),
            }
        }
    })
}

/// Shortcuts of the blocking collectives in their commonest form (dense predefined types, an
/// engine op where one reduces, buffers and root that pass the checks): straight to the engine,
/// without the general path's type routing, plan and built steps, which a 16 B call feels (an
/// allreduce's own cost was 1130 instructions through them, 491 here). None: the general path
/// decides, errors included.
mod direct {
    use super::*;
    use crate::packing::dense_bytes;

    /// The engine's type and op for a reduction of `dt` with `o`.
    fn engine_reduction(dt: MPI_Datatype, count: i64, o: MPI_Op) -> Option<(usize, DType, distcomm::ReduceOp)> {
        let d = datatype::predefined_ref(dt)?;
        Some((d.bytes_if_valid(count)?, d.engine()?, op::engine_arithmetic(o)?))
    }

    fn missing(p: *const c_void, n: usize) -> bool {
        n > 0 && p.is_null()
    }

    fn root_of(k: &Coll, root: c_int) -> Option<usize> {
        (0..k.size() as c_int).contains(&root).then_some(root as usize)
    }

    fn run(k: &Coll, args: CollArgs) -> Option<Res> {
        Some(k.mc.comm.collective(args).map_err(|e| coll_err(e, k.mc.handle)))
    }

    pub(super) fn bcast(k: &Coll, buf: *mut c_void, count: i64, dt: MPI_Datatype, root: c_int) -> Option<Res> {
        let (n, root) = (dense_bytes(dt, count)?, root_of(k, root)?);
        if missing(buf, n) {
            return None;
        }
        run(k, CollArgs::Broadcast { buf: mb(buf, n), dt: DType::Uint8, root })
    }

    pub(super) fn allreduce(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Option<Res> {
        let (n, edt, eop) = engine_reduction(dt, count, o)?;
        let inplace = in_place(sbuf);
        if missing(rbuf, n) || (!inplace && missing(sbuf, n)) {
            return None;
        }
        run(k, CollArgs::Allreduce { send: (!inplace).then(|| cb(sbuf, n)), recv: mb(rbuf, n), dt: edt, op: eop })
    }

    pub(super) fn reduce(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op, root: c_int) -> Option<Res> {
        let (n, edt, eop) = engine_reduction(dt, count, o)?;
        let root = root_of(k, root)?;
        let (is_root, inplace) = (k.rank() == root, in_place(sbuf));
        if (inplace && !is_root) || (!inplace && missing(sbuf, n)) || (is_root && missing(rbuf, n)) {
            return None;
        }
        run(k, CollArgs::Reduce { send: (!inplace).then(|| cb(sbuf, n)), recv: is_root.then(|| mb(rbuf, n)), bytes: n, dt: edt, op: eop, root })
    }

    pub(super) fn reduce_scatter_block(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, rcount: i64, dt: MPI_Datatype, o: MPI_Op) -> Option<Res> {
        let (n, edt, eop) = engine_reduction(dt, rcount, o)?;
        let total = n.checked_mul(k.size())?;
        if in_place(sbuf) || missing(sbuf, total) || missing(rbuf, n) {
            return None;
        }
        run(k, CollArgs::ReduceScatter { send: Some(cb(sbuf, total)), recv: mb(rbuf, n), dt: edt, op: eop })
    }

    /// A block's bytes and the receive buffer's (size x block) where it is dense and, unless the
    /// send is in place, the send block is dense and of the same size.
    fn blocks(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype) -> Option<(usize, usize)> {
        let rb = dense_bytes(rdt, rcount)?;
        let total = rb.checked_mul(k.size())?;
        let send_fits = in_place(sbuf) || dense_bytes(sdt, scount) == Some(rb);
        (send_fits && !missing(rbuf, total)).then_some((rb, total))
    }

    pub(super) fn allgather(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype) -> Option<Res> {
        let (block, total) = blocks(k, sbuf, scount, sdt, rbuf, rcount, rdt)?;
        let inplace = in_place(sbuf);
        if !inplace && missing(sbuf, block) {
            return None;
        }
        run(k, CollArgs::Allgather { send: (!inplace).then(|| cb(sbuf, block)), recv: mb(rbuf, total), dt: DType::Uint8 })
    }

    pub(super) fn alltoall(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype) -> Option<Res> {
        // In place it sends from a copy: the general path.
        if in_place(sbuf) {
            return None;
        }
        let (_, total) = blocks(k, sbuf, scount, sdt, rbuf, rcount, rdt)?;
        if missing(sbuf, total) {
            return None;
        }
        run(k, CollArgs::Alltoall { send: cb(sbuf, total), recv: mb(rbuf, total), dt: DType::Uint8 })
    }

    // No shortcut (yet) for these: the general path.
    pub(super) fn scan(_: &Coll, _: *const c_void, _: *mut c_void, _: i64, _: MPI_Datatype, _: MPI_Op) -> Option<Res> {
        None
    }

    pub(super) fn exscan(_: &Coll, _: *const c_void, _: *mut c_void, _: i64, _: MPI_Datatype, _: MPI_Op) -> Option<Res> {
        None
    }

    /// Not in place, the root's block of the same size as everyone's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gather(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Option<Res> {
        let root = root_of(k, root)?;
        let sb = dense_bytes(sdt, scount)?;
        if in_place(sbuf) || missing(sbuf, sb) {
            return None;
        }
        let recv = if k.rank() == root { Some(mb(rbuf, root_blocks(k, rbuf, rcount, rdt, sb)?)) } else { None };
        run(k, CollArgs::Gather { send: cb(sbuf, sb), recv, dt: DType::Uint8, root })
    }

    /// Not in place, the root's block of the same size as everyone's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scatter(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Option<Res> {
        let root = root_of(k, root)?;
        let rb = dense_bytes(rdt, rcount)?;
        if in_place(rbuf) || missing(rbuf, rb) {
            return None;
        }
        let send = if k.rank() == root { Some(cb(sbuf, root_blocks(k, sbuf, scount, sdt, rb)?)) } else { None };
        run(k, CollArgs::Scatter { send, recv: mb(rbuf, rb), dt: DType::Uint8, root })
    }

    /// The bytes of a root's buffer of one block per rank, where its block is dense and of
    /// `block` bytes, as every other rank's.
    fn root_blocks(k: &Coll, buf: *const c_void, count: i64, dt: MPI_Datatype, block: usize) -> Option<usize> {
        let total = (dense_bytes(dt, count)? == block).then(|| block.checked_mul(k.size()))??;
        (!missing(buf, total)).then_some(total)
    }

    /// A v-collective's counts and displacements in elements of a dense predefined `dt`, as
    /// bytes, and the bytes they span. None where an array is NULL, an entry is negative or
    /// the type is another: the general path decides (and names the error).
    fn v_bytes(counts: *const c_int, displs: *const c_int, n: usize, dt: MPI_Datatype) -> Option<(Vec<usize>, Vec<usize>, usize)> {
        let unit = dense_bytes(dt, 1)?;
        if counts.is_null() || displs.is_null() {
            return None;
        }
        // SAFETY: the caller's arrays have one entry per rank.
        let (cs, ds) = unsafe { (std::slice::from_raw_parts(counts, n), std::slice::from_raw_parts(displs, n)) };
        let (mut bc, mut bd, mut span) = (Vec::with_capacity(n), Vec::with_capacity(n), 0usize);
        for (&c, &d) in cs.iter().zip(ds) {
            let (b, off) = (usize::try_from(c).ok()?.checked_mul(unit)?, usize::try_from(d).ok()?.checked_mul(unit)?);
            span = span.max(off.checked_add(b)?);
            bc.push(b);
            bd.push(off);
        }
        Some((bc, bd, span))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn allgatherv(k: &Coll, sbuf: *const c_void, scount: c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, displs: *const c_int, rdt: MPI_Datatype) -> Option<Res> {
        let (counts, displs, span) = v_bytes(rcounts, displs, k.size(), rdt)?;
        if missing(rbuf, span) {
            return None;
        }
        let send = if in_place(sbuf) {
            None
        } else {
            let sb = dense_bytes(sdt, scount as i64)?;
            if sb != counts[k.rank()] || missing(sbuf, sb) {
                return None;
            }
            Some(cb(sbuf, sb))
        };
        run(k, CollArgs::Allgatherv { send, recv: mb(rbuf, span), counts, displs, dt: DType::Uint8 })
    }

    /// Not in place (that sends from a copy).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn alltoallv(k: &Coll, sbuf: *const c_void, scounts: *const c_int, sdispls: *const c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, rdispls: *const c_int, rdt: MPI_Datatype) -> Option<Res> {
        if in_place(sbuf) {
            return None;
        }
        let (sc, sd, sspan) = v_bytes(scounts, sdispls, k.size(), sdt)?;
        let (rc, rd, rspan) = v_bytes(rcounts, rdispls, k.size(), rdt)?;
        if missing(sbuf, sspan) || missing(rbuf, rspan) {
            return None;
        }
        run(k, CollArgs::Alltoallv { send: cb(sbuf, sspan), scounts: sc, sdispls: sd, recv: mb(rbuf, rspan), rcounts: rc, rdispls: rd, dt: DType::Uint8 })
    }
}

/// A blocking collective: its shortcut (`direct`) where the call is in the commonest form, else
/// the intercommunicator's or the general path. The shortcut is inlined into the export and the
/// other paths are not: a 16 B call feels every frame it passes through.
#[inline(always)]
fn blocking(
    c: MPI_Comm,
    shortcut: impl FnOnce(&Coll) -> Option<Res>,
    inter: impl FnOnce(&CommRef) -> Res,
    build: impl FnOnce(&Coll) -> Result<Built, MpiErr>,
) -> Res {
    let k = match Coll::or_inter(c)? {
        Ok(k) => k,
        Err(mc) => return not_inlined(|| inter_now(&mc, inter)),
    };
    match shortcut(&k) {
        Some(r) => r,
        None => not_inlined(|| {
            let b = build(&k)?;
            k.go(b, None)
        }),
    }
}

/// Runs `f` out of line (keeps a caller's hot path small).
#[inline(never)]
fn not_inlined<T>(f: impl FnOnce() -> T) -> T {
    f()
}

macro_rules! reduction_forms {
    // The blocking forms try `direct::$blocking` first; None takes the general path.
    ($build:ident, $blocking:ident, $blocking_c:ident, $nb:ident, $nb_c:ident, ($($a:ident: $t:ty),*), ($($ac:ident: $tc:ty),*)) => {
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        pub unsafe fn $blocking_c($($ac: $tc,)* c: MPI_Comm) -> Res {
            blocking(c, |k| direct::$blocking(k, $($ac as _),*), |mc| crate::inter::$blocking(mc, $($ac as _),*), |k| $build(k, $($ac as _),*))
        }
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        pub unsafe fn $blocking($($a: $t,)* c: MPI_Comm) -> Res {
            blocking(c, |k| direct::$blocking(k, $($a as _),*), |mc| crate::inter::$blocking(mc, $($a as _),*), |k| $build(k, $($a as _),*))
        }
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $nb_c($($ac: $tc,)* c: MPI_Comm, r: *mut MPI_Request) -> Res {
            let Some((k, r)) = nb_start(c, r, concat!("MPI_", stringify!($nb_c)), move |mc| crate::inter::$blocking(mc, $($ac as _),*))? else { return Ok(()) };
            let b = $build(&k, $($ac as _),*)?;
            k.go(b, Some(r))
        }
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $nb($($a: $t,)* c: MPI_Comm, r: *mut MPI_Request) -> Res {
            let Some((k, r)) = nb_start(c, r, concat!("MPI_", stringify!($nb)), move |mc| crate::inter::$blocking(mc, $($a as _),*))? else { return Ok(()) };
            let b = $build(&k, $($a as _),*)?;
            k.go(b, Some(r))
        }
    };
}

reduction_forms!(w_reduce, reduce, reduce_c, ireduce, ireduce_c,
    (sbuf: *const c_void, rbuf: *mut c_void, count: c_int, dt: MPI_Datatype, o: MPI_Op, root: c_int),
    (sbuf: *const c_void, rbuf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, o: MPI_Op, root: c_int));

pub(crate) fn build_allreduce(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    let d = k.dt(dt)?;
    let n = k.bytes(&d, count)?;
    let plan = k.plan(o, &d)?;
    let inplace = in_place(sbuf);
    if !inplace {
        k.buf(sbuf, n, "sendbuf")?;
    }
    k.buf(rbuf, n, "recvbuf")?;
    Ok(match plan {
        Plan::Engine(edt, eop) => Built::plain(CollArgs::Allreduce { send: (!inplace).then(|| cb(sbuf, n)), recv: mb(rbuf, n), dt: edt, op: eop }),
        Plan::Local(l) => {
            // Everyone gathers everything and folds in the same order: the same bytes everywhere.
            let mine = copy_of(if inplace { rbuf } else { sbuf }, n);
            let (args, mine, all) = gather_all(k, mine, None);
            let out = P::of(rbuf);
            let cnt = count as usize;
            Built {
                args,
                after: Some(Box::new(move || {
                    drop(mine);
                    op::fold_ranks(&l, cnt, n, &all, unsafe { out.bytes(n) });
                })),
            }
        }
    })
}

reduction_forms!(w_allreduce, allreduce, allreduce_c, iallreduce, iallreduce_c,
    (sbuf: *const c_void, rbuf: *mut c_void, count: c_int, dt: MPI_Datatype, o: MPI_Op),
    (sbuf: *const c_void, rbuf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, o: MPI_Op));

/// Scan (inclusive) and Exscan: every contribution gathered, each rank folds ranks 0..=rank
/// (0..rank for Exscan; rank 0's receive buffer is left alone then, as the standard allows).
pub(crate) fn build_scan(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op, exclusive: bool) -> Result<Built, MpiErr> {
    let d = k.dt(dt)?;
    let n = k.bytes(&d, count)?;
    let plan = k.plan(o, &d)?;
    let l = match plan {
        Plan::Local(l) => l,
        Plan::Engine(..) => Local::Predef(o, d),
    };
    let inplace = in_place(sbuf);
    if !inplace {
        k.buf(sbuf, n, "sendbuf")?;
    }
    k.buf(rbuf, n, "recvbuf")?;
    let mine = copy_of(if inplace { rbuf } else { sbuf }, n);
    let (args, mine, all) = gather_all(k, mine, None);
    let (out, cnt, upto) = (P::of(rbuf), count as usize, if exclusive { k.rank() } else { k.rank() + 1 });
    Ok(Built {
        args,
        after: Some(Box::new(move || {
            drop(mine);
            if upto > 0 {
                op::fold_ranks(&l, cnt, n, &all[..upto * n], unsafe { out.bytes(n) });
            }
        })),
    })
}

pub(crate) fn build_inscan(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    build_scan(k, sbuf, rbuf, count, dt, o, false)
}
pub(crate) fn build_exscan(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    build_scan(k, sbuf, rbuf, count, dt, o, true)
}

reduction_forms!(w_inscan, scan, scan_c, iscan, iscan_c,
    (sbuf: *const c_void, rbuf: *mut c_void, count: c_int, dt: MPI_Datatype, o: MPI_Op),
    (sbuf: *const c_void, rbuf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, o: MPI_Op));
reduction_forms!(w_exscan, exscan, exscan_c, iexscan, iexscan_c,
    (sbuf: *const c_void, rbuf: *mut c_void, count: c_int, dt: MPI_Datatype, o: MPI_Op),
    (sbuf: *const c_void, rbuf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, o: MPI_Op));

pub(crate) fn build_reduce_scatter_block(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, rcount: i64, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    let d = k.dt(dt)?;
    let n = k.bytes(&d, rcount)?;
    let plan = k.plan(o, &d)?;
    let total = n * k.size();
    let inplace = in_place(sbuf);
    if !inplace {
        k.buf(sbuf, total, "sendbuf")?;
    }
    k.buf(rbuf, if inplace { total } else { n }, "recvbuf")?;
    let rank = k.rank();
    Ok(match plan {
        Plan::Engine(edt, eop) if inplace => {
            // The engine's in-place form works in the whole buffer (partial sums in the other
            // blocks, the result in block `rank`); MPI leaves all but the first block as it
            // was (as MPICH does): the engine reads a copy and writes the first block only.
            let mine = copy_of(rbuf, total);
            Built {
                args: CollArgs::ReduceScatter { send: Some(ConstBuf::from_slice(&mine)), recv: mb(rbuf, n), dt: edt, op: eop },
                after: Some(Box::new(move || drop(mine))),
            }
        }
        Plan::Engine(edt, eop) => Built::plain(CollArgs::ReduceScatter { send: Some(cb(sbuf, total)), recv: mb(rbuf, n), dt: edt, op: eop }),
        Plan::Local(l) => {
            let mine = copy_of(if inplace { rbuf } else { sbuf }, total);
            let (args, mine, all) = gather_all(k, mine, None);
            let (out, cnt, size) = (P::of(rbuf), rcount as usize, k.size());
            Built {
                args,
                after: Some(Box::new(move || {
                    drop(mine);
                    let blocks: Vec<u8> = (0..size).flat_map(|r| all[r * total + rank * n..r * total + (rank + 1) * n].iter().copied()).collect();
                    op::fold_ranks(&l, cnt, n, &blocks, unsafe { out.bytes(n) });
                })),
            }
        }
    })
}

reduction_forms!(w_reduce_scatter_block, reduce_scatter_block, reduce_scatter_block_c, ireduce_scatter_block, ireduce_scatter_block_c,
    (sbuf: *const c_void, rbuf: *mut c_void, rcount: c_int, dt: MPI_Datatype, o: MPI_Op),
    (sbuf: *const c_void, rbuf: *mut c_void, rcount: MPI_Count, dt: MPI_Datatype, o: MPI_Op));

/// Reduce_scatter with per-rank counts: an allreduce of the whole vector into a buffer of our
/// own, then this rank's block copied out (one engine call, so it is non-blocking too).
pub(crate) fn build_reduce_scatter(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, rcounts: Vec<i64>, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    let d = k.dt(dt)?;
    let (rank, size) = (k.rank(), k.size());
    let mut offs = Vec::with_capacity(size + 1);
    offs.push(0usize);
    for &c in &rcounts {
        let b = k.bytes(&d, c)?;
        offs.push(offs.last().unwrap() + b);
    }
    let total = offs[size];
    let elems: i64 = rcounts.iter().sum();
    let inplace = in_place(sbuf);
    let src = if inplace { rbuf as *const c_void } else { sbuf };
    k.buf(src, total, if inplace { "recvbuf" } else { "sendbuf" })?;
    let mine_n = offs[rank + 1] - offs[rank];
    k.buf(rbuf, mine_n, "recvbuf")?;
    let mut whole = copy_of(src, total);
    let sub = build_allreduce(k, MPI_IN_PLACE as *const c_void, whole.as_mut_ptr() as *mut c_void, elems, dt, o)?;
    let (out, off) = (P::of(rbuf), offs[rank]);
    let inner = sub.after;
    Ok(Built {
        args: sub.args,
        after: Some(Box::new(move || {
            if let Some(f) = inner {
                f();
            }
            unsafe { out.bytes(mine_n) }.copy_from_slice(&whole[off..off + mine_n]);
        })),
    })
}

/// Reduce_scatter's entry points: the counts (one per rank) are read, then the call runs or starts.
macro_rules! reduce_scatter_forms {
    ($blocking:ident, $nb:ident, $ct:ty) => {
        pub unsafe fn $blocking(sbuf: *const c_void, rbuf: *mut c_void, rcounts: *const $ct, dt: MPI_Datatype, o: MPI_Op, c: MPI_Comm) -> Res {
            let k = match Coll::or_inter(c)? {
                Ok(k) => k,
                Err(mc) => return inter_now(&mc, |mc| crate::inter::reduce_scatter(mc, sbuf, rbuf, rcounts, dt, o)),
            };
            let rc = counts(rcounts, k.size(), "recvcounts").map_err(|e| e.on(c))?;
            let b = w_reduce_scatter(&k, sbuf, rbuf, rc, dt, o)?;
            k.go(b, None)
        }
        pub unsafe fn $nb(sbuf: *const c_void, rbuf: *mut c_void, rcounts: *const $ct, dt: MPI_Datatype, o: MPI_Op, c: MPI_Comm, r: *mut MPI_Request) -> Res {
            let inter = move |mc: &MpiComm| crate::inter::reduce_scatter(mc, sbuf, rbuf, rcounts, dt, o);
            let Some((k, r)) = nb_start(c, r, concat!("MPI_", stringify!($nb)), inter)? else { return Ok(()) };
            let rc = counts(rcounts, k.size(), "recvcounts").map_err(|e| e.on(c))?;
            let b = w_reduce_scatter(&k, sbuf, rbuf, rc, dt, o)?;
            k.go(b, Some(r))
        }
    };
}
reduce_scatter_forms!(reduce_scatter, ireduce_scatter, c_int);
reduce_scatter_forms!(reduce_scatter_c, ireduce_scatter_c, MPI_Count);

/// MPI_Reduce_local: inoutbuf = inbuf op inoutbuf, here.
pub(crate) fn reduce_local_any(inbuf: *const c_void, inout: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Res {
    let d = datatype::get(dt)?;
    let n = d.bytes(count)?;
    let l = match op::plan(o, &d)? {
        Plan::Local(l) => l,
        Plan::Engine(..) => Local::Predef(o, d),
    };
    if (inbuf.is_null() || inout.is_null()) && n > 0 {
        return crate::mpi_err!(MPI_ERR_BUFFER, "inbuf or inoutbuf is NULL with a non-zero count");
    }
    let a = copy_of(inbuf, n);
    op::apply(&l, count as usize, &a, unsafe { P::of(inout).bytes(n) });
    Ok(())
}

pub unsafe fn reduce_local(inbuf: *const c_void, inout: *mut c_void, count: c_int, dt: MPI_Datatype, o: MPI_Op) -> Res {
    w_reduce_local(inbuf, inout, count as i64, dt, o)
}
pub unsafe fn reduce_local_c(inbuf: *const c_void, inout: *mut c_void, count: MPI_Count, dt: MPI_Datatype, o: MPI_Op) -> Res {
    w_reduce_local(inbuf, inout, count, dt, o)
}

// ---- gather, scatter, allgather, alltoall --------------------------------------------------------

/// The byte size of one rank's block as the sender and the receiver describe it; they must
/// agree (MPI requires matching type signatures; this library moves bytes).
fn block(k: &Coll, scount: i64, sdt: MPI_Datatype, rcount: i64, rdt: MPI_Datatype, send_used: bool, recv_used: bool) -> Result<(usize, usize), MpiErr> {
    let sb = if send_used { k.bytes(&k.dt(sdt)?, scount)? } else { 0 };
    let rb = if recv_used { k.bytes(&k.dt(rdt)?, rcount)? } else { 0 };
    if send_used && recv_used && sb != rb {
        let class = if rb < sb { MPI_ERR_TRUNCATE } else { MPI_ERR_ARG };
        return Err(k.err(class, format!("send block of {sb} bytes but receive block of {rb} bytes")));
    }
    Ok((sb, rb))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_gather(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let root = k.root(root)?;
    let is_root = k.rank() == root;
    let inplace = in_place(sbuf);
    if inplace && !is_root {
        return Err(k.err(MPI_ERR_BUFFER, "MPI_IN_PLACE is only allowed at the root".into()));
    }
    let (sb, rb) = block(k, scount, sdt, rcount, rdt, !inplace, is_root)?;
    let bsz = if is_root { rb } else { sb };
    let total = bsz * k.size();
    if !inplace {
        k.buf(sbuf, sb, "sendbuf")?;
    }
    if is_root {
        k.buf(rbuf, total, "recvbuf")?;
    }
    if inplace {
        // The root's block is already where it belongs; the engine sends a copy of it.
        let own = copy_of(unsafe { (rbuf as *const u8).add(root * bsz) } as *const c_void, bsz);
        let args = CollArgs::Gather { send: ConstBuf::from_slice(&own), recv: Some(mb(rbuf, total)), dt: DType::Uint8, root };
        return Ok(Built { args, after: Some(Box::new(move || drop(own))) });
    }
    Ok(Built::plain(CollArgs::Gather { send: cb(sbuf, sb), recv: is_root.then(|| mb(rbuf, total)), dt: DType::Uint8, root }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_scatter(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let root = k.root(root)?;
    let is_root = k.rank() == root;
    let inplace = in_place(rbuf);
    if inplace && !is_root {
        return Err(k.err(MPI_ERR_BUFFER, "MPI_IN_PLACE is only allowed at the root".into()));
    }
    let (sb, rb) = block(k, scount, sdt, rcount, rdt, is_root, !inplace)?;
    let bsz = if is_root { sb } else { rb };
    let total = bsz * k.size();
    if is_root {
        k.buf(sbuf, total, "sendbuf")?;
    }
    let send = is_root.then(|| cb(sbuf, total));
    if inplace {
        // The root keeps its block where it is; the engine writes its copy aside.
        let mut scratch = vec![0u8; bsz];
        let args = CollArgs::Scatter { send, recv: own_mut(&mut scratch), dt: DType::Uint8, root };
        return Ok(Built { args, after: Some(Box::new(move || drop(scratch))) });
    }
    k.buf(rbuf, rb, "recvbuf")?;
    Ok(Built::plain(CollArgs::Scatter { send, recv: mb(rbuf, rb), dt: DType::Uint8, root }))
}

pub(crate) fn build_allgather(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype) -> Result<Built, MpiErr> {
    let inplace = in_place(sbuf);
    let (sb, rb) = block(k, scount, sdt, rcount, rdt, !inplace, true)?;
    let total = rb * k.size();
    if !inplace {
        k.buf(sbuf, sb, "sendbuf")?;
    }
    k.buf(rbuf, total, "recvbuf")?;
    Ok(Built::plain(CollArgs::Allgather { send: (!inplace).then(|| cb(sbuf, sb)), recv: mb(rbuf, total), dt: DType::Uint8 }))
}

pub(crate) fn build_alltoall(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype) -> Result<Built, MpiErr> {
    let inplace = in_place(sbuf);
    let (_, rb) = block(k, scount, sdt, rcount, rdt, !inplace, true)?;
    let total = rb * k.size();
    if !inplace {
        k.buf(sbuf, total, "sendbuf")?;
    }
    k.buf(rbuf, total, "recvbuf")?;
    if inplace {
        // The receive buffer is also what is sent; the engine sends from a copy.
        let copy = copy_of(rbuf, total);
        let args = CollArgs::Alltoall { send: ConstBuf::from_slice(&copy), recv: mb(rbuf, total), dt: DType::Uint8 };
        return Ok(Built { args, after: Some(Box::new(move || drop(copy))) });
    }
    Ok(Built::plain(CollArgs::Alltoall { send: cb(sbuf, total), recv: mb(rbuf, total), dt: DType::Uint8 }))
}

macro_rules! move_forms {
    ($build:ident, $blocking:ident, $blocking_c:ident, $nb:ident, $nb_c:ident, ($($a:ident),*), ($($post:ident: $qt:ty),*)) => {
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        pub unsafe fn $blocking_c(sbuf: *const c_void, scount: MPI_Count, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: MPI_Count, rdt: MPI_Datatype, $($post: $qt,)* c: MPI_Comm) -> Res {
            blocking(c, |k| direct::$blocking(k, sbuf, scount, sdt, rbuf, rcount, rdt $(, $a)*),
                |mc| crate::inter::$blocking(mc, sbuf, scount, sdt, rbuf, rcount, rdt $(, $post)*),
                |k| $build(k, sbuf, scount, sdt, rbuf, rcount, rdt $(, $a)*))
        }
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        pub unsafe fn $blocking(sbuf: *const c_void, scount: c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rdt: MPI_Datatype, $($post: $qt,)* c: MPI_Comm) -> Res {
            let (scount, rcount) = (scount as i64, rcount as i64);
            blocking(c, |k| direct::$blocking(k, sbuf, scount, sdt, rbuf, rcount, rdt $(, $a)*),
                |mc| crate::inter::$blocking(mc, sbuf, scount, sdt, rbuf, rcount, rdt $(, $post)*),
                |k| $build(k, sbuf, scount, sdt, rbuf, rcount, rdt $(, $a)*))
        }
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $nb_c(sbuf: *const c_void, scount: MPI_Count, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: MPI_Count, rdt: MPI_Datatype, $($post: $qt,)* c: MPI_Comm, r: *mut MPI_Request) -> Res {
            let inter = move |mc: &MpiComm| crate::inter::$blocking(mc, sbuf, scount, sdt, rbuf, rcount, rdt $(, $post)*);
            let Some((k, r)) = nb_start(c, r, concat!("MPI_", stringify!($nb_c)), inter)? else { return Ok(()) };
            let b = $build(&k, sbuf, scount, sdt, rbuf, rcount, rdt $(, $a)*)?;
            k.go(b, Some(r))
        }
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $nb(sbuf: *const c_void, scount: c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rdt: MPI_Datatype, $($post: $qt,)* c: MPI_Comm, r: *mut MPI_Request) -> Res {
            let inter = move |mc: &MpiComm| crate::inter::$blocking(mc, sbuf, scount as i64, sdt, rbuf, rcount as i64, rdt $(, $post)*);
            let Some((k, r)) = nb_start(c, r, concat!("MPI_", stringify!($nb)), inter)? else { return Ok(()) };
            let b = $build(&k, sbuf, scount as i64, sdt, rbuf, rcount as i64, rdt $(, $a)*)?;
            k.go(b, Some(r))
        }
    };
}

move_forms!(w_gather, gather, gather_c, igather, igather_c, (root), (root: c_int));
move_forms!(w_scatter, scatter, scatter_c, iscatter, iscatter_c, (root), (root: c_int));
move_forms!(w_allgather, allgather, allgather_c, iallgather, iallgather_c, (), ());
move_forms!(w_alltoall, alltoall, alltoall_c, ialltoall, ialltoall_c, (), ());

// ---- v-forms ---------------------------------------------------------------------------------------

/// Gatherv and Scatterv as the engine's alltoallv in which only the root's row (scatter) or
/// column (gather) has bytes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_gatherv(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: &[i64], displs: &[i64], rdt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let root = k.root(root)?;
    let (rank, size) = (k.rank(), k.size());
    let is_root = rank == root;
    let inplace = in_place(sbuf);
    if inplace && !is_root {
        return Err(k.err(MPI_ERR_BUFFER, "MPI_IN_PLACE is only allowed at the root".into()));
    }
    let sb = if inplace { 0 } else { k.bytes(&k.dt(sdt)?, scount)? };
    if !inplace {
        k.buf(sbuf, sb, "sendbuf")?;
    }
    let mut scounts = vec![0usize; size];
    scounts[root] = sb;
    let (mut rc, mut rd, mut span) = (vec![0usize; size], vec![0usize; size], 0);
    if is_root {
        let d = k.dt(rdt)?;
        (rc, rd, span) = to_bytes(k, &d, rcounts, displs)?;
        if !inplace && rc[root] != sb {
            return Err(k.err(if rc[root] < sb { MPI_ERR_TRUNCATE } else { MPI_ERR_ARG }, format!("root sends {sb} bytes to itself but receives {}", rc[root])));
        }
        if inplace {
            rc[root] = 0;
        }
        k.buf(rbuf, span, "recvbuf")?;
    }
    Ok(Built::plain(CollArgs::Alltoallv { send: cb(sbuf, sb), scounts, sdispls: vec![0; size], recv: mb(rbuf, span), rcounts: rc, rdispls: rd, dt: DType::Uint8 }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_scatterv(k: &Coll, sbuf: *const c_void, scounts: &[i64], displs: &[i64], sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let root = k.root(root)?;
    let (rank, size) = (k.rank(), k.size());
    let is_root = rank == root;
    let inplace = in_place(rbuf);
    if inplace && !is_root {
        return Err(k.err(MPI_ERR_BUFFER, "MPI_IN_PLACE is only allowed at the root".into()));
    }
    let rb = if inplace { 0 } else { k.bytes(&k.dt(rdt)?, rcount)? };
    if !inplace {
        k.buf(rbuf, rb, "recvbuf")?;
    }
    let mut rcounts = vec![0usize; size];
    rcounts[root] = rb;
    let (mut sc, mut sd, mut span) = (vec![0usize; size], vec![0usize; size], 0);
    if is_root {
        let d = k.dt(sdt)?;
        (sc, sd, span) = to_bytes(k, &d, scounts, displs)?;
        if !inplace && sc[root] != rb {
            return Err(k.err(if rb < sc[root] { MPI_ERR_TRUNCATE } else { MPI_ERR_ARG }, format!("root sends {} bytes to itself but receives {rb}", sc[root])));
        }
        if inplace {
            sc[root] = 0;
        }
        k.buf(sbuf, span, "sendbuf")?;
    }
    Ok(Built::plain(CollArgs::Alltoallv { send: cb(sbuf, span), scounts: sc, sdispls: sd, recv: mb(rbuf, rb), rcounts, rdispls: vec![0; size], dt: DType::Uint8 }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_allgatherv(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: &[i64], displs: &[i64], rdt: MPI_Datatype) -> Result<Built, MpiErr> {
    let inplace = in_place(sbuf);
    let d = k.dt(rdt)?;
    let (rc, rd, span) = to_bytes(k, &d, rcounts, displs)?;
    k.buf(rbuf, span, "recvbuf")?;
    let send = if inplace {
        None
    } else {
        let sb = k.bytes(&k.dt(sdt)?, scount)?;
        k.buf(sbuf, sb, "sendbuf")?;
        if sb != rc[k.rank()] {
            return Err(k.err(MPI_ERR_ARG, format!("sends {sb} bytes but recvcounts[{}] says {}", k.rank(), rc[k.rank()])));
        }
        Some(cb(sbuf, sb))
    };
    Ok(Built::plain(CollArgs::Allgatherv { send, recv: mb(rbuf, span), counts: rc, displs: rd, dt: DType::Uint8 }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_alltoallv(k: &Coll, sbuf: *const c_void, scounts: &[i64], sdispls: &[i64], sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: &[i64], rdispls: &[i64], rdt: MPI_Datatype) -> Result<Built, MpiErr> {
    let inplace = in_place(sbuf);
    let d = k.dt(rdt)?;
    let (rc, rd, rspan) = to_bytes(k, &d, rcounts, rdispls)?;
    k.buf(rbuf, rspan, "recvbuf")?;
    if inplace {
        // Send what the receive buffer holds, with the receive layout; from a copy.
        let copy = copy_of(rbuf, rspan);
        let args = CollArgs::Alltoallv { send: ConstBuf::from_slice(&copy), scounts: rc.clone(), sdispls: rd.clone(), recv: mb(rbuf, rspan), rcounts: rc, rdispls: rd, dt: DType::Uint8 };
        return Ok(Built { args, after: Some(Box::new(move || drop(copy))) });
    }
    let sd = k.dt(sdt)?;
    let (sc, sdd, sspan) = to_bytes(k, &sd, scounts, sdispls)?;
    k.buf(sbuf, sspan, "sendbuf")?;
    Ok(Built::plain(CollArgs::Alltoallv { send: cb(sbuf, sspan), scounts: sc, sdispls: sdd, recv: mb(rbuf, rspan), rcounts: rc, rdispls: rd, dt: DType::Uint8 }))
}

/// A v-collective's entry point: the arrays are read (`$body` builds), then run or started.
macro_rules! v_entry {
    // A blocking form with a shortcut (`direct::$name`) tried first, as `blocking` does.
    ($name:ident, direct, ($($p:ident: $t:ty),*), |$k:ident| $body:block) => {
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name($($p: $t,)* c: MPI_Comm) -> Res {
            blocking(c, |k| direct::$name(k, $($p),*), |mc| crate::inter::$name(mc, $($p),*), |$k| {
                (|| -> Result<Built, MpiErr> { $body })().map_err(|e| e.on(c))
            })
        }
    };
    ($name:ident, ($($p:ident: $t:ty),*), |$k:ident| $body:block) => {
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name($($p: $t,)* c: MPI_Comm) -> Res {
            // An intercommunicator's blocking v-forms: see inter.rs.
            let $k = match Coll::or_inter(c)? {
                Ok(k) => k,
                Err(mc) => {
                    return inter_now(&mc, |mc| crate::inter::$name(mc, $($p),*));
                }
            };
            let b = (|| -> Result<Built, MpiErr> { $body })().map_err(|e| e.on(c))?;
            $k.go(b, None)
        }
    };
    // The non-blocking form; `$inter` names the blocking one an intercommunicator's task runs.
    ($name:ident => $inter:ident, ($($p:ident: $t:ty),*), request, |$k:ident| $body:block) => {
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name($($p: $t,)* c: MPI_Comm, r: *mut MPI_Request) -> Res {
            let inter = move |mc: &MpiComm| crate::inter::$inter(mc, $($p),*);
            let Some(($k, r)) = nb_start(c, r, concat!("MPI_", stringify!($name)), inter)? else { return Ok(()) };
            let b = (|| -> Result<Built, MpiErr> { $body })().map_err(|e| e.on(c))?;
            $k.go(b, Some(r))
        }
    };
}

fn is_root(k: &Coll, root: c_int) -> bool {
    root >= 0 && k.rank() == root as usize
}

v_entry!(gatherv, (sbuf: *const c_void, scount: c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, displs: *const c_int, rdt: MPI_Datatype, root: c_int), |k| {
    let n = if is_root(&k, root) { k.size() } else { 0 };
    w_gatherv(&k, sbuf, scount as i64, sdt, rbuf, &counts(rcounts, n, "recvcounts")?, &counts(displs, n, "displs")?, rdt, root)
});
v_entry!(gatherv_c, (sbuf: *const c_void, scount: MPI_Count, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const MPI_Count, displs: *const MPI_Aint, rdt: MPI_Datatype, root: c_int), |k| {
    let n = if is_root(&k, root) { k.size() } else { 0 };
    w_gatherv(&k, sbuf, scount, sdt, rbuf, &counts(rcounts, n, "recvcounts")?, &aints(displs, n, "displs")?, rdt, root)
});
v_entry!(igatherv => gatherv, (sbuf: *const c_void, scount: c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, displs: *const c_int, rdt: MPI_Datatype, root: c_int), request, |k| {
    let n = if is_root(&k, root) { k.size() } else { 0 };
    w_gatherv(&k, sbuf, scount as i64, sdt, rbuf, &counts(rcounts, n, "recvcounts")?, &counts(displs, n, "displs")?, rdt, root)
});
v_entry!(igatherv_c => gatherv_c, (sbuf: *const c_void, scount: MPI_Count, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const MPI_Count, displs: *const MPI_Aint, rdt: MPI_Datatype, root: c_int), request, |k| {
    let n = if is_root(&k, root) { k.size() } else { 0 };
    w_gatherv(&k, sbuf, scount, sdt, rbuf, &counts(rcounts, n, "recvcounts")?, &aints(displs, n, "displs")?, rdt, root)
});
v_entry!(scatterv, (sbuf: *const c_void, scounts: *const c_int, displs: *const c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rdt: MPI_Datatype, root: c_int), |k| {
    let n = if is_root(&k, root) { k.size() } else { 0 };
    w_scatterv(&k, sbuf, &counts(scounts, n, "sendcounts")?, &counts(displs, n, "displs")?, sdt, rbuf, rcount as i64, rdt, root)
});
v_entry!(scatterv_c, (sbuf: *const c_void, scounts: *const MPI_Count, displs: *const MPI_Aint, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: MPI_Count, rdt: MPI_Datatype, root: c_int), |k| {
    let n = if is_root(&k, root) { k.size() } else { 0 };
    w_scatterv(&k, sbuf, &counts(scounts, n, "sendcounts")?, &aints(displs, n, "displs")?, sdt, rbuf, rcount, rdt, root)
});
v_entry!(iscatterv => scatterv, (sbuf: *const c_void, scounts: *const c_int, displs: *const c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: c_int, rdt: MPI_Datatype, root: c_int), request, |k| {
    let n = if is_root(&k, root) { k.size() } else { 0 };
    w_scatterv(&k, sbuf, &counts(scounts, n, "sendcounts")?, &counts(displs, n, "displs")?, sdt, rbuf, rcount as i64, rdt, root)
});
v_entry!(iscatterv_c => scatterv_c, (sbuf: *const c_void, scounts: *const MPI_Count, displs: *const MPI_Aint, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: MPI_Count, rdt: MPI_Datatype, root: c_int), request, |k| {
    let n = if is_root(&k, root) { k.size() } else { 0 };
    w_scatterv(&k, sbuf, &counts(scounts, n, "sendcounts")?, &aints(displs, n, "displs")?, sdt, rbuf, rcount, rdt, root)
});
v_entry!(allgatherv, direct, (sbuf: *const c_void, scount: c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, displs: *const c_int, rdt: MPI_Datatype), |k| {
    w_allgatherv(&k, sbuf, scount as i64, sdt, rbuf, &counts(rcounts, k.size(), "recvcounts")?, &counts(displs, k.size(), "displs")?, rdt)
});
v_entry!(allgatherv_c, (sbuf: *const c_void, scount: MPI_Count, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const MPI_Count, displs: *const MPI_Aint, rdt: MPI_Datatype), |k| {
    w_allgatherv(&k, sbuf, scount, sdt, rbuf, &counts(rcounts, k.size(), "recvcounts")?, &aints(displs, k.size(), "displs")?, rdt)
});
v_entry!(iallgatherv => allgatherv, (sbuf: *const c_void, scount: c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, displs: *const c_int, rdt: MPI_Datatype), request, |k| {
    w_allgatherv(&k, sbuf, scount as i64, sdt, rbuf, &counts(rcounts, k.size(), "recvcounts")?, &counts(displs, k.size(), "displs")?, rdt)
});
v_entry!(iallgatherv_c => allgatherv_c, (sbuf: *const c_void, scount: MPI_Count, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const MPI_Count, displs: *const MPI_Aint, rdt: MPI_Datatype), request, |k| {
    w_allgatherv(&k, sbuf, scount, sdt, rbuf, &counts(rcounts, k.size(), "recvcounts")?, &aints(displs, k.size(), "displs")?, rdt)
});
v_entry!(alltoallv, direct, (sbuf: *const c_void, scounts: *const c_int, sdispls: *const c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, rdispls: *const c_int, rdt: MPI_Datatype), |k| {
    let (n, ip) = (k.size(), in_place(sbuf));
    let (sc, sd) = if ip { (Vec::new(), Vec::new()) } else { (counts(scounts, n, "sendcounts")?, counts(sdispls, n, "sdispls")?) };
    w_alltoallv(&k, sbuf, &sc, &sd, sdt, rbuf, &counts(rcounts, n, "recvcounts")?, &counts(rdispls, n, "rdispls")?, rdt)
});
v_entry!(alltoallv_c, (sbuf: *const c_void, scounts: *const MPI_Count, sdispls: *const MPI_Aint, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const MPI_Count, rdispls: *const MPI_Aint, rdt: MPI_Datatype), |k| {
    let (n, ip) = (k.size(), in_place(sbuf));
    let (sc, sd) = if ip { (Vec::new(), Vec::new()) } else { (counts(scounts, n, "sendcounts")?, aints(sdispls, n, "sdispls")?) };
    w_alltoallv(&k, sbuf, &sc, &sd, sdt, rbuf, &counts(rcounts, n, "recvcounts")?, &aints(rdispls, n, "rdispls")?, rdt)
});
v_entry!(ialltoallv => alltoallv, (sbuf: *const c_void, scounts: *const c_int, sdispls: *const c_int, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const c_int, rdispls: *const c_int, rdt: MPI_Datatype), request, |k| {
    let (n, ip) = (k.size(), in_place(sbuf));
    let (sc, sd) = if ip { (Vec::new(), Vec::new()) } else { (counts(scounts, n, "sendcounts")?, counts(sdispls, n, "sdispls")?) };
    w_alltoallv(&k, sbuf, &sc, &sd, sdt, rbuf, &counts(rcounts, n, "recvcounts")?, &counts(rdispls, n, "rdispls")?, rdt)
});
v_entry!(ialltoallv_c => alltoallv_c, (sbuf: *const c_void, scounts: *const MPI_Count, sdispls: *const MPI_Aint, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const MPI_Count, rdispls: *const MPI_Aint, rdt: MPI_Datatype), request, |k| {
    let (n, ip) = (k.size(), in_place(sbuf));
    let (sc, sd) = if ip { (Vec::new(), Vec::new()) } else { (counts(scounts, n, "sendcounts")?, aints(sdispls, n, "sdispls")?) };
    w_alltoallv(&k, sbuf, &sc, &sd, sdt, rbuf, &counts(rcounts, n, "recvcounts")?, &aints(rdispls, n, "rdispls")?, rdt)
});
