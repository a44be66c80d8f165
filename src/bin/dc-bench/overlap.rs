//! `dc-bench --overlap`: how well a non-blocking allreduce progresses while the caller computes
//! on every core (data-parallel training overlaps the gradient allreduce with the backward pass).
//!
//! Per size, the slowest rank's average of `iters` runs of each: the allreduce alone
//! (`dc_iallreduce` then `dc_request_wait`), the compute alone (a loop on every core this rank
//! has: its share of the host's cores, the calling thread included), and both (start the
//! allreduce, compute, then wait). The compute is sized to take as long as the allreduce alone,
//! the hardest case for overlap. Overlap efficiency = both / max(alone): 1.0 is perfect overlap,
//! 2.0 none at all.

use distcomm::comm::Comm;
use distcomm::ffi::{self, coll, dc_status, request};
use distcomm::request::Request;
use std::ffi::c_void;
use std::time::Instant;

pub struct Overlap {
    pub bytes: usize,
    pub comm_us: f64,
    pub compute_us: f64,
    pub both_us: f64,
}

impl Overlap {
    pub fn efficiency(&self) -> f64 {
        self.both_us / self.comm_us.max(self.compute_us)
    }
}

/// A unit of compute: floating-point work on a small, cache-resident array (as a backward pass's
/// kernels keep the cores busy), never optimised away.
fn compute_units(units: u64, seed: f32) -> f32 {
    let mut v = [seed; 256];
    for _ in 0..units {
        for x in v.iter_mut() {
            *x = x.mul_add(0.999_9, 0.000_1);
        }
    }
    std::hint::black_box(v.iter().sum())
}

/// `units` of compute on `threads` threads (this one and `threads - 1` more), joined.
fn compute_everywhere(units: u64, threads: usize) {
    std::thread::scope(|s| {
        for t in 1..threads {
            s.spawn(move || compute_units(units, t as f32));
        }
        compute_units(units, 0.0);
    });
}

/// This rank's share of the host's cores (at least 1): the compute threads it runs.
pub fn threads_per_rank(n: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let local = std::env::var("LOCAL_WORLD_SIZE").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(n).max(1);
    (cores / local).max(1)
}

fn ok(st: dc_status, what: &str) {
    if st != dc_status::DC_SUCCESS {
        eprintln!("dc-bench: {what} failed: {}", crate::last_error());
        std::process::exit(1);
    }
}

fn max_over_ranks(comm: *mut Comm, v: f64) -> f64 {
    let mut out = 0.0f64;
    // SAFETY: one f64 in, one out, valid comm.
    ok(unsafe { coll::dc_allreduce(&v as *const f64 as *const c_void, &mut out as *mut f64 as *mut c_void, 1, ffi::DC_FLOAT64, ffi::DC_MAX, comm) }, "dc_allreduce");
    out
}

fn barrier(comm: *mut Comm) {
    // SAFETY: valid comm.
    ok(unsafe { coll::dc_barrier(comm) }, "dc_barrier");
}

/// Times `iters` runs of `f` after one untimed one: the slowest rank's average, in us.
fn timed(comm: *mut Comm, iters: u32, mut f: impl FnMut()) -> f64 {
    f();
    barrier(comm);
    let t0 = Instant::now();
    for _ in 0..iters {
        f();
    }
    max_over_ranks(comm, t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters))
}

/// Measures one size (float sum allreduce of `bytes`).
pub fn measure(comm: *mut Comm, n: usize, bytes: usize, iters: u32) -> Overlap {
    let count = (bytes / 4).max(1);
    let send = vec![1.0f32; count];
    let mut recv = vec![0.0f32; count];
    let threads = threads_per_rank(n);
    let mut start = || {
        let mut req: *mut Request = std::ptr::null_mut();
        // SAFETY: buffers of `count` floats that outlive the request (waited below).
        ok(unsafe { coll::dc_iallreduce(send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void, count, ffi::DC_FLOAT32, ffi::DC_SUM, comm, &mut req) }, "dc_iallreduce");
        req
    };
    let wait = |req: *mut Request| {
        // SAFETY: a request of ours, waited once and freed.
        ok(unsafe { request::dc_request_wait(req) }, "dc_request_wait");
        ok(unsafe { request::dc_request_free(req) }, "dc_request_free");
    };
    let comm_us = timed(comm, iters, || wait(start()));
    // Compute sized to take as long as the allreduce alone (the same on every rank).
    let probe = 2000u64;
    let unit_us = max_over_ranks(comm, {
        let t0 = Instant::now();
        compute_everywhere(probe, threads);
        t0.elapsed().as_secs_f64() * 1e6 / probe as f64
    });
    let units = ((comm_us / unit_us.max(1e-6)) as u64).max(1);
    let compute_us = timed(comm, iters, || compute_everywhere(units, threads));
    let both_us = timed(comm, iters, || {
        let req = start();
        compute_everywhere(units, threads);
        wait(req);
    });
    let expect = n as f32;
    assert!(recv.iter().all(|&x| x == expect), "dc-bench --overlap: wrong allreduce result");
    Overlap { bytes, comm_us, compute_us, both_us }
}
