//! The "external32" data representation (MPI_Pack_external): every basic element big-endian,
//! at the standard's external32 sizes (MPI_LONG and MPI_UNSIGNED_LONG are 4 bytes there,
//! MPI_WCHAR 2). Long double types have no conversion here: MPI_ERR_UNSUPPORTED_OPERATION.

use crate::abi_gen::*;
use crate::datatype::predefined;
use crate::err::MpiErr;
use crate::typemap::Layout;

/// Native bytes, external32 bytes, and how the value converts.
#[derive(Clone, Copy)]
enum Conv {
    /// An integer or IEEE float: byte order (and width, for integers: `signed` extends).
    Int(bool),
    /// x86 80-bit extended (in 16 bytes) <-> IEEE binary128.
    LongDouble,
}

/// (native bytes, external32 bytes, conversion) of one component.
type Comp = (usize, usize, Conv);

/// The components of one basic element: (native bytes, external32 bytes, conversion), in the
/// order of its packed form.
fn comps(h: MPI_Datatype) -> Result<Vec<Comp>, MpiErr> {
    use Conv::*;
    let ld = (16, 16, LongDouble);
    Ok(match h {
        MPI_LONG_DOUBLE | MPI_REAL16 => vec![ld],
        MPI_C_LONG_DOUBLE_COMPLEX | MPI_CXX_LONG_DOUBLE_COMPLEX | MPI_COMPLEX32 => vec![ld, ld],
        MPI_LONG_DOUBLE_INT => vec![ld, (4, 4, Int(true))],
        _ => int_comps(h)?.into_iter().map(|(a, b, s)| (a, b, Int(s))).collect(),
    })
}

fn int_comps(h: MPI_Datatype) -> Result<Vec<(usize, usize, bool)>, MpiErr> {
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
        _ if d.name.contains("COMPLEX") => vec![(d.size / 2, d.size / 2, true), (d.size / 2, d.size / 2, true)],
        _ => vec![(d.size, d.size, true)],
    })
}

/// Calls `f(native component bytes, external32 bytes, conversion)` for each component of
/// `count` elements of `map`, in packed order (each basic type's components looked up once).
fn walk(map: &Layout, count: u64, mut f: impl FnMut(usize, usize, Conv)) -> Result<(), MpiErr> {
    let mut known: Vec<(usize, Vec<Comp>)> = Vec::new();
    let mut failed = None;
    for _ in 0..count {
        map.for_each_run(|r| {
            if failed.is_some() {
                return;
            }
            let i = match known.iter().position(|k| k.0 == r.basic) {
                Some(i) => i,
                None => match comps(r.basic) {
                    Ok(cs) => {
                        known.push((r.basic, cs));
                        known.len() - 1
                    }
                    Err(e) => {
                        failed = Some(e);
                        return;
                    }
                },
            };
            for _ in 0..r.n {
                for &(a, b, c) in &known[i].1 {
                    f(a, b, c);
                }
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(())
}

/// Bytes of `count` elements of `map` in external32 (counted over the type's compact
/// signature, not element by element: a type may hold 2^40 of them).
pub fn size(map: &Layout, count: u64) -> Result<u64, MpiErr> {
    let overflow = || MpiErr::new(MPI_ERR_COUNT, format!("count {count} overflows"));
    let per = map.sum_over_runs(&|r| r.n.checked_mul(comps(r.basic)?.iter().map(|c| c.1 as u64).sum()).ok_or_else(overflow), &overflow)?;
    per.checked_mul(count).ok_or_else(overflow)
}

/// Native packed bytes -> external32.
pub fn encode(map: &Layout, native: &[u8], count: u64) -> Result<Vec<u8>, MpiErr> {
    let mut out = Vec::with_capacity(native.len());
    let mut i = 0;
    walk(map, count, |a, b, c| {
        let v = &native[i..i + a];
        match c {
            // Little-endian native value: its low `b` bytes, most significant first.
            Conv::Int(_) => out.extend(v[..b].iter().rev()),
            Conv::LongDouble => out.extend(x87_to_quad(v).to_be_bytes()),
        }
        i += a;
    })?;
    Ok(out)
}

/// External32 -> native packed bytes (narrowed integers widened back, sign-extended).
pub fn decode(map: &Layout, ext: &[u8], count: u64) -> Result<Vec<u8>, MpiErr> {
    let mut out = Vec::with_capacity(ext.len());
    let mut i = 0;
    walk(map, count, |a, b, c| {
        let v = &ext[i..i + b];
        match c {
            Conv::Int(signed) => {
                out.extend(v.iter().rev());
                let fill = if signed && b < a && v[0] & 0x80 != 0 { 0xff } else { 0 };
                out.extend(std::iter::repeat_n(fill, a - b));
            }
            Conv::LongDouble => out.extend(quad_to_x87(u128::from_be_bytes(v.try_into().expect("16 bytes")))),
        }
        i += b;
    })?;
    Ok(out)
}

/// x86 extended precision (64-bit mantissa with explicit integer bit, 15-bit exponent, sign;
/// little-endian in the first 10 of 16 bytes) as IEEE binary128 bits: the same exponent bias,
/// the 63 fraction bits at the top of the 112.
fn x87_to_quad(v: &[u8]) -> u128 {
    let mant = u64::from_le_bytes(v[0..8].try_into().expect("8 bytes"));
    let se = u16::from_le_bytes([v[8], v[9]]) as u128;
    let frac = (mant & !(1u64 << 63)) as u128;
    (se << 112) | (frac << 49)
}

/// The inverse of `x87_to_quad` (the 49 lowest fraction bits of binary128 are dropped).
fn quad_to_x87(q: u128) -> [u8; 16] {
    let se = (q >> 112) as u16;
    let frac = ((q >> 49) as u64) & !(1u64 << 63);
    // The explicit integer bit: set for every normal number (exponent not 0), and for inf/NaN.
    let int = if se & 0x7fff != 0 { 1u64 << 63 } else { 0 };
    let mut out = [0u8; 16];
    out[0..8].copy_from_slice(&(frac | int).to_le_bytes());
    out[8..10].copy_from_slice(&se.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::resolve_any;

    #[test]
    fn ints_and_doubles_are_big_endian_and_long_is_four_bytes() {
        let int = resolve_any(MPI_INT).unwrap().0;
        assert_eq!(encode(&int.map, &258i32.to_le_bytes(), 1).unwrap(), vec![0, 0, 1, 2]);
        let long = resolve_any(MPI_LONG).unwrap().0;
        assert_eq!(size(&long.map, 3).unwrap(), 12);
        let e = encode(&long.map, &(-2i64).to_le_bytes(), 1).unwrap();
        assert_eq!(e, vec![0xff, 0xff, 0xff, 0xfe]);
        assert_eq!(decode(&long.map, &e, 1).unwrap(), (-2i64).to_le_bytes().to_vec());
        let d = resolve_any(MPI_DOUBLE).unwrap().0;
        assert_eq!(encode(&d.map, &1.5f64.to_le_bytes(), 1).unwrap(), 1.5f64.to_be_bytes().to_vec());
    }

    /// A type of 2^40 { long; int } pairs: its size is counted without writing it out, and a
    /// small vector of the same pairs converts as its elements one by one.
    #[test]
    fn sizes_of_huge_types_are_counted_compactly() {
        use crate::typemap::Part;
        let (long, int) = (resolve_any(MPI_LONG).unwrap().0, resolve_any(MPI_INT).unwrap().0);
        let pair = Layout::compose(&[Part::new(0, 1, &long.map), Part::new(8, 1, &int.map)], true).unwrap();
        let huge = Layout::compose(&[Part::strided(0, 1 << 40, 32, &pair)], false).unwrap();
        assert_eq!(size(&huge, 2).unwrap(), 2 * (1u64 << 40) * 8);
        let small = Layout::compose(&[Part::strided(0, 300, 32, &pair)], false).unwrap();
        let native: Vec<u8> = (0..300).flat_map(|k: i64| [(-k).to_le_bytes().to_vec(), (k as i32).to_le_bytes().to_vec()].concat()).collect();
        let e = encode(&small, &native, 1).unwrap();
        assert_eq!(e.len() as u64, size(&small, 1).unwrap());
        assert_eq!(&e[8 * 299..8 * 300], &[0xff, 0xff, 0xfe, 0xd5, 0, 0, 1, 43]);
        assert_eq!(decode(&small, &e, 1).unwrap(), native);
    }

    #[test]
    fn long_double_converts_to_binary128_and_back() {
        // 1.5 in x87: mantissa 0xC000_0000_0000_0000, exponent 0x3fff.
        let mut x = [0u8; 16];
        x[0..8].copy_from_slice(&0xC000_0000_0000_0000u64.to_le_bytes());
        x[8..10].copy_from_slice(&0x3fffu16.to_le_bytes());
        let q = x87_to_quad(&x);
        assert_eq!(q >> 112, 0x3fff);
        assert_eq!(q, 0x3fff_8000_0000_0000_0000_0000_0000_0000u128);
        assert_eq!(quad_to_x87(q), x);
    }
}
