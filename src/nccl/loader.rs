//! Run-time discovery of the CUDA driver and NCCL, done with our own `dlopen` before cudarc is
//! ever touched: cudarc panics when a library or symbol is missing, so nothing reaches it until
//! this probe has seen every library and symbol it will be asked for.
//!
//! NCCL entry points are resolved here too, from our own handle on `libnccl.so.2`, and typed with
//! cudarc's NCCL bindings: cudarc's own loader only looks for `libnccl.so` and a list of names
//! that does not include `libnccl.so.2`, the one name every NCCL runtime ships under (the
//! `libnccl.so` link comes only with development packages, and pip's `nvidia-nccl-cu12` has none).

use cudarc::nccl::sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// The CUDA driver library name probed by default.
pub const CUDA_LIB: &str = "libcuda.so.1";
/// The NCCL runtime library name probed by default (`DC_NCCL_LIBRARY` overrides it).
pub const NCCL_LIB: &str = "libnccl.so.2";

/// Every driver symbol the backend calls through cudarc (cudarc resolves them lazily and panics
/// on a missing one, so all are checked up front).
pub const CUDA_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetPCIBusId",
    "cuDevicePrimaryCtxRetain",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxGetDevice",
    "cuPointerGetAttribute",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventDestroy_v2",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyDtoDAsync_v2",
];

/// A library opened with `dlopen(RTLD_NOW | RTLD_LOCAL)`. Never closed: cudarc, NCCL and our
/// function table keep pointers into it for the life of the process.
pub struct Lib {
    handle: *mut c_void,
    pub name: String,
}

// SAFETY: a dlopen handle may be used from any thread (dlsym is thread-safe).
unsafe impl Send for Lib {}
unsafe impl Sync for Lib {}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

impl Lib {
    /// Opens `name` (a file name searched like the dynamic loader does, or a path).
    /// The error text is dlerror's, which names the file and the reason.
    pub fn open(name: &str) -> Result<Lib, String> {
        let c = CString::new(name).map_err(|_| format!("{name:?}: name contains NUL"))?;
        // SAFETY: a valid C string; RTLD_LOCAL keeps the library's symbols out of the global scope.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(dlerror_text());
        }
        Ok(Lib { handle, name: name.to_string() })
    }

    /// The address of `sym`, if the library defines it.
    pub fn sym(&self, sym: &str) -> Option<*mut c_void> {
        let c = CString::new(sym).ok()?;
        // SAFETY: a live handle and a valid C string.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// The symbols of `names` this library lacks.
    pub fn missing(&self, names: &[&str]) -> Vec<String> {
        names.iter().filter(|n| self.sym(n).is_none()).map(|n| n.to_string()).collect()
    }
}

type NcclRes = c_int;

/// The NCCL entry points the backend calls, resolved from our own handle. Results are read as
/// plain integers (a newer NCCL may return codes that no Rust enum of ours knows).
#[allow(clippy::type_complexity)]
pub struct NcclApi {
    /// ncclGetVersion: major*10000 + minor*100 + patch.
    pub version: i32,
    pub get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> NcclRes,
    pub comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> NcclRes,
    /// ncclCommSplit (NCCL 2.18+): comm, color, key, newcomm, config (NULL: the parent's).
    pub comm_split: Option<unsafe extern "C" fn(ncclComm_t, c_int, c_int, *mut ncclComm_t, *mut c_void) -> NcclRes>,
    pub comm_abort: unsafe extern "C" fn(ncclComm_t) -> NcclRes,
    pub comm_destroy: unsafe extern "C" fn(ncclComm_t) -> NcclRes,
    pub comm_get_async_error: unsafe extern "C" fn(ncclComm_t, *mut NcclRes) -> NcclRes,
    pub get_error_string: unsafe extern "C" fn(NcclRes) -> *const c_char,
    /// ncclGetLastError (NCCL 2.13+): the text of the last failure.
    pub get_last_error: Option<unsafe extern "C" fn(ncclComm_t) -> *const c_char>,
    pub all_reduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) -> NcclRes,
    pub broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> NcclRes,
    pub reduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclRedOp_t, c_int, ncclComm_t, cudaStream_t) -> NcclRes,
    pub all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclComm_t, cudaStream_t) -> NcclRes,
    pub reduce_scatter:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) -> NcclRes,
    pub send: unsafe extern "C" fn(*const c_void, usize, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> NcclRes,
    pub recv: unsafe extern "C" fn(*mut c_void, usize, ncclDataType_t, c_int, ncclComm_t, cudaStream_t) -> NcclRes,
    pub group_start: unsafe extern "C" fn() -> NcclRes,
    pub group_end: unsafe extern "C" fn() -> NcclRes,
}

/// The oldest NCCL the backend accepts: 2.10 brought ncclAvg and bfloat16.
pub const MIN_NCCL_VERSION: i32 = 21000;

/// Symbols NCCL must define (ncclCommSplit and ncclGetLastError are optional).
pub const NCCL_SYMBOLS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommAbort",
    "ncclCommDestroy",
    "ncclCommGetAsyncError",
    "ncclGetErrorString",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
];

impl NcclApi {
    /// Resolves the table from `lib`; an error names what is missing.
    #[allow(clippy::missing_transmute_annotations)]
    pub fn resolve(lib: &Lib) -> Result<NcclApi, String> {
        let missing = lib.missing(NCCL_SYMBOLS);
        if !missing.is_empty() {
            return Err(format!("{} lacks {}", lib.name, missing.join(", ")));
        }
        macro_rules! get {
            ($name:literal) => {{
                let p = lib.sym($name).expect("checked above");
                // SAFETY: the symbol is NCCL's function of this name; its C signature is the one
                // declared by the field's type (as in nccl.h and cudarc's bindings).
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }};
        }
        macro_rules! opt {
            ($name:literal) => {{
                // SAFETY: as for get!.
                lib.sym($name).map(|p| unsafe { std::mem::transmute::<*mut c_void, _>(p) })
            }};
        }
        let get_version: unsafe extern "C" fn(*mut c_int) -> NcclRes = get!("ncclGetVersion");
        let mut version: c_int = 0;
        // SAFETY: writes one int.
        let r = unsafe { get_version(&mut version) };
        if r != 0 {
            return Err(format!("{}: ncclGetVersion failed with code {r}", lib.name));
        }
        if version < MIN_NCCL_VERSION {
            return Err(format!("{} is NCCL {}, older than the 2.10 this backend needs", lib.name, version_text(version)));
        }
        Ok(NcclApi {
            version,
            get_unique_id: get!("ncclGetUniqueId"),
            comm_init_rank: get!("ncclCommInitRank"),
            comm_split: opt!("ncclCommSplit"),
            comm_abort: get!("ncclCommAbort"),
            comm_destroy: get!("ncclCommDestroy"),
            comm_get_async_error: get!("ncclCommGetAsyncError"),
            get_error_string: get!("ncclGetErrorString"),
            get_last_error: opt!("ncclGetLastError"),
            all_reduce: get!("ncclAllReduce"),
            broadcast: get!("ncclBroadcast"),
            reduce: get!("ncclReduce"),
            all_gather: get!("ncclAllGather"),
            reduce_scatter: get!("ncclReduceScatter"),
            send: get!("ncclSend"),
            recv: get!("ncclRecv"),
            group_start: get!("ncclGroupStart"),
            group_end: get!("ncclGroupEnd"),
        })
    }
}

/// "2.21.5" from 22105 (NCCL >= 2.9 encoding; older ones used major*1000 + minor*100 + patch).
pub fn version_text(v: i32) -> String {
    if v >= 10000 {
        format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100)
    }
}

/// Both libraries, opened and checked: every symbol the backend will call is present.
pub struct Libs {
    pub cuda: Lib,
    pub nccl_lib: Lib,
    pub nccl: NcclApi,
}

/// Opens and checks `cuda_name` and `nccl_name`. On failure the text says exactly what is
/// missing: which library could not be opened (with dlerror's reason) or which symbols it lacks.
pub fn probe_libs(cuda_name: &str, nccl_name: &str) -> Result<Libs, String> {
    let cuda = Lib::open(cuda_name).map_err(|e| format!("cannot load the CUDA driver {cuda_name} ({e})"));
    let nccl_lib = Lib::open(nccl_name).map_err(|e| format!("cannot load NCCL {nccl_name} ({e})"));
    let (cuda, nccl_lib) = match (cuda, nccl_lib) {
        (Ok(c), Ok(n)) => (c, n),
        (c, n) => {
            let msgs: Vec<String> = [c.err(), n.err()].into_iter().flatten().collect();
            return Err(msgs.join("; "));
        }
    };
    let missing = cuda.missing(CUDA_SYMBOLS);
    if !missing.is_empty() {
        return Err(format!("the CUDA driver {cuda_name} lacks {}", missing.join(", ")));
    }
    let nccl = NcclApi::resolve(&nccl_lib)?;
    Ok(Libs { cuda, nccl_lib, nccl })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_libraries_are_named() {
        let e = probe_libs("libdistcomm-no-such-cuda.so.1", "libdistcomm-no-such-nccl.so.2").err().expect("bogus names must fail");
        assert!(e.contains("libdistcomm-no-such-cuda.so.1"), "{e}");
        assert!(e.contains("libdistcomm-no-such-nccl.so.2"), "{e}");
    }

    #[test]
    fn missing_symbols_are_named() {
        // libc is always there and defines none of CUDA's symbols.
        let libc = Lib::open("libc.so.6").expect("libc.so.6");
        assert!(libc.sym("malloc").is_some());
        let m = libc.missing(CUDA_SYMBOLS);
        assert_eq!(m.len(), CUDA_SYMBOLS.len());
        let e = NcclApi::resolve(&libc).err().expect("libc is not NCCL");
        assert!(e.contains("ncclAllReduce"), "{e}");
        let e = probe_libs("libc.so.6", "libc.so.6").err().expect("libc is not the driver");
        assert!(e.contains("lacks cuInit"), "{e}");
    }

    #[test]
    fn versions_read_like_nccl_prints_them() {
        assert_eq!(version_text(22105), "2.21.5");
        assert_eq!(version_text(2804), "2.8.4");
    }
}
