//! The NCCL backend's device paths on a machine without a GPU, against stand-ins for
//! libcuda.so.1 and libnccl.so.2 (tests/fake_cuda/fake_cuda.c: "device memory" is host memory
//! the fake driver hands out; NCCL ranks are threads meeting in process memory). This checks the
//! plumbing that a real GPU cannot check cheaply: probe and symbol checks, cudarc calls through
//! the panic boundary, pointer classification, routing, the unique id through the store, every
//! collective's pointer arithmetic (in-place forms, displacements), grouped sends and receives,
//! envelopes, requests and events, streams, splits and abort. It says nothing about real NCCL
//! or real GPUs (scripts/gpu_check.sh does).
//!
//! The libraries must be found by the dynamic loader at process start, so the test compiles
//! them with `cc` and re-runs this test binary with LD_LIBRARY_PATH pointing at them.

#![cfg(feature = "nccl")]

use distcomm::comm::Comm;
use distcomm::ffi::coll::*;
use distcomm::ffi::comm::*;
use distcomm::ffi::p2p::{dc_irecv, dc_isend, dc_recv, dc_recv_info, dc_send};
use distcomm::ffi::request::{dc_request_free, dc_request_is_completed, dc_request_recv_info, dc_request_wait, dc_request_wait_all};
use distcomm::ffi::*;
use distcomm::request::Request;
use std::ffi::{c_char, c_void, CStr, CString};
use std::net::TcpListener;
use std::process::Command;

extern "C" {
    fn dc_last_error() -> *const c_char;
}

fn last_error() -> String {
    // SAFETY: the library returns a valid C string.
    unsafe { CStr::from_ptr(dc_last_error()) }.to_string_lossy().into_owned()
}

#[test]
fn device_paths_against_a_fake_cuda_and_nccl() {
    let dir = std::env::temp_dir().join(format!("distcomm-fake-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_cuda/fake_cuda.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    for (def, name) in [("FAKE_CUDA", "libcuda.so.1"), ("FAKE_NCCL", "libnccl.so.2")] {
        let st = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", &format!("-D{def}"), "-o"])
            .arg(dir.join(name))
            .arg(format!("-Wl,-soname,{name}"))
            .arg(src)
            .arg("-lpthread")
            .status();
        match st {
            Ok(s) if s.success() => {}
            other => {
                if std::env::var("DC_TEST_STRICT").as_deref() == Ok("1") {
                    panic!("cannot build the fake {name} with {cc}: {other:?}");
                }
                eprintln!("skipped: cannot build the fake {name} with {cc}: {other:?}");
                return;
            }
        }
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["fake_child", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("DC_FAKE_CUDA_CHILD", "1")
        .env_remove("DC_NCCL_LIBRARY")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(out.status.success(), "child failed: {:?}", out.status);
    assert!(stdout.contains("1 passed"), "the child test did not run");
}

// ---- the child: runs with the fake libraries on the loader path --------------------------------

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> i32;
type Free = unsafe extern "C" fn(u64) -> i32;
type StreamCreate = unsafe extern "C" fn(*mut *mut c_void, u32) -> i32;

struct FakeDriver {
    alloc: Alloc,
    free: Free,
    stream: StreamCreate,
}

fn driver() -> FakeDriver {
    // SAFETY: the fake driver's own functions, with these signatures.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null());
        let sym = |n: &CStr| {
            let p = libc::dlsym(h, n.as_ptr());
            assert!(!p.is_null(), "{n:?}");
            p
        };
        FakeDriver {
            alloc: std::mem::transmute::<*mut c_void, Alloc>(sym(c"cuMemAlloc_v2")),
            free: std::mem::transmute::<*mut c_void, Free>(sym(c"cuMemFree_v2")),
            stream: std::mem::transmute::<*mut c_void, StreamCreate>(sym(c"cuStreamCreate")),
        }
    }
}

/// "Device" memory of the fake driver (host memory it recognises), as a typed slice.
struct Dev<T: Copy + 'static> {
    ptr: *mut T,
    len: usize,
}

impl<T: Copy + 'static> Dev<T> {
    fn new(d: &FakeDriver, init: &[T]) -> Dev<T> {
        let mut p = 0u64;
        // SAFETY: the fake allocates zeroed host memory.
        assert_eq!(unsafe { (d.alloc)(&mut p, std::mem::size_of_val(init).max(1)) }, 0);
        let ptr = p as usize as *mut T;
        // SAFETY: fresh allocation of that size.
        unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), ptr, init.len()) };
        Dev { ptr, len: init.len() }
    }
    fn zeroed(d: &FakeDriver, n: usize) -> Dev<T> {
        // SAFETY: all-zero bytes are a valid T for the plain numbers used here.
        Dev::new(d, &vec![unsafe { std::mem::zeroed::<T>() }; n])
    }
    fn get(&self) -> Vec<T> {
        // SAFETY: our allocation of len elements.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }.to_vec()
    }
    fn set(&self, v: &[T]) {
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr, v.len().min(self.len)) };
    }
    fn p(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }
    fn at(&self, i: usize) -> *mut c_void {
        // SAFETY: within the allocation (checked by the callers' sizes).
        unsafe { self.ptr.add(i) as *mut c_void }
    }
    fn free(self, d: &FakeDriver) {
        // SAFETY: our allocation.
        unsafe { (d.free)(self.ptr as usize as u64) };
    }
}

macro_rules! ok {
    ($e:expr) => {{
        let s = $e;
        assert_eq!(s, dc_status::DC_SUCCESS, "{}: {}", stringify!($e), last_error());
    }};
}
macro_rules! status {
    ($e:expr, $want:expr) => {{
        let s = $e;
        assert_eq!(s, $want, "{}: {}", stringify!($e), last_error());
    }};
}

fn init(port: u16, rank: i32, n: i32, backend: &str) -> *mut Comm {
    let method = CString::new(format!("tcp://127.0.0.1:{port}")).unwrap();
    let be = CString::new(backend).unwrap();
    let mut o = dc_init_options::default();
    o.init_method = method.as_ptr();
    o.backend = be.as_ptr();
    o.rank = rank;
    o.world_size = n;
    o.timeout_ms = 30_000;
    let mut w = std::ptr::null_mut();
    // SAFETY: valid options and out-pointer.
    ok!(unsafe { dc_init(&o, &mut w) });
    w
}

fn backend(c: *mut Comm) -> String {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: a live comm.
    ok!(unsafe { dc_comm_backend(c, &mut p) });
    // SAFETY: a static string.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_string()
}

fn val(r: i32, i: usize) -> f32 {
    (r + 1) as f32 + (i % 7) as f32
}

/// Everything on one rank of `n` thread-ranks with backend "nccl".
unsafe fn rank_main(port: u16, r: i32, n: i32) {
    let d = driver();
    let w = init(port, r, n, "nccl");
    assert_eq!(backend(w), "nccl");
    let nu = n as usize;
    let ru = r as usize;

    // classification
    let probe = Dev::<u8>::zeroed(&d, 8);
    let place = distcomm::nccl::DevicePlace { ordinal: 0, allocation: Some((probe.p() as usize, 8)) };
    assert_eq!(distcomm::nccl::classify(probe.p() as usize), distcomm::nccl::MemKind::Device(place));
    assert_eq!(distcomm::nccl::classify(&d as *const FakeDriver as usize), distcomm::nccl::MemKind::Host);
    probe.free(&d);

    // allreduce, out of place and in place
    let count = 1000;
    let h: Vec<f32> = (0..count).map(|i| val(r, i)).collect();
    let want: Vec<f32> = (0..count).map(|i| (0..n).map(|q| val(q, i)).sum()).collect();
    let s = Dev::new(&d, &h);
    let o = Dev::<f32>::zeroed(&d, count);
    ok!(dc_allreduce(s.p(), o.p(), count, DC_FLOAT32, DC_SUM, w));
    assert_eq!(o.get(), want);
    ok!(dc_allreduce(s.p(), s.p(), count, DC_FLOAT32, DC_SUM, w));
    assert_eq!(s.get(), want);
    let mx = Dev::new(&d, &[r * 10 - 5, -r, 3]);
    ok!(dc_allreduce(mx.p(), mx.p(), 3, DC_INT32, DC_MAX, w));
    assert_eq!(mx.get(), vec![(n - 1) * 10 - 5, 0, 3]);
    let avg = Dev::new(&d, &[(r * 2) as f64]);
    ok!(dc_allreduce(avg.p(), avg.p(), 1, DC_FLOAT64, DC_AVG, w));
    assert_eq!(avg.get()[0], (n - 1) as f64);

    // what is refused on device memory
    status!(dc_allreduce(mx.p(), mx.p(), 3, DC_INT32, DC_BXOR, w), dc_status::DC_ERR_UNAVAILABLE);
    assert!(last_error().contains("bitwise"), "{}", last_error());
    let mut host = [0f32; 1000];
    status!(dc_allreduce(s.p(), host.as_mut_ptr().cast(), count, DC_FLOAT32, DC_SUM, w), dc_status::DC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("mixes CUDA device memory and host memory"), "{}", last_error());
    status!(dc_recv(o.p(), 4, DC_FLOAT32, DC_ANY_SOURCE, 0, w, std::ptr::null_mut()), dc_status::DC_ERR_UNAVAILABLE);
    assert!(last_error().contains("DC_ANY_SOURCE"), "{}", last_error());
    status!(dc_send(o.p(), 4, DC_FLOAT32, r, 0, w), dc_status::DC_ERR_UNAVAILABLE);
    // a device buffer longer than its allocation is refused before NCCL sees it
    status!(dc_allreduce(s.p(), s.p(), count + 1, DC_FLOAT32, DC_SUM, w), dc_status::DC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("its CUDA allocation ends 4000 bytes after it"), "{}", last_error());
    status!(dc_broadcast(s.at(1), count, DC_FLOAT32, 0, w), dc_status::DC_ERR_INVALID_ARGUMENT);
    status!(dc_recv(o.at(count - 1), 2, DC_FLOAT32, (r + 1) % n, 0, w, std::ptr::null_mut()), dc_status::DC_ERR_INVALID_ARGUMENT);
    // host buffers on the NCCL comm: the CPU transports, bitwise ops included
    let hs = [1i32 << r; 4];
    let mut hr = [0i32; 4];
    ok!(dc_allreduce(hs.as_ptr().cast(), hr.as_mut_ptr().cast(), 4, DC_INT32, DC_BOR, w));
    assert_eq!(hr[0], (1 << n) - 1);

    // broadcast, reduce
    let b = Dev::new(&d, &(0..50).map(|i| if r == n - 1 { i * 3 } else { -1 }).collect::<Vec<i64>>());
    ok!(dc_broadcast(b.p(), 50, DC_INT64, n - 1, w));
    assert_eq!(b.get(), (0..50).map(|i| i * 3).collect::<Vec<i64>>());
    let rr = Dev::<f32>::zeroed(&d, count);
    let s2 = Dev::new(&d, &h);
    ok!(dc_reduce(s2.p(), if r == 0 { rr.p() } else { std::ptr::null_mut() }, count, DC_FLOAT32, DC_SUM, 0, w));
    if r == 0 {
        assert_eq!(rr.get(), want);
    }

    // allgather, in place too
    let blk = 5;
    let mine: Vec<i32> = (0..blk).map(|i| r * 100 + i as i32).collect();
    let all_want: Vec<i32> = (0..n).flat_map(|q| (0..blk).map(move |i| q * 100 + i as i32)).collect();
    let ms = Dev::new(&d, &mine);
    let ag = Dev::<i32>::zeroed(&d, blk * nu);
    ok!(dc_allgather(ms.p(), ag.p(), blk, DC_INT32, w));
    assert_eq!(ag.get(), all_want);
    let mut pre = vec![-1i32; blk * nu];
    pre[ru * blk..(ru + 1) * blk].copy_from_slice(&mine);
    ag.set(&pre);
    ok!(dc_allgather(ag.at(ru * blk), ag.p(), blk, DC_INT32, w));
    assert_eq!(ag.get(), all_want);

    // allgatherv with gaps
    let counts: Vec<usize> = (0..nu).map(|q| q * 2 + 1).collect();
    let mut displs = Vec::new();
    let mut total = 0;
    for c in &counts {
        displs.push(total + 1);
        total += c + 1;
    }
    let vs = Dev::new(&d, &(0..counts[ru]).map(|i| r * 1000 + i as i32).collect::<Vec<_>>());
    let vr = Dev::<i32>::zeroed(&d, total);
    ok!(dc_allgatherv(vs.p(), counts[ru], vr.p(), counts.as_ptr(), displs.as_ptr(), DC_INT32, w));
    let got = vr.get();
    for q in 0..nu {
        for i in 0..counts[q] {
            assert_eq!(got[displs[q] + i], q as i32 * 1000 + i as i32);
        }
    }

    // gather at root 1, scatter from root 0
    let g = Dev::<i32>::zeroed(&d, blk * nu);
    let groot = 1 % n;
    ok!(dc_gather(ms.p(), if r == groot { g.p() } else { std::ptr::null_mut() }, blk, DC_INT32, groot, w));
    if r == groot {
        assert_eq!(g.get(), all_want);
    }
    let sc_src = Dev::new(&d, &all_want);
    let sc_dst = Dev::<i32>::zeroed(&d, blk);
    ok!(dc_scatter(if r == 0 { sc_src.p() } else { std::ptr::null_mut() }, sc_dst.p(), blk, DC_INT32, 0, w));
    assert_eq!(sc_dst.get(), mine);

    // reduce_scatter, in place too
    let rs_in: Vec<i32> = (0..blk * nu).map(|i| r + i as i32).collect();
    let rs_want: Vec<i32> = (0..blk).map(|i| (0..n).map(|q| q + (ru * blk + i) as i32).sum()).collect();
    let rsi = Dev::new(&d, &rs_in);
    let rso = Dev::<i32>::zeroed(&d, blk);
    ok!(dc_reduce_scatter(rsi.p(), rso.p(), blk, DC_INT32, DC_SUM, w));
    assert_eq!(rso.get(), rs_want);
    ok!(dc_reduce_scatter(rsi.p(), rsi.at(ru * blk), blk, DC_INT32, DC_SUM, w));
    assert_eq!(&rsi.get()[ru * blk..(ru + 1) * blk], &rs_want[..]);

    // alltoall, alltoallv
    let a2a: Vec<i32> = (0..nu * blk).map(|i| r * 1000 + i as i32).collect();
    let a2a_want: Vec<i32> = (0..nu).flat_map(|q| (0..blk).map(move |i| q as i32 * 1000 + (ru * blk + i) as i32)).collect();
    let asrc = Dev::new(&d, &a2a);
    let adst = Dev::<i32>::zeroed(&d, nu * blk);
    ok!(dc_alltoall(asrc.p(), adst.p(), blk, DC_INT32, w));
    assert_eq!(adst.get(), a2a_want);
    let sc: Vec<usize> = (0..nu).map(|p| ru + p + 1).collect();
    let rc: Vec<usize> = (0..nu).map(|p| p + ru + 1).collect();
    let sd: Vec<usize> = (0..nu).scan(0, |acc, p| {
        let o = *acc;
        *acc += sc[p] + 2;
        Some(o)
    }).collect();
    let rd: Vec<usize> = (0..nu).scan(0, |acc, p| {
        let o = *acc;
        *acc += rc[p];
        Some(o)
    }).collect();
    let mut vsrc = vec![0i32; sd[nu - 1] + sc[nu - 1]];
    for p in 0..nu {
        for i in 0..sc[p] {
            vsrc[sd[p] + i] = r * 1000 + p as i32 * 10 + i as i32;
        }
    }
    let vsd = Dev::new(&d, &vsrc);
    let vrd = Dev::<i32>::zeroed(&d, rd[nu - 1] + rc[nu - 1]);
    ok!(dc_alltoallv(vsd.p(), sc.as_ptr(), sd.as_ptr(), vrd.p(), rc.as_ptr(), rd.as_ptr(), DC_INT32, w));
    let got = vrd.get();
    for p in 0..nu {
        for i in 0..rc[p] {
            assert_eq!(got[rd[p] + i], p as i32 * 1000 + r * 10 + i as i32);
        }
    }

    // barrier, non-blocking collective (the fake event is "not ready" once)
    ok!(dc_barrier(w));
    let mut req: *mut Request = std::ptr::null_mut();
    let nb = Dev::new(&d, &[r + 1; 4]);
    ok!(dc_iallreduce(nb.p(), nb.p(), 4, DC_INT32, DC_SUM, w, &mut req));
    let mut done = false;
    let mut polls = 0;
    while !done {
        ok!(dc_request_is_completed(req, &mut done));
        polls += 1;
    }
    assert!(polls >= 2, "the first query must see the op pending");
    ok!(dc_request_wait(req));
    ok!(dc_request_wait(req));
    ok!(dc_request_free(req));
    assert_eq!(nb.get()[0], n * (n + 1) / 2);

    // the caller's stream
    let mut stream: *mut c_void = std::ptr::null_mut();
    assert_eq!((d.stream)(&mut stream, 1), 0);
    ok!(dc_comm_set_stream(w, stream));
    ok!(dc_allreduce(nb.p(), nb.p(), 4, DC_INT32, DC_SUM, w));
    ok!(dc_comm_set_stream(w, std::ptr::null_mut()));
    assert_eq!(nb.get()[0], n * n * (n + 1) / 2);

    // point to point: a ring of irecv + isend (one NCCL group), then a blocking pair
    if n >= 2 {
        let next = (r + 1) % n;
        let prev = (r + n - 1) % n;
        let ps = Dev::new(&d, &[r; 6]);
        let pr = Dev::<i32>::zeroed(&d, 6);
        let mut reqs: [*mut Request; 2] = [std::ptr::null_mut(); 2];
        ok!(dc_irecv(pr.p(), 6, DC_INT32, prev, 3, w, &mut reqs[0]));
        ok!(dc_isend(ps.p(), 6, DC_INT32, next, 3, w, &mut reqs[1]));
        ok!(dc_request_wait_all(2, reqs.as_ptr()));
        let mut info = dc_recv_info::default();
        ok!(dc_request_recv_info(reqs[0], &mut info));
        assert_eq!((info.source, info.tag, info.count), (prev, 3, 6));
        ok!(dc_request_free(reqs[0]));
        ok!(dc_request_free(reqs[1]));
        assert_eq!(pr.get(), vec![prev; 6]);
        if r == 0 {
            ok!(dc_send(ps.p(), 6, DC_INT32, 1, 11, w));
        } else if r == 1 {
            ok!(dc_recv(pr.p(), 6, DC_INT32, 0, DC_ANY_TAG, w, &mut info));
            assert_eq!((info.source, info.tag, info.count), (0, 11, 6));
            assert_eq!(pr.get(), vec![0; 6]);
        }
    }

    // groups: split reversed, new_group, a tag mismatch and an abort on children
    let mut half: *mut Comm = std::ptr::null_mut();
    ok!(dc_comm_split(w, 0, -r, &mut half));
    assert_eq!(backend(half), "nccl");
    let mut hrank = -1;
    ok!(dc_comm_rank(half, &mut hrank));
    assert_eq!(hrank, n - 1 - r);
    let hv = Dev::new(&d, &[hrank; 3]);
    ok!(dc_broadcast(hv.p(), 3, DC_INT32, 0, half));
    assert_eq!(hv.get(), vec![0; 3], "child rank 0 is parent rank n-1");
    if hrank == 0 && n >= 2 {
        ok!(dc_send(hv.p(), 3, DC_INT32, 1, 1, half));
    } else if hrank == 1 {
        status!(dc_recv(hv.p(), 3, DC_INT32, 0, 2, half, std::ptr::null_mut()), dc_status::DC_ERR_UNAVAILABLE);
        assert!(last_error().contains("tags cannot reorder"), "{}", last_error());
        status!(dc_allreduce(hv.p(), hv.p(), 3, DC_INT32, DC_SUM, half), dc_status::DC_ERR_ABORTED);
    }
    ok!(dc_comm_destroy(half));
    let order: Vec<i32> = (0..n).rev().collect();
    let mut rev: *mut Comm = std::ptr::null_mut();
    ok!(dc_comm_new_group(w, order.as_ptr(), n, &mut rev));
    assert_eq!(backend(rev), "nccl");
    ok!(dc_barrier(rev));
    ok!(dc_comm_abort(rev));
    status!(dc_allreduce(hv.p(), hv.p(), 3, DC_INT32, DC_SUM, rev), dc_status::DC_ERR_ABORTED);
    ok!(dc_comm_destroy(rev));
    ok!(dc_barrier(w));
    ok!(dc_comm_destroy(w));
}

#[test]
#[ignore = "run by device_paths_against_a_fake_cuda_and_nccl with the fake libraries loaded"]
fn fake_child() {
    if std::env::var("DC_FAKE_CUDA_CHILD").as_deref() != Ok("1") {
        return;
    }
    let rt = distcomm::nccl::runtime().unwrap_or_else(|e| panic!("the fake libraries must load: {e}"));
    assert!(rt.describe().contains("NCCL 2.26.0"), "{}", rt.describe());
    // "auto": one rank gets NCCL; two thread-ranks share the one (fake) GPU and stay on the CPU.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let w = init(port, 0, 1, "auto");
    assert_eq!(backend(w), "nccl");
    // SAFETY: a live comm.
    ok!(unsafe { dc_comm_destroy(w) });
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let hs: Vec<_> = (0..2).map(|r| std::thread::spawn(move || {
        let w = init(port, r, 2, "auto");
        assert_ne!(backend(w), "nccl");
        // SAFETY: a live comm.
        ok!(unsafe { dc_comm_destroy(w) });
    })).collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    // "nccl" on 1 and 3 thread-ranks: every call on device memory.
    for n in [1, 3] {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let hs: Vec<_> = (0..n).map(|r| std::thread::spawn(move || unsafe { rank_main(port, r, n) })).collect();
        for h in hs {
            h.join().unwrap();
        }
    }
}
