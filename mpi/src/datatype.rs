//! Datatype handles: the standard's predefined ones (size, extent, what reductions see) and
//! derived ones (every constructor of MPI 5.0; darray in darray.rs), each with its type map
//! (`typemap::Layout`) and the arguments it was made with (MPI_Type_get_envelope/contents).

use crate::abi_gen::*;
use crate::err::MpiErr;
use crate::typemap::{Layout, MapErr, Part, Run, SigSeg};
use distcomm::DType;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex};

/// Handles of derived datatypes: TYPE_BASE + slot.
pub const TYPE_BASE: usize = 0x6000_0000;

/// A datatype: its summary, its type map, and how it was made. Operations in flight hold an
/// Arc, so MPI_Type_free of a type still in use does not pull it from under them.
#[derive(Debug)]
pub struct Type {
    pub dt: Dt,
    pub map: Layout,
    pub env: Envelope,
}

/// The constructor and its arguments, as MPI_Type_get_contents gives them back.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub combiner: c_int,
    pub ints: Vec<c_int>,
    pub addrs: Vec<MPI_Aint>,
    pub larges: Vec<MPI_Count>,
    /// The old types: predefined handles, or derived types kept alive here.
    pub types: Vec<OldType>,
}

/// An old type of a constructor: its handle, and the type itself when it is derived.
pub type OldType = (MPI_Datatype, Option<Arc<Type>>);

struct Derived {
    t: Arc<Type>,
    committed: bool,
    name: String,
}

static DERIVED: Mutex<Vec<Option<Derived>>> = Mutex::new(Vec::new());
/// Names given to predefined types by MPI_Type_set_name.
static PREDEF_NAMES: Mutex<Option<HashMap<MPI_Datatype, String>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What an element is, for reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    /// C long double (see ldouble.rs).
    F80,
    /// Complex: two of this real format (real part first).
    Complex(Real),
    /// A 16-byte integer (Fortran INTEGER*16).
    I128,
    /// A floating format with no kernel here (REAL*16; complex: COMPLEX*4, COMPLEX*32): the
    /// standard defines the arithmetic ops on it, this library does not apply them.
    NoKernel { complex: bool },
    /// C _Bool / C++ bool / Fortran LOGICAL of this many bytes.
    Bool(u8),
    Byte,
    /// (value, int index) pairs for MINLOC/MAXLOC: value kind, offset of the int.
    Pair(PairVal, u8),
    /// Characters and the like: moved, never reduced (the standard defines no op on them).
    Other,
}

/// The real format of a complex kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Real {
    F32,
    F64,
    F80,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairVal {
    F32,
    F64,
    I64,
    I32,
    I16,
    /// long double value, int index (MPI_LONG_DOUBLE_INT).
    F80,
    /// REAL value and REAL index (MPI_2REAL).
    F32F32,
    /// DOUBLE PRECISION value and index (MPI_2DOUBLE_PRECISION).
    F64F64,
}

#[derive(Debug, Clone, Copy)]
pub struct Dt {
    pub handle: MPI_Datatype,
    /// Bytes of data in one element (MPI_Type_size).
    pub size: usize,
    /// Bytes one element spans in memory (MPI_Type_get_extent): what messages move.
    pub extent: usize,
    pub kind: Kind,
    pub name: &'static str,
    /// Bytes one basic (predefined) element spans.
    pub elem: usize,
    /// User memory of `count` elements is `count * size` bytes in a row from the buffer's
    /// address: moved as it is, with no packing.
    pub dense: bool,
}

macro_rules! dt {
    ($h:expr, $size:expr, $ext:expr, $kind:expr, $name:expr) => {
        Some(Dt { handle: $h, size: $size, extent: $ext, kind: $kind, name: $name, elem: $ext, dense: $size == $ext })
    };
}

/// The ABI's predefined datatype handles all lie in `PREDEF_FIRST..PREDEF_FIRST + PREDEF_SPAN`.
const PREDEF_FIRST: MPI_Datatype = MPI_DATATYPE_NULL;
const PREDEF_SPAN: usize = 0x100;

/// The predefined datatype behind a handle: every typed call asks, so it is one load from a
/// table made once (the match below costs a few hundred instructions a call).
pub fn predefined(h: MPI_Datatype) -> Option<Dt> {
    predefined_ref(h).copied()
}

/// `predefined` without copying the summary out (the direct paths of 16 B calls feel it).
#[inline]
pub fn predefined_ref(h: MPI_Datatype) -> Option<&'static Dt> {
    // Built at compile time: no first-use check on every call.
    static TABLE: [Option<Dt>; PREDEF_SPAN] = {
        let mut t = [None; PREDEF_SPAN];
        let mut i = 0;
        while i < PREDEF_SPAN {
            t[i] = predefined_by_match(PREDEF_FIRST + i);
            i += 1;
        }
        t
    };
    match h.wrapping_sub(PREDEF_FIRST) {
        i if i < PREDEF_SPAN => TABLE[i].as_ref(),
        _ => None,
    }
}

const fn predefined_by_match(h: MPI_Datatype) -> Option<Dt> {
    use Kind::*;
    match h {
        MPI_AINT => dt!(h, 8, 8, I64, "MPI_AINT"),
        MPI_COUNT => dt!(h, 8, 8, I64, "MPI_COUNT"),
        MPI_OFFSET => dt!(h, 8, 8, I64, "MPI_OFFSET"),
        MPI_PACKED => dt!(h, 1, 1, Byte, "MPI_PACKED"),
        MPI_SHORT => dt!(h, 2, 2, I16, "MPI_SHORT"),
        MPI_INT => dt!(h, 4, 4, I32, "MPI_INT"),
        MPI_LONG => dt!(h, 8, 8, I64, "MPI_LONG"),
        MPI_LONG_LONG => dt!(h, 8, 8, I64, "MPI_LONG_LONG"),
        MPI_UNSIGNED_SHORT => dt!(h, 2, 2, U16, "MPI_UNSIGNED_SHORT"),
        MPI_UNSIGNED => dt!(h, 4, 4, U32, "MPI_UNSIGNED"),
        MPI_UNSIGNED_LONG => dt!(h, 8, 8, U64, "MPI_UNSIGNED_LONG"),
        MPI_UNSIGNED_LONG_LONG => dt!(h, 8, 8, U64, "MPI_UNSIGNED_LONG_LONG"),
        MPI_FLOAT => dt!(h, 4, 4, F32, "MPI_FLOAT"),
        MPI_C_FLOAT_COMPLEX => dt!(h, 8, 8, Complex(Real::F32), "MPI_C_FLOAT_COMPLEX"),
        MPI_CXX_FLOAT_COMPLEX => dt!(h, 8, 8, Complex(Real::F32), "MPI_CXX_FLOAT_COMPLEX"),
        MPI_DOUBLE => dt!(h, 8, 8, F64, "MPI_DOUBLE"),
        MPI_C_DOUBLE_COMPLEX => dt!(h, 16, 16, Complex(Real::F64), "MPI_C_DOUBLE_COMPLEX"),
        MPI_CXX_DOUBLE_COMPLEX => dt!(h, 16, 16, Complex(Real::F64), "MPI_CXX_DOUBLE_COMPLEX"),
        MPI_LOGICAL => dt!(h, 4, 4, Bool(4), "MPI_LOGICAL"),
        MPI_INTEGER => dt!(h, 4, 4, I32, "MPI_INTEGER"),
        MPI_REAL => dt!(h, 4, 4, F32, "MPI_REAL"),
        MPI_COMPLEX => dt!(h, 8, 8, Complex(Real::F32), "MPI_COMPLEX"),
        MPI_DOUBLE_PRECISION => dt!(h, 8, 8, F64, "MPI_DOUBLE_PRECISION"),
        MPI_DOUBLE_COMPLEX => dt!(h, 16, 16, Complex(Real::F64), "MPI_DOUBLE_COMPLEX"),
        MPI_CHARACTER => dt!(h, 1, 1, Other, "MPI_CHARACTER"),
        MPI_LONG_DOUBLE => dt!(h, 16, 16, F80, "MPI_LONG_DOUBLE"),
        MPI_C_LONG_DOUBLE_COMPLEX => dt!(h, 32, 32, Complex(Real::F80), "MPI_C_LONG_DOUBLE_COMPLEX"),
        MPI_CXX_LONG_DOUBLE_COMPLEX => dt!(h, 32, 32, Complex(Real::F80), "MPI_CXX_LONG_DOUBLE_COMPLEX"),
        MPI_FLOAT_INT => dt!(h, 8, 8, Pair(PairVal::F32, 4), "MPI_FLOAT_INT"),
        MPI_DOUBLE_INT => dt!(h, 12, 16, Pair(PairVal::F64, 8), "MPI_DOUBLE_INT"),
        MPI_LONG_INT => dt!(h, 12, 16, Pair(PairVal::I64, 8), "MPI_LONG_INT"),
        MPI_2INT => dt!(h, 8, 8, Pair(PairVal::I32, 4), "MPI_2INT"),
        MPI_SHORT_INT => dt!(h, 6, 8, Pair(PairVal::I16, 4), "MPI_SHORT_INT"),
        MPI_LONG_DOUBLE_INT => dt!(h, 20, 32, Pair(PairVal::F80, 16), "MPI_LONG_DOUBLE_INT"),
        MPI_2REAL => dt!(h, 8, 8, Pair(PairVal::F32F32, 4), "MPI_2REAL"),
        MPI_2DOUBLE_PRECISION => dt!(h, 16, 16, Pair(PairVal::F64F64, 8), "MPI_2DOUBLE_PRECISION"),
        MPI_2INTEGER => dt!(h, 8, 8, Pair(PairVal::I32, 4), "MPI_2INTEGER"),
        MPI_C_BOOL => dt!(h, 1, 1, Bool(1), "MPI_C_BOOL"),
        MPI_CXX_BOOL => dt!(h, 1, 1, Bool(1), "MPI_CXX_BOOL"),
        MPI_WCHAR => dt!(h, 4, 4, Other, "MPI_WCHAR"),
        MPI_INT8_T => dt!(h, 1, 1, I8, "MPI_INT8_T"),
        MPI_UINT8_T => dt!(h, 1, 1, U8, "MPI_UINT8_T"),
        // Not among the standard's reduction types, but MPICH reduces it as the C `char` it is
        // and programs rely on that (OSU's osu_acc_latency accumulates MPI_CHAR with MPI_SUM).
        #[cfg(any(target_arch = "aarch64", target_arch = "powerpc64", target_arch = "s390x"))]
        MPI_CHAR => dt!(h, 1, 1, U8, "MPI_CHAR"),
        #[cfg(not(any(target_arch = "aarch64", target_arch = "powerpc64", target_arch = "s390x")))]
        MPI_CHAR => dt!(h, 1, 1, I8, "MPI_CHAR"),
        MPI_SIGNED_CHAR => dt!(h, 1, 1, I8, "MPI_SIGNED_CHAR"),
        MPI_UNSIGNED_CHAR => dt!(h, 1, 1, U8, "MPI_UNSIGNED_CHAR"),
        MPI_BYTE => dt!(h, 1, 1, Byte, "MPI_BYTE"),
        MPI_INT16_T => dt!(h, 2, 2, I16, "MPI_INT16_T"),
        MPI_UINT16_T => dt!(h, 2, 2, U16, "MPI_UINT16_T"),
        MPI_INT32_T => dt!(h, 4, 4, I32, "MPI_INT32_T"),
        MPI_UINT32_T => dt!(h, 4, 4, U32, "MPI_UINT32_T"),
        MPI_INT64_T => dt!(h, 8, 8, I64, "MPI_INT64_T"),
        MPI_UINT64_T => dt!(h, 8, 8, U64, "MPI_UINT64_T"),
        MPI_LOGICAL1 => dt!(h, 1, 1, Bool(1), "MPI_LOGICAL1"),
        MPI_INTEGER1 => dt!(h, 1, 1, I8, "MPI_INTEGER1"),
        MPI_LOGICAL2 => dt!(h, 2, 2, Bool(2), "MPI_LOGICAL2"),
        MPI_INTEGER2 => dt!(h, 2, 2, I16, "MPI_INTEGER2"),
        MPI_REAL2 => dt!(h, 2, 2, F16, "MPI_REAL2"),
        MPI_LOGICAL4 => dt!(h, 4, 4, Bool(4), "MPI_LOGICAL4"),
        MPI_INTEGER4 => dt!(h, 4, 4, I32, "MPI_INTEGER4"),
        MPI_REAL4 => dt!(h, 4, 4, F32, "MPI_REAL4"),
        MPI_COMPLEX4 => dt!(h, 4, 4, NoKernel { complex: true }, "MPI_COMPLEX4"),
        MPI_LOGICAL8 => dt!(h, 8, 8, Bool(8), "MPI_LOGICAL8"),
        MPI_INTEGER8 => dt!(h, 8, 8, I64, "MPI_INTEGER8"),
        MPI_REAL8 => dt!(h, 8, 8, F64, "MPI_REAL8"),
        MPI_COMPLEX8 => dt!(h, 8, 8, Complex(Real::F32), "MPI_COMPLEX8"),
        MPI_LOGICAL16 => dt!(h, 16, 16, Bool(16), "MPI_LOGICAL16"),
        MPI_INTEGER16 => dt!(h, 16, 16, I128, "MPI_INTEGER16"),
        MPI_REAL16 => dt!(h, 16, 16, NoKernel { complex: false }, "MPI_REAL16"),
        MPI_COMPLEX16 => dt!(h, 16, 16, Complex(Real::F64), "MPI_COMPLEX16"),
        MPI_COMPLEX32 => dt!(h, 32, 32, NoKernel { complex: true }, "MPI_COMPLEX32"),
        _ => None,
    }
}

/// Where the data of one predefined element lies, and its alignment (as C lays it out).
fn predef_layout(d: &Dt) -> Layout {
    let h = d.handle;
    let blocks: Vec<(i64, u64)> = match h {
        // { short; int }: the int is 4-aligned.
        MPI_SHORT_INT => vec![(0, 2), (4, 4)],
        _ => vec![(0, d.size as u64)],
    };
    let align = match h {
        MPI_FLOAT_INT | MPI_2INT | MPI_SHORT_INT | MPI_2REAL | MPI_2INTEGER => 4,
        MPI_DOUBLE_INT | MPI_LONG_INT | MPI_2DOUBLE_PRECISION => 8,
        MPI_LONG_DOUBLE_INT => 16,
        _ if d.name.contains("COMPLEX") => (d.extent / 2).max(1),
        _ => d.extent.clamp(1, 16),
    };
    let mut l = Layout::predefined(h, &blocks, d.extent as i64, align as u64);
    // A pair type is two basic elements (value, index) for MPI_Get_elements and external32;
    // reductions still see the pair as one (`basic`).
    let pair = match h {
        MPI_FLOAT_INT => Some((MPI_FLOAT, 4, MPI_INT)),
        MPI_DOUBLE_INT => Some((MPI_DOUBLE, 8, MPI_INT)),
        MPI_LONG_INT => Some((MPI_LONG, 8, MPI_INT)),
        MPI_SHORT_INT => Some((MPI_SHORT, 2, MPI_INT)),
        MPI_LONG_DOUBLE_INT => Some((MPI_LONG_DOUBLE, 16, MPI_INT)),
        MPI_2INT => Some((MPI_INT, 4, MPI_INT)),
        MPI_2REAL => Some((MPI_REAL, 4, MPI_REAL)),
        MPI_2DOUBLE_PRECISION => Some((MPI_DOUBLE_PRECISION, 8, MPI_DOUBLE_PRECISION)),
        MPI_2INTEGER => Some((MPI_INTEGER, 4, MPI_INTEGER)),
        _ => None,
    };
    if let Some((v, vs, i)) = pair {
        let is = l.size - vs;
        l.sig = if v == i { Arc::new([SigSeg::Run(Run { basic: v, size: vs, n: 2 })]) } else { Arc::new([SigSeg::Run(Run { basic: v, size: vs, n: 1 }), SigSeg::Run(Run { basic: i, size: is, n: 1 })]) };
        l.nelems = 2;
    }
    l
}

/// The predefined types, each made once on first use (their handles are below 4096: the
/// standard ABI reserves that range): every typed call asks for one.
static PREDEF_TYPES: [std::sync::OnceLock<Arc<Type>>; 4096] = [const { std::sync::OnceLock::new() }; 4096];

/// A predefined type with its map, from its summary.
pub fn predef_type(d: Dt) -> Arc<Type> {
    let make = || {
        let map = predef_layout(&d);
        Arc::new(Type { dt: d, map, env: Envelope { combiner: MPI_COMBINER_NAMED, ints: vec![], addrs: vec![], larges: vec![], types: vec![] } })
    };
    match PREDEF_TYPES.get(d.handle) {
        Some(cell) => cell.get_or_init(make).clone(),
        None => make(),
    }
}

/// The summary of a derived type's map: reductions see the basic element's kind when the type
/// is dense and that element is a dense non-pair one (then the old element-wise code applies).
fn summary(map: &Layout) -> Dt {
    let basic = map.basic.and_then(predefined);
    let dense = map.dense();
    let kind = match basic {
        Some(b) if dense && b.dense && !matches!(b.kind, Kind::Pair(..)) => b.kind,
        _ => Kind::Other,
    };
    let elem = map.size.checked_div(map.nelems).map_or_else(|| basic.map_or(1, |b| b.size), |e| e as usize);
    Dt { handle: 0, size: map.size as usize, extent: map.extent().max(0) as usize, kind, name: "", elem, dense }
}

/// The datatype behind a handle, committed or not (for the type queries), or MPI_ERR_TYPE.
pub fn resolve_any(h: MPI_Datatype) -> Result<(Arc<Type>, bool), MpiErr> {
    if let Some(d) = predefined(h) {
        return Ok((predef_type(d), true));
    }
    if h >= TYPE_BASE {
        if let Some(Some(d)) = lock(&DERIVED).get(h - TYPE_BASE) {
            return Ok((d.t.clone(), d.committed));
        }
    }
    if h == MPI_DATATYPE_NULL {
        return crate::mpi_err!(MPI_ERR_TYPE, "MPI_DATATYPE_NULL is not a datatype");
    }
    crate::mpi_err!(MPI_ERR_TYPE, "{h:#x} is not a valid datatype (never made, or freed)")
}

/// The datatype behind a handle for communication: it must be committed.
pub fn resolve(h: MPI_Datatype) -> Result<Arc<Type>, MpiErr> {
    match resolve_any(h)? {
        (t, true) => Ok(t),
        (_, false) => crate::mpi_err!(MPI_ERR_TYPE, "datatype {h:#x} is not committed (MPI_Type_commit)"),
    }
}

/// The summary of a handle's datatype, committed or not.
pub fn get_any(h: MPI_Datatype) -> Result<(Dt, bool), MpiErr> {
    if let Some(d) = predefined(h) {
        return Ok((d, true));
    }
    let (t, c) = resolve_any(h)?;
    Ok((Dt { handle: h, ..t.dt }, c))
}

/// The summary of a handle's datatype for communication: it must be committed.
pub fn get(h: MPI_Datatype) -> Result<Dt, MpiErr> {
    match get_any(h)? {
        (d, true) => Ok(d),
        (_, false) => crate::mpi_err!(MPI_ERR_TYPE, "datatype {h:#x} is not committed (MPI_Type_commit)"),
    }
}

pub(crate) fn map_err(e: MapErr) -> MpiErr {
    match e {
        MapErr::Overflow => MpiErr::new(MPI_ERR_ARG, "the datatype's offsets or size overflow"),
        MapErr::NoMemory => MpiErr::new(MPI_ERR_NO_MEM, "no memory for the datatype's map"),
    }
}

fn add(t: Type, committed: bool) -> MPI_Datatype {
    let mut v = lock(&DERIVED);
    let slot = v.iter().position(|s| s.is_none()).unwrap_or_else(|| {
        v.push(None);
        v.len() - 1
    });
    let h = TYPE_BASE + slot;
    let t = Type { dt: Dt { handle: h, ..t.dt }, ..t };
    v[slot] = Some(Derived { t: Arc::new(t), committed, name: String::new() });
    h
}

/// What a constructor call was made with, in the order MPI_Type_get_contents gives it: `ints`
/// are the int arguments; `counts` the count/displacement arguments, which go to `addrs` (byte
/// displacements, `is_addr`) or `ints` for the int form, and all to `larges` for the _c form.
struct Args<'a> {
    combiner: c_int,
    large: bool,
    /// (value, is a byte displacement)
    vals: &'a [(i64, bool)],
    /// Ints that stay ints in both forms (subarray's ndims and order).
    fixed_ints: &'a [c_int],
}

fn envelope(a: &Args, types: Vec<OldType>) -> Result<Envelope, MpiErr> {
    let mut e = Envelope { combiner: a.combiner, ints: a.fixed_ints.to_vec(), addrs: vec![], larges: vec![], types };
    for &(v, is_addr) in a.vals {
        if a.large {
            e.larges.push(v);
        } else if is_addr {
            e.addrs.push(v as MPI_Aint);
        } else {
            e.ints.push(c_int::try_from(v).map_err(|_| MpiErr::new(MPI_ERR_ARG, format!("{v} does not fit an int")))?);
        }
    }
    // Subarray's ndims comes first and order last among the ints.
    if a.combiner == MPI_COMBINER_SUBARRAY && !a.fixed_ints.is_empty() && !a.large {
        let order = e.ints.remove(1);
        e.ints.push(order);
    }
    Ok(e)
}

/// The type behind `h`, and what a new type's envelope keeps of it.
fn old(h: MPI_Datatype) -> Result<(Arc<Type>, OldType), MpiErr> {
    let (t, _) = resolve_any(h)?;
    let keep = if h >= TYPE_BASE { Some(t.clone()) } else { None };
    Ok((t, (h, keep)))
}

fn nonneg(v: i64, what: &str) -> Result<u64, MpiErr> {
    u64::try_from(v).map_err(|_| MpiErr::new(if what == "count" { MPI_ERR_COUNT } else { MPI_ERR_ARG }, format!("{what} {v} is negative")))
}

fn mul(a: i64, b: i64) -> Result<i64, MpiErr> {
    a.checked_mul(b).ok_or_else(|| MpiErr::new(MPI_ERR_ARG, format!("{a} * {b} overflows")))
}

pub(crate) fn finish(map: Layout, env: Envelope) -> MPI_Datatype {
    let dt = summary(&map);
    add(Type { dt, map, env }, false)
}

/// The parts of `count` blocks of `old`: (byte displacement, blocklength).
fn build(blocks: &[(i64, u64)], t: &Type, pad: bool) -> Result<Layout, MpiErr> {
    let parts: Vec<Part> = blocks.iter().map(|&(disp, reps)| Part::new(disp, reps, &t.map)).collect();
    Layout::compose(&parts, pad).map_err(map_err)
}

/// MPI_Type_contiguous: `count` elements of `old` back to back.
pub fn contiguous(count: i64, old_h: MPI_Datatype) -> Result<MPI_Datatype, MpiErr> {
    contiguous_x(count, old_h, false)
}

pub fn contiguous_x(count: i64, old_h: MPI_Datatype, large: bool) -> Result<MPI_Datatype, MpiErr> {
    let n = nonneg(count, "count")?;
    let (t, o) = old(old_h)?;
    let map = build(&[(0, n)], &t, false)?;
    let env = envelope(&Args { combiner: MPI_COMBINER_CONTIGUOUS, large, vals: &[(count, false)], fixed_ints: &[] }, vec![o])?;
    Ok(finish(map, env))
}

/// MPI_Type_vector (stride in elements of old) and MPI_Type_create_hvector (`bytes`: in bytes).
pub fn vector(count: i64, bl: i64, stride: i64, old_h: MPI_Datatype, bytes: bool, large: bool) -> Result<MPI_Datatype, MpiErr> {
    let n = nonneg(count, "count")?;
    let b = nonneg(bl, "blocklength")?;
    let (t, o) = old(old_h)?;
    let step = if bytes { stride } else { mul(stride, t.map.extent())? };
    let map = if b == 0 || n == 0 {
        build(&[], &t, false)?
    } else if step == mul(bl, t.map.extent())? {
        // Blocks that follow each other: one run of count * blocklength elements.
        build(&[(0, n.checked_mul(b).ok_or_else(|| map_err(MapErr::Overflow))?)], &t, false)?
    } else {
        // `count` blocks, `step` bytes apart: one strided part (a repeat in the map).
        let block = build(&[(0, b)], &t, false)?;
        Layout::compose(&[Part::strided(0, n, step, &block)], false).map_err(map_err)?
    };
    let combiner = if bytes { MPI_COMBINER_HVECTOR } else { MPI_COMBINER_VECTOR };
    let env = envelope(&Args { combiner, large, vals: &[(count, false), (bl, false), (stride, bytes)], fixed_ints: &[] }, vec![o])?;
    Ok(finish(map, env))
}

/// MPI_Type_indexed / create_hindexed (`bytes`: displacements in bytes).
pub fn indexed(bls: &[i64], displs: &[i64], old_h: MPI_Datatype, bytes: bool, large: bool) -> Result<MPI_Datatype, MpiErr> {
    let (t, o) = old(old_h)?;
    let ext = t.map.extent();
    let mut blocks = Vec::with_capacity(bls.len());
    for (&b, &d) in bls.iter().zip(displs) {
        blocks.push((if bytes { d } else { mul(d, ext)? }, nonneg(b, "blocklength")?));
    }
    let map = build(&blocks, &t, false)?;
    let mut vals = vec![(bls.len() as i64, false)];
    vals.extend(bls.iter().map(|&b| (b, false)));
    vals.extend(displs.iter().map(|&d| (d, bytes)));
    let combiner = if bytes { MPI_COMBINER_HINDEXED } else { MPI_COMBINER_INDEXED };
    Ok(finish(map, envelope(&Args { combiner, large, vals: &vals, fixed_ints: &[] }, vec![o])?))
}

/// MPI_Type_create_indexed_block / create_hindexed_block.
pub fn indexed_block(bl: i64, displs: &[i64], old_h: MPI_Datatype, bytes: bool, large: bool) -> Result<MPI_Datatype, MpiErr> {
    let (t, o) = old(old_h)?;
    let b = nonneg(bl, "blocklength")?;
    let ext = t.map.extent();
    let mut blocks = Vec::with_capacity(displs.len());
    for &d in displs {
        blocks.push((if bytes { d } else { mul(d, ext)? }, b));
    }
    let map = build(&blocks, &t, false)?;
    let mut vals = vec![(displs.len() as i64, false), (bl, false)];
    vals.extend(displs.iter().map(|&d| (d, bytes)));
    let combiner = if bytes { MPI_COMBINER_HINDEXED_BLOCK } else { MPI_COMBINER_INDEXED_BLOCK };
    Ok(finish(map, envelope(&Args { combiner, large, vals: &vals, fixed_ints: &[] }, vec![o])?))
}

/// MPI_Type_create_struct: blocks of different types at byte displacements; the extent is
/// padded to the largest alignment of its members (as a C compiler pads the struct).
pub fn structure(bls: &[i64], displs: &[i64], types: &[MPI_Datatype], large: bool) -> Result<MPI_Datatype, MpiErr> {
    let mut olds = Vec::with_capacity(types.len());
    let mut keep = Vec::with_capacity(types.len());
    for &h in types {
        let (t, o) = old(h)?;
        olds.push(t);
        keep.push(o);
    }
    let mut parts = Vec::with_capacity(bls.len());
    for i in 0..bls.len() {
        parts.push(Part::new(displs[i], nonneg(bls[i], "blocklength")?, &olds[i].map));
    }
    let map = Layout::compose(&parts, true).map_err(map_err)?;
    let mut vals = vec![(bls.len() as i64, false)];
    vals.extend(bls.iter().map(|&b| (b, false)));
    vals.extend(displs.iter().map(|&d| (d, true)));
    Ok(finish(map, envelope(&Args { combiner: MPI_COMBINER_STRUCT, large, vals: &vals, fixed_ints: &[] }, keep)?))
}

/// MPI_Type_create_subarray: a `subsizes` block at `starts` of a `sizes` array (C order: the
/// last dimension varies fastest; Fortran order: the first); lb 0, extent the whole array.
pub fn subarray(sizes: &[i64], subsizes: &[i64], starts: &[i64], order: c_int, old_h: MPI_Datatype, large: bool) -> Result<MPI_Datatype, MpiErr> {
    let nd = sizes.len();
    if nd == 0 {
        return crate::mpi_err!(MPI_ERR_ARG, "ndims must be positive");
    }
    if order != MPI_ORDER_C && order != MPI_ORDER_FORTRAN {
        return crate::mpi_err!(MPI_ERR_ARG, "order {order} is neither MPI_ORDER_C nor MPI_ORDER_FORTRAN");
    }
    for d in 0..nd {
        if sizes[d] < 1 || subsizes[d] < 1 || starts[d] < 0 || subsizes[d] > sizes[d] || starts[d] > sizes[d] - subsizes[d] {
            return crate::mpi_err!(MPI_ERR_ARG, "dimension {d}: size {}, subsize {}, start {} are not a subarray", sizes[d], subsizes[d], starts[d]);
        }
    }
    let (t, o) = old(old_h)?;
    let ext = t.map.extent();
    // Dimensions from the fastest-varying one out.
    let dims: Vec<usize> = if order == MPI_ORDER_C { (0..nd).rev().collect() } else { (0..nd).collect() };
    let mut cur = t.map.clone();
    let mut stride = ext;
    let mut start_off = 0i64;
    for (k, &d) in dims.iter().enumerate() {
        let next = if k == 0 {
            // The fastest dimension: a run of elements of the old type.
            Layout::compose(&[Part::new(0, subsizes[d] as u64, &cur)], false).map_err(map_err)?
        } else {
            Layout::compose(&[Part::strided(0, subsizes[d] as u64, stride, &cur)], false).map_err(map_err)?
        };
        start_off = start_off.checked_add(mul(starts[d], stride)?).ok_or_else(|| map_err(MapErr::Overflow))?;
        stride = mul(stride, sizes[d])?;
        cur = next;
    }
    let placed = Layout::compose(&[Part::new(start_off, 1, &cur)], false).map_err(map_err)?;
    let map = placed.resized(0, stride).map_err(map_err)?;
    let mut vals: Vec<(i64, bool)> = Vec::with_capacity(3 * nd);
    vals.extend(sizes.iter().map(|&v| (v, false)));
    vals.extend(subsizes.iter().map(|&v| (v, false)));
    vals.extend(starts.iter().map(|&v| (v, false)));
    let fixed = [nd as c_int, order];
    Ok(finish(map, envelope(&Args { combiner: MPI_COMBINER_SUBARRAY, large, vals: &vals, fixed_ints: &fixed }, vec![o])?))
}

/// MPI_Type_create_resized.
pub fn resized(old_h: MPI_Datatype, lb: i64, extent: i64, large: bool) -> Result<MPI_Datatype, MpiErr> {
    let (t, o) = old(old_h)?;
    let map = t.map.resized(lb, extent).map_err(map_err)?;
    Ok(finish(map, envelope(&Args { combiner: MPI_COMBINER_RESIZED, large, vals: &[(lb, true), (extent, true)], fixed_ints: &[] }, vec![o])?))
}

/// MPI_Type_dup: the same type under a new handle (committed if the old one is).
pub fn dup(old_h: MPI_Datatype) -> Result<MPI_Datatype, MpiErr> {
    let (t, committed) = resolve_any(old_h)?;
    let keep = if old_h >= TYPE_BASE { Some(t.clone()) } else { None };
    let env = Envelope { combiner: MPI_COMBINER_DUP, ints: vec![], addrs: vec![], larges: vec![], types: vec![(old_h, keep)] };
    let h = add(Type { dt: summary(&t.map), map: t.map.clone(), env }, committed);
    if old_h >= TYPE_BASE {
        let name = lock(&DERIVED)[old_h - TYPE_BASE].as_ref().map(|d| d.name.clone()).unwrap_or_default();
        set_name(h, &name)?;
    }
    Ok(h)
}

/// A new handle for an old type that MPI_Type_get_contents hands out (the caller frees it).
pub fn handle_for(t: &Arc<Type>) -> MPI_Datatype {
    let mut v = lock(&DERIVED);
    let slot = v.iter().position(|s| s.is_none()).unwrap_or_else(|| {
        v.push(None);
        v.len() - 1
    });
    v[slot] = Some(Derived { t: t.clone(), committed: true, name: String::new() });
    TYPE_BASE + slot
}

pub fn commit(h: MPI_Datatype) -> Result<(), MpiErr> {
    if predefined(h).is_some() {
        return Ok(());
    }
    resolve_any(h)?;
    if let Some(Some(d)) = lock(&DERIVED).get_mut(h - TYPE_BASE) {
        d.committed = true;
    }
    Ok(())
}

/// MPI_Type_free: derived types only (operations in flight keep their Arc of the type).
pub fn free(h: MPI_Datatype) -> Result<(), MpiErr> {
    if predefined(h).is_some() {
        return crate::mpi_err!(MPI_ERR_TYPE, "predefined datatypes cannot be freed");
    }
    let (t, _) = resolve_any(h)?;
    if crate::f90::is_f90(t.env.combiner) {
        return crate::mpi_err!(MPI_ERR_TYPE, "a datatype from MPI_Type_create_f90_* is predefined and cannot be freed");
    }
    lock(&DERIVED)[h - TYPE_BASE] = None;
    Ok(())
}

pub fn name(h: MPI_Datatype) -> Result<String, MpiErr> {
    // The null handle has a name too (MPICH and mpi4py agree on it).
    if h == MPI_DATATYPE_NULL {
        return Ok("MPI_DATATYPE_NULL".to_string());
    }
    if let Some(d) = predefined(h) {
        let names = lock(&PREDEF_NAMES);
        return Ok(names.as_ref().and_then(|m| m.get(&h).cloned()).unwrap_or_else(|| d.name.to_string()));
    }
    resolve_any(h)?;
    Ok(lock(&DERIVED)[h - TYPE_BASE].as_ref().map(|d| d.name.clone()).unwrap_or_default())
}

pub fn set_name(h: MPI_Datatype, name: &str) -> Result<(), MpiErr> {
    if predefined(h).is_some() {
        lock(&PREDEF_NAMES).get_or_insert_with(HashMap::new).insert(h, name.to_string());
        return Ok(());
    }
    resolve_any(h)?;
    if let Some(Some(d)) = lock(&DERIVED).get_mut(h - TYPE_BASE) {
        d.name = name.to_string();
    }
    Ok(())
}

impl Dt {
    /// Bytes that `count` elements span, or MPI_ERR_COUNT.
    pub fn bytes(&self, count: i64) -> Result<usize, MpiErr> {
        if count < 0 {
            return crate::mpi_err!(MPI_ERR_COUNT, "count {count} is negative");
        }
        self.bytes_if_valid(count).ok_or_else(|| MpiErr::new(MPI_ERR_COUNT, format!("count {count} of {} overflows", self.name)))
    }

    /// `bytes` without the error (for the shortcuts, which leave every error to the general path).
    #[inline]
    pub fn bytes_if_valid(&self, count: i64) -> Option<usize> {
        u64::try_from(count).ok()?.checked_mul(self.extent as u64).filter(|&b| b <= isize::MAX as u64).map(|b| b as usize)
    }

    /// The engine's element type for this datatype, where it has one.
    pub fn engine(&self) -> Option<DType> {
        Some(match self.kind {
            Kind::I8 => DType::Int8,
            Kind::U8 => DType::Uint8,
            Kind::I32 => DType::Int32,
            Kind::U32 => DType::Uint32,
            Kind::I64 => DType::Int64,
            Kind::U64 => DType::Uint64,
            Kind::F16 => DType::Float16,
            Kind::F32 => DType::Float32,
            Kind::F64 => DType::Float64,
            _ => return None,
        })
    }
}

/// MPI_Type_size (MPI_UNDEFINED when it does not fit an int).
pub fn type_size(h: MPI_Datatype) -> Result<i64, MpiErr> {
    Ok(get_any(h)?.0.size as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_predefined_type_is_in_the_table() {
        for h in 0..0x10000 {
            if let Some(d) = predefined_by_match(h) {
                assert!((PREDEF_FIRST..PREDEF_FIRST + PREDEF_SPAN).contains(&h), "{} ({h:#x}) is outside the table", d.name);
                assert_eq!(predefined(h).map(|t| t.name), Some(d.name));
            }
        }
        assert!(predefined(PREDEF_FIRST + PREDEF_SPAN).is_none() && predefined(0).is_none() && predefined(usize::MAX).is_none());
    }

    #[test]
    fn predefined_sizes_match_c() {
        assert_eq!(predefined(MPI_INT).unwrap().size, std::mem::size_of::<std::ffi::c_int>());
        assert_eq!(predefined(MPI_LONG).unwrap().size, std::mem::size_of::<std::ffi::c_long>());
        assert_eq!(predefined(MPI_DOUBLE_INT).unwrap().extent, 16);
        assert_eq!(predefined(MPI_DOUBLE_INT).unwrap().size, 12);
        assert!(predefined(MPI_DATATYPE_NULL).is_none());
        assert_eq!(get(0x7777).err().map(|e| e.class), Some(MPI_ERR_TYPE));
        assert_eq!(predefined(MPI_INT).unwrap().bytes(-1).err().map(|e| e.class), Some(MPI_ERR_COUNT));
        assert_eq!(predefined(MPI_INT).unwrap().bytes(i64::MAX).err().map(|e| e.class), Some(MPI_ERR_COUNT));
    }

    #[test]
    fn contiguous_types_need_a_commit() {
        let t = contiguous(3, MPI_DOUBLE).unwrap();
        assert_eq!(get(t).err().map(|e| e.class), Some(MPI_ERR_TYPE));
        let (d, committed) = get_any(t).unwrap();
        assert!(!committed);
        assert_eq!((d.size, d.extent, d.elem, d.kind, d.dense), (24, 24, 8, Kind::F64, true));
        commit(t).unwrap();
        assert_eq!(get(t).unwrap().engine(), Some(DType::Float64));
        let u = dup(t).unwrap();
        assert_eq!(get(u).unwrap().size, 24);
        free(t).unwrap();
        assert!(get_any(t).is_err());
        assert!(free(MPI_INT).is_err());
        free(u).unwrap();
    }
}

#[cfg(test)]
mod predefined_tests {
    use super::*;

    /// Callers skip the lookup for a predefined type whose summary says it is dense: the
    /// summary and the type's map must agree, and the cached type must be the one made fresh.
    #[test]
    fn the_summary_of_a_predefined_type_agrees_with_its_map() {
        let mut n = 0;
        for h in 0..4096 {
            let Some(d) = predefined(h) else { continue };
            let (t, committed) = resolve_any(h).unwrap();
            assert!(committed);
            assert_eq!(d.dense, t.map.dense(), "{}", d.name);
            assert_eq!(predef_layout(&d).dense(), t.map.dense(), "{}", d.name);
            assert!(Arc::ptr_eq(&t, &resolve_any(h).unwrap().0), "{}: made once", d.name);
            n += 1;
        }
        assert!(n > 40, "only {n} predefined types");
    }
}

#[cfg(test)]
mod derived_tests {
    use super::*;

    fn map_of(h: MPI_Datatype) -> Layout {
        resolve_any(h).unwrap().0.map.clone()
    }

    #[test]
    fn constructors_give_the_standards_bounds() {
        // vector(3, 2, 4) of double: 3 blocks of 16 bytes, 32 apart; extent (2*4 + 2) * 8.
        let v = vector(3, 2, 4, MPI_DOUBLE, false, false).unwrap();
        let m = map_of(v);
        assert_eq!((m.size, m.lb, m.extent(), m.flat_blocks().len()), (48, 0, 80, 3));
        // hvector with a negative stride: lb below 0.
        let h = vector(2, 1, -16, MPI_INT, true, false).unwrap();
        let m = map_of(h);
        assert_eq!((m.lb, m.extent(), m.true_lb, m.true_extent()), (-16, 20, -16, 20));
        // struct { char; double; } pads to 16 like a C compiler; { int; char } to 8.
        let s = structure(&[1, 1], &[0, 8], &[MPI_CHAR, MPI_DOUBLE], false).unwrap();
        assert_eq!((map_of(s).size, map_of(s).extent()), (9, 16));
        let s2 = structure(&[1, 1], &[0, 4], &[MPI_INT, MPI_CHAR], false).unwrap();
        assert_eq!(map_of(s2).extent(), 8);
        // subarray 2x3 at (1,1) of a 4x5 int array, C order: rows of 3 ints, 5 apart.
        let a = subarray(&[4, 5], &[2, 3], &[1, 1], MPI_ORDER_C, MPI_INT, false).unwrap();
        let m = map_of(a);
        assert_eq!((m.lb, m.extent(), m.size, m.true_lb, m.true_extent()), (0, 80, 24, 24, 32));
        assert_eq!(m.flat_blocks().iter().map(|b| (b.off, b.len)).collect::<Vec<_>>(), vec![(24, 12), (44, 12)]);
        // Fortran order: the first dimension varies fastest.
        let f = subarray(&[4, 5], &[2, 3], &[1, 1], MPI_ORDER_FORTRAN, MPI_INT, false).unwrap();
        assert_eq!(map_of(f).flat_blocks().len(), 3);
        let r = resized(MPI_INT, -4, 12, false).unwrap();
        assert_eq!((map_of(r).lb, map_of(r).extent()), (-4, 12));
        for t in [v, h, s, s2, a, f, r] {
            free(t).unwrap();
        }
    }

    #[test]
    fn envelopes_record_the_arguments() {
        let v = vector(3, 2, 4, MPI_DOUBLE, false, false).unwrap();
        let e = resolve_any(v).unwrap().0.env.clone();
        assert_eq!((e.combiner, e.ints.clone(), e.addrs.len()), (MPI_COMBINER_VECTOR, vec![3, 2, 4], 0));
        let s = structure(&[1, 2], &[0, 8], &[MPI_CHAR, v], false).unwrap();
        let e = resolve_any(s).unwrap().0.env.clone();
        assert_eq!((e.combiner, e.ints.clone(), e.addrs.clone()), (MPI_COMBINER_STRUCT, vec![2, 1, 2], vec![0, 8]));
        // The old derived type stays alive in the envelope after its handle is freed.
        free(v).unwrap();
        assert!(e.types[1].1.is_some());
        let h = vector(3, 2, 4, MPI_DOUBLE, true, true).unwrap();
        let e = resolve_any(h).unwrap().0.env.clone();
        assert_eq!((e.combiner, e.larges.clone(), e.ints.len()), (MPI_COMBINER_HVECTOR, vec![3, 2, 4], 0));
        let a = subarray(&[4, 5], &[2, 3], &[1, 1], MPI_ORDER_C, MPI_INT, false).unwrap();
        assert_eq!(resolve_any(a).unwrap().0.env.ints, vec![2, 4, 5, 2, 3, 1, 1, MPI_ORDER_C]);
        for t in [s, h, a] {
            free(t).unwrap();
        }
    }

    #[test]
    fn bad_arguments_are_errors_not_crashes() {
        assert_eq!(vector(-1, 1, 1, MPI_INT, false, false).err().map(|e| e.class), Some(MPI_ERR_COUNT));
        assert_eq!(vector(1, -1, 1, MPI_INT, false, false).err().map(|e| e.class), Some(MPI_ERR_ARG));
        assert_eq!(vector(2, 1, i64::MAX, MPI_INT, false, false).err().map(|e| e.class), Some(MPI_ERR_ARG));
        assert_eq!(contiguous(1, MPI_DATATYPE_NULL).err().map(|e| e.class), Some(MPI_ERR_TYPE));
        assert_eq!(subarray(&[4], &[5], &[0], MPI_ORDER_C, MPI_INT, false).err().map(|e| e.class), Some(MPI_ERR_ARG));
        assert_eq!(subarray(&[4], &[2], &[0], 7, MPI_INT, false).err().map(|e| e.class), Some(MPI_ERR_ARG));
        // Huge layouts stay small: regular ones one block, strided ones one repeat.
        let big = vector(1 << 40, 1, 1, MPI_CHAR, false, true).unwrap();
        assert_eq!(map_of(big).flat_blocks().len(), 1);
        free(big).unwrap();
        for big in [vector(1 << 40, 1, 2, MPI_CHAR, false, true).unwrap(), subarray(&[1 << 40, 4], &[1 << 39, 2], &[0, 0], MPI_ORDER_C, MPI_CHAR, true).unwrap()] {
            let m = map_of(big);
            assert_eq!((m.blocks.len(), m.size), (1, 1 << 40));
            free(big).unwrap();
        }
        let t = contiguous(2, MPI_INT).unwrap();
        assert_eq!(resolve(t).err().map(|e| e.class), Some(MPI_ERR_TYPE), "uncommitted");
        free(t).unwrap();
        // A handle never made (freeing `t` again would race with the other tests of this
        // process, which may be given its slot meanwhile).
        let never = (TYPE_BASE + 0x0fff_fff0) as MPI_Datatype;
        assert_eq!(free(never).err().map(|e| e.class), Some(MPI_ERR_TYPE), "not a datatype");
    }

    #[test]
    fn pair_types_pack_without_their_padding() {
        let m = predef_layout(&predefined(MPI_SHORT_INT).unwrap());
        assert_eq!((m.size, m.extent(), m.flat_blocks().len()), (6, 8, 2));
        assert!(!m.dense());
        assert!(predef_layout(&predefined(MPI_DOUBLE).unwrap()).dense());
        // Two basic elements per pair: 20 bytes of MPI_DOUBLE_INT are 3 elements.
        let di = predef_layout(&predefined(MPI_DOUBLE_INT).unwrap());
        assert_eq!((di.nelems, di.elements_in(20), di.elements_in(24), di.bytes_of_elements(3)), (2, Some(3), Some(4), Some(20)));
        assert_eq!(di.basic, Some(MPI_DOUBLE_INT));
    }
}
