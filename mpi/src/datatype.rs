//! Datatypes: the standard's predefined ones (size, extent, what reductions see).

use crate::abi_gen::*;
use crate::err::MpiErr;
use distcomm::DType;
use std::sync::Mutex;

/// Handles of derived datatypes: TYPE_BASE + slot.
pub const TYPE_BASE: usize = 0x6000_0000;

/// A derived datatype: this library makes only contiguous ones (MPI_Type_contiguous, a dup),
/// which are a predefined element repeated, so they move and reduce like their element.
struct Derived {
    dt: Dt,
    committed: bool,
}

static DERIVED: Mutex<Vec<Option<Derived>>> = Mutex::new(Vec::new());

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
    /// C _Bool / C++ bool / Fortran LOGICAL of this many bytes.
    Bool(u8),
    Byte,
    /// (value, int index) pairs for MINLOC/MAXLOC: value kind, offset of the int.
    Pair(PairVal, u8),
    /// Complex, long double, wchar and the like: moved, not reduced here.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairVal {
    F32,
    F64,
    I64,
    I32,
    I16,
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
    /// Bytes one basic (predefined) element spans: MPI_Get_elements counts these.
    pub elem: usize,
}

macro_rules! dt {
    ($h:expr, $size:expr, $ext:expr, $kind:expr, $name:expr) => {
        Some(Dt { handle: $h, size: $size, extent: $ext, kind: $kind, name: $name, elem: $ext })
    };
}

/// The predefined datatype behind a handle.
pub fn predefined(h: MPI_Datatype) -> Option<Dt> {
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
        MPI_C_FLOAT_COMPLEX => dt!(h, 8, 8, Other, "MPI_C_FLOAT_COMPLEX"),
        MPI_CXX_FLOAT_COMPLEX => dt!(h, 8, 8, Other, "MPI_CXX_FLOAT_COMPLEX"),
        MPI_DOUBLE => dt!(h, 8, 8, F64, "MPI_DOUBLE"),
        MPI_C_DOUBLE_COMPLEX => dt!(h, 16, 16, Other, "MPI_C_DOUBLE_COMPLEX"),
        MPI_CXX_DOUBLE_COMPLEX => dt!(h, 16, 16, Other, "MPI_CXX_DOUBLE_COMPLEX"),
        MPI_LOGICAL => dt!(h, 4, 4, Bool(4), "MPI_LOGICAL"),
        MPI_INTEGER => dt!(h, 4, 4, I32, "MPI_INTEGER"),
        MPI_REAL => dt!(h, 4, 4, F32, "MPI_REAL"),
        MPI_COMPLEX => dt!(h, 8, 8, Other, "MPI_COMPLEX"),
        MPI_DOUBLE_PRECISION => dt!(h, 8, 8, F64, "MPI_DOUBLE_PRECISION"),
        MPI_DOUBLE_COMPLEX => dt!(h, 16, 16, Other, "MPI_DOUBLE_COMPLEX"),
        MPI_CHARACTER => dt!(h, 1, 1, Other, "MPI_CHARACTER"),
        MPI_LONG_DOUBLE => dt!(h, 16, 16, Other, "MPI_LONG_DOUBLE"),
        MPI_C_LONG_DOUBLE_COMPLEX => dt!(h, 32, 32, Other, "MPI_C_LONG_DOUBLE_COMPLEX"),
        MPI_CXX_LONG_DOUBLE_COMPLEX => dt!(h, 32, 32, Other, "MPI_CXX_LONG_DOUBLE_COMPLEX"),
        MPI_FLOAT_INT => dt!(h, 8, 8, Pair(PairVal::F32, 4), "MPI_FLOAT_INT"),
        MPI_DOUBLE_INT => dt!(h, 12, 16, Pair(PairVal::F64, 8), "MPI_DOUBLE_INT"),
        MPI_LONG_INT => dt!(h, 12, 16, Pair(PairVal::I64, 8), "MPI_LONG_INT"),
        MPI_2INT => dt!(h, 8, 8, Pair(PairVal::I32, 4), "MPI_2INT"),
        MPI_SHORT_INT => dt!(h, 6, 8, Pair(PairVal::I16, 4), "MPI_SHORT_INT"),
        MPI_LONG_DOUBLE_INT => dt!(h, 20, 32, Other, "MPI_LONG_DOUBLE_INT"),
        MPI_2REAL => dt!(h, 8, 8, Other, "MPI_2REAL"),
        MPI_2DOUBLE_PRECISION => dt!(h, 16, 16, Other, "MPI_2DOUBLE_PRECISION"),
        MPI_2INTEGER => dt!(h, 8, 8, Pair(PairVal::I32, 4), "MPI_2INTEGER"),
        MPI_C_BOOL => dt!(h, 1, 1, Bool(1), "MPI_C_BOOL"),
        MPI_CXX_BOOL => dt!(h, 1, 1, Bool(1), "MPI_CXX_BOOL"),
        MPI_WCHAR => dt!(h, 4, 4, Other, "MPI_WCHAR"),
        MPI_INT8_T => dt!(h, 1, 1, I8, "MPI_INT8_T"),
        MPI_UINT8_T => dt!(h, 1, 1, U8, "MPI_UINT8_T"),
        MPI_CHAR => dt!(h, 1, 1, Other, "MPI_CHAR"),
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
        MPI_COMPLEX4 => dt!(h, 4, 4, Other, "MPI_COMPLEX4"),
        MPI_LOGICAL8 => dt!(h, 8, 8, Bool(8), "MPI_LOGICAL8"),
        MPI_INTEGER8 => dt!(h, 8, 8, I64, "MPI_INTEGER8"),
        MPI_REAL8 => dt!(h, 8, 8, F64, "MPI_REAL8"),
        MPI_COMPLEX8 => dt!(h, 8, 8, Other, "MPI_COMPLEX8"),
        MPI_LOGICAL16 => dt!(h, 16, 16, Other, "MPI_LOGICAL16"),
        MPI_INTEGER16 => dt!(h, 16, 16, Other, "MPI_INTEGER16"),
        MPI_REAL16 => dt!(h, 16, 16, Other, "MPI_REAL16"),
        MPI_COMPLEX16 => dt!(h, 16, 16, Other, "MPI_COMPLEX16"),
        MPI_COMPLEX32 => dt!(h, 32, 32, Other, "MPI_COMPLEX32"),
        _ => None,
    }
}

/// The datatype behind a handle, committed or not (for the type queries), or MPI_ERR_TYPE.
pub fn get_any(h: MPI_Datatype) -> Result<(Dt, bool), MpiErr> {
    if let Some(d) = predefined(h) {
        return Ok((d, true));
    }
    if h >= TYPE_BASE {
        if let Some(Some(d)) = lock(&DERIVED).get(h - TYPE_BASE) {
            return Ok((d.dt, d.committed));
        }
    }
    if h == MPI_DATATYPE_NULL {
        return crate::mpi_err!(MPI_ERR_TYPE, "MPI_DATATYPE_NULL is not a datatype");
    }
    crate::mpi_err!(MPI_ERR_TYPE, "{h:#x} is not a valid datatype (never made, or freed)")
}

/// The datatype behind a handle for communication: it must be committed.
pub fn get(h: MPI_Datatype) -> Result<Dt, MpiErr> {
    match get_any(h)? {
        (d, true) => Ok(d),
        (_, false) => crate::mpi_err!(MPI_ERR_TYPE, "datatype {h:#x} is not committed (MPI_Type_commit)"),
    }
}

/// MPI_Type_contiguous: `count` elements of `old` back to back.
pub fn contiguous(count: i64, old: MPI_Datatype) -> Result<MPI_Datatype, MpiErr> {
    if count < 0 {
        return crate::mpi_err!(MPI_ERR_COUNT, "count {count} is negative");
    }
    let (o, _) = get_any(old)?;
    let n = count as usize;
    let (size, extent) = (o.size.checked_mul(n), o.extent.checked_mul(n));
    let (Some(size), Some(extent)) = (size, extent) else { return crate::mpi_err!(MPI_ERR_COUNT, "count {count} overflows") };
    // MINLOC/MAXLOC are defined on the predefined pair types only.
    let kind = if matches!(o.kind, Kind::Pair(..)) { Kind::Other } else { o.kind };
    Ok(add(Dt { handle: 0, size, extent, kind, name: "", elem: o.elem }))
}

/// MPI_Type_dup: the same type under a new handle (committed if the old one is).
pub fn dup(old: MPI_Datatype) -> Result<MPI_Datatype, MpiErr> {
    let (o, committed) = get_any(old)?;
    let h = add(Dt { name: if old >= TYPE_BASE { o.name } else { "" }, ..o });
    if committed {
        commit(h)?;
    }
    Ok(h)
}

fn add(mut d: Dt) -> MPI_Datatype {
    let mut v = lock(&DERIVED);
    let slot = v.iter().position(|s| s.is_none()).unwrap_or_else(|| {
        v.push(None);
        v.len() - 1
    });
    d.handle = TYPE_BASE + slot;
    v[slot] = Some(Derived { dt: d, committed: false });
    d.handle
}

pub fn commit(h: MPI_Datatype) -> Result<(), MpiErr> {
    if predefined(h).is_some() {
        return Ok(());
    }
    get_any(h)?;
    if let Some(Some(d)) = lock(&DERIVED).get_mut(h - TYPE_BASE) {
        d.committed = true;
    }
    Ok(())
}

/// MPI_Type_free: derived types only (operations in flight keep what they need).
pub fn free(h: MPI_Datatype) -> Result<(), MpiErr> {
    if predefined(h).is_some() {
        return crate::mpi_err!(MPI_ERR_TYPE, "predefined datatypes cannot be freed");
    }
    get_any(h)?;
    lock(&DERIVED)[h - TYPE_BASE] = None;
    Ok(())
}

impl Dt {
    /// Bytes that `count` elements span, or MPI_ERR_COUNT.
    pub fn bytes(&self, count: i64) -> Result<usize, MpiErr> {
        if count < 0 {
            return crate::mpi_err!(MPI_ERR_COUNT, "count {count} is negative");
        }
        (count as u64)
            .checked_mul(self.extent as u64)
            .filter(|&b| b <= isize::MAX as u64)
            .map(|b| b as usize)
            .ok_or_else(|| MpiErr::new(MPI_ERR_COUNT, format!("count {count} of {} overflows", self.name)))
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
        assert_eq!((d.size, d.extent, d.elem, d.kind), (24, 24, 8, Kind::F64));
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
