//! The "external32" data representation (MPI_Pack_external): every basic element big-endian,
//! at the standard's external32 sizes (MPI_LONG and MPI_UNSIGNED_LONG are 4 bytes there,
//! MPI_WCHAR 2). Long double types have no conversion here: MPI_ERR_UNSUPPORTED_OPERATION.

use crate::abi_gen::*;
use crate::datatype::predefined;
use crate::err::MpiErr;
use crate::typemap::Layout;

/// The integer or float components of one basic element: (native bytes, external32 bytes,
/// signed), in memory order of its packed form.
fn comps(h: MPI_Datatype) -> Result<Vec<(usize, usize, bool)>, MpiErr> {
    let d = predefined(h).ok_or_else(|| MpiErr::new(MPI_ERR_TYPE, format!("{h:#x} is not a basic datatype")))?;
    Ok(match h {
        MPI_LONG => vec![(8, 4, true)],
        MPI_UNSIGNED_LONG => vec![(8, 4, false)],
        MPI_WCHAR => vec![(4, 2, false)],
        MPI_LONG_INT => vec![(8, 4, true), (4, 4, true)],
        MPI_FLOAT_INT | MPI_2INT | MPI_2REAL | MPI_2INTEGER => vec![(4, 4, true), (4, 4, true)],
        MPI_DOUBLE_INT => vec![(8, 8, true), (4, 4, true)],
        MPI_SHORT_INT => vec![(2, 2, true), (4, 4, true)],
        MPI_2DOUBLE_PRECISION => vec![(8, 8, true), (8, 8, true)],
        MPI_LONG_DOUBLE | MPI_C_LONG_DOUBLE_COMPLEX | MPI_CXX_LONG_DOUBLE_COMPLEX | MPI_LONG_DOUBLE_INT | MPI_REAL16 | MPI_COMPLEX32 => {
            return crate::mpi_err!(MPI_ERR_UNSUPPORTED_OPERATION, "{} has no external32 conversion here", d.name)
        }
        _ if d.name.contains("COMPLEX") => vec![(d.size / 2, d.size / 2, true), (d.size / 2, d.size / 2, true)],
        _ => vec![(d.size, d.size, true)],
    })
}

/// Calls `f(native component bytes, external32 bytes, signed)` for each component of `count`
/// elements of `map`, in packed order.
fn walk(map: &Layout, count: u64, mut f: impl FnMut(usize, usize, bool)) -> Result<(), MpiErr> {
    let per: Vec<(Vec<(usize, usize, bool)>, u64)> = map.sig.iter().map(|r| Ok((comps(r.basic)?, r.n))).collect::<Result<_, MpiErr>>()?;
    for _ in 0..count {
        for (cs, n) in &per {
            for _ in 0..*n {
                for &(a, b, s) in cs {
                    f(a, b, s);
                }
            }
        }
    }
    Ok(())
}

/// Bytes of `count` elements of `map` in external32.
pub fn size(map: &Layout, count: u64) -> Result<u64, MpiErr> {
    let mut per = 0u64;
    walk(map, 1, |_, b, _| per += b as u64)?;
    per.checked_mul(count).ok_or_else(|| MpiErr::new(MPI_ERR_COUNT, format!("count {count} overflows")))
}

/// Native packed bytes -> external32.
pub fn encode(map: &Layout, native: &[u8], count: u64) -> Result<Vec<u8>, MpiErr> {
    let mut out = Vec::with_capacity(native.len());
    let mut i = 0;
    walk(map, count, |a, b, _| {
        // Little-endian native value: its low `b` bytes, most significant first.
        let v = &native[i..i + a];
        out.extend(v[..b].iter().rev());
        i += a;
    })?;
    Ok(out)
}

/// External32 -> native packed bytes (narrowed integers widened back, sign-extended).
pub fn decode(map: &Layout, ext: &[u8], count: u64) -> Result<Vec<u8>, MpiErr> {
    let mut out = Vec::with_capacity(ext.len());
    let mut i = 0;
    walk(map, count, |a, b, signed| {
        let v = &ext[i..i + b];
        out.extend(v.iter().rev());
        let fill = if signed && b < a && v[0] & 0x80 != 0 { 0xff } else { 0 };
        out.extend(std::iter::repeat_n(fill, a - b));
        i += b;
    })?;
    Ok(out)
}
