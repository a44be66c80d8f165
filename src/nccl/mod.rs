//! The NCCL backend (cargo feature `nccl`): CUDA device buffers go through NCCL communicators
//! that shadow the library's own comms; host buffers keep using the CPU transports.
//!
//! Nothing here is linked: `loader` finds `libcuda.so.1` and `libnccl.so.2` with our own
//! `dlopen` at run time and checks every symbol, then the driver is called through cudarc's
//! bindings (`cuda`) and NCCL through a table resolved from our handle (`loader::NcclApi`).
//! Every cudarc call runs inside [`contain`], so a missing library or symbol is an error,
//! never a panic reaching the caller. Without the libraries the probe fails once, with a message
//! naming what is missing, and the rest of the library never notices.
//!
//! Layout: `loader` (dlopen probe, NCCL table), `cuda` (driver calls: devices, streams,
//! events, pointer classification), `device` (`DeviceComm`: one NCCL communicator, its
//! stream and the collectives and point-to-point built on it), `p2p` (device send/receive with
//! the envelope that carries tag and size over the CPU transport).

pub mod cuda;
pub mod device;
pub mod loader;
pub mod p2p;

pub use cuda::DevicePlace;
pub use device::{DevOp, DeviceComm};
pub use p2p::DeviceP2p;

use crate::error::{Error, Result, Status};
use once_cell::sync::OnceCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// Runs `f` (a call into cudarc) so that a panic becomes `DC_ERR_UNAVAILABLE` naming `what`.
pub fn contain<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| Error::new(Status::Unavailable, format!("{what}: CUDA binding failed: {}", crate::panics::message(&*p))))
}

/// What this process found at run time: both libraries, checked, and the driver initialised.
pub struct Runtime {
    pub libs: loader::Libs,
    pub devices: i32,
    pub driver_version: i32,
    opened: Mutex<HashMap<i32, Arc<cuda::Device>>>,
}

impl Runtime {
    pub fn nccl(&self) -> &loader::NcclApi {
        &self.libs.nccl
    }

    /// One line for logs: "NCCL 2.21.5 (libnccl.so.2), CUDA driver 12040, 8 devices".
    pub fn describe(&self) -> String {
        format!(
            "NCCL {} ({}), CUDA driver {}, {} device(s)",
            loader::version_text(self.libs.nccl.version),
            self.libs.nccl_lib.name,
            self.driver_version,
            self.devices
        )
    }

    /// The device with this ordinal (opened once per process).
    pub fn device(&self, ordinal: i32) -> Result<Arc<cuda::Device>> {
        let mut m = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = m.get(&ordinal) {
            return Ok(d.clone());
        }
        let d = Arc::new(cuda::Device::open(ordinal)?);
        m.insert(ordinal, d.clone());
        Ok(d)
    }
}

/// The NCCL library name to probe: `DC_NCCL_LIBRARY` (a name or a path) or `libnccl.so.2`.
fn nccl_library_name() -> String {
    crate::params::get().nccl_library.clone().unwrap_or_else(|| loader::NCCL_LIB.to_string())
}

/// Probes with the given library names and initialises the driver; the error text says what
/// is missing. Used once per process by [`runtime`]; tests call it with bogus names.
pub fn probe(cuda_name: &str, nccl_name: &str) -> std::result::Result<Runtime, String> {
    let libs = loader::probe_libs(cuda_name, nccl_name)?;
    let devices = cuda::init_and_count().map_err(|e| format!("the CUDA driver does not initialise: {}", e.msg))?;
    let driver_version = cuda::driver_version().unwrap_or(0);
    Ok(Runtime { libs, devices, driver_version, opened: Mutex::new(HashMap::new()) })
}

/// The process's CUDA + NCCL runtime, probed on first use.
pub fn runtime() -> std::result::Result<&'static Runtime, &'static str> {
    static RT: OnceCell<std::result::Result<Runtime, String>> = OnceCell::new();
    RT.get_or_init(|| probe(loader::CUDA_LIB, &nccl_library_name())).as_ref().map_err(|e| e.as_str())
}

/// For backend "nccl": the runtime and at least one device, or `DC_ERR_UNAVAILABLE` saying
/// exactly what is missing.
pub fn require() -> Result<&'static Runtime> {
    let rt = runtime().map_err(|e| Error::new(Status::Unavailable, format!("backend \"nccl\" is unavailable: {e}")))?;
    if rt.devices < 1 {
        return Err(Error::new(Status::Unavailable, format!("backend \"nccl\" is unavailable: no CUDA device ({})", rt.describe())));
    }
    Ok(rt)
}

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemKind {
    Host,
    Device(cuda::DevicePlace),
}

/// Classifies `addr` with `cuPointerGetAttribute`; host when CUDA is absent or the driver does
/// not know the pointer.
pub fn classify(addr: usize) -> MemKind {
    match runtime() {
        Ok(_) => cuda::device_place(addr).map_or(MemKind::Host, MemKind::Device),
        _ => MemKind::Host,
    }
}

/// Whether a comm gets NCCL (decided at init from the backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMode {
    /// "shm" / "socket": never.
    Off,
    /// "auto": when every rank has the libraries and its own GPU; otherwise quietly not.
    IfAvailable,
    /// "nccl": always (dc_init fails with DC_ERR_UNAVAILABLE otherwise).
    Required,
}

/// The world's GPU plan: mode and the rank's place on its host (picks the device).
#[derive(Debug, Clone, Copy)]
pub struct GpuPlan {
    pub mode: GpuMode,
    pub local_rank: Option<usize>,
}

impl GpuPlan {
    pub fn off() -> GpuPlan {
        GpuPlan { mode: GpuMode::Off, local_rank: None }
    }
}

/// The device this rank uses: the one current on the calling thread (as NCCL expects callers to
/// select it), else `LOCAL_RANK % device count`. An error says why there is none.
pub fn local_device(local_rank: Option<usize>) -> std::result::Result<(&'static Runtime, Arc<cuda::Device>), String> {
    let rt = runtime().map_err(|e| e.to_string())?;
    if rt.devices < 1 {
        return Err("no CUDA device".into());
    }
    let ordinal = match cuda::current_device().map_err(|e| e.msg)? {
        Some(d) => d,
        None => (local_rank.unwrap_or(0) % rt.devices as usize) as i32,
    };
    let dev = rt.device(ordinal).map_err(|e| e.msg)?;
    Ok((rt, dev))
}

/// An NCCL failure as our status: ncclUnhandledCudaError and ncclSystemError are
/// DC_ERR_SYSTEM, ncclInternalError DC_ERR_INTERNAL, ncclInvalidArgument and ncclInvalidUsage
/// their namesakes, ncclRemoteError DC_ERR_PEER_LOST; anything else DC_ERR_INTERNAL.
pub fn status_of(code: i32) -> Status {
    match code {
        1 | 2 => Status::System,
        3 => Status::Internal,
        4 => Status::InvalidArgument,
        5 => Status::InvalidUsage,
        6 => Status::PeerLost,
        _ => Status::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_results_map_to_statuses() {
        assert_eq!(status_of(1), Status::System);
        assert_eq!(status_of(2), Status::System);
        assert_eq!(status_of(3), Status::Internal);
        assert_eq!(status_of(4), Status::InvalidArgument);
        assert_eq!(status_of(5), Status::InvalidUsage);
        assert_eq!(status_of(6), Status::PeerLost);
        assert_eq!(status_of(7), Status::Internal);
        assert_eq!(status_of(99), Status::Internal);
    }

    #[test]
    fn panics_are_contained() {
        let r: Result<()> = contain("test", || panic!("Unable to dynamically load the \"cuda\" shared library"));
        let e = r.unwrap_err();
        assert_eq!(e.status, Status::Unavailable);
        assert!(e.msg.contains("Unable to dynamically load"), "{}", e.msg);
    }

    #[test]
    fn probe_with_bogus_names_fails_cleanly() {
        let e = probe("libdistcomm-bogus-cuda.so.1", "libdistcomm-bogus-nccl.so.2").err().expect("must fail");
        assert!(e.contains("libdistcomm-bogus-cuda.so.1") && e.contains("libdistcomm-bogus-nccl.so.2"), "{e}");
    }

    /// On a machine without libcuda, calling a cudarc entry directly makes cudarc panic (it
    /// cannot load the driver); the boundary turns that into an error. With a driver present
    /// the call simply works; either way nothing unwinds out of `contain`.
    #[test]
    fn cudarc_missing_library_panic_is_contained() {
        let r = contain("cuDriverGetVersion", || {
            let mut v = 0;
            // SAFETY: writes one int (if the driver can be loaded at all).
            unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
        });
        if loader::Lib::open(loader::CUDA_LIB).is_err() && loader::Lib::open("libcuda.so").is_err() {
            let e = r.expect_err("no driver: cudarc must have panicked");
            assert_eq!(e.status, Status::Unavailable);
            assert!(e.msg.contains("cuda"), "{}", e.msg);
        }
    }

    #[test]
    fn host_pointers_classify_as_host() {
        #[allow(clippy::useless_vec)] // a heap pointer on purpose
        let v = vec![1u32; 16];
        assert_eq!(classify(v.as_ptr() as usize), MemKind::Host);
        let s = 5u64;
        assert_eq!(classify(&s as *const u64 as usize), MemKind::Host);
        if runtime().is_err() {
            // Without CUDA every pointer is host memory, even a made-up one.
            assert_eq!(classify(0x7f00_dead_0000), MemKind::Host);
        }
    }
}
