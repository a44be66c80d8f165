//! `dc-bench`: distcomm's collectives measured in the manner of nccl-tests, through the library's
//! C functions (`distcomm::ffi::*`, exactly what C callers get). See `dc-bench --help` and the
//! README's "Benchmarks" section.
//!
//! Per op, type, reduction op and size: fill the inputs, run the warm-up iterations, a barrier,
//! then time `iters` back-to-back calls; the row's time is the slowest rank's average (a max
//! over ranks after timing). With `--check N`, N more untimed calls follow with fresh data
//! (deterministic per rank and check iteration) and every element of every rank is compared
//! with its exact expected value; `#wrong` is the total over ranks.

mod args;
mod csv;
mod data;
mod plot;
mod overlap;

use args::{Args, Parsed};
use csv::Row;
use data::{Data, Dt, Gen, Op, Redop};
use distcomm::comm::Comm;
use distcomm::ffi::{self, coll, comm as fcomm, dc_status, p2p};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::{c_void, CStr};
use std::io::Write;
use std::time::Instant;

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match args::parse(argv) {
        Ok(Parsed::Help) => {
            print!("{}", args::USAGE);
            return;
        }
        Ok(Parsed::Run(a)) => a,
        Err(e) => {
            eprintln!("dc-bench: {e}\n(dc-bench --help lists the options)");
            std::process::exit(2);
        }
    };
    std::process::exit(if args.no_run { plot_only(&args) } else { run(&args) });
}

/// Reads the `--compare` files and draws `--plot` from them alone.
fn plot_only(args: &Args) -> i32 {
    let mut rows = Vec::new();
    for f in &args.compare {
        match csv::read(f) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("dc-bench: {e}");
                return 1;
            }
        }
    }
    write_plot(args, &rows, "bus bandwidth and time against size")
}

fn write_plot(args: &Args, rows: &[Row], title: &str) -> i32 {
    let Some(path) = &args.plot else { return 0 };
    let svg = plot::render(rows, args.title.as_deref().unwrap_or(title));
    match std::fs::write(path, svg) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dc-bench: cannot write {}: {e}", path.display());
            1
        }
    }
}

/// A zeroed, page-aligned host buffer (as a C caller's posix_memalign would give).
struct Buf {
    ptr: *mut u8,
    layout: Layout,
}

impl Buf {
    fn new(len: usize) -> Buf {
        let layout = Layout::from_size_align(len.max(64), 4096).expect("buffer layout");
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            eprintln!("dc-bench: cannot allocate {len} bytes");
            std::process::exit(1);
        }
        Buf { ptr, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() bytes, zero-initialised.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }

    fn at(&self, byte_offset: usize) -> *mut c_void {
        debug_assert!(byte_offset <= self.layout.size());
        // SAFETY: within the allocation.
        unsafe { self.ptr.add(byte_offset) as *mut c_void }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// The element counts of one row: `count` elements in all (`bytes` = count * type size);
/// `block` per rank for the ops that split their buffer into blocks, else `count`.
#[derive(Debug, Clone, Copy)]
struct Shape {
    bytes: usize,
    count: usize,
    block: usize,
}

fn shape(op: Op, dt: Dt, n: usize, size: u64) -> Option<Shape> {
    if op == Op::Barrier {
        return Some(Shape { bytes: 0, count: 0, block: 0 });
    }
    let ts = dt.size();
    let size = size as usize;
    let (count, block) = if op.blocked() {
        let per = size / (ts * n);
        (per * n, per)
    } else {
        (size / ts, size / ts)
    };
    (count > 0).then_some(Shape { bytes: count * ts, count, block })
}

/// One row's parameters.
#[derive(Debug, Clone, Copy)]
struct Case {
    op: Op,
    dt: Dt,
    redop: Option<Redop>,
    shape: Shape,
}

struct Bench {
    comm: *mut Comm,
    rank: usize,
    n: usize,
    root: usize,
    send: Buf,
    recv: Buf,
    seed: u64,
    inject_wrong: bool,
    /// The v forms' counts and displacements for the case being measured (`v_layout`).
    vcounts: Vec<usize>,
    vdispls: Vec<usize>,
}

fn last_error() -> String {
    // SAFETY: the library returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::dc_last_error()) }.to_string_lossy().into_owned()
}

fn status_name(s: dc_status) -> String {
    // SAFETY: never NULL, static.
    unsafe { CStr::from_ptr(ffi::dc_status_name(s as u32)) }.to_string_lossy().into_owned()
}

/// Exits on a failed call, naming it (dcrun then stops the other ranks).
fn check(st: dc_status, what: &str, rank: usize) {
    if st != dc_status::DC_SUCCESS {
        eprintln!("dc-bench: rank {rank}: {what} failed: {}: {}", status_name(st), last_error());
        let _ = std::io::stdout().flush();
        std::process::exit(1);
    }
}

impl Bench {
    /// One call of the op in the given form, through the C functions.
    fn call(&self, c: &Case, inplace: bool) -> dc_status {
        let ts = c.dt.size();
        let dt = c.dt.c();
        let redop = c.redop.map_or(ffi::DC_SUM, Redop::c);
        let (send, recv) = (self.send.at(0), self.recv.at(0));
        // This rank's block of the receive buffer (the in-place forms of the blocked ops).
        let own = || self.recv.at(self.rank * c.shape.block * ts);
        let root = self.root as i32;
        let comm = self.comm;
        // SAFETY: buffers hold at least the sweep's largest size; counts are derived from it.
        unsafe {
            match (c.op, inplace) {
                (Op::Allreduce, false) => coll::dc_allreduce(send, recv, c.shape.count, dt, redop, comm),
                (Op::Allreduce, true) => coll::dc_allreduce(recv, recv, c.shape.count, dt, redop, comm),
                (Op::Reduce, false) => coll::dc_reduce(send, recv, c.shape.count, dt, redop, root, comm),
                (Op::Reduce, true) => coll::dc_reduce(recv, recv, c.shape.count, dt, redop, root, comm),
                (Op::Broadcast, _) => coll::dc_broadcast(recv, c.shape.count, dt, root, comm),
                (Op::Allgather, false) => coll::dc_allgather(send, recv, c.shape.block, dt, comm),
                (Op::Allgather, true) => coll::dc_allgather(own(), recv, c.shape.block, dt, comm),
                (Op::ReduceScatter, false) => coll::dc_reduce_scatter(send, recv, c.shape.block, dt, redop, comm),
                (Op::ReduceScatter, true) => coll::dc_reduce_scatter(recv, own(), c.shape.block, dt, redop, comm),
                (Op::Alltoall, _) => coll::dc_alltoall(send, recv, c.shape.block, dt, comm),
                (Op::Sendrecv, _) => {
                    let next = ((self.rank + 1) % self.n) as i32;
                    let prev = ((self.rank + self.n - 1) % self.n) as i32;
                    p2p::dc_sendrecv(send, c.shape.count, dt, next, 0, recv, c.shape.count, dt, prev, 0, comm, std::ptr::null_mut())
                }
                (Op::Barrier, _) => coll::dc_barrier(comm),
                (Op::Gather, _) => coll::dc_gather(send, recv, c.shape.block, dt, root, comm),
                (Op::Scatter, _) => coll::dc_scatter(send, recv, c.shape.block, dt, root, comm),
                (Op::Allgatherv, _) => {
                    let (counts, displs) = (self.vcounts.as_ptr(), self.vdispls.as_ptr());
                    coll::dc_allgatherv(send, c.shape.block, recv, counts, displs, dt, comm)
                }
                (Op::Alltoallv, _) => {
                    let (counts, displs) = (self.vcounts.as_ptr(), self.vdispls.as_ptr());
                    coll::dc_alltoallv(send, counts, displs, recv, counts, displs, dt, comm)
                }
            }
        }
    }

    /// Every count the block, block j at j * block: made before the timed calls, which then do
    /// not pay for them.
    fn v_layout(&mut self, c: &Case) {
        self.vcounts = vec![c.shape.block; self.n];
        self.vdispls = (0..self.n).map(|j| j * c.shape.block).collect();
    }

    fn data(&self, c: &Case) -> Data {
        match c.redop {
            Some(r) if c.op.reduces() => Data::new(Gen::Reduce(r), c.dt, self.n),
            _ => Data::new(Gen::Move, c.dt, self.n),
        }
    }

    /// Writes this rank's inputs for `seed` and fills the outputs with a poison pattern.
    fn prepare(&mut self, c: &Case, inplace: bool, seed: u64) {
        let d = self.data(c);
        let (rank, dt, sh) = (self.rank, c.dt, c.shape);
        let ts = dt.size();
        let poison = 0xA5u8 ^ (seed as u8).wrapping_mul(0x3B);
        let fill = |buf: &mut [u8], from: usize, elems: usize, src_rank: usize, first_index: usize| {
            for i in 0..elems {
                dt.put(buf, from + i, d.bits(src_rank, first_index + i, seed));
            }
        };
        match c.op {
            Op::Barrier => {}
            Op::Allreduce | Op::Reduce => {
                if inplace {
                    fill(self.recv.bytes(), 0, sh.count, rank, 0);
                } else {
                    fill(self.send.bytes(), 0, sh.count, rank, 0);
                    self.recv.bytes()[..sh.bytes].fill(poison);
                }
            }
            Op::Broadcast => {
                if rank == self.root {
                    fill(self.recv.bytes(), 0, sh.count, rank, 0);
                } else {
                    self.recv.bytes()[..sh.bytes].fill(poison);
                }
            }
            Op::Allgather | Op::Allgatherv | Op::Gather => {
                self.recv.bytes()[..sh.bytes].fill(poison);
                if inplace {
                    fill(self.recv.bytes(), rank * sh.block, sh.block, rank, 0);
                } else {
                    fill(self.send.bytes(), 0, sh.block, rank, 0);
                }
            }
            Op::ReduceScatter => {
                if inplace {
                    fill(self.recv.bytes(), 0, sh.count, rank, 0);
                } else {
                    fill(self.send.bytes(), 0, sh.count, rank, 0);
                    self.recv.bytes()[..sh.block * ts].fill(poison);
                }
            }
            Op::Scatter => {
                if rank == self.root {
                    fill(self.send.bytes(), 0, sh.count, rank, 0);
                }
                self.recv.bytes()[..sh.block * ts].fill(poison);
            }
            Op::Alltoall | Op::Alltoallv => {
                fill(self.send.bytes(), 0, sh.count, rank, 0);
                self.recv.bytes()[..sh.bytes].fill(poison);
            }
            Op::Sendrecv => {
                fill(self.send.bytes(), 0, sh.count, rank, 0);
                self.recv.bytes()[..sh.bytes].fill(poison);
            }
        }
    }

    /// Counts this rank's wrong output elements for `seed`.
    fn verify(&mut self, c: &Case, inplace: bool, seed: u64) -> u64 {
        let d = self.data(c);
        let (rank, n, root, dt, sh) = (self.rank, self.n, self.root, c.dt, c.shape);
        let out = self.recv.bytes();
        let mut wrong = 0u64;
        let mut expect = |idx: usize, bits: u64| {
            if !dt.same(dt.get(out, idx), bits) {
                wrong += 1;
            }
        };
        match c.op {
            Op::Barrier => {}
            Op::Allreduce => (0..sh.count).for_each(|i| expect(i, dt.encode(d.reduced(i, seed)))),
            Op::Reduce if rank == root => (0..sh.count).for_each(|i| expect(i, dt.encode(d.reduced(i, seed)))),
            Op::Reduce => {}
            Op::Broadcast => (0..sh.count).for_each(|i| expect(i, d.bits(root, i, seed))),
            Op::Gather if rank != root => {}
            Op::Allgather | Op::Allgatherv | Op::Gather => {
                for j in 0..n {
                    (0..sh.block).for_each(|i| expect(j * sh.block + i, d.bits(j, i, seed)));
                }
            }
            Op::ReduceScatter => {
                let at = if inplace { rank * sh.block } else { 0 };
                (0..sh.block).for_each(|i| expect(at + i, dt.encode(d.reduced(rank * sh.block + i, seed))));
            }
            Op::Scatter => (0..sh.block).for_each(|i| expect(i, d.bits(root, rank * sh.block + i, seed))),
            Op::Alltoall | Op::Alltoallv => {
                for j in 0..n {
                    (0..sh.block).for_each(|i| expect(j * sh.block + i, d.bits(j, rank * sh.block + i, seed)));
                }
            }
            Op::Sendrecv => {
                let prev = (rank + n - 1) % n;
                (0..sh.count).for_each(|i| expect(i, d.bits(prev, i, seed)));
            }
        }
        wrong
    }

    fn max_f64(&self, v: f64) -> f64 {
        let mut out = 0f64;
        // SAFETY: one f64 each way.
        let st = unsafe {
            coll::dc_allreduce(&v as *const f64 as *const c_void, &mut out as *mut f64 as *mut c_void, 1, ffi::DC_FLOAT64, ffi::DC_MAX, self.comm)
        };
        check(st, "dc_allreduce (time)", self.rank);
        out
    }

    fn sum_i64(&self, v: i64) -> i64 {
        let mut out = 0i64;
        // SAFETY: one i64 each way.
        let st = unsafe {
            coll::dc_allreduce(&v as *const i64 as *const c_void, &mut out as *mut i64 as *mut c_void, 1, ffi::DC_INT64, ffi::DC_SUM, self.comm)
        };
        check(st, "dc_allreduce (#wrong)", self.rank);
        out
    }

    /// Times one form of a case and checks it: (slowest rank's seconds per iteration, wrong
    /// elements over all ranks or -1 when not checked).
    fn measure(&mut self, c: &Case, inplace: bool, args: &Args) -> (f64, i64) {
        let what = format!("dc_{}", c.op.name());
        self.v_layout(c);
        self.prepare(c, inplace, 0);
        for _ in 0..args.warmup {
            check(self.call(c, inplace), &what, self.rank);
        }
        // SAFETY: valid comm.
        check(unsafe { coll::dc_barrier(self.comm) }, "dc_barrier", self.rank);
        let t0 = Instant::now();
        for _ in 0..args.iters {
            check(self.call(c, inplace), &what, self.rank);
        }
        let mine = t0.elapsed().as_secs_f64() / args.iters as f64;
        let time = self.max_f64(mine);
        if args.check == 0 {
            return (time, -1);
        }
        let mut wrong = 0u64;
        for _ in 0..args.check {
            self.seed += 1;
            let seed = self.seed;
            self.prepare(c, inplace, seed);
            check(self.call(c, inplace), &what, self.rank);
            if self.inject_wrong && self.rank == 0 && c.shape.bytes > 0 {
                // Test hook (DC_BENCH_INJECT_WRONG=1): damage one output element, so the tests
                // can see that the check notices.
                self.recv.bytes()[0] ^= 0x5A;
            }
            wrong += self.verify(c, inplace, seed);
        }
        (time, self.sum_i64(wrong as i64))
    }
}

/// `--overlap`: one line per size (see `overlap`).
fn run_overlap(comm: *mut Comm, n: usize, args: &Args, lead: bool) -> i32 {
    if lead {
        println!("# overlap: float sum iallreduce beside a compute loop on {} thread(s) per rank, {} timed runs each", overlap::threads_per_rank(n), args.iters);
        println!("# {:>10} {:>12} {:>12} {:>12} {:>10}", "size (B)", "comm (us)", "compute (us)", "both (us)", "both/max");
    }
    for s in args.sizes() {
        let o = overlap::measure(comm, n, s as usize, args.iters.max(1));
        if lead {
            println!("  {:>10} {:>12.1} {:>12.1} {:>12.1} {:>10.2}", o.bytes, o.comm_us, o.compute_us, o.both_us, o.efficiency());
        }
    }
    // SAFETY: valid comm, not used after.
    unsafe { fcomm::dc_comm_destroy(comm) };
    0
}

fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: buffer and its length.
    if unsafe { libc::gethostname(b.as_mut_ptr() as *mut libc::c_char, b.len()) } != 0 {
        return "?".into();
    }
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Every rank's host name, gathered (64 bytes each).
fn hosts(comm: *mut Comm, rank: usize, n: usize) -> Vec<String> {
    let mut mine = [0u8; 64];
    let h = hostname();
    let len = h.len().min(63);
    mine[..len].copy_from_slice(&h.as_bytes()[..len]);
    let mut all = vec![0u8; 64 * n];
    // SAFETY: 64 bytes in, 64*n out.
    let st = unsafe { coll::dc_allgather(mine.as_ptr() as *const c_void, all.as_mut_ptr() as *mut c_void, 64, ffi::DC_UINT8, comm) };
    check(st, "dc_allgather (host names)", rank);
    all.chunks(64)
        .map(|c| String::from_utf8_lossy(&c[..c.iter().position(|&b| b == 0).unwrap_or(64)]).into_owned())
        .collect()
}

fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

fn run(args: &Args) -> i32 {
    let mut comm: *mut Comm = std::ptr::null_mut();
    // SAFETY: NULL options (all from the environment) and a valid out-pointer.
    let st = unsafe { fcomm::dc_init(std::ptr::null(), &mut comm) };
    if st != dc_status::DC_SUCCESS {
        eprintln!(
            "dc-bench: dc_init failed: {}: {}\n(start it with a launcher, e.g. dcrun -n 2 dc-bench ...)",
            status_name(st),
            last_error()
        );
        return 1;
    }
    let (mut rank, mut size) = (0i32, 0i32);
    let mut backend: *const libc::c_char = std::ptr::null();
    // SAFETY: valid comm and out-pointers.
    unsafe {
        check(fcomm::dc_comm_rank(comm, &mut rank), "dc_comm_rank", 0);
        check(fcomm::dc_comm_size(comm, &mut size), "dc_comm_size", 0);
        check(fcomm::dc_comm_backend(comm, &mut backend), "dc_comm_backend", 0);
    }
    let (rank, n) = (rank as usize, size as usize);
    // SAFETY: the string lives as long as the comm.
    let backend = unsafe { CStr::from_ptr(backend) }.to_string_lossy().into_owned();
    if args.root as usize >= n {
        if rank == 0 {
            eprintln!("dc-bench: --root {} is not a rank of this {n}-rank job", args.root);
        }
        // SAFETY: valid comm.
        unsafe { fcomm::dc_comm_destroy(comm) };
        return 2;
    }
    let host_names = hosts(comm, rank, n);
    let lead = rank == 0;

    let mut csv_out = None;
    if lead {
        if let Some(p) = &args.csv {
            match csv::Writer::create(p) {
                Ok(w) => csv_out = Some(w),
                Err(e) => {
                    eprintln!("dc-bench: cannot write {}: {e}", p.display());
                    std::process::exit(1);
                }
            }
        }
    }

    let bufsize = args.maxbytes.max(64) as usize;
    let mut b = Bench { comm, rank, n, root: args.root as usize, send: Buf::new(bufsize), recv: Buf::new(bufsize), seed: 0,
        inject_wrong: std::env::var("DC_BENCH_INJECT_WRONG").is_ok_and(|v| v == "1"), vcounts: Vec::new(), vdispls: Vec::new() };

    if lead {
        let mut hs: Vec<(String, usize)> = Vec::new();
        for h in &host_names {
            match hs.iter_mut().find(|(x, _)| x == h) {
                Some(e) => e.1 += 1,
                None => hs.push((h.clone(), 1)),
            }
        }
        let hosts = if hs.len() == 1 {
            format!("host {}", hs[0].0)
        } else {
            format!("hosts {}", hs.iter().map(|(h, k)| format!("{h} ({k} ranks)")).collect::<Vec<_>>().join(", "))
        };
        let v = ffi::dc_version();
        println!(
            "# dc-bench: distcomm {}.{}.{}, {n} ranks, transport {backend}, {hosts}",
            v / 10000,
            v / 100 % 100,
            v % 100
        );
        let step = match args.stepbytes {
            Some(s) => format!("step {} bytes", s),
            None => format!("step factor {}", args.stepfactor),
        };
        println!(
            "# sizes {} to {} bytes, {step}; warmup {} and {} timed iterations per size; check {}; root {}",
            args.minbytes,
            args.maxbytes,
            args.warmup,
            args.iters,
            if args.check == 0 { "off".to_string() } else { format!("{} run(s) per size", args.check) },
            args.root
        );
        println!("# time: the slowest rank's average per iteration; algbw = size/time; busbw = algbw x nccl-tests' factor");
    }

    if args.overlap {
        return run_overlap(comm, n, args, lead);
    }

    let mut rows: Vec<Row> = Vec::new();
    let mut total_wrong = 0i64;
    let mut bw_sum = 0.0;
    let mut bw_rows = 0usize;
    for &op in &args.ops {
        if lead {
            println!("#");
            println!("# op: {}", op.name());
            println!(
                "# {:>10} {:>12} {:>9} {:>6} {:>5}  {:^36}  {:^36}",
                "", "", "", "", "", "out-of-place", "in-place"
            );
            println!(
                "# {:>10} {:>12} {:>9} {:>6} {:>5}  {:>9} {:>8} {:>8} {:>8}  {:>9} {:>8} {:>8} {:>8}",
                "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
            );
            println!(
                "# {:>10} {:>12} {:>9} {:>6} {:>5}  {:>9} {:>8} {:>8} {:>8}  {:>9} {:>8} {:>8} {:>8}",
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
            );
        }
        let dts: Vec<Option<Dt>> = if op == Op::Barrier { vec![None] } else { args.dtypes.iter().copied().map(Some).collect() };
        for dt in dts {
            let redops: Vec<Option<Redop>> = match dt {
                Some(dt) if op.reduces() => args.redops.iter().copied().filter(|r| r.valid_for(dt)).map(Some).collect(),
                _ => vec![None],
            };
            for redop in redops {
                let sizes = if op == Op::Barrier { vec![0] } else { args.sizes() };
                let mut last_bytes = None;
                for s in sizes {
                    let d = dt.unwrap_or(Dt::Uint8);
                    let Some(sh) = shape(op, d, n, s) else { continue };
                    if last_bytes == Some(sh.bytes) {
                        continue;
                    }
                    last_bytes = Some(sh.bytes);
                    let case = Case { op, dt: d, redop, shape: sh };
                    let (oop, ip) = op.forms();
                    let mut line = format!(
                        "  {:>10} {:>12} {:>9} {:>6} {:>5}",
                        sh.bytes,
                        sh.count,
                        dt.map_or("none", Dt::name),
                        redop.map_or("none", Redop::name),
                        if op.has_root() { args.root as i64 } else { -1 }
                    );
                    for (enabled, inplace) in [(oop, false), (ip, true)] {
                        if !enabled {
                            line.push_str(&format!("  {:>9} {:>8} {:>8} {:>8}", "N/A", "N/A", "N/A", "N/A"));
                            continue;
                        }
                        let (secs, wrong) = b.measure(&case, inplace, args);
                        let time_us = secs * 1e6;
                        let algbw = if secs > 0.0 { sh.bytes as f64 / secs / 1e9 } else { 0.0 };
                        let busbw = algbw * op.bus_factor(n);
                        if wrong > 0 {
                            total_wrong += wrong;
                        }
                        if op != Op::Barrier {
                            bw_sum += busbw;
                            bw_rows += 1;
                        }
                        line.push_str(&format!(
                            "  {:>9} {:>8.2} {:>8.2} {:>8}",
                            fmt_time(time_us),
                            algbw,
                            busbw,
                            if wrong < 0 { "N/A".to_string() } else { wrong.to_string() }
                        ));
                        let row = Row {
                            op: op.name().into(),
                            bytes: sh.bytes as u64,
                            count: sh.count as u64,
                            dtype: dt.map_or("none", Dt::name).into(),
                            redop: redop.map_or("none", Redop::name).into(),
                            root: if op.has_root() { args.root as i64 } else { -1 },
                            inplace,
                            time_us,
                            algbw,
                            busbw,
                            wrong,
                            ranks: n as u64,
                            implementation: args.label.clone(),
                        };
                        if let Some(w) = csv_out.as_mut() {
                            if let Err(e) = w.row(&row) {
                                eprintln!("dc-bench: writing the CSV: {e}");
                                std::process::exit(1);
                            }
                        }
                        rows.push(row);
                    }
                    if lead {
                        println!("{line}");
                    }
                }
            }
        }
    }

    if lead {
        println!("#");
        if args.check > 0 {
            println!("# wrong elements: {total_wrong} {}", if total_wrong == 0 { "(OK)" } else { "(FAILED)" });
        } else {
            println!("# wrong elements: not checked (--check 0)");
        }
        if bw_rows > 0 {
            println!("# avg bus bandwidth: {:.4} GB/s (mean over the rows above)", bw_sum / bw_rows as f64);
        }
    }
    let mut rc = 0;
    if lead && args.plot.is_some() {
        let mut all = rows.clone();
        for f in &args.compare {
            match csv::read(f) {
                Ok(r) => all.extend(r),
                Err(e) => {
                    eprintln!("dc-bench: {e}");
                    rc = 1;
                }
            }
        }
        let title = format!("dc-bench: {n} ranks, transport {backend}");
        if write_plot(args, &all, &title) != 0 {
            rc = 1;
        }
    }
    drop(b);
    // SAFETY: valid comm, destroyed once.
    check(unsafe { fcomm::dc_comm_destroy(comm) }, "dc_comm_destroy", rank);
    if rc != 0 {
        rc
    } else if total_wrong > 0 {
        3
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let s = shape(Op::Allreduce, Dt::Float, 2, 8).unwrap();
        assert_eq!((s.bytes, s.count, s.block), (8, 2, 2));
        assert!(shape(Op::Allgather, Dt::Float, 4, 8).is_none());
        let s = shape(Op::Allgather, Dt::Float, 3, 100).unwrap();
        assert_eq!((s.bytes, s.count, s.block), (96, 24, 8));
        let s = shape(Op::Alltoall, Dt::Double, 2, 1 << 20).unwrap();
        assert_eq!((s.bytes, s.count, s.block), (1 << 20, 1 << 17, 1 << 16));
        assert_eq!(shape(Op::Barrier, Dt::Float, 2, 8).unwrap().bytes, 0);
        assert!(shape(Op::Sendrecv, Dt::Double, 2, 4).is_none());
    }

    #[test]
    fn bus_factors() {
        assert_eq!(Op::Allreduce.bus_factor(4), 1.5);
        assert_eq!(Op::Allgather.bus_factor(4), 0.75);
        assert_eq!(Op::Broadcast.bus_factor(4), 1.0);
    }
}
