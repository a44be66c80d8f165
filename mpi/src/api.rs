//! The supported functions. Each `name` here is the export `MPI_Name` (see abi_gen.rs, which
//! wraps the int-returning ones in `err::guard`: an `Err` goes to the communicator's handler).
//!
//! # Safety
//! Every function takes the C caller's pointers as the MPI standard specifies them; they are
//! checked for NULL where the standard gives an error class for it, and otherwise trusted.

use crate::abi_gen::*;
use crate::err::{self, MpiErr, Res};
use crate::mpi_err;
use crate::op;
use crate::request::{self, Req};
use crate::state::{self, CommRef, MpiComm};
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::comm::Exchanged;
use distcomm::completion::LazyDeadline;
use distcomm::transport::{waits_at_once, waits_at_once_up_to};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The largest tag (MPI_TAG_UB's value): the engine's user tags are 32 bits.
pub const TAG_UB: c_int = c_int::MAX;

fn active() -> Res {
    state::check_active()
}

/// The communicator behind a handle, MPI being active.
pub(crate) fn comm(h: MPI_Comm) -> Result<CommRef, MpiErr> {
    // Before init and after finalize no handle is found, and the error says which it is.
    state::get_comm(h)
}

pub(crate) fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, MpiErr> {
    // SAFETY: a non-NULL out-pointer from the caller is writable (the standard's contract).
    unsafe { p.as_mut() }.ok_or_else(|| MpiErr::new(MPI_ERR_ARG, format!("{what} is NULL")))
}

pub(crate) fn write_status(st: *mut MPI_Status, s: MPI_Status) {
    if let Some(p) = unsafe { st.as_mut() } {
        // MPI_ERROR is left alone by single-completion calls (the standard says so).
        let e = p.MPI_ERROR;
        *p = s;
        p.MPI_ERROR = e;
    }
}

/// Copies a Rust string into a caller's char buffer of `max` bytes, NUL-terminated.
pub(crate) fn put_str(s: &str, buf: *mut c_char, len: *mut c_int, max: usize) -> Res {
    if buf.is_null() {
        return mpi_err!(MPI_ERR_ARG, "string buffer is NULL");
    }
    let b = s.as_bytes();
    let n = b.len().min(max - 1);
    // SAFETY: the caller's buffer holds at least `max` bytes (MPI_MAX_* of the call).
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    if let Some(l) = unsafe { len.as_mut() } {
        *l = n as c_int;
    }
    Ok(())
}

// ---- environment ------------------------------------------------------------------------------

pub unsafe fn init(_argc: *mut c_int, _argv: *mut *mut *mut c_char) -> Res {
    state::init(MPI_THREAD_SINGLE).map(|_| ())
}

pub unsafe fn init_thread(_argc: *mut c_int, _argv: *mut *mut *mut c_char, required: c_int, provided: *mut c_int) -> Res {
    let p = out(provided, "provided")?;
    *p = state::init(required)?;
    Ok(())
}

pub unsafe fn initialized(flag: *mut c_int) -> Res {
    *out(flag, "flag")? = state::initialized() as c_int;
    Ok(())
}

pub unsafe fn finalized(flag: *mut c_int) -> Res {
    *out(flag, "flag")? = state::finalized() as c_int;
    Ok(())
}

pub unsafe fn finalize() -> Res {
    state::finalize()
}

pub unsafe fn abort(c: MPI_Comm, errorcode: c_int) -> Res {
    state::say(&format!("{}: MPI_Abort(comm {c:#x}, {errorcode}) called: ending the job\n", state::who()));
    state::abort_job(c, errorcode)
}

pub unsafe fn query_thread(provided: *mut c_int) -> Res {
    *out(provided, "provided")? = state::THREAD_LEVEL.load(Ordering::Relaxed);
    Ok(())
}

pub unsafe fn is_thread_main(flag: *mut c_int) -> Res {
    active()?;
    *out(flag, "flag")? = state::is_main_thread() as c_int;
    Ok(())
}

pub unsafe fn get_version(version: *mut c_int, subversion: *mut c_int) -> Res {
    *out(version, "version")? = MPI_VERSION;
    *out(subversion, "subversion")? = MPI_SUBVERSION;
    Ok(())
}

pub unsafe fn abi_get_version(major: *mut c_int, minor: *mut c_int) -> Res {
    *out(major, "abi_major")? = MPI_ABI_VERSION;
    *out(minor, "abi_minor")? = MPI_ABI_SUBVERSION;
    Ok(())
}

/// MPI_Abi_get_info: the sizes of the ABI's address, count and offset integers (callable
/// before MPI_Init).
pub unsafe fn abi_get_info(info: *mut MPI_Info) -> Res {
    let size = |n: usize| n.to_string();
    crate::info::with_pairs(
        &[
            ("mpi_aint_size", size(std::mem::size_of::<MPI_Aint>())),
            ("mpi_count_size", size(std::mem::size_of::<MPI_Count>())),
            ("mpi_offset_size", size(std::mem::size_of::<MPI_Offset>())),
        ],
        info,
    )
}

/// MPI_Abi_get_fortran_info: the sizes of the Fortran types this library's datatypes describe
/// (no Fortran bindings: the C datatypes), and which of the optional ones it has.
pub unsafe fn abi_get_fortran_info(info: *mut MPI_Info) -> Res {
    let size_of = |h: MPI_Datatype| crate::datatype::predefined(h).map_or(0, |d| d.size).to_string();
    let mut pairs = vec![
        ("mpi_logical_size", size_of(MPI_LOGICAL)),
        ("mpi_integer_size", size_of(MPI_INTEGER)),
        ("mpi_real_size", size_of(MPI_REAL)),
        ("mpi_double_precision_size", size_of(MPI_DOUBLE_PRECISION)),
    ];
    let optional = [
        ("mpi_logical1_supported", MPI_LOGICAL1),
        ("mpi_logical2_supported", MPI_LOGICAL2),
        ("mpi_logical4_supported", MPI_LOGICAL4),
        ("mpi_logical8_supported", MPI_LOGICAL8),
        ("mpi_logical16_supported", MPI_LOGICAL16),
        ("mpi_integer1_supported", MPI_INTEGER1),
        ("mpi_integer2_supported", MPI_INTEGER2),
        ("mpi_integer4_supported", MPI_INTEGER4),
        ("mpi_integer8_supported", MPI_INTEGER8),
        ("mpi_integer16_supported", MPI_INTEGER16),
        ("mpi_real2_supported", MPI_REAL2),
        ("mpi_real4_supported", MPI_REAL4),
        ("mpi_real8_supported", MPI_REAL8),
        ("mpi_real16_supported", MPI_REAL16),
        ("mpi_complex4_supported", MPI_COMPLEX4),
        ("mpi_complex8_supported", MPI_COMPLEX8),
        ("mpi_complex16_supported", MPI_COMPLEX16),
        ("mpi_complex32_supported", MPI_COMPLEX32),
        ("mpi_double_complex_supported", MPI_DOUBLE_COMPLEX),
    ];
    pairs.extend(optional.iter().map(|&(k, h)| (k, crate::datatype::predefined(h).is_some().to_string())));
    crate::info::with_pairs(&pairs, info)
}

pub fn library_version() -> String {
    format!(
        "distcomm MPI library {} (libmpi_abi.so.1: MPI {MPI_VERSION}.{MPI_SUBVERSION} standard ABI {MPI_ABI_VERSION}.{MPI_ABI_SUBVERSION}, on the distcomm engine)",
        env!("CARGO_PKG_VERSION")
    )
}

pub unsafe fn get_library_version(version: *mut c_char, resultlen: *mut c_int) -> Res {
    put_str(&library_version(), version, resultlen, MPI_MAX_LIBRARY_VERSION_STRING as usize)
}

pub unsafe fn get_processor_name(name: *mut c_char, resultlen: *mut c_int) -> Res {
    put_str(&distcomm::log::hostname(), name, resultlen, MPI_MAX_PROCESSOR_NAME as usize)
}

pub unsafe fn wtime() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

pub unsafe fn wtick() -> f64 {
    1e-9
}

pub unsafe fn aint_add(base: MPI_Aint, disp: MPI_Aint) -> MPI_Aint {
    base.wrapping_add(disp)
}

pub unsafe fn aint_diff(a: MPI_Aint, b: MPI_Aint) -> MPI_Aint {
    a.wrapping_sub(b)
}

// ---- handle conversions: every handle of this library is an integer already ---------------------

macro_rules! int_conv {
    ($to:ident, $from:ident) => {
        pub unsafe fn $to(h: usize) -> c_int {
            h as c_int
        }
        pub unsafe fn $from(i: c_int) -> usize {
            i as u32 as usize
        }
    };
}
int_conv!(comm_toint, comm_fromint);
int_conv!(errhandler_toint, errhandler_fromint);
int_conv!(file_toint, file_fromint);
int_conv!(group_toint, group_fromint);
int_conv!(info_toint, info_fromint);
int_conv!(message_toint, message_fromint);
int_conv!(op_toint, op_fromint);
int_conv!(request_toint, request_fromint);
int_conv!(session_toint, session_fromint);
int_conv!(type_toint, type_fromint);
int_conv!(win_toint, win_fromint);

// ---- errors ----------------------------------------------------------------------------------------

pub unsafe fn error_class(code: c_int, class: *mut c_int) -> Res {
    let c = out(class, "errorclass")?;
    match err::class_of(code) {
        Some(k) => {
            *c = k;
            Ok(())
        }
        None => mpi_err!(MPI_ERR_ARG, "{code} is not an error code"),
    }
}

pub unsafe fn error_string(code: c_int, string: *mut c_char, resultlen: *mut c_int) -> Res {
    match err::code_string(code) {
        Some(s) => put_str(&s, string, resultlen, MPI_MAX_ERROR_STRING as usize),
        None => mpi_err!(MPI_ERR_ARG, "{code} is not an error code"),
    }
}

pub unsafe fn comm_set_errhandler(c: MPI_Comm, eh: MPI_Errhandler) -> Res {
    let mc = comm(c)?;
    if !err::valid_errhandler(eh) {
        return Err(MpiErr::new(MPI_ERR_ARG, format!("{eh:#x} is not a valid error handler")).on(c));
    }
    mc.errhandler.store(eh, Ordering::Relaxed);
    err::handler_set_on(c);
    Ok(())
}

pub unsafe fn comm_get_errhandler(c: MPI_Comm, eh: *mut MPI_Errhandler) -> Res {
    let mc = comm(c)?;
    *out(eh, "errhandler").map_err(|e| e.on(c))? = mc.errhandler.load(Ordering::Relaxed);
    Ok(())
}

pub unsafe fn comm_create_errhandler(f: Option<MPI_Comm_errhandler_function>, eh: *mut MPI_Errhandler) -> Res {
    let Some(f) = f else { return mpi_err!(MPI_ERR_ARG, "comm_errhandler_fn is NULL") };
    *out(eh, "errhandler")? = err::new_user_handler(f);
    Ok(())
}

pub unsafe fn comm_call_errhandler(c: MPI_Comm, code: c_int) -> Res {
    let mc = comm(c)?;
    let class = err::class_of(code).unwrap_or(MPI_ERR_UNKNOWN);
    if class == MPI_SUCCESS {
        return Ok(());
    }
    let msg = err::code_string(code).unwrap_or_default();
    match mc.errhandler.load(Ordering::Relaxed) {
        // The handler is called and the call succeeds once it returns (the standard's words:
        // MPI_ERRORS_RETURN returns at once, as MPICH does); the fatal handlers end the job.
        h if h >= err::ERRH_BASE => {
            err::call_user_handler(h, c, code);
            Ok(())
        }
        MPI_ERRORS_RETURN => Ok(()),
        _ => Err(MpiErr::new(class, msg).on(c)),
    }
}

pub unsafe fn errhandler_free(eh: *mut MPI_Errhandler) -> Res {
    let h = out(eh, "errhandler")?;
    if !err::valid_errhandler(*h) {
        return mpi_err!(MPI_ERR_ARG, "{:#x} is not a valid error handler", *h);
    }
    *h = MPI_ERRHANDLER_NULL;
    Ok(())
}

// ---- communicators -------------------------------------------------------------------------------

pub unsafe fn comm_size(c: MPI_Comm, size: *mut c_int) -> Res {
    let mc = comm(c)?;
    *out(size, "size").map_err(|e| e.on(c))? = mc.size() as c_int;
    Ok(())
}

pub unsafe fn comm_rank(c: MPI_Comm, rank: *mut c_int) -> Res {
    let mc = comm(c)?;
    *out(rank, "rank").map_err(|e| e.on(c))? = mc.rank() as c_int;
    Ok(())
}

pub unsafe fn comm_dup(c: MPI_Comm, newcomm: *mut MPI_Comm) -> Res {
    let mc = comm(c)?;
    let o = out(newcomm, "newcomm").map_err(|e| e.on(c))?;
    // A failing copy callback leaves MPI_COMM_NULL (as MPICH does).
    *o = MPI_COMM_NULL;
    let attrs = crate::info::copied_attrs(&mc).map_err(|e| e.on(c))?;
    *o = dup_groups(&mc)?;
    crate::bsend::comm_derived(c, *o);
    crate::topo::copy_to(&mc, *o)?;
    state::set_attrs(*o, attrs);
    Ok(())
}

/// A new communicator of the same group(s) and error handler, in a context of its own, without
/// the attributes. Collective.
pub(crate) fn dup_groups(mc: &MpiComm) -> Result<MPI_Comm, MpiErr> {
    if mc.inter.get().is_some() {
        return crate::inter::dup(mc);
    }
    let all: Vec<usize> = (0..mc.size()).collect();
    let child = mc.comm.new_group(&all).map_err(|e| MpiErr::from(e).on(mc.handle))?.expect("every rank is a member of its dup");
    Ok(state::add_comm(child, mc.errhandler.load(Ordering::Relaxed)))
}

pub unsafe fn comm_dup_with_info(c: MPI_Comm, _info: MPI_Info, newcomm: *mut MPI_Comm) -> Res {
    comm_dup(c, newcomm)
}

pub unsafe fn comm_split(c: MPI_Comm, color: c_int, key: c_int, newcomm: *mut MPI_Comm) -> Res {
    let mc = comm(c)?;
    let o = out(newcomm, "newcomm").map_err(|e| e.on(c))?;
    if color < 0 && color != MPI_UNDEFINED {
        return Err(MpiErr::new(MPI_ERR_ARG, format!("color {color} is negative (only MPI_UNDEFINED may be)")).on(c));
    }
    if mc.inter.get().is_some() {
        *o = crate::inter::split(&mc, color, key)?;
        return Ok(());
    }
    let color = if color == MPI_UNDEFINED { -1 } else { color };
    *o = match mc.comm.split(color, key).map_err(|e| MpiErr::from(e).on(c))? {
        Some(child) => state::add_comm(child, mc.errhandler.load(Ordering::Relaxed)),
        None => MPI_COMM_NULL,
    };
    crate::bsend::comm_derived(c, *o);
    Ok(())
}

pub unsafe fn comm_free(c: *mut MPI_Comm) -> Res {
    active()?;
    let h = out(c, "comm")?;
    if *h != MPI_COMM_WORLD && *h != MPI_COMM_SELF {
        // The delete callbacks run while the comm is still valid (they may query it).
        crate::info::delete_all(&*state::get_comm(*h)?);
    }
    let mc = state::remove_comm(*h)?;
    crate::bsend::forget_comm(*h);
    state::release(mc);
    *h = MPI_COMM_NULL;
    Ok(())
}

/// MPI_Comm_disconnect: collective; returns once every member's pending communication on the
/// comm is done (a barrier after this rank's: the engine completes a send only once its data
/// is out), then frees the comm like MPI_Comm_free. There are no dynamic processes here, so
/// this is all it has to do; the predefined comms are not the program's to disconnect.
pub unsafe fn comm_disconnect(c: *mut MPI_Comm) -> Res {
    active()?;
    let h = *out(c, "comm")?;
    if h == MPI_COMM_WORLD || h == MPI_COMM_SELF {
        return Err(MpiErr::new(MPI_ERR_COMM, "MPI_COMM_WORLD and MPI_COMM_SELF cannot be disconnected").on(h));
    }
    state::get_comm(h)?;
    crate::colls::barrier(h)?;
    comm_free(c)
}

pub unsafe fn comm_compare(a: MPI_Comm, b: MPI_Comm, result: *mut c_int) -> Res {
    let (ca, cb) = (comm(a)?, comm(b)?);
    let r = out(result, "result").map_err(|e| e.on(a))?;
    let (ma, mb) = (ca.group_members(), cb.group_members());
    *r = if Arc::ptr_eq(&ca, &cb) {
        MPI_IDENT
    } else if ca.inter.get().is_some() || cb.inter.get().is_some() {
        crate::inter::compare(&ca, &cb)
    } else if ma == mb {
        MPI_CONGRUENT
    } else {
        let (mut sa, mut sb) = (ma.to_vec(), mb.to_vec());
        sa.sort_unstable();
        sb.sort_unstable();
        if sa == sb {
            MPI_SIMILAR
        } else {
            MPI_UNEQUAL
        }
    };
    Ok(())
}

static ATTR_TAG_UB: c_int = TAG_UB;
static ATTR_FALSE: c_int = 0;
static ATTR_IO: c_int = MPI_ANY_SOURCE;
static ATTR_HOST: c_int = MPI_PROC_NULL;
static ATTR_APPNUM: c_int = 0;
static ATTR_UNIVERSE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);

pub unsafe fn comm_get_attr(c: MPI_Comm, keyval: c_int, value: *mut c_void, flag: *mut c_int) -> Res {
    let _mc = comm(c)?;
    let f = out(flag, "flag").map_err(|e| e.on(c))?;
    let v = out(value as *mut *const c_int, "attribute_val").map_err(|e| e.on(c))?;
    let p: &'static c_int = match keyval {
        MPI_TAG_UB => &ATTR_TAG_UB,
        MPI_WTIME_IS_GLOBAL => &ATTR_FALSE,
        MPI_IO => &ATTR_IO,
        MPI_HOST => &ATTR_HOST,
        MPI_LASTUSEDCODE => crate::errclass::lastused(),
        MPI_APPNUM => &ATTR_APPNUM,
        MPI_UNIVERSE_SIZE => {
            ATTR_UNIVERSE.store(state::get_comm(MPI_COMM_WORLD)?.size() as c_int, Ordering::Relaxed);
            // SAFETY: an AtomicI32 has the layout of an int; it is only written before this read.
            unsafe { &*(ATTR_UNIVERSE.as_ptr() as *const c_int) }
        }
        k if crate::info::is_user_keyval(k) => {
            match crate::info::get_user_attr(&_mc, k) {
                Some(v) => {
                    *(value as *mut usize) = v;
                    *f = 1;
                }
                None => *f = 0,
            }
            return Ok(());
        }
        _ => return Err(MpiErr::new(MPI_ERR_KEYVAL, format!("keyval {keyval} is not a valid attribute key")).on(c)),
    };
    *v = p;
    *f = 1;
    Ok(())
}

// ---- point to point ----------------------------------------------------------------------------

pub(crate) struct P2p {
    pub(crate) mc: CommRef,
}

pub(crate) fn p2p_args(buf: *const c_void, count: i64, dt: MPI_Datatype, peer: c_int, tag: c_int, c: MPI_Comm, recv: bool) -> Result<P2p, MpiErr> {
    let mc = comm(c)?;
    let on = |e: MpiErr| e.on(c);
    crate::packing::checked_len(buf, count, dt).map_err(on)?;
    check_peer(&mc, peer, tag, c, recv)?;
    Ok(P2p { mc })
}

/// The communicator of a probe, after checking its source and tag as a receive's.
pub(crate) fn check_comm_peer(source: c_int, tag: c_int, c: MPI_Comm) -> Result<CommRef, MpiErr> {
    let mc = comm(c)?;
    check_peer(&mc, source, tag, c, true)?;
    Ok(mc)
}

fn check_peer(mc: &MpiComm, peer: c_int, tag: c_int, c: MPI_Comm, recv: bool) -> Res {
    if !peer_ok(mc, peer, recv) {
        let what = if recv { "source" } else { "dest" };
        return Err(MpiErr::new(MPI_ERR_RANK, format!("{what} {peer} is not a rank of the communicator (size {})", mc.comm.size())).on(c));
    }
    if !tag_ok(tag, recv) {
        return Err(MpiErr::new(MPI_ERR_TAG, format!("tag {tag} is outside [0, MPI_TAG_UB = {TAG_UB}]")).on(c));
    }
    Ok(())
}

/// A rank of the communicator (the engine comm's size: the remote group's on an
/// intercommunicator), MPI_PROC_NULL, or for a receive MPI_ANY_SOURCE.
fn peer_ok(mc: &MpiComm, peer: c_int, recv: bool) -> bool {
    (0..mc.comm.size() as c_int).contains(&peer) || peer == MPI_PROC_NULL || (recv && peer == MPI_ANY_SOURCE)
}

/// A receive's checked source and tag as the engine takes them (None: any).
pub(crate) fn engine_source_tag(src: c_int, tag: c_int) -> (Option<usize>, Option<u32>) {
    ((src != MPI_ANY_SOURCE).then_some(src as usize), (tag != MPI_ANY_TAG).then_some(tag as u32))
}

fn tag_ok(tag: c_int, recv: bool) -> bool {
    (0..=TAG_UB).contains(&tag) || (recv && tag == MPI_ANY_TAG)
}

/// Whether a shortcut to the engine may take this peer and tag: both valid, and the peer a real
/// one (not `MPI_PROC_NULL`, which the general path completes at once). `recv`: the wildcards
/// are allowed.
#[inline]
fn direct_target(mc: &MpiComm, peer: c_int, tag: c_int, recv: bool) -> bool {
    peer != MPI_PROC_NULL && peer_ok(mc, peer, recv) && tag_ok(tag, recv)
}

pub(crate) fn start_send(buf: *const c_void, count: i64, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Result<Req, MpiErr> {
    start_send_on(&comm(c)?, buf, count, dt, dest, tag, c)
}

/// `start_send` on the communicator `mc` behind handle `c`, already looked up. The buffer is
/// checked (count, type, NULL) by `outgoing` before the peer, as `p2p_args` orders the checks.
pub(crate) fn start_send_on(mc: &CommRef, buf: *const c_void, count: i64, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Result<Req, MpiErr> {
    let o = crate::packing::outgoing(buf, count, dt).map_err(|e| e.on(c))?;
    check_peer(mc, dest, tag, c, false)?;
    if dest == MPI_PROC_NULL {
        return Ok(Req::Done(request::proc_null_status()));
    }
    // SAFETY: the bytes (the caller's buffer, or our packed copy) stay until the send completes.
    let b = unsafe { ConstBuf::new(o.ptr, o.len) };
    let op = mc.comm.post_send(b, dest as usize, tag as u32).map_err(|e| MpiErr::from(e).on(c))?;
    Ok(crate::packing::wrap(Req::Send { comm: mc.clone(), op }, o.keep, None))
}

/// The two halves of a send-receive: the receive posted first (so two ranks exchanging pass),
/// then the send; if the send cannot start, the receive is withdrawn again, so a call that fails
/// leaves nothing posted into the caller's buffer.
pub(crate) fn start_recv_then_send(recv: Result<Req, MpiErr>, send: impl FnOnce() -> Result<Req, MpiErr>) -> Result<(Req, Req), MpiErr> {
    let r = recv?;
    match send() {
        Ok(s) => Ok((r, s)),
        Err(e) => {
            r.cancel_now();
            Err(e)
        }
    }
}

/// Waits for both halves of a send-receive within the comm's timeout (`request::finish_pair`)
/// and writes the receive's status.
fn finish_recv_and_send(r: Req, s: Req, st: *mut MPI_Status) -> Res {
    let timeout_ms = r.comm().or(s.comm()).map_or(0, |c| c.comm.timeout_ms());
    write_status(st, request::finish_pair(r, s, &LazyDeadline::new(timeout_ms))?);
    Ok(())
}

pub(crate) fn start_recv(buf: *mut c_void, count: i64, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm) -> Result<Req, MpiErr> {
    start_recv_on(&comm(c)?, buf, count, dt, src, tag, c)
}

/// `start_recv` on the communicator `mc` behind handle `c`, already looked up (checks ordered
/// as in `start_send_on`).
pub(crate) fn start_recv_on(mc: &CommRef, buf: *mut c_void, count: i64, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm) -> Result<Req, MpiErr> {
    let i = crate::packing::incoming(buf, count, dt).map_err(|e| e.on(c))?;
    check_peer(mc, src, tag, c, true)?;
    if src == MPI_PROC_NULL {
        return Ok(Req::Done(request::proc_null_status()));
    }
    // SAFETY: the bytes (the caller's buffer, or our packed one) stay until the receive completes.
    let b = unsafe { MutBuf::new(i.ptr, i.len) };
    let (src, tag) = engine_source_tag(src, tag);
    let op = mc.comm.post_recv(b, src, tag).map_err(|e| MpiErr::from(e).on(c))?;
    Ok(crate::packing::wrap_recv(Req::Recv { comm: mc.clone(), op }, i.tmp))
}

// The blocking calls wait for what they start at once (see `distcomm::transport::waits_at_once`).
pub unsafe fn send_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Res {
    let mc = comm(c)?;
    match send_direct(&mc, buf, count, dt, dest, tag) {
        Some(r) => r,
        None => waits_at_once(|| start_send_on(&mc, buf, count, dt, dest, tag, c)?.finish().map(|_| ())),
    }
}

/// `MPI_Send` in its commonest form (a dense predefined type, a valid buffer, peer and tag,
/// not MPI_PROC_NULL) straight on the engine, without a request (as `recv_direct`). None:
/// the general path, which also reports every error.
fn send_direct(mc: &MpiComm, buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int) -> Option<Res> {
    let len = crate::packing::dense_run(buf, count, dt)?;
    if !direct_target(mc, dest, tag, false) {
        return None;
    }
    // SAFETY: checked above; the caller's buffer stays until the send is waited for.
    let b = unsafe { ConstBuf::new(buf as *const u8, len) };
    let sent = waits_at_once_up_to(len, || {
        let op = mc.comm.post_send(b, dest as usize, tag as u32)?;
        mc.comm.wait_p2p_started(&op, &|| "MPI send".to_string())
    });
    Some(sent.map(|_| ()).map_err(|e| err::from_engine(&e).on(mc.handle)))
}

pub unsafe fn send(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Res {
    send_c(buf, count as MPI_Count, dt, dest, tag, c)
}

pub unsafe fn recv_c(buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm, st: *mut MPI_Status) -> Res {
    let mc = comm(c)?;
    let s = match recv_direct(&mc, buf, count, dt, src, tag) {
        Some(r) => r,
        None => waits_at_once(|| start_recv_on(&mc, buf, count, dt, src, tag, c)?.finish()),
    }?;
    write_status(st, s);
    Ok(())
}

/// `MPI_Recv` in its commonest form (a dense predefined type, a valid buffer, source and tag,
/// not MPI_PROC_NULL) straight on the engine, without a request. None: the general path,
/// which also reports every error.
fn recv_direct(mc: &MpiComm, buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, src: c_int, tag: c_int) -> Option<Result<MPI_Status, MpiErr>> {
    let len = crate::packing::dense_run(buf as *const c_void, count, dt)?;
    if !direct_target(mc, src, tag, true) {
        return None;
    }
    // SAFETY: checked above; the caller's buffer stays until the receive is waited for.
    let b = unsafe { MutBuf::new(buf as *mut u8, len) };
    let deadline = LazyDeadline::new(mc.comm.timeout_ms());
    let (src, tag) = engine_source_tag(src, tag);
    Some(waits_at_once_up_to(len, || request::recv_blocking(mc, b, src, tag, &deadline)))
}

pub unsafe fn recv(buf: *mut c_void, count: c_int, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm, st: *mut MPI_Status) -> Res {
    recv_c(buf, count as MPI_Count, dt, src, tag, c, st)
}

pub unsafe fn isend_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    let r = out(req, "request").map_err(|e| e.on(c))?;
    *r = request::add(start_send(buf, count, dt, dest, tag, c)?);
    Ok(())
}

pub unsafe fn isend(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    isend_c(buf, count as MPI_Count, dt, dest, tag, c, req)
}

pub unsafe fn irecv_c(buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    let r = out(req, "request").map_err(|e| e.on(c))?;
    *r = request::add(start_recv(buf, count, dt, src, tag, c)?);
    Ok(())
}

pub unsafe fn irecv(buf: *mut c_void, count: c_int, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    irecv_c(buf, count as MPI_Count, dt, src, tag, c, req)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn sendrecv_c(
    sbuf: *const c_void,
    scount: MPI_Count,
    sdt: MPI_Datatype,
    dest: c_int,
    stag: c_int,
    rbuf: *mut c_void,
    rcount: MPI_Count,
    rdt: MPI_Datatype,
    src: c_int,
    rtag: c_int,
    c: MPI_Comm,
    st: *mut MPI_Status,
) -> Res {
    let mc = comm(c)?;
    match sendrecv_direct(&mc, (sbuf, scount, sdt, dest, stag), (rbuf, rcount, rdt, src, rtag), st) {
        Some(r) => r,
        None => waits_at_once(|| sendrecv_general(&mc, (sbuf, scount, sdt, dest, stag), (rbuf, rcount, rdt, src, rtag), c, st)),
    }
}

/// `MPI_Sendrecv` through requests: every form, and every error reported. Out of line, so that
/// the shortcut's path through the export stays small.
#[inline(never)]
fn sendrecv_general(
    mc: &CommRef,
    (sbuf, scount, sdt, dest, stag): (*const c_void, MPI_Count, MPI_Datatype, c_int, c_int),
    (rbuf, rcount, rdt, src, rtag): (*mut c_void, MPI_Count, MPI_Datatype, c_int, c_int),
    c: MPI_Comm,
    st: *mut MPI_Status,
) -> Res {
    let (r, s) = start_recv_then_send(start_recv_on(mc, rbuf, rcount, rdt, src, rtag, c), || start_send_on(mc, sbuf, scount, sdt, dest, stag, c))?;
    finish_recv_and_send(r, s, st)
}

/// `MPI_Sendrecv` in its commonest form (dense predefined types, valid buffers, peers and tags,
/// neither peer MPI_PROC_NULL) straight on the engine's operations, without requests (it
/// costs about 250 instructions less per call). None: the general path, which also reports
/// every error.
#[inline(always)]
fn sendrecv_direct(
    mc: &MpiComm,
    (sbuf, scount, sdt, dest, stag): (*const c_void, MPI_Count, MPI_Datatype, c_int, c_int),
    (rbuf, rcount, rdt, src, rtag): (*mut c_void, MPI_Count, MPI_Datatype, c_int, c_int),
    st: *mut MPI_Status,
) -> Option<Res> {
    let slen = crate::packing::dense_run(sbuf, scount, sdt)?;
    let rlen = crate::packing::dense_run(rbuf as *const c_void, rcount, rdt)?;
    if !direct_target(mc, dest, stag, false) || !direct_target(mc, src, rtag, true) {
        return None;
    }
    // SAFETY: checked above; the caller's buffers stay until both operations are waited for.
    let (sb, rb) = unsafe { (ConstBuf::new(sbuf as *const u8, slen), MutBuf::new(rbuf as *mut u8, rlen)) };
    let (from, tag) = engine_source_tag(src, rtag);
    Some(waits_at_once_up_to(slen.max(rlen), || exchange(mc, (sb, dest as usize, stag as u32), (rb, from, tag), st)))
}

/// `sendrecv_direct`'s exchange on the engine, its arguments checked: a send that failed is
/// the error reported, otherwise the receive's error or status.
#[inline(always)]
fn exchange(mc: &MpiComm, send: (ConstBuf, usize, u32), recv: (MutBuf, Option<usize>, Option<u32>), st: *mut MPI_Status) -> Res {
    let deadline = LazyDeadline::new(mc.comm.timeout_ms());
    let what = (&|| "MPI send".to_string(), &|| "MPI receive".to_string());
    match mc.comm.sendrecv(send, recv, &|| deadline.get(), (&what.0, &what.1)) {
        Exchanged::Failed(e) => Err(err::from_engine(&e).on(mc.handle)),
        Exchanged::Both { sent, got } => {
            sent.map_err(|e| err::from_engine(&e).on(mc.handle))?;
            write_status(st, request::recv_status(mc, got)?);
            Ok(())
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn sendrecv(
    sbuf: *const c_void,
    scount: c_int,
    sdt: MPI_Datatype,
    dest: c_int,
    stag: c_int,
    rbuf: *mut c_void,
    rcount: c_int,
    rdt: MPI_Datatype,
    src: c_int,
    rtag: c_int,
    c: MPI_Comm,
    st: *mut MPI_Status,
) -> Res {
    sendrecv_c(sbuf, scount as MPI_Count, sdt, dest, stag, rbuf, rcount as MPI_Count, rdt, src, rtag, c, st)
}

// ---- completion ---------------------------------------------------------------------------------

/// Errors of a request go to its communicator's handler (MPI_COMM_WORLD's before it has one).
pub unsafe fn wait(req: *mut MPI_Request, st: *mut MPI_Status) -> Res {
    active()?;
    let h = out(req, "request")?;
    if *h == MPI_REQUEST_NULL {
        write_status(st, request::empty_status());
        return Ok(());
    }
    write_status(st, request::complete(h)?);
    Ok(())
}

pub unsafe fn test(req: *mut MPI_Request, flag: *mut c_int, st: *mut MPI_Status) -> Res {
    active()?;
    let h = out(req, "request")?;
    let f = out(flag, "flag")?;
    if *h == MPI_REQUEST_NULL {
        *f = 1;
        write_status(st, request::empty_status());
        return Ok(());
    }
    let r = request::take(*h)?;
    let done = r.is_done();
    request::put_back(*h, r);
    if !done {
        *f = 0;
        return Ok(());
    }
    *f = 1;
    write_status(st, request::complete(h)?);
    Ok(())
}

pub unsafe fn request_free(req: *mut MPI_Request) -> Res {
    active()?;
    let h = out(req, "request")?;
    if *h == MPI_REQUEST_NULL {
        return mpi_err!(MPI_ERR_REQUEST, "MPI_REQUEST_NULL cannot be freed");
    }
    // The operation goes on (the engine holds what it needs); nobody will look at its result.
    let r = request::take(*h)?;
    if let Req::Generalized(g) = r {
        let hv = std::mem::replace(h, MPI_REQUEST_NULL);
        return g.release(hv);
    }
    request::release(*h);
    *h = MPI_REQUEST_NULL;
    match r {
        Req::Coll { req, after, .. } => {
            // A collective's follow-up (e.g. a copy into the caller's buffer) still has to run.
            std::thread::spawn(move || {
                if req.wait().is_ok() {
                    if let Some(f) = after {
                        f();
                    }
                }
            });
        }
        Req::Packed(p) => {
            // A freed receive still delivers into the caller's buffer; ours must outlive it.
            std::thread::spawn(move || {
                let _ = Req::Packed(p).finish();
            });
        }
        other => drop(other),
    }
    Ok(())
}

fn reqs<'a>(n: c_int, p: *mut MPI_Request) -> Result<&'a mut [MPI_Request], MpiErr> {
    if n < 0 {
        return mpi_err!(MPI_ERR_COUNT, "count {n} is negative");
    }
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return mpi_err!(MPI_ERR_ARG, "array_of_requests is NULL");
    }
    // SAFETY: the caller's array holds `n` requests.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n as usize) })
}

fn status_at(sts: *mut MPI_Status, i: usize) -> *mut MPI_Status {
    if sts.is_null() {
        sts
    } else {
        // SAFETY: the caller's status array has one entry per request.
        unsafe { sts.add(i) }
    }
}

fn timeout_of(hs: &[MPI_Request]) -> i64 {
    let _ = hs;
    state::world_timeout_ms().unwrap_or(300_000)
}

pub unsafe fn waitall(n: c_int, rq: *mut MPI_Request, sts: *mut MPI_Status) -> Res {
    active()?;
    let hs = reqs(n, rq)?;
    let mut failed: Option<MpiErr> = None;
    // Take every request first: an invalid handle fails the call before anything is waited on.
    for (i, h) in hs.iter_mut().enumerate() {
        if *h == MPI_REQUEST_NULL {
            write_status(status_at(sts, i), request::empty_status());
            continue;
        }
        match request::complete(h) {
            Ok(s) => {
                if let Some(p) = unsafe { status_at(sts, i).as_mut() } {
                    *p = s;
                    p.MPI_ERROR = MPI_SUCCESS;
                }
            }
            Err(e) => {
                if let Some(p) = unsafe { status_at(sts, i).as_mut() } {
                    p.MPI_ERROR = e.class;
                }
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        None => Ok(()),
        Some(e) if sts.is_null() => Err(e),
        Some(e) => Err(MpiErr { class: MPI_ERR_IN_STATUS, msg: format!("a request failed (see the statuses): {}", e.msg), comm: e.comm }),
    }
}

pub unsafe fn testall(n: c_int, rq: *mut MPI_Request, flag: *mut c_int, sts: *mut MPI_Status) -> Res {
    active()?;
    let hs = reqs(n, rq)?;
    let f = out(flag, "flag")?;
    // Complete only when all are done (the standard: none is completed otherwise).
    for &h in hs.iter() {
        if h == MPI_REQUEST_NULL {
            continue;
        }
        let r = request::take(h)?;
        let done = r.is_done();
        request::put_back(h, r);
        if !done {
            *f = 0;
            return Ok(());
        }
    }
    *f = 1;
    waitall(n, rq, sts)
}

/// Index of a completed request among `hs` (after polling every active one), or None if none
/// is active; `block` waits until one completes.
fn any(hs: &mut [MPI_Request], block: bool) -> Result<Option<Option<usize>>, MpiErr> {
    let mut backoff = request::Backoff::new(timeout_of(hs));
    loop {
        let mut active_seen = false;
        for (i, &h) in hs.iter().enumerate() {
            if !request::is_active(h)? {
                continue;
            }
            active_seen = true;
            let r = request::take(h)?;
            let done = r.is_done();
            request::put_back(h, r);
            if done {
                return Ok(Some(Some(i)));
            }
        }
        if !active_seen {
            return Ok(Some(None));
        }
        if !block {
            return Ok(None);
        }
        backoff.pause()?;
    }
}

pub unsafe fn waitany(n: c_int, rq: *mut MPI_Request, index: *mut c_int, st: *mut MPI_Status) -> Res {
    active()?;
    let hs = reqs(n, rq)?;
    let idx = out(index, "index")?;
    match any(hs, true)?.flatten() {
        None => {
            *idx = MPI_UNDEFINED;
            write_status(st, request::empty_status());
            Ok(())
        }
        Some(i) => {
            *idx = i as c_int;
            write_status(st, request::complete(&mut hs[i])?);
            Ok(())
        }
    }
}

pub unsafe fn testany(n: c_int, rq: *mut MPI_Request, index: *mut c_int, flag: *mut c_int, st: *mut MPI_Status) -> Res {
    active()?;
    let hs = reqs(n, rq)?;
    let idx = out(index, "index")?;
    let f = out(flag, "flag")?;
    match any(hs, false)? {
        None => {
            *f = 0;
            *idx = MPI_UNDEFINED;
            Ok(())
        }
        Some(None) => {
            *f = 1;
            *idx = MPI_UNDEFINED;
            write_status(st, request::empty_status());
            Ok(())
        }
        Some(Some(i)) => {
            *f = 1;
            *idx = i as c_int;
            write_status(st, request::complete(&mut hs[i])?);
            Ok(())
        }
    }
}

// ---- collectives: see colls.rs ------------------------------------------------------------------

pub use crate::colls::*;
pub use crate::colltypes::{alltoallw, alltoallw_c, ialltoallw, ialltoallw_c};
pub use crate::typeapi::*;
pub use crate::envfns::*;
pub use crate::extras::{
    get_address, isendrecv, isendrecv_c, isendrecv_replace, isendrecv_replace_c, request_get_status_all, request_get_status_any,
    request_get_status_some, status_get_error, status_get_source, status_get_tag, status_set_error, status_set_source, status_set_tag,
};
pub use crate::groupops::{group_difference, group_intersection, group_range_excl, group_range_incl, group_union};
pub use crate::probe::{improbe, imrecv, imrecv_c, iprobe, mprobe, mrecv, mrecv_c, probe};
pub use crate::pcoll::*;
pub use crate::greq::{grequest_complete, grequest_start};
pub use crate::topo::{
    cart_coords, cart_create, cart_get, cart_map, cart_rank, cart_shift, cart_sub, cartdim_get, dims_create, dist_graph_create, dist_graph_create_adjacent, dist_graph_neighbors,
    dist_graph_neighbors_count, graph_create, graph_get, graph_map, graph_neighbors, graph_neighbors_count, graphdims_get, topo_test,
};
pub use crate::neighbor::*;
pub use crate::persist::{
    bsend_init, bsend_init_c, cancel, issend, issend_c, recv_init, recv_init_c, rsend_init, rsend_init_c, send_init, send_init_c, ssend,
    ssend_c, ssend_init, ssend_init_c, start, startall,
};

// ---- user operations ---------------------------------------------------------------------------

pub unsafe fn op_create(f: Option<MPI_User_function>, commute: c_int, o: *mut MPI_Op) -> Res {
    let p = out(o, "op")?;
    *p = op::create(f.map(op::UserFn::Int), commute != 0)?;
    Ok(())
}

pub unsafe fn op_create_c(f: Option<MPI_User_function_c>, commute: c_int, o: *mut MPI_Op) -> Res {
    let p = out(o, "op")?;
    *p = op::create(f.map(op::UserFn::Large), commute != 0)?;
    Ok(())
}

pub unsafe fn op_commutative(o: MPI_Op, commute: *mut c_int) -> Res {
    let p = out(commute, "commute")?;
    *p = op::commutative(o)? as c_int;
    Ok(())
}

pub unsafe fn op_free(o: *mut MPI_Op) -> Res {
    let p = out(o, "op")?;
    op::free(*p)?;
    *p = MPI_OP_NULL;
    Ok(())
}

// ---- more environment, datatypes, statuses ----------------------------------------------------

pub unsafe fn alloc_mem(size: MPI_Aint, _info: MPI_Info, baseptr: *mut c_void) -> Res {
    let out = out(baseptr as *mut *mut c_void, "baseptr")?;
    if size < 0 {
        return mpi_err!(MPI_ERR_SIZE, "size {size} is negative");
    }
    // SAFETY: malloc of at least one byte; freed by MPI_Free_mem.
    let p = unsafe { libc::malloc((size as usize).max(1)) };
    if p.is_null() {
        return mpi_err!(MPI_ERR_NO_MEM, "cannot allocate {size} bytes");
    }
    *out = p;
    Ok(())
}

pub unsafe fn free_mem(base: *mut c_void) -> Res {
    // SAFETY: memory from MPI_Alloc_mem (malloc), or NULL.
    unsafe { libc::free(base) };
    Ok(())
}

pub unsafe fn status_set_cancelled(st: *mut MPI_Status, flag: c_int) -> Res {
    out(st, "status")?.MPI_internal[2] = (flag != 0) as c_int;
    Ok(())
}

pub unsafe fn test_cancelled(st: *const MPI_Status, flag: *mut c_int) -> Res {
    let s = unsafe { st.as_ref() }.ok_or_else(|| MpiErr::new(MPI_ERR_ARG, "status is NULL"))?;
    *out(flag, "flag")? = (s.MPI_internal[2] != 0) as c_int;
    Ok(())
}

// ---- more completion ------------------------------------------------------------------------------

pub unsafe fn request_get_status(h: MPI_Request, flag: *mut c_int, st: *mut MPI_Status) -> Res {
    active()?;
    let f = out(flag, "flag")?;
    if h == MPI_REQUEST_NULL {
        *f = 1;
        write_status(st, request::empty_status());
        return Ok(());
    }
    let mut r = request::take(h)?;
    let got = r.peek();
    request::put_back(h, r);
    match got {
        None => *f = 0,
        Some(res) => {
            *f = 1;
            write_status(st, res?);
        }
    }
    Ok(())
}

/// Waitsome/Testsome: completes every request that is done (at least one when `block`).
fn some(n: c_int, rq: *mut MPI_Request, outcount: *mut c_int, indices: *mut c_int, sts: *mut MPI_Status, block: bool) -> Res {
    active()?;
    let hs = reqs(n, rq)?;
    let oc = out(outcount, "outcount")?;
    let mut backoff = request::Backoff::new(timeout_of(hs));
    loop {
        let mut active_seen = false;
        let mut done = Vec::new();
        for (i, &h) in hs.iter().enumerate() {
            if !request::is_active(h)? {
                continue;
            }
            active_seen = true;
            let r = request::take(h)?;
            let finished = r.is_done();
            request::put_back(h, r);
            if finished {
                done.push(i);
            }
        }
        if !active_seen {
            *oc = MPI_UNDEFINED;
            return Ok(());
        }
        if !done.is_empty() || !block {
            if !done.is_empty() && indices.is_null() {
                return mpi_err!(MPI_ERR_ARG, "array_of_indices is NULL");
            }
            *oc = done.len() as c_int;
            let mut failed = None;
            for (k, i) in done.into_iter().enumerate() {
                // SAFETY: the caller's index array holds incount entries.
                unsafe { *indices.add(k) = i as c_int };
                match request::complete(&mut hs[i]) {
                    Ok(s) => {
                        if let Some(p) = unsafe { status_at(sts, k).as_mut() } {
                            *p = s;
                            p.MPI_ERROR = MPI_SUCCESS;
                        }
                    }
                    Err(e) => {
                        if let Some(p) = unsafe { status_at(sts, k).as_mut() } {
                            p.MPI_ERROR = e.class;
                        }
                        failed.get_or_insert(e);
                    }
                }
            }
            return match failed {
                None => Ok(()),
                Some(e) if sts.is_null() => Err(e),
                Some(e) => Err(MpiErr { class: MPI_ERR_IN_STATUS, msg: format!("a request failed (see the statuses): {}", e.msg), comm: e.comm }),
            };
        }
        backoff.pause()?;
    }
}

pub unsafe fn waitsome(n: c_int, rq: *mut MPI_Request, outcount: *mut c_int, indices: *mut c_int, sts: *mut MPI_Status) -> Res {
    some(n, rq, outcount, indices, sts, true)
}

pub unsafe fn testsome(n: c_int, rq: *mut MPI_Request, outcount: *mut c_int, indices: *mut c_int, sts: *mut MPI_Status) -> Res {
    some(n, rq, outcount, indices, sts, false)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn sendrecv_replace_c(buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, stag: c_int, src: c_int, rtag: c_int, c: MPI_Comm, st: *mut MPI_Status) -> Res {
    // The send goes out of a packed copy, so the receive may go straight into the buffer.
    let copy = crate::packing::pack_copy(buf, count, dt).map_err(|e| e.on(c))?;
    let (r, s) = start_recv_then_send(start_recv(buf, count, dt, src, rtag, c), || {
        start_send(copy.as_ptr() as *const c_void, copy.len() as i64, MPI_BYTE, dest, stag, c)
    })?;
    // `copy` outlives the send it is sent from.
    let r = finish_recv_and_send(r, s, st);
    drop(copy);
    r
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn sendrecv_replace(buf: *mut c_void, count: c_int, dt: MPI_Datatype, dest: c_int, stag: c_int, src: c_int, rtag: c_int, c: MPI_Comm, st: *mut MPI_Status) -> Res {
    sendrecv_replace_c(buf, count as MPI_Count, dt, dest, stag, src, rtag, c, st)
}

// ---- more communicators, groups --------------------------------------------------------------

pub unsafe fn comm_set_name(c: MPI_Comm, name: *const c_char) -> Res {
    let mc = comm(c)?;
    if name.is_null() {
        return Err(MpiErr::new(MPI_ERR_ARG, "comm_name is NULL").on(c));
    }
    // SAFETY: a NUL-terminated string from the caller.
    let s = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
    let max = MPI_MAX_OBJECT_NAME as usize - 1;
    let mut s = s.into_owned();
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    *mc.name.lock().unwrap_or_else(|p| p.into_inner()) = s;
    Ok(())
}

pub unsafe fn comm_get_name(c: MPI_Comm, name: *mut c_char, len: *mut c_int) -> Res {
    if c == MPI_COMM_NULL {
        active()?;
        return put_str("MPI_COMM_NULL", name, len, MPI_MAX_OBJECT_NAME as usize);
    }
    let mc = comm(c)?;
    let s = mc.name.lock().unwrap_or_else(|p| p.into_inner()).clone();
    put_str(&s, name, len, MPI_MAX_OBJECT_NAME as usize).map_err(|e| e.on(c))
}

pub unsafe fn comm_group(c: MPI_Comm, g: *mut MPI_Group) -> Res {
    let mc = comm(c)?;
    *out(g, "group").map_err(|e| e.on(c))? = crate::group::add(mc.group_members());
    Ok(())
}

fn my_world_rank() -> Result<u32, MpiErr> {
    Ok(state::get_comm(MPI_COMM_WORLD)?.rank() as u32)
}

pub unsafe fn group_size(g: MPI_Group, size: *mut c_int) -> Res {
    active()?;
    *out(size, "size")? = crate::group::get(g)?.len() as c_int;
    Ok(())
}

pub unsafe fn group_rank(g: MPI_Group, rank: *mut c_int) -> Res {
    active()?;
    let m = crate::group::get(g)?;
    let me = my_world_rank()?;
    *out(rank, "rank")? = m.iter().position(|&w| w == me).map_or(MPI_UNDEFINED, |r| r as c_int);
    Ok(())
}

fn rank_list<'a>(n: c_int, ranks: *const c_int, gsize: usize) -> Result<&'a [c_int], MpiErr> {
    if n < 0 {
        return mpi_err!(MPI_ERR_ARG, "n = {n} is negative");
    }
    if n == 0 {
        return Ok(&[]);
    }
    if ranks.is_null() {
        return mpi_err!(MPI_ERR_ARG, "ranks is NULL");
    }
    // SAFETY: the caller's array holds n ranks.
    let r = unsafe { std::slice::from_raw_parts(ranks, n as usize) };
    for (i, &x) in r.iter().enumerate() {
        if x < 0 || x as usize >= gsize {
            return mpi_err!(MPI_ERR_RANK, "ranks[{i}] = {x} is not a rank of the group (size {gsize})");
        }
        if r[..i].contains(&x) {
            return mpi_err!(MPI_ERR_RANK, "rank {x} is listed twice");
        }
    }
    Ok(r)
}

pub unsafe fn group_incl(g: MPI_Group, n: c_int, ranks: *const c_int, newgroup: *mut MPI_Group) -> Res {
    active()?;
    let m = crate::group::get(g)?;
    let o = out(newgroup, "newgroup")?;
    let r = rank_list(n, ranks, m.len())?;
    *o = crate::group::add(r.iter().map(|&i| m[i as usize]).collect());
    Ok(())
}

pub unsafe fn group_excl(g: MPI_Group, n: c_int, ranks: *const c_int, newgroup: *mut MPI_Group) -> Res {
    active()?;
    let m = crate::group::get(g)?;
    let o = out(newgroup, "newgroup")?;
    let r = rank_list(n, ranks, m.len())?;
    *o = crate::group::add(m.iter().enumerate().filter(|(i, _)| !r.contains(&(*i as c_int))).map(|(_, &w)| w).collect());
    Ok(())
}

pub unsafe fn group_translate_ranks(g1: MPI_Group, n: c_int, r1: *const c_int, g2: MPI_Group, r2: *mut c_int) -> Res {
    active()?;
    let (m1, m2) = (crate::group::get(g1)?, crate::group::get(g2)?);
    if n < 0 {
        return mpi_err!(MPI_ERR_ARG, "n = {n} is negative");
    }
    if n > 0 && (r1.is_null() || r2.is_null()) {
        return mpi_err!(MPI_ERR_ARG, "ranks1 or ranks2 is NULL");
    }
    for i in 0..n as usize {
        // SAFETY: both caller arrays hold n entries.
        let x = unsafe { *r1.add(i) };
        let y = if x == MPI_PROC_NULL {
            MPI_PROC_NULL
        } else if x < 0 || x as usize >= m1.len() {
            return mpi_err!(MPI_ERR_RANK, "ranks1[{i}] = {x} is not a rank of group1 (size {})", m1.len());
        } else {
            m2.iter().position(|&w| w == m1[x as usize]).map_or(MPI_UNDEFINED, |p| p as c_int)
        };
        unsafe { *r2.add(i) = y };
    }
    Ok(())
}

pub unsafe fn group_compare(g1: MPI_Group, g2: MPI_Group, result: *mut c_int) -> Res {
    active()?;
    let (a, b) = (crate::group::get(g1)?, crate::group::get(g2)?);
    let r = out(result, "result")?;
    *r = if a == b {
        MPI_IDENT
    } else {
        let (mut x, mut y) = (a.to_vec(), b.to_vec());
        x.sort_unstable();
        y.sort_unstable();
        if x == y {
            MPI_SIMILAR
        } else {
            MPI_UNEQUAL
        }
    };
    Ok(())
}

pub unsafe fn group_free(g: *mut MPI_Group) -> Res {
    active()?;
    let h = out(g, "group")?;
    crate::group::free(*h)?;
    *h = MPI_GROUP_NULL;
    Ok(())
}

/// MPI_Comm_create: collective over `c`; the group must be a subset of its members.
pub unsafe fn comm_create(c: MPI_Comm, g: MPI_Group, newcomm: *mut MPI_Comm) -> Res {
    let mc = comm(c)?;
    let o = out(newcomm, "newcomm").map_err(|e| e.on(c))?;
    let m = crate::group::get(g).map_err(|e| e.on(c))?;
    if mc.inter.get().is_some() {
        *o = crate::inter::create(&mc, &m)?;
        return Ok(());
    }
    let members = mc.comm.members();
    let mut ranks = Vec::with_capacity(m.len());
    for &w in m.iter() {
        match members.iter().position(|&x| x == w) {
            Some(r) => ranks.push(r),
            None => return Err(MpiErr::new(MPI_ERR_GROUP, format!("world rank {w} of the group is not a member of the communicator")).on(c)),
        }
    }
    // Ranks may pass different groups if they are disjoint (one new comm per group, MPI 2.2):
    // a split with the group's first member as color, the place in the group as key.
    let color = match ranks.iter().position(|&r| r == mc.rank()) {
        Some(_) => ranks[0] as c_int,
        None => -1,
    };
    let key = ranks.iter().position(|&r| r == mc.rank()).unwrap_or(0) as c_int;
    *o = match mc.comm.split(color, key).map_err(|e| MpiErr::from(e).on(c))? {
        Some(child) => state::add_comm(child, mc.errhandler.load(Ordering::Relaxed)),
        None => MPI_COMM_NULL,
    };
    crate::bsend::comm_derived(c, *o);
    Ok(())
}

pub use crate::splittype::comm_split_type;

// ---- ready and buffered sends ---------------------------------------------------------------------

// A ready send may be a standard send (the standard: it differs only in what the program
// promises, that the receive is posted).
pub unsafe fn rsend_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Res {
    send_c(buf, count, dt, dest, tag, c)
}
pub unsafe fn rsend(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Res {
    send_c(buf, count as MPI_Count, dt, dest, tag, c)
}
pub unsafe fn irsend_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    isend_c(buf, count, dt, dest, tag, c, req)
}
pub unsafe fn irsend(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    isend_c(buf, count as MPI_Count, dt, dest, tag, c, req)
}

pub use crate::bsend::*;
pub use crate::partitioned::{parrived, precv_init, pready, pready_list, pready_range, psend_init};
pub use crate::failure_ack::{x_comm_failure_ack, x_comm_failure_get_acked};
pub use crate::commnew::{comm_create_group, comm_get_parent, comm_idup, comm_idup_with_info};
pub use crate::inter::{comm_remote_group, comm_remote_size, comm_test_inter, intercomm_create, intercomm_create_from_groups, intercomm_merge};

// ---- info and attributes: see info.rs -------------------------------------------------------------

// MPI-1's names of the communicator attribute functions (deprecated, still in the ABI).
pub use self::comm_get_attr as attr_get;
pub use crate::info::{
    comm_create_keyval as keyval_create, comm_delete_attr as attr_delete, comm_free_keyval as keyval_free,
    comm_set_attr as attr_put,
};
pub use crate::info::{
    comm_create_keyval, comm_delete_attr, comm_free_keyval, comm_set_attr, info_create, info_delete, info_dup, info_free, info_get,
    info_get_nkeys, info_get_nthkey, info_get_string, info_get_valuelen, info_set,
};

/// MPI_Pcontrol: profiling control; this library has no profiling levels, so it is a no-op
/// (the standard lets an implementation ignore it).
pub unsafe fn pcontrol(_level: c_int) -> Res {
    Ok(())
}

/// MPI_Comm_get_info: a new info object with the hints in use (none are read yet).
pub unsafe fn comm_get_info(c: MPI_Comm, info: *mut MPI_Info) -> Res {
    let _ = comm(c)?;
    crate::info::info_create(info).map_err(|e| e.on(c))
}

/// MPI_Comm_set_info: hints may be ignored (the standard's words); the info must be valid.
pub unsafe fn comm_set_info(c: MPI_Comm, info: MPI_Info) -> Res {
    let _ = comm(c)?;
    let mut n = 0;
    crate::info::info_get_nkeys(info, &mut n).map_err(|e| e.on(c))
}

// ---- sessions, windows, files, datatype attributes: see session.rs, win.rs, file.rs, keyval.rs ----

pub use crate::win::{
    win_create_c, win_create, win_allocate_c, win_allocate, win_allocate_shared_c, win_allocate_shared, win_create_dynamic, win_attach, win_detach, win_shared_query_c,
    win_shared_query, win_free, win_fence, win_post, win_start, win_complete, win_wait, win_test, win_lock, win_unlock, win_lock_all, win_unlock_all, win_flush, win_flush_local,
    win_flush_all, win_flush_local_all, win_sync, put_c, put, get_c, get, accumulate_c, accumulate, get_accumulate_c,
    get_accumulate, fetch_and_op, compare_and_swap, rput_c, rput, rget_c, rget, raccumulate_c, raccumulate,
    rget_accumulate_c, rget_accumulate, win_get_attr, win_set_attr, win_delete_attr, win_create_keyval,
    win_free_keyval, win_set_name, win_get_name, win_get_group, win_set_info, win_get_info, win_create_errhandler,
    win_set_errhandler, win_get_errhandler, win_call_errhandler,
};
pub use crate::file::{
    register_datarep, register_datarep_c, file_call_errhandler, file_close, file_create_errhandler, file_delete, file_get_amode, file_get_atomicity, file_get_byte_offset, file_get_errhandler, file_get_group, file_get_info, file_get_position, file_get_position_shared, file_get_size, file_get_type_extent, file_get_type_extent_c, file_get_view, file_iread, file_iread_all, file_iread_all_c, file_iread_at, file_iread_at_all, file_iread_at_all_c, file_iread_at_c, file_iread_c, file_iread_shared, file_iread_shared_c, file_iwrite, file_iwrite_all, file_iwrite_all_c, file_iwrite_at, file_iwrite_at_all, file_iwrite_at_all_c, file_iwrite_at_c, file_iwrite_c, file_iwrite_shared, file_iwrite_shared_c, file_open, file_preallocate, file_read, file_read_all, file_read_all_begin, file_read_all_begin_c, file_read_all_c, file_read_all_end, file_read_at, file_read_at_all, file_read_at_all_begin, file_read_at_all_begin_c, file_read_at_all_c, file_read_at_all_end, file_read_at_c, file_read_c, file_read_ordered, file_read_ordered_begin, file_read_ordered_begin_c, file_read_ordered_c, file_read_ordered_end, file_read_shared, file_read_shared_c, file_seek, file_seek_shared, file_set_atomicity, file_set_errhandler, file_set_info, file_set_size, file_set_view, file_sync, file_write, file_write_all, file_write_all_begin, file_write_all_begin_c, file_write_all_c, file_write_all_end, file_write_at, file_write_at_all, file_write_at_all_begin, file_write_at_all_begin_c, file_write_at_all_c, file_write_at_all_end, file_write_at_c, file_write_c, file_write_ordered, file_write_ordered_begin, file_write_ordered_begin_c, file_write_ordered_c, file_write_ordered_end, file_write_shared, file_write_shared_c,
};
pub use crate::session::{
    comm_create_from_group, session_init, session_finalize, session_get_num_psets, session_get_nth_pset,
    session_get_pset_info, session_get_info, group_from_session_pset, session_create_errhandler, session_set_errhandler,
    session_get_errhandler, session_call_errhandler,
};
pub use crate::keyval::{
    type_create_keyval, type_free_keyval, type_set_attr, type_get_attr, type_delete_attr,
};
