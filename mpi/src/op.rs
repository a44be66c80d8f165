//! Reduction operations: the predefined ops (on the engine where it has the op and type, else
//! applied here) and user ops from MPI_Op_create.

use crate::abi_gen::*;
use crate::datatype::{Dt, Kind, PairVal, Real};
use crate::ldouble::{self, F80};
use crate::opnum;
use crate::err::MpiErr;
use distcomm::ReduceOp;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

pub const OP_BASE: usize = 0x2000_0000;

/// A user function: MPI_Op_create's (int count) or MPI_Op_create_c's (MPI_Count).
#[derive(Clone, Copy)]
pub enum UserFn {
    Int(MPI_User_function),
    Large(MPI_User_function_c),
}

#[derive(Clone, Copy)]
struct UserOp {
    f: UserFn,
    commute: bool,
    live: bool,
}

static USER_OPS: Mutex<Vec<UserOp>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a reduction of `dt` with `op` runs.
#[derive(Clone, Copy)]
pub enum Plan {
    /// On the engine's collectives.
    Engine(distcomm::DType, ReduceOp),
    /// Contributions gathered, then folded here in rank order.
    Local(Local),
}

#[derive(Clone, Copy)]
pub enum Local {
    Predef(MPI_Op, Dt),
    User(UserFn, Dt),
}

fn op_name(op: MPI_Op) -> &'static str {
    match op {
        MPI_SUM => "MPI_SUM",
        MPI_MIN => "MPI_MIN",
        MPI_MAX => "MPI_MAX",
        MPI_PROD => "MPI_PROD",
        MPI_BAND => "MPI_BAND",
        MPI_BOR => "MPI_BOR",
        MPI_BXOR => "MPI_BXOR",
        MPI_LAND => "MPI_LAND",
        MPI_LOR => "MPI_LOR",
        MPI_LXOR => "MPI_LXOR",
        MPI_MINLOC => "MPI_MINLOC",
        MPI_MAXLOC => "MPI_MAXLOC",
        MPI_REPLACE => "MPI_REPLACE",
        MPI_NO_OP => "MPI_NO_OP",
        _ => "a user op",
    }
}

fn is_int(k: Kind) -> bool {
    matches!(k, Kind::I8 | Kind::U8 | Kind::I16 | Kind::U16 | Kind::I32 | Kind::U32 | Kind::I64 | Kind::U64 | Kind::I128)
}
fn is_float(k: Kind) -> bool {
    matches!(k, Kind::F16 | Kind::F32 | Kind::F64 | Kind::F80)
}
fn is_complex(k: Kind) -> bool {
    matches!(k, Kind::Complex(_))
}
/// Kinds whose elements are (or hold) a long double.
fn uses_ldouble(k: Kind) -> bool {
    matches!(k, Kind::F80 | Kind::Complex(Real::F80) | Kind::Pair(PairVal::F80, _))
}

/// Whether the standard allows `op` on `dt` (and this library can apply it). The standard's
/// table (MPI 5.0 section 6.9.2): MIN, MAX on integers and floating point; SUM, PROD on those
/// and complex; the logical ops on integers and logicals; the bitwise ops on integers and
/// bytes; MINLOC, MAXLOC on the pair types. (The logical ops are also taken on Fortran and
/// multi-language integers, which this summary does not tell from C ones, as MPICH does.)
fn allowed(op: MPI_Op, dt: &Dt) -> Result<(), MpiErr> {
    let k = dt.kind;
    let ok = match op {
        MPI_MIN | MPI_MAX => is_int(k) || is_float(k) || k == Kind::NoKernel { complex: false },
        MPI_SUM | MPI_PROD => is_int(k) || is_float(k) || is_complex(k) || matches!(k, Kind::NoKernel { .. }),
        MPI_LAND | MPI_LOR | MPI_LXOR => is_int(k) || matches!(k, Kind::Bool(_)),
        MPI_BAND | MPI_BOR | MPI_BXOR => is_int(k) || k == Kind::Byte,
        MPI_MINLOC | MPI_MAXLOC => matches!(k, Kind::Pair(..)),
        MPI_REPLACE | MPI_NO_OP => return crate::mpi_err!(MPI_ERR_OP, "{} is only for one-sided accumulate operations", op_name(op)),
        _ => return crate::mpi_err!(MPI_ERR_OP, "{op:#x} is not a valid operation"),
    };
    if !ok {
        return crate::mpi_err!(MPI_ERR_OP, "{} is not defined on {}", op_name(op), dt.name);
    }
    if matches!(k, Kind::NoKernel { .. }) || (uses_ldouble(k) && !ldouble::SUPPORTED) {
        return crate::mpi_err!(MPI_ERR_UNSUPPORTED_OPERATION, "{} on {}: this library has no arithmetic for that format", op_name(op), dt.name);
    }
    Ok(())
}

/// The engine's op for SUM, PROD, MIN and MAX: defined on every type the engine has.
pub fn engine_arithmetic(op: MPI_Op) -> Option<ReduceOp> {
    match op {
        MPI_SUM => Some(ReduceOp::Sum),
        MPI_PROD => Some(ReduceOp::Prod),
        MPI_MIN => Some(ReduceOp::Min),
        MPI_MAX => Some(ReduceOp::Max),
        _ => None,
    }
}

/// Chooses how `op` on `dt` runs; MPI_ERR_OP for a combination the standard does not define.
pub fn plan(op: MPI_Op, dt: &Dt) -> Result<Plan, MpiErr> {
    if op >= OP_BASE {
        let u = lock(&USER_OPS).get(op - OP_BASE).copied().filter(|u| u.live);
        let Some(u) = u else { return crate::mpi_err!(MPI_ERR_OP, "{op:#x} is not a valid operation (never made, or freed)") };
        let _ = u.commute;
        return Ok(Plan::Local(Local::User(u.f, *dt)));
    }
    let engine_op = engine_arithmetic(op).or(match op {
        MPI_BAND => Some(ReduceOp::Band),
        MPI_BOR => Some(ReduceOp::Bor),
        MPI_BXOR => Some(ReduceOp::Bxor),
        _ => None,
    });
    // The common case first, without the general check: an arithmetic op on a type the engine
    // has (every one an integer or a float, on which SUM, PROD, MIN and MAX are defined).
    if let (Some(d), Some(o)) = (dt.engine(), engine_op) {
        if !o.is_bitwise() {
            return Ok(Plan::Engine(d, o));
        }
    }
    allowed(op, dt)?;
    match (dt.engine(), engine_op) {
        (Some(d), Some(o)) if o.valid_for(d) => Ok(Plan::Engine(d, o)),
        _ => Ok(Plan::Local(Local::Predef(op, *dt))),
    }
}

pub fn create(f: Option<UserFn>, commute: bool) -> Result<MPI_Op, MpiErr> {
    let Some(f) = f else { return crate::mpi_err!(MPI_ERR_ARG, "user_fn is NULL") };
    let mut v = lock(&USER_OPS);
    v.push(UserOp { f, commute, live: true });
    Ok(OP_BASE + v.len() - 1)
}

pub fn free(op: MPI_Op) -> Result<(), MpiErr> {
    let mut v = lock(&USER_OPS);
    match op.checked_sub(OP_BASE).and_then(|i| v.get_mut(i)) {
        Some(u) if u.live => {
            u.live = false;
            Ok(())
        }
        _ => crate::mpi_err!(MPI_ERR_OP, "{op:#x} is not a user operation (predefined ones cannot be freed)"),
    }
}

/// MPI_Op_commutative: every predefined reduction op is commutative; MPI_REPLACE and
/// MPI_NO_OP are not (MPICH answers the same).
pub fn commutative(op: MPI_Op) -> Result<bool, MpiErr> {
    if op >= OP_BASE {
        return match lock(&USER_OPS).get(op - OP_BASE) {
            Some(u) if u.live => Ok(u.commute),
            _ => crate::mpi_err!(MPI_ERR_OP, "{op:#x} is not a valid operation (never made, or freed)"),
        };
    }
    match op {
        MPI_REPLACE | MPI_NO_OP => Ok(false),
        _ if valid_handle(op) => Ok(true),
        _ => crate::mpi_err!(MPI_ERR_OP, "{op:#x} is not a valid operation"),
    }
}

pub fn valid_handle(op: MPI_Op) -> bool {
    (MPI_SUM..=MPI_NO_OP).contains(&op) && op_name(op) != "a user op" || (op >= OP_BASE && lock(&USER_OPS).get(op - OP_BASE).is_some_and(|u| u.live))
}

// ---- applying an op here ------------------------------------------------------------------------

fn fold<T: Copy>(inv: &[u8], inout: &mut [u8], f: impl Fn(T, T) -> T) {
    let n = std::mem::size_of::<T>();
    for (a, b) in inv.chunks_exact(n).zip(inout.chunks_exact_mut(n)) {
        // SAFETY: both chunks hold exactly size_of::<T>() bytes; unaligned reads and writes.
        unsafe {
            let x = std::ptr::read_unaligned(a.as_ptr() as *const T);
            let y = std::ptr::read_unaligned(b.as_ptr() as *const T);
            std::ptr::write_unaligned(b.as_mut_ptr() as *mut T, f(x, y));
        }
    }
}

macro_rules! int_op {
    ($t:ty, $op:expr, $inv:expr, $inout:expr) => {
        match $op {
            MPI_SUM => fold::<$t>($inv, $inout, |a, b| a.wrapping_add(b)),
            MPI_PROD => fold::<$t>($inv, $inout, |a, b| a.wrapping_mul(b)),
            MPI_MIN => fold::<$t>($inv, $inout, |a, b| a.min(b)),
            MPI_MAX => fold::<$t>($inv, $inout, |a, b| a.max(b)),
            MPI_BAND => fold::<$t>($inv, $inout, |a, b| a & b),
            MPI_BOR => fold::<$t>($inv, $inout, |a, b| a | b),
            MPI_BXOR => fold::<$t>($inv, $inout, |a, b| a ^ b),
            MPI_LAND => fold::<$t>($inv, $inout, |a, b| (a != 0 && b != 0) as $t),
            MPI_LOR => fold::<$t>($inv, $inout, |a, b| (a != 0 || b != 0) as $t),
            MPI_LXOR => fold::<$t>($inv, $inout, |a, b| ((a != 0) != (b != 0)) as $t),
            _ => unreachable!("checked by plan"),
        }
    };
}

macro_rules! float_op {
    ($t:ty, $op:expr, $inv:expr, $inout:expr) => {
        match $op {
            MPI_SUM => fold::<$t>($inv, $inout, |a, b| a + b),
            MPI_PROD => fold::<$t>($inv, $inout, |a, b| a * b),
            MPI_MIN => fold::<$t>($inv, $inout, |a, b| a.min(b)),
            MPI_MAX => fold::<$t>($inv, $inout, |a, b| a.max(b)),
            _ => unreachable!("checked by plan"),
        }
    };
}

/// (value, index) pairs: MINLOC/MAXLOC keep the smaller/larger value, and on a tie the
/// smaller index. `V` is the value type, the int sits `off` bytes into the element.
fn pair_op<V: Copy + PartialOrd>(min: bool, off: usize, ext: usize, inv: &[u8], inout: &mut [u8]) {
    for (a, b) in inv.chunks_exact(ext).zip(inout.chunks_exact_mut(ext)) {
        // SAFETY: each chunk is one element: a V at 0 and an int at `off` (within `ext`).
        unsafe {
            let (va, vb) = (std::ptr::read_unaligned(a.as_ptr() as *const V), std::ptr::read_unaligned(b.as_ptr() as *const V));
            let (ia, ib) = (std::ptr::read_unaligned(a.as_ptr().add(off) as *const c_int), std::ptr::read_unaligned(b.as_ptr().add(off) as *const c_int));
            let better = if min { va < vb } else { va > vb };
            if better {
                std::ptr::write_unaligned(b.as_mut_ptr() as *mut V, va);
                std::ptr::write_unaligned(b.as_mut_ptr().add(off) as *mut c_int, ia);
            } else if va == vb && ia < ib {
                std::ptr::write_unaligned(b.as_mut_ptr().add(off) as *mut c_int, ia);
            }
        }
    }
}

/// inout = in (op) inout, for `count` elements.
pub fn apply(l: &Local, count: usize, inv: &[u8], inout: &mut [u8]) {
    match *l {
        Local::User(f, dt) => {
            let mut h = dt.handle;
            let (a, b) = (inv.as_ptr() as *mut c_void, inout.as_mut_ptr() as *mut c_void);
            match f {
                UserFn::Int(f) => {
                    // A count beyond an int goes to the function in pieces of at most INT_MAX.
                    let mut done = 0usize;
                    while done < count {
                        let n = (count - done).min(c_int::MAX as usize);
                        let mut len = n as c_int;
                        let off = done * dt.extent;
                        // SAFETY: the user's function, called as MPI_User_function is
                        // specified, on elements done..done + n of both buffers.
                        unsafe { f(a.cast::<u8>().add(off).cast(), b.cast::<u8>().add(off).cast(), &mut len, &mut h) };
                        done += n;
                    }
                }
                UserFn::Large(f) => {
                    let mut len = count as MPI_Count;
                    // SAFETY: the user's function, called as MPI_User_function_c is specified.
                    unsafe { f(a, b, &mut len, &mut h) };
                }
            }
        }
        Local::Predef(op, dt) => match dt.kind {
            Kind::I8 => int_op!(i8, op, inv, inout),
            Kind::U8 | Kind::Byte | Kind::Bool(1) => int_op!(u8, op, inv, inout),
            Kind::I16 => int_op!(i16, op, inv, inout),
            Kind::U16 | Kind::Bool(2) => int_op!(u16, op, inv, inout),
            Kind::I32 => int_op!(i32, op, inv, inout),
            Kind::U32 | Kind::Bool(4) => int_op!(u32, op, inv, inout),
            Kind::I64 => int_op!(i64, op, inv, inout),
            Kind::U64 | Kind::Bool(8) => int_op!(u64, op, inv, inout),
            Kind::I128 => int_op!(i128, op, inv, inout),
            Kind::Bool(16) => int_op!(u128, op, inv, inout),
            Kind::F32 => float_op!(f32, op, inv, inout),
            Kind::F64 => float_op!(f64, op, inv, inout),
            Kind::F80 => opnum::real::<F80>(op, inv, inout),
            Kind::Complex(Real::F32) => opnum::complex::<f32>(op, inv, inout),
            Kind::Complex(Real::F64) => opnum::complex::<f64>(op, inv, inout),
            Kind::Complex(Real::F80) => opnum::complex::<F80>(op, inv, inout),
            Kind::F16 => engine_apply(op, &dt, inv, inout),
            Kind::Pair(v, off) => {
                let (min, off, ext) = (op == MPI_MINLOC, off as usize, dt.extent);
                match v {
                    PairVal::F32 => pair_op::<f32>(min, off, ext, inv, inout),
                    PairVal::F64 => pair_op::<f64>(min, off, ext, inv, inout),
                    PairVal::I64 => pair_op::<i64>(min, off, ext, inv, inout),
                    PairVal::I32 => pair_op::<i32>(min, off, ext, inv, inout),
                    PairVal::I16 => pair_op::<i16>(min, off, ext, inv, inout),
                    PairVal::F80 => opnum::pair::<F80, i32>(min, off, ext, inv, inout),
                    PairVal::F32F32 => opnum::pair::<f32, f32>(min, off, ext, inv, inout),
                    PairVal::F64F64 => opnum::pair::<f64, f64>(min, off, ext, inv, inout),
                }
            }
            Kind::Bool(_) | Kind::Other | Kind::NoKernel { .. } => unreachable!("checked by plan"),
        },
    }
}

/// An op the engine has on a type it has (half floats): its kernel, in place.
fn engine_apply(op: MPI_Op, dt: &Dt, inv: &[u8], inout: &mut [u8]) {
    let o = match op {
        MPI_SUM => ReduceOp::Sum,
        MPI_PROD => ReduceOp::Prod,
        MPI_MIN => ReduceOp::Min,
        MPI_MAX => ReduceOp::Max,
        _ => unreachable!("checked by plan"),
    };
    let d = dt.engine().expect("a kind the engine has");
    distcomm::reduce::combine(d, o, inout, inv);
}

/// Folds `n` contributions of `block` bytes each (rank order) into `out`: x0 op x1 op ... .
pub fn fold_ranks(l: &Local, count: usize, block: usize, all: &[u8], out: &mut [u8]) {
    let n = all.len() / block.max(1);
    if block == 0 || n == 0 {
        return;
    }
    out[..block].copy_from_slice(&all[(n - 1) * block..n * block]);
    for i in (0..n - 1).rev() {
        apply(l, count, &all[i * block..(i + 1) * block], &mut out[..block]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::predefined;

    fn ints(v: &[i32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn plans_use_the_engine_where_it_has_the_op_and_type() {
        let int = predefined(MPI_INT).unwrap();
        assert!(matches!(plan(MPI_SUM, &int), Ok(Plan::Engine(distcomm::DType::Int32, ReduceOp::Sum))));
        assert!(matches!(plan(MPI_LAND, &int), Ok(Plan::Local(_))));
        let short = predefined(MPI_SHORT).unwrap();
        assert!(matches!(plan(MPI_SUM, &short), Ok(Plan::Local(_))));
        let float = predefined(MPI_FLOAT).unwrap();
        assert_eq!(plan(MPI_BXOR, &float).err().map(|e| e.class), Some(MPI_ERR_OP));
        assert_eq!(plan(MPI_MINLOC, &int).err().map(|e| e.class), Some(MPI_ERR_OP));
        assert_eq!(plan(MPI_REPLACE, &int).err().map(|e| e.class), Some(MPI_ERR_OP));
        assert_eq!(plan(MPI_OP_NULL, &int).err().map(|e| e.class), Some(MPI_ERR_OP));
        let cplx = predefined(MPI_C_DOUBLE_COMPLEX).unwrap();
        assert!(matches!(plan(MPI_PROD, &cplx), Ok(Plan::Local(_))));
        assert_eq!(plan(MPI_MAX, &cplx).err().map(|e| e.class), Some(MPI_ERR_OP), "complex numbers have no order");
        let ld = predefined(MPI_LONG_DOUBLE).unwrap();
        assert_eq!(plan(MPI_SUM, &ld).is_ok(), ldouble::SUPPORTED);
        assert_eq!(plan(MPI_BAND, &ld).err().map(|e| e.class), Some(MPI_ERR_OP));
        let q = predefined(MPI_REAL16).unwrap();
        assert_eq!(plan(MPI_SUM, &q).err().map(|e| e.class), Some(MPI_ERR_UNSUPPORTED_OPERATION));
        assert_eq!(plan(MPI_LAND, &q).err().map(|e| e.class), Some(MPI_ERR_OP));
        // MPI_CHAR reduces as C's char (an extension the standard's table lacks, as MPICH's).
        let ch = predefined(MPI_CHAR).unwrap();
        assert!(plan(MPI_SUM, &ch).is_ok());
        assert_eq!(plan(MPI_SUM, &predefined(MPI_CHARACTER).unwrap()).err().map(|e| e.class), Some(MPI_ERR_OP));
        assert!(plan(MPI_LAND, &predefined(MPI_C_BOOL).unwrap()).is_ok());
        assert_eq!(plan(MPI_BAND, &predefined(MPI_C_BOOL).unwrap()).err().map(|e| e.class), Some(MPI_ERR_OP));
        assert!(commutative(MPI_SUM).unwrap() && !commutative(MPI_REPLACE).unwrap());
        assert_eq!(commutative(MPI_OP_NULL).err().map(|e| e.class), Some(MPI_ERR_OP));
    }

    #[test]
    fn local_kernels() {
        let int = predefined(MPI_INT).unwrap();
        let mut io = ints(&[5, 0, -3]);
        apply(&Local::Predef(MPI_LAND, int), 3, &ints(&[1, 1, 0]), &mut io);
        assert_eq!(io, ints(&[1, 0, 0]));
        let mut io = ints(&[5, 0, -3]);
        apply(&Local::Predef(MPI_LXOR, int), 3, &ints(&[1, 1, 0]), &mut io);
        assert_eq!(io, ints(&[0, 1, 1]));
        let mut io = ints(&[i32::MAX]);
        apply(&Local::Predef(MPI_SUM, int), 1, &ints(&[1]), &mut io);
        assert_eq!(io, ints(&[i32::MIN]), "integer sums wrap");
        // MINLOC on MPI_2INT: the smaller value, and the smaller index on a tie.
        let pair = predefined(MPI_2INT).unwrap();
        let mut io = ints(&[3, 7, 2, 5]);
        apply(&Local::Predef(MPI_MINLOC, pair), 2, &ints(&[3, 4, 9, 1]), &mut io);
        assert_eq!(io, ints(&[3, 4, 2, 5]));
        let mut io = ints(&[3, 7]);
        apply(&Local::Predef(MPI_MAXLOC, pair), 1, &ints(&[8, 9]), &mut io);
        assert_eq!(io, ints(&[8, 9]));
    }

    unsafe extern "C" fn digits(inv: *mut c_void, inout: *mut c_void, len: *mut c_int, _dt: *mut MPI_Datatype) {
        // inout = the decimal digits of in, then those of inout: associative, not
        // commutative, so the result shows the order of application.
        unsafe {
            let (a, b) = (inv as *const i32, inout as *mut i32);
            for i in 0..*len as usize {
                let y = *b.add(i);
                let shift = 10i32.pow(y.max(1).ilog10() + 1);
                *b.add(i) = *a.add(i) * shift + y;
            }
        }
    }

    #[test]
    fn fold_is_in_rank_order() {
        let int = predefined(MPI_INT).unwrap();
        // Contributions of ranks 0..4 are 1, 2, 3, 4: x0 op x1 op x2 op x3 = 1234.
        let all = ints(&[1, 2, 3, 4]);
        let mut out = vec![0u8; 4];
        fold_ranks(&Local::User(UserFn::Int(digits), int), 1, 4, &all, &mut out);
        assert_eq!(out, ints(&[1234]));
        let h = create(Some(UserFn::Int(digits)), false).unwrap();
        assert!(h >= OP_BASE && valid_handle(h));
        assert!(matches!(plan(h, &int), Ok(Plan::Local(Local::User(..)))));
        free(h).unwrap();
        assert!(!valid_handle(h));
        assert_eq!(plan(h, &int).err().map(|e| e.class), Some(MPI_ERR_OP));
        assert_eq!(free(MPI_SUM).err().map(|e| e.class), Some(MPI_ERR_OP));
    }
}
