//! The CUDA driver calls of the backend, made through cudarc's bindings. Every call runs inside
//! `contain` (cudarc panics where a library or symbol is missing; no panic may reach a caller)
//! and is only reached after `loader::probe_libs` has seen the library and its symbols.

// Handles (streams, communicators) are raw pointers that the driver and NCCL check, not us.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use super::contain;
use crate::error::{Error, Result, Status};
use cudarc::driver::sys as cu;
use cudarc::driver::sys::CUresult;
use std::ffi::{c_char, c_void, CStr};

/// Runs one driver call inside the panic boundary and turns its `CUresult` into our error.
pub fn call(what: &str, f: impl FnOnce() -> CUresult) -> Result<()> {
    match contain(what, f)? {
        CUresult::CUDA_SUCCESS => Ok(()),
        code => Err(error(what, code)),
    }
}

/// A driver error as our status, with the driver's name and text for it.
pub fn error(what: &str, code: CUresult) -> Error {
    let text = |f: unsafe fn(CUresult, *mut *const c_char) -> CUresult| -> Option<String> {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the driver writes a pointer to a static string (or leaves it NULL).
        match contain("cuGetErrorString", || unsafe { f(code, &mut p) }) {
            Ok(CUresult::CUDA_SUCCESS) if !p.is_null() => Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()),
            _ => None,
        }
    };
    let name = text(cu::cuGetErrorName).unwrap_or_else(|| format!("{code:?}"));
    let desc = text(cu::cuGetErrorString).unwrap_or_default();
    let status = match code {
        CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_INVALID_HANDLE => Status::InvalidArgument,
        CUresult::CUDA_ERROR_NO_DEVICE
        | CUresult::CUDA_ERROR_NOT_INITIALIZED
        | CUresult::CUDA_ERROR_DEINITIALIZED
        | CUresult::CUDA_ERROR_NOT_SUPPORTED => Status::Unavailable,
        _ => Status::System,
    };
    Error::new(status, format!("{what} failed: {name} ({desc})"))
}

/// Initialises the driver and counts the devices.
pub fn init_and_count() -> Result<i32> {
    // SAFETY: plain driver calls with valid out-pointers.
    call("cuInit", || unsafe { cu::cuInit(0) })?;
    let mut n = 0;
    call("cuDeviceGetCount", || unsafe { cu::cuDeviceGetCount(&mut n) })?;
    Ok(n)
}

/// The driver's CUDA version (e.g. 12040).
pub fn driver_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: writes one int.
    call("cuDriverGetVersion", || unsafe { cu::cuDriverGetVersion(&mut v) })?;
    Ok(v)
}

/// The ordinal of the device whose context is current on this thread, if any.
pub fn current_device() -> Result<Option<i32>> {
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one pointer.
    call("cuCtxGetCurrent", || unsafe { cu::cuCtxGetCurrent(&mut ctx) })?;
    if ctx.is_null() {
        return Ok(None);
    }
    let mut dev: cu::CUdevice = 0;
    // SAFETY: writes one int.
    call("cuCtxGetDevice", || unsafe { cu::cuCtxGetDevice(&mut dev) })?;
    Ok(Some(dev))
}

/// One CUDA device and its primary context (retained for the life of the process, the context
/// the CUDA runtime, PyTorch and NCCL use too).
pub struct Device {
    pub ordinal: i32,
    ctx: cu::CUcontext,
    /// PCI bus id ("0000:3b:00.0"), which tells ranks on one host whether they share a GPU.
    pub bus_id: String,
}

// SAFETY: a CUcontext handle may be made current on any thread.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    pub fn open(ordinal: i32) -> Result<Device> {
        let mut dev: cu::CUdevice = 0;
        // SAFETY: plain driver calls with valid out-pointers.
        call("cuDeviceGet", || unsafe { cu::cuDeviceGet(&mut dev, ordinal) })?;
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        call("cuDevicePrimaryCtxRetain", || unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, dev) })?;
        let mut bus = [0 as c_char; 64];
        call("cuDeviceGetPCIBusId", || unsafe { cu::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) })?;
        // SAFETY: the driver NUL-terminates within the given length.
        let bus_id = unsafe { CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned();
        Ok(Device { ordinal, ctx, bus_id })
    }

    /// Makes this device's primary context current on the calling thread unless the caller has
    /// a context current already (theirs wins: it is the one their streams belong to).
    pub fn make_current(&self) -> Result<()> {
        let mut cur: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one pointer; sets a context we retained.
        call("cuCtxGetCurrent", || unsafe { cu::cuCtxGetCurrent(&mut cur) })?;
        if cur.is_null() {
            call("cuCtxSetCurrent", || unsafe { cu::cuCtxSetCurrent(self.ctx) })?;
        }
        Ok(())
    }
}

/// Device memory as the driver knows it: the device it is on and the allocation holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePlace {
    pub ordinal: i32,
    /// The allocation around the address (start, bytes); None when the driver does not say
    /// (then nothing is checked against it).
    pub allocation: Option<(usize, usize)>,
}

/// One pointer attribute of `addr`, or None when the driver refuses (plain host memory is
/// CUDA_ERROR_INVALID_VALUE).
fn pointer_attribute<T: Copy + Default>(addr: usize, attr: cu::CUpointer_attribute) -> Option<T> {
    let mut v = T::default();
    let r = contain("cuPointerGetAttribute", || {
        // SAFETY: the driver writes one value of the attribute's type, which the callers match
        // with T (unsigned int, int, CUdeviceptr or size_t).
        unsafe { cu::cuPointerGetAttribute(&mut v as *mut T as *mut c_void, attr, addr as cu::CUdeviceptr) }
    });
    matches!(r, Ok(CUresult::CUDA_SUCCESS)).then_some(v)
}

/// Where `addr` lives if it is device memory NCCL can use (device or managed), asked with
/// `cuPointerGetAttribute`; None means host memory.
pub fn device_place(addr: usize) -> Option<DevicePlace> {
    use cu::CUpointer_attribute as A;
    let kind: u32 = pointer_attribute(addr, A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)?;
    if kind != cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 && kind != cu::CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32 {
        return None;
    }
    let ordinal: i32 = pointer_attribute(addr, A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL).unwrap_or(-1);
    let start: Option<u64> = pointer_attribute(addr, A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
    let size: Option<usize> = pointer_attribute(addr, A::CU_POINTER_ATTRIBUTE_RANGE_SIZE);
    let allocation = start.zip(size).map(|(s, n)| (s as usize, n)).filter(|&(s, n)| s <= addr && n > 0);
    Some(DevicePlace { ordinal, allocation })
}

/// A stream created by the backend (a comm's own stream).
pub struct Stream(pub cu::CUstream);

// SAFETY: stream handles may be used from any thread.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// A blocking stream (CU_STREAM_DEFAULT): it orders itself after work the caller queued on
    /// the legacy default stream, so data the caller produced there is ready for the operation.
    pub fn new() -> Result<Stream> {
        let mut s: cu::CUstream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        call("cuStreamCreate", || unsafe { cu::cuStreamCreate(&mut s, cu::CUstream_flags::CU_STREAM_DEFAULT as u32) })?;
        Ok(Stream(s))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: our own handle, destroyed once.
        let _ = call("cuStreamDestroy", || unsafe { cu::cuStreamDestroy_v2(self.0) });
    }
}

/// Whether everything queued on `s` has finished (never blocks).
pub fn stream_idle(s: cu::CUstream) -> Result<bool> {
    // SAFETY: a stream handle the caller vouches for.
    match contain("cuStreamQuery", || unsafe { cu::cuStreamQuery(s) })? {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        code => Err(error("cuStreamQuery", code)),
    }
}

/// An event recorded after an operation: the operation is complete when the event is.
pub struct Event(cu::CUevent);

// SAFETY: event handles may be queried and destroyed from any thread.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub fn record(stream: cu::CUstream) -> Result<Event> {
        let mut e: cu::CUevent = std::ptr::null_mut();
        // SAFETY: writes one handle; records on a stream the caller vouches for.
        call("cuEventCreate", || unsafe { cu::cuEventCreate(&mut e, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) })?;
        let ev = Event(e);
        call("cuEventRecord", || unsafe { cu::cuEventRecord(ev.0, stream) })?;
        Ok(ev)
    }

    /// Whether the work before the event has finished (never blocks).
    pub fn query(&self) -> Result<bool> {
        // SAFETY: our own live handle.
        match contain("cuEventQuery", || unsafe { cu::cuEventQuery(self.0) })? {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(error("cuEventQuery", code)),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: our own handle, destroyed once.
        let _ = call("cuEventDestroy", || unsafe { cu::cuEventDestroy_v2(self.0) });
    }
}

/// Device memory the backend owns (the barrier's scratch word).
pub struct DeviceMem(pub cu::CUdeviceptr);

impl DeviceMem {
    pub fn alloc(bytes: usize) -> Result<DeviceMem> {
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: writes one device pointer.
        call("cuMemAlloc", || unsafe { cu::cuMemAlloc_v2(&mut p, bytes) })?;
        Ok(DeviceMem(p))
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // SAFETY: our own allocation, freed once.
        let _ = call("cuMemFree", || unsafe { cu::cuMemFree_v2(self.0) });
    }
}

/// Queues a device-to-device copy of `bytes` on `stream`.
pub fn copy_async(dst: usize, src: usize, bytes: usize, stream: cu::CUstream) -> Result<()> {
    if bytes == 0 || dst == src {
        return Ok(());
    }
    // SAFETY: both ranges are device memory of at least `bytes` (classified and sized by the caller).
    call("cuMemcpyDtoDAsync", || unsafe { cu::cuMemcpyDtoDAsync_v2(dst as cu::CUdeviceptr, src as cu::CUdeviceptr, bytes, stream) })
}
