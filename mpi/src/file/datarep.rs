//! Data representations of a view: "native" ("internal" is the same here), "external32", and
//! the program's own (MPI_Register_datarep). A registered representation's conversion
//! functions turn a transfer's elements into the bytes the file holds and back; its extent
//! function must give each basic type its native extent, the one layout this library stores
//! them in (another answers MPI_ERR_UNSUPPORTED_DATAREP at MPI_File_set_view).

use crate::abi_gen::*;
use crate::datatype::Type;
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub enum Datarep {
    Native,
    /// Every basic element big-endian (MPI_Pack_external's form), for types whose external32
    /// size is their native size.
    External32,
    User(Arc<UserRep>),
}

#[derive(Clone, Copy)]
enum Conversion {
    Int(MPI_Datarep_conversion_function),
    Large(MPI_Datarep_conversion_function_c),
}

pub struct UserRep {
    name: String,
    read: Option<Conversion>,
    write: Option<Conversion>,
    extent: MPI_Datarep_extent_function,
    extra: usize,
}

static REGISTERED: Mutex<Vec<Arc<UserRep>>> = Mutex::new(Vec::new());

const BUILT_IN: [&str; 3] = ["native", "internal", "external32"];

impl Datarep {
    pub fn parse(s: &str) -> Result<Datarep, MpiErr> {
        match s {
            "native" | "internal" => return Ok(Datarep::Native),
            "external32" => return Ok(Datarep::External32),
            _ => {}
        }
        let reps = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
        match reps.iter().find(|r| r.name == s) {
            Some(r) => Ok(Datarep::User(r.clone())),
            None => mpi_err!(MPI_ERR_UNSUPPORTED_DATAREP, "data representation {s:?} is neither \"native\", \"internal\", \"external32\" nor registered (MPI_Register_datarep)"),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Datarep::Native => "native",
            Datarep::External32 => "external32",
            Datarep::User(r) => &r.name,
        }
    }

    /// Refuses a type this representation would lay out otherwise than in memory.
    pub fn check(&self, t: &Type, what: &str) -> Res {
        match self {
            Datarep::Native => Ok(()),
            Datarep::External32 if crate::external32::size(&t.map, 1)? != t.map.size => {
                mpi_err!(MPI_ERR_UNSUPPORTED_DATAREP, "{what} has elements whose external32 size is not their native size (such as MPI_LONG); distcomm stores only same-size types as external32")
            }
            Datarep::External32 => Ok(()),
            Datarep::User(r) => r.check(t, what),
        }
    }

    /// The bytes the file holds for `count` elements of `dt` (type `t`) at `buf` (packed
    /// `native` bytes of them given), or None when they are the packed native bytes themselves.
    pub fn to_file(&self, native: &[u8], buf: *const c_void, count: MPI_Count, t: &Type, dt: MPI_Datatype) -> Result<Option<Vec<u8>>, MpiErr> {
        match self {
            Datarep::Native => Ok(None),
            Datarep::External32 => crate::external32::encode(&t.map, native, count as u64).map(Some),
            Datarep::User(r) => match r.write {
                None => Ok(None),
                Some(conv) => {
                    let mut file = vec![0u8; native.len()];
                    r.convert(conv, buf as *mut c_void, dt, count, &mut file)?;
                    Ok(Some(file))
                }
            },
        }
    }

    /// Whether reads hand the file's bytes to `from_file` rather than unpacking them.
    pub fn converts_reads(&self) -> bool {
        match self {
            Datarep::Native => false,
            Datarep::External32 => true,
            Datarep::User(r) => r.read.is_some(),
        }
    }

    /// Reads: `file` holds `count` whole elements of `dt` (type `t`) as the file has them;
    /// they go to the caller's `buf` (user representations) or become native packed bytes in
    /// place.
    pub fn from_file(&self, file: &mut [u8], buf: *mut c_void, count: u64, t: &Type, dt: MPI_Datatype) -> Res {
        match self {
            Datarep::Native => Ok(()),
            Datarep::External32 => {
                let native = crate::external32::decode(&t.map, file, count)?;
                file[..native.len()].copy_from_slice(&native);
                Ok(())
            }
            Datarep::User(r) => match r.read {
                None => Ok(()),
                Some(conv) => r.convert(conv, buf, dt, count as MPI_Count, file),
            },
        }
    }

    /// Whether the read conversion writes the caller's buffer itself (no unpacking after it).
    pub fn reads_into_caller(&self) -> bool {
        matches!(self, Datarep::User(r) if r.read.is_some())
    }
}

impl UserRep {
    /// Every basic type of `t` must have its native extent in the file.
    fn check(&self, t: &Type, what: &str) -> Res {
        let mut bad = None;
        let mut failed = None;
        t.map.for_each_run(|run| {
            if bad.is_some() || failed.is_some() {
                return;
            }
            let mut ext: MPI_Aint = 0;
            // SAFETY: the program's function, called as MPI_Register_datarep's contract says.
            let rc = unsafe { (self.extent)(run.basic, &mut ext, self.extra as *mut c_void) };
            let native = crate::datatype::predefined(run.basic).map_or(0, |d| d.extent as MPI_Aint);
            if rc != MPI_SUCCESS {
                failed = Some(rc);
            } else if ext != native {
                bad = Some((run.basic, ext, native));
            }
        });
        if let Some(rc) = failed {
            return Err(MpiErr::new(crate::err::class_of(rc).unwrap_or(MPI_ERR_OTHER), format!("the extent function of data representation {:?} failed (error {rc})", self.name)));
        }
        if let Some((basic, ext, native)) = bad {
            let name = crate::datatype::name(basic).unwrap_or_default();
            return mpi_err!(MPI_ERR_UNSUPPORTED_DATAREP, "data representation {:?} gives {name} of {what} an extent of {ext} bytes in the file, not its {native} in memory; distcomm stores a registered representation in the native layout only", self.name);
        }
        Ok(())
    }

    fn convert(&self, conv: Conversion, userbuf: *mut c_void, dt: MPI_Datatype, count: MPI_Count, file: &mut [u8]) -> Res {
        let file_ptr = file.as_mut_ptr() as *mut c_void;
        // SAFETY: the program's function on its buffer and ours of the elements' packed size.
        let rc = match conv {
            Conversion::Large(f) => unsafe { f(userbuf, dt, count, file_ptr, 0, self.extra as *mut c_void) },
            Conversion::Int(f) => {
                let n = c_int::try_from(count).map_err(|_| MpiErr::new(MPI_ERR_COUNT, format!("{count} elements do not fit the int count of the conversion function (register it with MPI_Register_datarep_c)")))?;
                unsafe { f(userbuf, dt, n, file_ptr, 0, self.extra as *mut c_void) }
            }
        };
        if rc != MPI_SUCCESS {
            return Err(MpiErr::new(crate::err::class_of(rc).unwrap_or(MPI_ERR_OTHER), format!("the conversion function of data representation {:?} failed (error {rc})", self.name)));
        }
        Ok(())
    }
}

fn register(name: *const std::ffi::c_char, read: Option<Conversion>, write: Option<Conversion>, extent: Option<MPI_Datarep_extent_function>, extra: *mut c_void) -> Res {
    crate::state::check_active()?;
    if name.is_null() {
        return mpi_err!(MPI_ERR_ARG, "datarep is NULL");
    }
    // SAFETY: a NUL-terminated string from the caller.
    let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned();
    if name.len() >= MPI_MAX_DATAREP_STRING as usize {
        return mpi_err!(MPI_ERR_ARG, "datarep {name:?} is longer than MPI_MAX_DATAREP_STRING - 1");
    }
    let Some(extent) = extent else { return mpi_err!(MPI_ERR_ARG, "dtype_file_extent_fn is NULL") };
    let mut reps = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    if BUILT_IN.contains(&name.as_str()) || reps.iter().any(|r| r.name == name) {
        return mpi_err!(MPI_ERR_DUP_DATAREP, "data representation {name:?} is already defined");
    }
    reps.push(Arc::new(UserRep { name, read, write, extent, extra: extra as usize }));
    Ok(())
}

pub unsafe fn register_datarep(
    name: *const std::ffi::c_char,
    read: Option<MPI_Datarep_conversion_function>,
    write: Option<MPI_Datarep_conversion_function>,
    extent: Option<MPI_Datarep_extent_function>,
    extra: *mut c_void,
) -> Res {
    register(name, read.map(Conversion::Int), write.map(Conversion::Int), extent, extra)
}

pub unsafe fn register_datarep_c(
    name: *const std::ffi::c_char,
    read: Option<MPI_Datarep_conversion_function_c>,
    write: Option<MPI_Datarep_conversion_function_c>,
    extent: Option<MPI_Datarep_extent_function>,
    extra: *mut c_void,
) -> Res {
    register(name, read.map(Conversion::Large), write.map(Conversion::Large), extent, extra)
}
