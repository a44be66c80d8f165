//! Collectives on any datatype. Dense types go to the collectives of colls.rs as they are;
//! the others are packed into buffers of ours first and run there as MPI_BYTE, and what a
//! rank receives is unpacked into the caller's memory when the collective completes.
//! Reductions on a non-dense type whose basic elements are all one predefined type run on an
//! array of that type (packed from the caller's memory) and are unpacked back the same way.
//! MPI_Alltoallw (per-peer datatypes, byte displacements) lives here too.

use crate::abi_gen::*;
use crate::colls::*;
use crate::datatype::{self, Type};
use crate::err::{MpiErr, Res};
use crate::op;
use distcomm::buffer::ConstBuf;
use distcomm::collective::CollArgs;
use distcomm::DType;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

fn ty(k: &Coll, h: MPI_Datatype) -> Result<Arc<Type>, MpiErr> {
    datatype::resolve(h).map_err(|e| e.on(k.mc.handle))
}

/// The type behind `h` where it has gaps (it must be packed around the engine), None where it
/// is dense: a dense predefined type is answered without a lookup.
fn sparse_ty(k: &Coll, h: MPI_Datatype) -> Result<Option<Arc<Type>>, MpiErr> {
    if datatype::predefined(h).is_some_and(|d| d.dense) {
        return Ok(None);
    }
    let t = ty(k, h)?;
    Ok((!t.map.dense()).then_some(t))
}

fn dense(t: &Option<Arc<Type>>) -> bool {
    t.as_ref().is_none_or(|t| t.map.dense())
}

fn on(k: &Coll) -> impl Fn(MpiErr) -> MpiErr + '_ {
    move |e| e.on(k.mc.handle)
}

fn len(k: &Coll, t: &Type, count: i64) -> Result<usize, MpiErr> {
    crate::packing::packed_len(t, count).map_err(on(k))
}

fn times(k: &Coll, a: i64, b: usize) -> Result<i64, MpiErr> {
    a.checked_mul(b as i64).ok_or_else(|| k.err(MPI_ERR_COUNT, format!("count {a} times {b} overflows")))
}

/// `count` elements of `t` at `p`, packed.
fn pack(k: &Coll, t: &Type, p: *const c_void, count: i64, what: &str) -> Result<Vec<u8>, MpiErr> {
    let n = len(k, t, count)?;
    crate::packing::check_typed_buf(p, t, n, what).map_err(on(k))?;
    let mut v = vec![0u8; n];
    // SAFETY: the caller's buffer holds `count` elements of the type.
    unsafe { t.map.pack(p as *const u8, count as u64, &mut v) };
    Ok(v)
}

/// A step that unpacks `data` into `count` elements of `t` at `addr`.
fn unpacker(t: Arc<Type>, addr: usize, count: i64) -> impl FnOnce(&[u8]) + Send {
    // SAFETY: the caller's receive buffer holds `count` elements until the collective completes.
    move |data| unsafe { t.map.unpack(data, addr as *mut u8, count as u64) }
}

/// `b`, then `f` once it succeeded.
fn then(b: Built, f: impl FnOnce() + Send + 'static) -> Built {
    let inner = b.after;
    Built {
        args: b.args,
        after: Some(Box::new(move || {
            if let Some(g) = inner {
                g();
            }
            f();
        })),
    }
}

fn ptr(v: &[u8]) -> *const c_void {
    v.as_ptr() as *const c_void
}
fn ptr_mut(v: &mut [u8]) -> *mut c_void {
    v.as_mut_ptr() as *mut c_void
}

// ---- bcast, gather, scatter, allgather, alltoall --------------------------------------------------

pub(crate) fn w_bcast(k: &Coll, buf: *mut c_void, count: i64, dt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let Some(t) = sparse_ty(k, dt)? else {
        return build_bcast(k, buf, count, dt, root);
    };
    let is_root = k.rank() == k.root(root)?;
    let mut data = if is_root { pack(k, &t, buf, count, "buffer")? } else { vec![0u8; len(k, &t, count)?] };
    crate::packing::check_typed_buf(buf, &t, data.len(), "buffer").map_err(on(k))?;
    let inner = build_bcast(k, ptr_mut(&mut data), data.len() as i64, MPI_BYTE, root)?;
    let un = unpacker(t, buf as usize, count);
    Ok(then(inner, move || {
        if !is_root {
            un(&data)
        }
    }))
}

/// The send side of a gather-like call: packed (or in place).
fn send_side(k: &Coll, used: bool, sbuf: *const c_void, scount: i64, st: &Option<Arc<Type>>) -> Result<Vec<u8>, MpiErr> {
    match st {
        Some(t) if used => pack(k, t, sbuf, scount, "sendbuf"),
        _ => Ok(Vec::new()),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn w_gather(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let is_root = k.rank() == k.root(root)?;
    let inplace = in_place(sbuf);
    let st = if inplace { None } else { Some(ty(k, sdt)?) };
    let rt = if is_root { Some(ty(k, rdt)?) } else { None };
    if dense(&st) && dense(&rt) {
        return build_gather(k, sbuf, scount, sdt, rbuf, rcount, rdt, root);
    }
    let sdata = send_side(k, !inplace, sbuf, scount, &st)?;
    let (mut rdata, mut rc, mut un) = (Vec::new(), 0, None);
    if let Some(t) = rt {
        let all = times(k, rcount, k.size())?;
        rdata = if inplace { pack(k, &t, rbuf, all, "recvbuf")? } else { vec![0u8; len(k, &t, all)?] };
        crate::packing::check_typed_buf(rbuf, &t, rdata.len(), "recvbuf").map_err(on(k))?;
        rc = len(k, &t, rcount)? as i64;
        un = Some(unpacker(t, rbuf as usize, all));
    }
    let sp = if inplace { sbuf } else { ptr(&sdata) };
    let inner = build_gather(k, sp, sdata.len() as i64, MPI_BYTE, ptr_mut(&mut rdata), rc, MPI_BYTE, root)?;
    Ok(then(inner, move || {
        drop(sdata);
        if let Some(u) = un {
            u(&rdata)
        }
    }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn w_scatter(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let is_root = k.rank() == k.root(root)?;
    let inplace = in_place(rbuf);
    let st = if is_root { Some(ty(k, sdt)?) } else { None };
    let rt = if inplace { None } else { Some(ty(k, rdt)?) };
    if dense(&st) && dense(&rt) {
        return build_scatter(k, sbuf, scount, sdt, rbuf, rcount, rdt, root);
    }
    let (mut sdata, mut sc) = (Vec::new(), 0);
    if let Some(t) = &st {
        sdata = pack(k, t, sbuf, times(k, scount, k.size())?, "sendbuf")?;
        sc = len(k, t, scount)? as i64;
    }
    let (mut rdata, mut un) = (Vec::new(), None);
    if let Some(t) = rt {
        rdata = vec![0u8; len(k, &t, rcount)?];
        crate::packing::check_typed_buf(rbuf, &t, rdata.len(), "recvbuf").map_err(on(k))?;
        un = Some(unpacker(t, rbuf as usize, rcount));
    }
    let rp = if inplace { rbuf } else { ptr_mut(&mut rdata) };
    let inner = build_scatter(k, ptr(&sdata), sc, MPI_BYTE, rp, rdata.len() as i64, MPI_BYTE, root)?;
    Ok(then(inner, move || {
        drop(sdata);
        if let Some(u) = un {
            u(&rdata)
        }
    }))
}

/// Allgather and alltoall: every rank sends and receives `size` blocks (allgather sends one).
#[allow(clippy::too_many_arguments)]
fn w_all(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, to_all: bool) -> Result<Built, MpiErr> {
    let inplace = in_place(sbuf);
    let st = if inplace { None } else { Some(ty(k, sdt)?) };
    let rt = ty(k, rdt)?;
    if dense(&st) && rt.map.dense() {
        return if to_all { build_alltoall(k, sbuf, scount, sdt, rbuf, rcount, rdt) } else { build_allgather(k, sbuf, scount, sdt, rbuf, rcount, rdt) };
    }
    let n = k.size();
    let sdata = match &st {
        Some(t) => pack(k, t, sbuf, if to_all { times(k, scount, n)? } else { scount }, "sendbuf")?,
        None => Vec::new(),
    };
    let sc = match &st {
        Some(t) => len(k, t, scount)? as i64,
        None => 0,
    };
    let all = times(k, rcount, n)?;
    let mut rdata = if inplace { pack(k, &rt, rbuf, all, "recvbuf")? } else { vec![0u8; len(k, &rt, all)?] };
    crate::packing::check_typed_buf(rbuf, &rt, rdata.len(), "recvbuf").map_err(on(k))?;
    let rc = len(k, &rt, rcount)? as i64;
    let sp = if inplace { sbuf } else { ptr(&sdata) };
    let rp = ptr_mut(&mut rdata);
    let inner = if to_all { build_alltoall(k, sp, sc, MPI_BYTE, rp, rc, MPI_BYTE)? } else { build_allgather(k, sp, sc, MPI_BYTE, rp, rc, MPI_BYTE)? };
    let un = unpacker(rt, rbuf as usize, all);
    Ok(then(inner, move || {
        drop(sdata);
        un(&rdata)
    }))
}

pub(crate) fn w_allgather(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype) -> Result<Built, MpiErr> {
    w_all(k, sbuf, scount, sdt, rbuf, rcount, rdt, false)
}

pub(crate) fn w_alltoall(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype) -> Result<Built, MpiErr> {
    w_all(k, sbuf, scount, sdt, rbuf, rcount, rdt, true)
}

// ---- segments: the v-forms and alltoallw -------------------------------------------------------------

/// `count` elements of `t` at byte `off` from a buffer; its packed bytes at `at` in ours.
#[derive(Clone)]
struct Seg {
    t: Arc<Type>,
    count: i64,
    off: i64,
    at: usize,
    len: usize,
}

/// Segments of per-rank counts and displacements (`unit`: bytes per displacement; None: the
/// type's extent), packed back to back in rank order.
fn segs(k: &Coll, ts: &[Arc<Type>], counts: &[i64], displs: &[i64], unit: Option<i64>) -> Result<(Vec<Seg>, usize), MpiErr> {
    let mut v = Vec::with_capacity(counts.len());
    let mut at = 0usize;
    for (i, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        let t = ts[i.min(ts.len() - 1)].clone();
        let len = len(k, &t, c)?;
        let u = unit.unwrap_or(t.map.extent());
        let off = d.checked_mul(u).ok_or_else(|| k.err(MPI_ERR_ARG, format!("displacement {d} of rank {i} overflows")))?;
        v.push(Seg { t, count: c, off, at, len });
        at = at.checked_add(len).ok_or_else(|| k.err(MPI_ERR_COUNT, "the counts overflow".into()))?;
    }
    Ok((v, at))
}

fn seg_counts(s: &[Seg]) -> (Vec<i64>, Vec<i64>) {
    (s.iter().map(|x| x.len as i64).collect(), s.iter().map(|x| x.at as i64).collect())
}

/// Packs (or, with `fill` false, makes room for) every segment of `base`.
fn pack_segs(k: &Coll, base: *const c_void, s: &[Seg], total: usize, fill: bool, what: &str) -> Result<Vec<u8>, MpiErr> {
    let mut v = vec![0u8; total];
    for x in s {
        crate::packing::check_typed_buf(base, &x.t, x.len, what).map_err(on(k))?;
        if fill && x.len > 0 {
            // SAFETY: the caller's buffer holds `count` elements at `off` for this rank.
            unsafe { x.t.map.pack((base as *const u8).wrapping_offset(x.off as isize), x.count as u64, &mut v[x.at..x.at + x.len]) };
        }
    }
    Ok(v)
}

/// Unpacks the segments `which` selects from `data` into the caller's buffer at `base`.
fn unpack_segs(base: usize, s: &[Seg], data: &[u8], which: impl Fn(usize) -> bool) {
    for (i, x) in s.iter().enumerate() {
        if which(i) && x.len > 0 {
            // SAFETY: the caller's buffer holds this rank's elements until completion.
            unsafe { x.t.map.unpack(&data[x.at..x.at + x.len], (base as *mut u8).wrapping_offset(x.off as isize), x.count as u64) };
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn w_gatherv(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: &[i64], displs: &[i64], rdt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let is_root = k.rank() == k.root(root)?;
    let inplace = in_place(sbuf);
    let st = if inplace { None } else { Some(ty(k, sdt)?) };
    let rt = if is_root { Some(ty(k, rdt)?) } else { None };
    if dense(&st) && dense(&rt) {
        return build_gatherv(k, sbuf, scount, sdt, rbuf, rcounts, displs, rdt, root);
    }
    let sdata = send_side(k, !inplace, sbuf, scount, &st)?;
    let (mut rdata, mut s) = (Vec::new(), Vec::new());
    if let Some(t) = rt {
        let total;
        (s, total) = segs(k, &[t], rcounts, displs, None)?;
        rdata = pack_segs(k, rbuf, &s, total, inplace, "recvbuf")?;
    }
    let (rc, rd) = seg_counts(&s);
    let sp = if inplace { sbuf } else { ptr(&sdata) };
    let inner = build_gatherv(k, sp, sdata.len() as i64, MPI_BYTE, ptr_mut(&mut rdata), &rc, &rd, MPI_BYTE, root)?;
    let (me, base) = (k.rank(), rbuf as usize);
    Ok(then(inner, move || {
        drop(sdata);
        unpack_segs(base, &s, &rdata, |i| !(inplace && i == me));
    }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn w_scatterv(k: &Coll, sbuf: *const c_void, scounts: &[i64], displs: &[i64], sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Result<Built, MpiErr> {
    let is_root = k.rank() == k.root(root)?;
    let inplace = in_place(rbuf);
    let st = if is_root { Some(ty(k, sdt)?) } else { None };
    let rt = if inplace { None } else { Some(ty(k, rdt)?) };
    if dense(&st) && dense(&rt) {
        return build_scatterv(k, sbuf, scounts, displs, sdt, rbuf, rcount, rdt, root);
    }
    let (mut sdata, mut s) = (Vec::new(), Vec::new());
    if let Some(t) = st {
        let total;
        (s, total) = segs(k, &[t], scounts, displs, None)?;
        sdata = pack_segs(k, sbuf, &s, total, true, "sendbuf")?;
    }
    let (sc, sd) = seg_counts(&s);
    let (mut rdata, mut un) = (Vec::new(), None);
    if let Some(t) = rt {
        rdata = vec![0u8; len(k, &t, rcount)?];
        crate::packing::check_typed_buf(rbuf, &t, rdata.len(), "recvbuf").map_err(on(k))?;
        un = Some(unpacker(t, rbuf as usize, rcount));
    }
    let rp = if inplace { rbuf } else { ptr_mut(&mut rdata) };
    let inner = build_scatterv(k, ptr(&sdata), &sc, &sd, MPI_BYTE, rp, rdata.len() as i64, MPI_BYTE, root)?;
    Ok(then(inner, move || {
        drop(sdata);
        if let Some(u) = un {
            u(&rdata)
        }
    }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn w_allgatherv(k: &Coll, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: &[i64], displs: &[i64], rdt: MPI_Datatype) -> Result<Built, MpiErr> {
    let inplace = in_place(sbuf);
    let st = if inplace { None } else { Some(ty(k, sdt)?) };
    let rt = ty(k, rdt)?;
    if dense(&st) && rt.map.dense() {
        return build_allgatherv(k, sbuf, scount, sdt, rbuf, rcounts, displs, rdt);
    }
    let sdata = send_side(k, !inplace, sbuf, scount, &st)?;
    let (s, total) = segs(k, &[rt], rcounts, displs, None)?;
    let mut rdata = pack_segs(k, rbuf, &s, total, inplace, "recvbuf")?;
    let (rc, rd) = seg_counts(&s);
    let sp = if inplace { sbuf } else { ptr(&sdata) };
    let inner = build_allgatherv(k, sp, sdata.len() as i64, MPI_BYTE, ptr_mut(&mut rdata), &rc, &rd, MPI_BYTE)?;
    let base = rbuf as usize;
    Ok(then(inner, move || {
        drop(sdata);
        unpack_segs(base, &s, &rdata, |_| true);
    }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn w_alltoallv(k: &Coll, sbuf: *const c_void, scounts: &[i64], sdispls: &[i64], sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: &[i64], rdispls: &[i64], rdt: MPI_Datatype) -> Result<Built, MpiErr> {
    let inplace = in_place(sbuf);
    let st = if inplace { None } else { Some(ty(k, sdt)?) };
    let rt = ty(k, rdt)?;
    if dense(&st) && rt.map.dense() {
        return build_alltoallv(k, sbuf, scounts, sdispls, sdt, rbuf, rcounts, rdispls, rdt);
    }
    let (rs, rtotal) = segs(k, &[rt], rcounts, rdispls, None)?;
    let (ss, stotal, sbase) = match st {
        Some(t) => {
            let (s, n) = segs(k, &[t], scounts, sdispls, None)?;
            (s, n, sbuf)
        }
        None => (rs.clone(), rtotal, rbuf as *const c_void),
    };
    alltoall_segs(k, sbase, ss, stotal, rbuf, rs, rtotal)
}

/// The engine's alltoallv on packed segments; unpacked into `rbuf` at completion.
fn alltoall_segs(k: &Coll, sbuf: *const c_void, ss: Vec<Seg>, stotal: usize, rbuf: *mut c_void, rs: Vec<Seg>, rtotal: usize) -> Result<Built, MpiErr> {
    let sdata = pack_segs(k, sbuf, &ss, stotal, true, "sendbuf")?;
    let mut rdata = vec![0u8; rtotal];
    for x in &rs {
        crate::packing::check_typed_buf(rbuf, &x.t, x.len, "recvbuf").map_err(on(k))?;
    }
    let to_usize = |v: Vec<i64>| v.into_iter().map(|x| x as usize).collect::<Vec<usize>>();
    let (sc, sd) = seg_counts(&ss);
    let (rc, rd) = seg_counts(&rs);
    let args = CollArgs::Alltoallv {
        send: ConstBuf::from_slice(&sdata),
        scounts: to_usize(sc),
        sdispls: to_usize(sd),
        recv: own_mut(&mut rdata),
        rcounts: to_usize(rc),
        rdispls: to_usize(rd),
        dt: DType::Uint8,
    };
    let base = rbuf as usize;
    Ok(Built {
        args,
        after: Some(Box::new(move || {
            drop(sdata);
            unpack_segs(base, &rs, &rdata, |_| true);
        })),
    })
}

/// MPI_Alltoallw: per-peer counts, byte displacements and datatypes.
#[allow(clippy::too_many_arguments)]
fn build_alltoallw(k: &Coll, sbuf: *const c_void, sc: &[i64], sd: &[i64], st: &[MPI_Datatype], rbuf: *mut c_void, rc: &[i64], rd: &[i64], rt: &[MPI_Datatype]) -> Result<Built, MpiErr> {
    let types = |hs: &[MPI_Datatype]| hs.iter().map(|&h| ty(k, h)).collect::<Result<Vec<_>, MpiErr>>();
    let (rs, rtotal) = segs(k, &types(rt)?, rc, rd, Some(1))?;
    if in_place(sbuf) {
        let ss = rs.clone();
        return alltoall_segs(k, rbuf as *const c_void, ss, rtotal, rbuf, rs, rtotal);
    }
    let (ss, stotal) = segs(k, &types(st)?, sc, sd, Some(1))?;
    if let (Some((scb, sdb, sspan)), Some((rcb, rdb, rspan))) = (byte_runs(&ss), byte_runs(&rs)) {
        // Every block is one run of bytes in the caller's buffers: moved from and to them as
        // they are (an alltoallv of bytes), with no packing (which took 3x the time at 1 MiB).
        for x in &ss {
            crate::packing::check_typed_buf(sbuf, &x.t, x.len, "sendbuf").map_err(on(k))?;
        }
        for x in &rs {
            crate::packing::check_typed_buf(rbuf, &x.t, x.len, "recvbuf").map_err(on(k))?;
        }
        return Ok(Built::plain(CollArgs::Alltoallv {
            send: cb(sbuf, sspan),
            scounts: scb,
            sdispls: sdb,
            recv: mb(rbuf, rspan),
            rcounts: rcb,
            rdispls: rdb,
            dt: DType::Uint8,
        }));
    }
    alltoall_segs(k, sbuf, ss, stotal, rbuf, rs, rtotal)
}

/// (byte counts, byte offsets, span) when every segment is one run of bytes at a non-negative
/// offset (a dense type), else None.
fn byte_runs(s: &[Seg]) -> Option<(Vec<usize>, Vec<usize>, usize)> {
    let (mut counts, mut offs, mut span) = (Vec::with_capacity(s.len()), Vec::with_capacity(s.len()), 0usize);
    for x in s {
        if !x.t.map.dense() || x.off < 0 {
            return None;
        }
        let off = x.off as usize;
        span = span.max(off.checked_add(x.len)?);
        counts.push(x.len);
        offs.push(off);
    }
    Some((counts, offs, span))
}

fn type_list(p: *const MPI_Datatype, n: usize, what: &str) -> Result<Vec<MPI_Datatype>, MpiErr> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    // SAFETY: the caller's array has one entry per rank.
    Ok(unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
}

macro_rules! alltoallw_entry {
    ($name:ident, $ct:ty, $dt:ty, $conv:ident $(, $req:ident)?) => {
        #[allow(clippy::too_many_arguments, unreachable_code)]
        pub unsafe fn $name(sbuf: *const c_void, scounts: *const $ct, sdispls: *const $dt, stypes: *const MPI_Datatype, rbuf: *mut c_void, rcounts: *const $ct, rdispls: *const $dt, rtypes: *const MPI_Datatype, c: MPI_Comm $(, $req: *mut MPI_Request)?) -> Res {
            // An intercommunicator's: see inter.rs (the arrays are read now).
            let k = match Coll::or_inter(c)? {
                Ok(k) => k,
                Err(mc) => {
                    let n = crate::inter::remote_n(&mc)?;
                    let on = |e: MpiErr| e.on(c);
                    let (sc, sd, st) = (counts(scounts, n, "sendcounts").map_err(on)?, $conv(sdispls, n, "sdispls").map_err(on)?, type_list(stypes, n, "sendtypes").map_err(on)?);
                    let (rc, rd, rt) = (counts(rcounts, n, "recvcounts").map_err(on)?, $conv(rdispls, n, "rdispls").map_err(on)?, type_list(rtypes, n, "recvtypes").map_err(on)?);
                    let run = move |mc: &crate::state::MpiComm| crate::inter::alltoallw(mc, sbuf, (&sc, &sd, &st), rbuf, (&rc, &rd, &rt));
                    $(return crate::colls::inter_start(&mc, $req, concat!("MPI_", stringify!($name)), run);)?
                    return crate::colls::inter_now(&mc, |mc| run(mc));
                }
            };
            $(let $req = Some(req_out($req, c)?);)?
            let n = k.size();
            let b = (|| -> Result<Built, MpiErr> {
                let ip = in_place(sbuf);
                let (sc, sd, st) = if ip { (vec![], vec![], vec![]) } else { (counts(scounts, n, "sendcounts")?, $conv(sdispls, n, "sdispls")?, type_list(stypes, n, "sendtypes")?) };
                build_alltoallw(&k, sbuf, &sc, &sd, &st, rbuf, &counts(rcounts, n, "recvcounts")?, &$conv(rdispls, n, "rdispls")?, &type_list(rtypes, n, "recvtypes")?)
            })().map_err(|e| e.on(c))?;
            #[allow(unused_mut, unused_assignments)]
            let mut r: Option<&mut MPI_Request> = None;
            $(r = $req;)?
            k.go(b, r)
        }
    };
}

alltoallw_entry!(alltoallw, c_int, c_int, counts);
alltoallw_entry!(alltoallw_c, MPI_Count, MPI_Aint, aints);
alltoallw_entry!(ialltoallw, c_int, c_int, counts, req);
alltoallw_entry!(ialltoallw_c, MPI_Count, MPI_Aint, aints, req);

// ---- reductions ------------------------------------------------------------------------------------

/// A derived type and its one basic type.
type TypeAndBasic = (Arc<Type>, Arc<Type>);

/// How a reduction of `dt` runs: None on the type as it is (predefined, or dense where the
/// op applies to its elements or is the user's); or on an array of its one basic type (a user
/// op: of the type itself, holes and all, see `to_basic`).
fn basic_route(k: &Coll, dt: MPI_Datatype, o: MPI_Op) -> Result<Option<TypeAndBasic>, MpiErr> {
    if datatype::predefined(dt).is_some() {
        return Ok(None); // the common case, answered without the full lookup
    }
    let d = datatype::get(dt).map_err(on(k))?;
    let user = o >= op::OP_BASE;
    if d.dense && (user || d.kind != datatype::Kind::Other) {
        return Ok(None);
    }
    let t = ty(k, dt)?;
    if user {
        // The user's function reads the type's own layout: it runs on arrays of ours in that
        // layout (the "basic" type is the type itself), which must hold every element's data
        // within its extent.
        let m = &t.map;
        if m.true_lb < 0 || m.true_ub > m.extent() {
            return Err(k.err(MPI_ERR_UNSUPPORTED_OPERATION, format!("a user operation on a datatype whose data lies outside its extent (true bounds [{}, {}), extent {}) is not supported", m.true_lb, m.true_ub, m.extent())));
        }
        return Ok(Some((t.clone(), t)));
    }
    match t.map.basic {
        Some(b) => Ok(Some((t, ty(k, b)?))),
        None => Err(k.err(MPI_ERR_OP, format!("predefined operations need one basic datatype throughout; {dt:#x} mixes several"))),
    }
}

/// `count` elements of `t` at `p` as an array of its basic type `b`.
fn to_basic(k: &Coll, t: &Type, b: &Type, p: *const c_void, count: i64, what: &str) -> Result<Vec<u8>, MpiErr> {
    let packed = pack(k, t, p, count, what)?;
    if b.map.dense() {
        return Ok(packed);
    }
    let n = (packed.len() as u64 / b.map.size.max(1)) as usize;
    let mut v = vec![0u8; n * b.map.extent() as usize];
    // SAFETY: `v` holds n elements of b.
    unsafe { b.map.unpack(&packed, v.as_mut_ptr(), n as u64) };
    Ok(v)
}

/// The inverse of `to_basic`: the array into `count` elements of `t` at `addr`.
fn from_basic(t: &Type, b: &Type, arr: &[u8], addr: usize, count: i64) {
    let packed;
    let data = if b.map.dense() {
        arr
    } else {
        let n = arr.len() as u64 / (b.map.extent().max(1) as u64);
        let mut v = vec![0u8; (n * b.map.size) as usize];
        // SAFETY: `arr` holds n elements of b.
        unsafe { b.map.pack(arr.as_ptr(), n, &mut v) };
        packed = v;
        &packed[..]
    };
    // SAFETY: the caller's buffer holds `count` elements of t until completion.
    unsafe { t.map.unpack(data, addr as *mut u8, count as u64) };
}

/// A reduction on basic arrays: `input` elements from the send buffer (or the receive buffer
/// in place); `output` elements unpacked to the receive buffer where `out_here`.
struct Red {
    t: Arc<Type>,
    b: Arc<Type>,
    sin: Vec<u8>,
    rout: Vec<u8>,
    has_out: bool,
    per: i64,
}

#[allow(clippy::too_many_arguments)]
fn red(k: &Coll, t: Arc<Type>, b: Arc<Type>, sbuf: *const c_void, rbuf: *mut c_void, input: i64, output: i64, out_here: bool) -> Result<Red, MpiErr> {
    let src = if in_place(sbuf) { rbuf as *const c_void } else { sbuf };
    let sin = to_basic(k, &t, &b, src, input, if in_place(sbuf) { "recvbuf" } else { "sendbuf" })?;
    // Elements of the basic type in one element of t (a pair type counts once here).
    let per = (t.map.size / b.map.size.max(1)) as i64;
    let rout = if out_here {
        let n = len(k, &t, output)?;
        crate::packing::check_typed_buf(rbuf, &t, n, "recvbuf").map_err(on(k))?;
        vec![0u8; (times(k, output, per as usize)? as u64 * b.map.extent() as u64) as usize]
    } else {
        Vec::new()
    };
    Ok(Red { t, b, sin, rout, has_out: out_here, per })
}

impl Red {
    fn n(&self, k: &Coll, items: i64) -> Result<i64, MpiErr> {
        times(k, items, self.per as usize)
    }
    /// Runs `inner` (on our arrays), then unpacks `output` elements into `rbuf` if `out_here`.
    fn run(mut self, inner: impl FnOnce(*const c_void, *mut c_void, MPI_Datatype) -> Result<Built, MpiErr>, rbuf: *mut c_void, output: i64, out_here: bool) -> Result<Built, MpiErr> {
        let rp = if self.has_out { ptr_mut(&mut self.rout) } else { std::ptr::null_mut() };
        let b = inner(ptr(&self.sin), rp, self.b.dt.handle)?;
        let addr = rbuf as usize;
        Ok(then(b, move || {
            drop(self.sin);
            if out_here {
                from_basic(&self.t, &self.b, &self.rout, addr, output);
            }
        }))
    }
}

pub(crate) fn w_reduce(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op, root: c_int) -> Result<Built, MpiErr> {
    let Some((t, b)) = basic_route(k, dt, o)? else { return build_reduce(k, sbuf, rbuf, count, dt, o, root) };
    let is_root = k.rank() == k.root(root)?;
    if in_place(sbuf) && !is_root {
        return Err(k.err(MPI_ERR_BUFFER, "MPI_IN_PLACE is only allowed at the root".into()));
    }
    let r = red(k, t, b, sbuf, rbuf, count, count, is_root)?;
    let n = r.n(k, count)?;
    r.run(|s, d, h| build_reduce(k, s, d, n, h, o, root), rbuf, count, is_root)
}

pub(crate) fn w_allreduce(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    let Some((t, b)) = basic_route(k, dt, o)? else { return build_allreduce(k, sbuf, rbuf, count, dt, o) };
    let r = red(k, t, b, sbuf, rbuf, count, count, true)?;
    let n = r.n(k, count)?;
    r.run(|s, d, h| build_allreduce(k, s, d, n, h, o), rbuf, count, true)
}

fn w_scan(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op, exclusive: bool) -> Result<Built, MpiErr> {
    let Some((t, b)) = basic_route(k, dt, o)? else {
        return if exclusive { build_exscan(k, sbuf, rbuf, count, dt, o) } else { build_inscan(k, sbuf, rbuf, count, dt, o) };
    };
    // Exscan leaves rank 0's receive buffer alone.
    let here = !(exclusive && k.rank() == 0);
    let r = red(k, t, b, sbuf, rbuf, count, count, true)?;
    let n = r.n(k, count)?;
    r.run(|s, d, h| if exclusive { build_exscan(k, s, d, n, h, o) } else { build_inscan(k, s, d, n, h, o) }, rbuf, count, here)
}

pub(crate) fn w_inscan(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    w_scan(k, sbuf, rbuf, count, dt, o, false)
}

pub(crate) fn w_exscan(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    w_scan(k, sbuf, rbuf, count, dt, o, true)
}

pub(crate) fn w_reduce_scatter_block(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, rcount: i64, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    let Some((t, b)) = basic_route(k, dt, o)? else { return build_reduce_scatter_block(k, sbuf, rbuf, rcount, dt, o) };
    let all = times(k, rcount, k.size())?;
    let r = red(k, t, b, sbuf, rbuf, all, rcount, true)?;
    let n = r.n(k, rcount)?;
    r.run(|s, d, h| build_reduce_scatter_block(k, s, d, n, h, o), rbuf, rcount, true)
}

pub(crate) fn w_reduce_scatter(k: &Coll, sbuf: *const c_void, rbuf: *mut c_void, rcounts: Vec<i64>, dt: MPI_Datatype, o: MPI_Op) -> Result<Built, MpiErr> {
    let Some((t, b)) = basic_route(k, dt, o)? else { return build_reduce_scatter(k, sbuf, rbuf, rcounts, dt, o) };
    let mut all = 0i64;
    for &c in &rcounts {
        if c < 0 {
            return Err(k.err(MPI_ERR_COUNT, format!("count {c} is negative")));
        }
        all = all.checked_add(c).ok_or_else(|| k.err(MPI_ERR_COUNT, "the counts overflow".into()))?;
    }
    let mine = rcounts.get(k.rank()).copied().unwrap_or(0);
    let r = red(k, t, b, sbuf, rbuf, all, mine, true)?;
    let scaled = rcounts.iter().map(|&c| r.n(k, c)).collect::<Result<Vec<_>, _>>()?;
    r.run(|s, d, h| build_reduce_scatter(k, s, d, scaled, h, o), rbuf, mine, true)
}

/// MPI_Reduce_local on any datatype (see `basic_route`).
pub(crate) fn w_reduce_local(inbuf: *const c_void, inout: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Res {
    let k = Coll::new(MPI_COMM_SELF)?;
    let Some((t, b)) = basic_route(&k, dt, o).map_err(|e| e.on(MPI_COMM_WORLD))? else { return reduce_local_any(inbuf, inout, count, dt, o) };
    let a = to_basic(&k, &t, &b, inbuf, count, "inbuf")?;
    let mut io = to_basic(&k, &t, &b, inout, count, "inoutbuf")?;
    let n = times(&k, count, (t.map.size / b.map.size.max(1)) as usize)?;
    reduce_local_any(ptr(&a), ptr_mut(&mut io), n, b.dt.handle, o)?;
    from_basic(&t, &b, &io, inout as usize, count);
    Ok(())
}
