//! The NCCL backend as a machine without CUDA sees it, through the C ABI: backend "nccl" fails
//! dc_init with DC_ERR_UNAVAILABLE naming the missing library (no crash, no panic), "auto"
//! quietly uses the CPU transports, streams are refused on CPU comms. On a machine that does
//! have CUDA and NCCL the same tests check that the backend comes up instead.

#![cfg(feature = "nccl")]

mod common;
use common::free_port;
use distcomm::ffi::coll::dc_allreduce;
use distcomm::ffi::comm::{dc_comm_backend, dc_comm_destroy, dc_comm_set_stream, dc_init, dc_init_options, dc_init_options_default};
use distcomm::ffi::{dc_status, DC_FLOAT32, DC_SUM};
use std::ffi::{c_char, CStr, CString};

extern "C" {
    fn dc_last_error() -> *const c_char;
}

fn last_error() -> String {
    // SAFETY: the library returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(dc_last_error()) }.to_string_lossy().into_owned()
}


/// dc_init of a one-rank job on `backend`.
fn init_one(backend: &str) -> (dc_status, *mut distcomm::comm::Comm) {
    let method = CString::new(format!("tcp://127.0.0.1:{}", free_port())).unwrap();
    let be = CString::new(backend).unwrap();
    let mut o = std::mem::MaybeUninit::<dc_init_options>::uninit();
    // SAFETY: dc_init_options_default fills every field.
    let mut o = unsafe {
        dc_init_options_default(o.as_mut_ptr());
        o.assume_init()
    };
    o.init_method = method.as_ptr();
    o.backend = be.as_ptr();
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 20_000;
    let mut world = std::ptr::null_mut();
    // SAFETY: valid options and out-pointer.
    let st = unsafe { dc_init(&o, &mut world) };
    (st, world)
}

fn cuda_present() -> bool {
    distcomm::nccl::runtime().is_ok()
}

#[test]
fn backend_nccl_without_cuda_is_unavailable_and_names_the_library() {
    let (st, world) = init_one("nccl");
    if cuda_present() {
        // A GPU machine: the backend must come up (or say clearly why not).
        assert!(st == dc_status::DC_SUCCESS || st == dc_status::DC_ERR_UNAVAILABLE, "{st:?}: {}", last_error());
        // SAFETY: a comm from dc_init (or NULL).
        unsafe { dc_comm_destroy(world) };
        return;
    }
    assert_eq!(st, dc_status::DC_ERR_UNAVAILABLE, "{}", last_error());
    assert!(world.is_null(), "out-pointer must stay untouched on failure");
    let msg = last_error();
    eprintln!("dc_last_error: {msg}");
    assert!(msg.starts_with("dc_init: "), "{msg}");
    assert!(msg.contains("backend \"nccl\""), "{msg}");
    assert!(msg.contains("libcuda.so.1") || msg.contains("libnccl.so.2"), "the message must name the missing library: {msg}");
    // Asking again gives the same answer (the probe is cached, nothing half-loaded).
    let (st2, _) = init_one("nccl");
    assert_eq!(st2, dc_status::DC_ERR_UNAVAILABLE);
    assert_eq!(last_error(), msg);
}

#[test]
fn backend_auto_without_cuda_uses_the_cpu_transports() {
    let (st, world) = init_one("auto");
    assert_eq!(st, dc_status::DC_SUCCESS, "{}", last_error());
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: a live comm and valid buffers throughout.
    unsafe {
        assert_eq!(dc_comm_backend(world, &mut name), dc_status::DC_SUCCESS);
        let backend = CStr::from_ptr(name).to_str().unwrap().to_string();
        if !cuda_present() {
            assert_ne!(backend, "nccl");
            // No CUDA streams on a CPU comm; NULL (the comm's own stream) is always fine.
            let mut fake = 0u64;
            assert_eq!(dc_comm_set_stream(world, &mut fake as *mut u64 as *mut libc::c_void), dc_status::DC_ERR_UNAVAILABLE);
            assert!(last_error().contains("no CUDA streams"), "{}", last_error());
        }
        assert_eq!(dc_comm_set_stream(world, std::ptr::null_mut()), dc_status::DC_SUCCESS);
        let send = [1.0f32, 2.0, 3.0];
        let mut recv = [0.0f32; 3];
        let st = dc_allreduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), 3, DC_FLOAT32, DC_SUM, world);
        assert_eq!(st, dc_status::DC_SUCCESS, "{}", last_error());
        assert_eq!(recv, send);
        assert_eq!(dc_comm_destroy(world), dc_status::DC_SUCCESS);
    }
}

#[test]
fn auto_on_thread_ranks_without_cuda_works() {
    use distcomm::buffer::{ConstBuf, MutBuf};
    use distcomm::collective::CollArgs;
    let n = 2;
    let out = common::thread_ranks("auto", n, 20_000, move |c| {
        let r = c.rank() as i32;
        // Thread-ranks share one GPU if there is one: "auto" must then stay on the CPU.
        assert_ne!(c.backend().to_str().unwrap(), "nccl");
        let send = [r as u8 + 1; 8];
        let mut recv = [0u8; 8];
        c.collective(CollArgs::Allreduce {
            send: Some(ConstBuf::from_slice(&send)),
            recv: MutBuf::from_slice(&mut recv),
            dt: distcomm::DType::Uint8,
            op: distcomm::ReduceOp::Sum,
        })
        .unwrap();
        let g = c.split(0, -r).unwrap().expect("member");
        assert_eq!(g.rank(), (n as i32 - 1 - r) as usize);
        g.destroy();
        recv
    });
    for recv in out {
        assert_eq!(recv, [3u8; 8]);
    }
}
