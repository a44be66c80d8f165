//! The fault suite (issue 4): never hang, never crash, never let a stranger in.
//!
//! Ranks are processes: the test binary re-runs itself as each rank (`DC_TEST_ROLE`, as in
//! tests/processes.rs) and drives the library through its C API, so statuses and
//! `dc_last_error()` texts are what C callers see. Each rank writes its output to a log file;
//! lines starting with `FAULT ` are results the parent checks (timestamps are wall-clock
//! milliseconds, so the parent can relate a survivor's failure to the victim's death).
//!
//! What is covered:
//! - SIGKILL of one rank of 3 during every collective (blocking and non-blocking) and during
//!   send/recv, both while the victim takes part ("mid") and while the others wait for it
//!   ("absent"): every survivor fails with PEER_LOST / TIMEOUT / ABORTED naming the lost rank,
//!   within about a second of the death.
//! - SIGSTOP of one rank of 3 (shared memory and sockets): the others fail with PEER_LOST
//!   naming it as stopped after the peer timeout (DC_PEER_TIMEOUT_MS); a rank that only sleeps
//!   that long is not lost. With the peer timeout off and a 1 s operation timeout, the calls
//!   that need it (a 4 MiB sendrecv, single-copy or over sockets; an allreduce) end with
//!   TIMEOUT within 1.5 s (a send it may be reading is revoked after a tenth of the timeout).
//! - dc_comm_abort from another thread while blocked in each kind of call.
//! - a job with a missing rank fails init with DC_ERR_TIMEOUT naming it.
//! - strangers (garbage, silence, huge lengths, wrong token, slow senders, a flood) at the
//!   rendezvous port during init do not stop the job (a data listener: tests/init_listeners.rs).
//! - CPU used while blocked; 8 ranks on 2 cores; 1000 subgroup create/destroy cycles.
//! - mismatched collectives: DC_DEBUG=DETAIL names the ranks and the difference; without it a
//!   count mismatch fails fast and never writes out of bounds.
mod common;
use common::{free_port, strangers};


use distcomm::comm::Comm;
use distcomm::ffi::coll::*;
use distcomm::ffi::comm::*;
use distcomm::ffi::p2p::*;
use distcomm::ffi::request::*;
use distcomm::ffi::status::dc_last_error;
use distcomm::ffi::types::*;
use distcomm::request::Request;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type C = *mut Comm;
const OK: dc_status = dc_status::DC_SUCCESS;
/// The comm timeout of the fault jobs: short, so that ranks that only depend on a lost rank
/// indirectly (if any) still finish quickly.
const TIMEOUT_MS: u64 = 5000;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

fn env_usize(k: &str) -> usize {
    env(k).parse().unwrap_or_else(|_| panic!("{k} not set"))
}

// =============================================================================================
// Parent side: spawning jobs and reading their results
// =============================================================================================


static JOBS: AtomicUsize = AtomicUsize::new(0);

struct Job {
    name: String,
    dir: PathBuf,
    n: usize,
    port: u16,
    env: Vec<(String, String)>,
    children: Vec<(usize, Child)>,
}

/// One result line: `FAULT key=value ... msg=free text`.
#[derive(Debug, Clone)]
struct Line {
    rank: usize,
    kv: HashMap<String, String>,
}

impl Line {
    fn get(&self, k: &str) -> &str {
        self.kv.get(k).map(|s| s.as_str()).unwrap_or_else(|| panic!("no {k} in {self:?}"))
    }
    fn num(&self, k: &str) -> u64 {
        self.get(k).parse().unwrap_or_else(|_| panic!("{k} is not a number in {self:?}"))
    }
    fn status(&self) -> u32 {
        self.num("status") as u32
    }
    fn msg(&self) -> &str {
        self.kv.get("msg").map(|s| s.as_str()).unwrap_or("")
    }
}

struct Outcome {
    /// Exit code per rank; None: killed by a signal.
    codes: HashMap<usize, Option<i32>>,
    lines: Vec<Line>,
    logs: String,
    wall: Duration,
}

impl Outcome {
    fn of(&self, rank: usize, what: &str) -> Vec<&Line> {
        self.lines.iter().filter(|l| l.rank == rank && l.kv.get("what").map(|s| s.as_str()) == Some(what)).collect()
    }
    fn one(&self, rank: usize, what: &str) -> &Line {
        let v = self.of(rank, what);
        assert_eq!(v.len(), 1, "rank {rank}: expected one {what:?} line\n{}", self.logs);
        v[0]
    }
}

impl Job {
    fn new(name: &str, n: usize, timeout_ms: u64) -> Job {
        let id = JOBS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("dc-faults-{}-{id}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let env = vec![
            ("DC_TEST_ROLE".to_string(), name.to_string()),
            ("DC_TIMEOUT_MS".to_string(), timeout_ms.to_string()),
            ("WORLD_SIZE".to_string(), n.to_string()),
            ("MASTER_ADDR".to_string(), "127.0.0.1".to_string()),
            ("DC_TEST_DIR".to_string(), dir.display().to_string()),
        ];
        Job { name: name.to_string(), dir, n, port: free_port(), env, children: Vec::new() }
    }

    fn env(mut self, k: &str, v: impl ToString) -> Job {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// Starts rank `r`.
    fn start(&mut self, r: usize) {
        let log = File::create(self.dir.join(format!("r{r}.log"))).unwrap();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env_remove("DC_DEBUG")
            .env_remove("DC_TOKEN")
            .env("RANK", r.to_string())
            .env("MASTER_PORT", self.port.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.children.push((r, cmd.spawn().unwrap()));
    }

    fn start_all(mut self) -> Job {
        for r in 0..self.n {
            self.start(r);
        }
        self
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        let mut ranks: Vec<usize> = self.children.iter().map(|c| c.0).collect();
        ranks.sort();
        for r in ranks {
            let text = std::fs::read_to_string(self.dir.join(format!("r{r}.log"))).unwrap_or_default();
            out.push_str(&format!("---- {} rank {r} ----\n{text}", self.name));
        }
        out
    }

    /// Waits for every started rank (killing all after `limit`) and parses their results.
    fn wait(mut self, limit: Duration) -> Outcome {
        let t0 = Instant::now();
        let mut codes = HashMap::new();
        while codes.len() < self.children.len() {
            for (r, c) in self.children.iter_mut() {
                if codes.contains_key(r) {
                    continue;
                }
                if let Some(s) = c.try_wait().unwrap() {
                    codes.insert(*r, s.code());
                }
            }
            if t0.elapsed() > limit {
                for (_, c) in self.children.iter_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                panic!("job {} did not finish within {limit:?} (exited: {codes:?})\n{}", self.name, self.logs());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let wall = t0.elapsed();
        let logs = self.logs();
        let mut lines = Vec::new();
        for (r, _) in &self.children {
            let text = std::fs::read_to_string(self.dir.join(format!("r{r}.log"))).unwrap_or_default();
            // The harness may print "test child_entry ... " just before a result on the same line.
            for l in text.lines().filter_map(|l| l.find("FAULT what=").map(|i| &l[i + 6..])) {
                let (head, msg) = match l.find(" msg=") {
                    Some(i) => (&l[..i], Some(&l[i + 5..])),
                    None => (l, None),
                };
                let mut kv: HashMap<String, String> =
                    head.split_whitespace().filter_map(|p| p.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
                if let Some(m) = msg {
                    kv.insert("msg".into(), m.to_string());
                }
                lines.push(Line { rank: *r, kv });
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Outcome { codes, lines, logs, wall }
    }
}

const PEER_LOST: u32 = dc_status::DC_ERR_PEER_LOST as u32;
const TIMEOUT: u32 = dc_status::DC_ERR_TIMEOUT as u32;
const ABORTED: u32 = dc_status::DC_ERR_ABORTED as u32;
const MISMATCH: u32 = dc_status::DC_ERR_MISMATCH as u32;

// =============================================================================================
// Child side
// =============================================================================================

fn last_error() -> String {
    unsafe { CStr::from_ptr(dc_last_error()) }.to_string_lossy().replace('\n', " ")
}

/// Prints a result line for the parent.
fn report(what: &str, fields: &[(&str, String)], msg: Option<&str>) {
    let mut s = format!("FAULT what={what}");
    for (k, v) in fields {
        s.push_str(&format!(" {k}={v}"));
    }
    if let Some(m) = msg {
        s.push_str(&format!(" msg={m}"));
    }
    println!("{s}");
}

fn init_world() -> C {
    let mut c: C = std::ptr::null_mut();
    let s = unsafe { dc_init(std::ptr::null(), &mut c) };
    assert_eq!(s, OK, "dc_init: {}", last_error());
    c
}

fn rank_size(c: C) -> (usize, usize) {
    let (mut r, mut n) = (0i32, 0i32);
    unsafe {
        assert_eq!(dc_comm_rank(c, &mut r), OK);
        assert_eq!(dc_comm_size(c, &mut n), OK);
    }
    (r as usize, n as usize)
}

/// Kills this process the hard way, after telling the parent when.
fn die() -> ! {
    println!("FAULT what=dying at={}", now_ms());
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!()
}

/// Buffers for one operation kind at `n` ranks, reused across calls.
struct Bufs {
    op: String,
    rank: usize,
    n: usize,
    send: Vec<f32>,
    recv: Vec<f32>,
    counts: Vec<usize>,
    displs: Vec<usize>,
    counts2: Vec<usize>,
    displs2: Vec<usize>,
    /// Root for broadcast, reduce, gather, scatter instead of their defaults (0, 1, 1, 2).
    root: Option<i32>,
}

impl Bufs {
    fn new(op: &str, rank: usize, n: usize) -> Bufs {
        let (send_len, recv_len) = match op {
            "allreduce_small" | "iallreduce" => (1024, 1024),
            "allreduce_large" => (1 << 20, 1 << 20),
            "broadcast" => (0, 1 << 19),
            "reduce" => (1 << 16, 1 << 16),
            "allgather" => (4096, 4096 * n),
            "allgatherv" => (1000 * (rank + 1), 1000 * n * (n + 1) / 2),
            "gather" => (1024, 1024 * n),
            "scatter" => (1024 * n, 1024),
            "reduce_scatter" => (4096 * n, 4096),
            "alltoall" => (2048 * n, 2048 * n),
            "alltoallv" => (64 * n * n, 64 * n * n),
            "sendrecv" => (4096 * n, 4096 * n),
            "sendrecv_large" => (1 << 20, 1 << 20),
            "recv_any" => (0, 1024),
            "barrier" => (0, 0),
            other => panic!("unknown op {other}"),
        };
        let mut b = Bufs {
            op: op.to_string(),
            rank,
            n,
            send: vec![1.0; send_len],
            recv: vec![0.0; recv_len],
            counts: vec![],
            displs: vec![],
            counts2: vec![],
            displs2: vec![],
            root: None,
        };
        match op {
            "allgatherv" => {
                b.counts = (0..n).map(|i| 1000 * (i + 1)).collect();
                b.displs = b.counts.iter().scan(0, |acc, &c| Some(std::mem::replace(acc, *acc + c))).collect();
            }
            "alltoallv" => {
                // rank i sends 8*(i+j+1) elements to rank j.
                b.counts = (0..n).map(|j| 8 * (rank + j + 1)).collect();
                b.displs = (0..n).map(|j| 64 * n * j).collect();
                b.counts2 = (0..n).map(|i| 8 * (i + rank + 1)).collect();
                b.displs2 = (0..n).map(|i| 64 * n * i).collect();
            }
            _ => {}
        }
        b
    }

    /// Runs the operation once on `c`.
    fn run(&mut self, c: C) -> dc_status {
        let (s, r) = (self.send.as_ptr() as *const c_void, self.recv.as_mut_ptr() as *mut c_void);
        let (n, rank) = (self.n, self.rank);
        unsafe {
            match self.op.as_str() {
                "allreduce_small" | "allreduce_large" => dc_allreduce(s, r, self.send.len(), DC_FLOAT32, DC_SUM, c),
                "iallreduce" => {
                    let mut req: *mut Request = std::ptr::null_mut();
                    let st = dc_iallreduce(s, r, self.send.len(), DC_FLOAT32, DC_SUM, c, &mut req);
                    if st != OK {
                        return st;
                    }
                    let st = dc_request_wait(req);
                    let msg = last_error();
                    dc_request_free(req);
                    if st != OK {
                        distcomm::ffi::set_last_error(&msg);
                    }
                    st
                }
                "broadcast" => dc_broadcast(r, self.recv.len(), DC_FLOAT32, self.root.unwrap_or(0), c),
                "reduce" => dc_reduce(s, r, self.send.len(), DC_FLOAT32, DC_SUM, self.root.unwrap_or(1 % n as i32), c),
                "allgather" => dc_allgather(s, r, self.send.len(), DC_FLOAT32, c),
                "allgatherv" => dc_allgatherv(s, self.send.len(), r, self.counts.as_ptr(), self.displs.as_ptr(), DC_FLOAT32, c),
                "gather" => dc_gather(s, r, 1024, DC_FLOAT32, self.root.unwrap_or(1 % n as i32), c),
                "scatter" => dc_scatter(s, r, 1024, DC_FLOAT32, self.root.unwrap_or(2 % n as i32), c),
                "reduce_scatter" => dc_reduce_scatter(s, r, self.recv.len(), DC_FLOAT32, DC_SUM, c),
                "alltoall" => dc_alltoall(s, r, 2048, DC_FLOAT32, c),
                "alltoallv" => dc_alltoallv(
                    s,
                    self.counts.as_ptr(),
                    self.displs.as_ptr(),
                    r,
                    self.counts2.as_ptr(),
                    self.displs2.as_ptr(),
                    DC_FLOAT32,
                    c,
                ),
                "barrier" => dc_barrier(c),
                // 4 MiB to the next rank, from the previous one (single-copy on one host).
                "sendrecv_large" => {
                    let len = self.send.len();
                    dc_sendrecv(s, len, DC_FLOAT32, ((rank + 1) % n) as i32, 8, r, len, DC_FLOAT32, ((rank + n - 1) % n) as i32, 8, c, std::ptr::null_mut())
                }
                // Nobody sends: only a lost member can end it (it could have been the sender).
                "recv_any" => dc_recv(self.recv.as_mut_ptr() as *mut c_void, 1024, DC_FLOAT32, distcomm::ffi::types::DC_ANY_SOURCE, 11, c, std::ptr::null_mut()),
                "sendrecv" => {
                    // Every rank exchanges a block with every other rank.
                    let block = 4096;
                    let mut reqs = Vec::new();
                    for k in 1..n {
                        let to = (rank + k) % n;
                        let mut q: *mut Request = std::ptr::null_mut();
                        let st = dc_isend(self.send.as_ptr().add(to * block) as *const c_void, block, DC_FLOAT32, to as i32, 7, c, &mut q);
                        if st != OK {
                            let msg = last_error();
                            reqs.into_iter().for_each(|q| {
                                dc_request_free(q);
                            });
                            distcomm::ffi::set_last_error(&msg);
                            return st;
                        }
                        reqs.push(q);
                    }
                    let mut st = OK;
                    let mut msg = String::new();
                    for k in 1..n {
                        let from = (rank + n - k) % n;
                        let x = dc_recv(self.recv.as_mut_ptr().add(from * block) as *mut c_void, block, DC_FLOAT32, from as i32, 7, c, std::ptr::null_mut());
                        if x != OK {
                            (st, msg) = (x, last_error());
                            break;
                        }
                    }
                    if st == OK {
                        st = dc_request_wait_all(reqs.len(), reqs.as_ptr());
                        msg = last_error();
                    }
                    for q in reqs {
                        dc_request_free(q);
                    }
                    if st != OK {
                        distcomm::ffi::set_last_error(&msg);
                    }
                    st
                }
                other => panic!("unknown op {other}"),
            }
        }
    }
}

/// One rank of a kill job: everyone loops over the operation; the victim dies (SIGKILL) either
/// without ever entering it ("absent": the others are blocked waiting for it) or from a second
/// thread while it takes part ("mid"). Survivors report the first failure and exit cleanly.
fn child_kill() -> i32 {
    let op = env("DC_TEST_OP");
    let victim = env_usize("DC_TEST_VICTIM");
    let mode = env("DC_TEST_MODE");
    let c = init_world();
    let (rank, n) = rank_size(c);
    let mut bufs = Bufs::new(&op, rank, n);
    assert_eq!(unsafe { dc_barrier(c) }, OK, "{}", last_error());
    if rank == victim {
        if mode == "absent" {
            std::thread::sleep(Duration::from_millis(300));
            die();
        }
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(150));
            die();
        });
    }
    let start = Instant::now();
    loop {
        let t0 = Instant::now();
        let st = bufs.run(c);
        if st != OK {
            let msg = last_error();
            if rank == victim {
                // The victim's own calls cannot fail before it dies; say so and wait for death.
                report("victim_failed", &[("status", (st as u32).to_string())], Some(&msg));
                std::thread::sleep(Duration::from_secs(60));
            }
            report(
                "result",
                &[("status", (st as u32).to_string()), ("at", now_ms().to_string()), ("call_ms", t0.elapsed().as_millis().to_string())],
                Some(&msg),
            );
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            report("no_failure", &[], None);
            return 5;
        }
        // Pacing, so ranks that only send (gather, scatter at non-roots) do not run far ahead.
        std::thread::sleep(Duration::from_micros(300));
    }
    if op == "recv_any" {
        after_ack(c, rank, n, victim);
    }
    // Destroy only when every survivor has its result: a survivor that is gone early would be
    // what the slower one reports instead of the victim.
    let dir = PathBuf::from(env("DC_TEST_DIR"));
    File::create(dir.join(format!("done{rank}"))).unwrap();
    let t = Instant::now();
    while (0..n).filter(|&r| r != victim).any(|r| !dir.join(format!("done{r}")).exists()) && t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    let st = unsafe { dc_comm_destroy(c) };
    report("destroyed", &[("status", (st as u32).to_string()), ("ms", t.elapsed().as_millis().to_string())], None);
    0
}

/// After a receive from any source failed for the victim: the survivor acknowledges the loss
/// (dc_comm_failure_ack), and then such a receive goes on with the others (the first survivor
/// sends to the second, which receives from any source); one from the victim still fails.
fn after_ack(c: *mut Comm, rank: usize, n: usize, victim: usize) {
    let survivors: Vec<usize> = (0..n).filter(|&r| r != victim).collect();
    let mut acked = -1;
    let ack = unsafe { distcomm::ffi::comm::dc_comm_failure_ack(c, &mut acked) };
    let mut v = [0f32; 1];
    let st = if rank == survivors[0] {
        v[0] = 42.0;
        unsafe { dc_send(v.as_ptr() as *const c_void, 1, DC_FLOAT32, survivors[1] as i32, 12, c) }
    } else {
        let mut info = dc_recv_info::default();
        let st = unsafe { dc_recv(v.as_mut_ptr() as *mut c_void, 1, DC_FLOAT32, distcomm::ffi::types::DC_ANY_SOURCE, 12, c, &mut info) };
        if st == OK && (v[0] != 42.0 || info.source != survivors[0] as i32) {
            report("after_ack_wrong", &[("value", v[0].to_string()), ("source", info.source.to_string())], None);
        }
        st
    };
    let from_victim = unsafe { dc_recv(v.as_mut_ptr() as *mut c_void, 1, DC_FLOAT32, victim as i32, 13, c, std::ptr::null_mut()) };
    report(
        "after_ack",
        &[("ack", (ack as u32).to_string()), ("acked", acked.to_string()), ("status", (st as u32).to_string()), ("from_victim", (from_victim as u32).to_string())],
        Some(&last_error()),
    );
}

/// Checks a kill job: the victim died by the signal, every survivor failed with an allowed
/// status naming the victim, within `bound` of the death.
fn check_kill(op: &str, mode: &str, victim: usize) {
    let n = 3;
    let o = Job::new("kill", n, TIMEOUT_MS)
        .env("DC_TEST_OP", op)
        .env("DC_TEST_MODE", mode)
        .env("DC_TEST_VICTIM", victim)
        .start_all()
        .wait(Duration::from_secs(40));
    let ctx = format!("op {op}, mode {mode}, victim {victim}");
    assert_eq!(o.codes[&victim], None, "{ctx}: the victim should have been killed\n{}", o.logs);
    let died = o.one(victim, "dying").num("at");
    let mut direct = 0;
    let mut worst = 0i64;
    for r in (0..n).filter(|&r| r != victim) {
        assert_eq!(o.codes[&r], Some(0), "{ctx}: rank {r} exit code\n{}", o.logs);
        let l = o.one(r, "result");
        let st = l.status();
        assert!([PEER_LOST, TIMEOUT, ABORTED].contains(&st), "{ctx}: rank {r} returned status {st}: {}\n{}", l.msg(), o.logs);
        assert!(l.msg().contains(&format!("rank {victim}")), "{ctx}: rank {r}'s message does not name rank {victim}: {}", l.msg());
        let after = l.num("at") as i64 - died as i64;
        let bound = if st == TIMEOUT { TIMEOUT_MS as i64 + 2500 } else { 2500 };
        assert!(after < bound, "{ctx}: rank {r} failed {after} ms after the death (bound {bound} ms): {}\n{}", l.msg(), o.logs);
        worst = worst.max(after);
        direct += usize::from(st == PEER_LOST);
        if op == "recv_any" {
            let a = o.one(r, "after_ack");
            assert_eq!((a.num("ack"), a.num("acked"), a.num("status")), (0, 1, 0), "{ctx}: rank {r} after dc_comm_failure_ack\n{}", o.logs);
            assert_eq!(a.num("from_victim"), PEER_LOST as u64, "{ctx}: rank {r}: a receive from the victim after the acknowledgement\n{}", o.logs);
            assert!(!o.logs.contains("after_ack_wrong"), "{ctx}: the message after the acknowledgement was wrong\n{}", o.logs);
        }
        let d = o.one(r, "destroyed");
        assert_eq!(d.num("status"), 0, "{ctx}: rank {r}: destroy after the failure failed\n{}", o.logs);
    }
    assert!(direct > 0, "{ctx}: no survivor saw DC_ERR_PEER_LOST\n{}", o.logs);
    eprintln!("{ctx}: survivors failed within {worst} ms of the death (job {:?})", o.wall);
}

macro_rules! kill_tests {
    ($($name:ident: $op:expr, $victim:expr;)*) => {$(
        #[test]
        fn $name() {
            check_kill($op, "absent", $victim);
            check_kill($op, "mid", ($victim + 1) % 3);
        }
    )*};
}

kill_tests! {
    kill_during_allreduce_small: "allreduce_small", 2;
    kill_during_allreduce_large: "allreduce_large", 1;
    kill_during_iallreduce: "iallreduce", 0;
    kill_during_broadcast: "broadcast", 0;
    kill_during_reduce: "reduce", 1;
    kill_during_allgather: "allgather", 2;
    kill_during_allgatherv: "allgatherv", 1;
    kill_during_gather: "gather", 1;
    kill_during_scatter: "scatter", 2;
    kill_during_reduce_scatter: "reduce_scatter", 0;
    kill_during_alltoall: "alltoall", 1;
    kill_during_alltoallv: "alltoallv", 2;
    kill_during_barrier: "barrier", 2;
    kill_during_send_recv: "sendrecv", 1;
    kill_during_recv_from_any_source: "recv_any", 2;
}

// ---- a stopped peer (SIGSTOP) -----------------------------------------------------------------

/// The peer timeout of the stop jobs (DC_PEER_TIMEOUT_MS): a stopped peer is lost after it.
const PEER_TIMEOUT_MS: u64 = 1500;

/// One rank of a stop job: everyone loops over the operation; the victim stops itself
/// (SIGSTOP, as a debugger or a job scheduler would) without entering it, after arranging to
/// be killed 12 s later. With `DC_TEST_MODE=slow` the victim instead sleeps three peer timeouts
/// (a slow process, not a stopped one) and everyone must finish every call.
fn child_stop() -> i32 {
    let op = env("DC_TEST_OP");
    let victim = env_usize("DC_TEST_VICTIM");
    let slow = env("DC_TEST_MODE") == "slow";
    let c = init_world();
    let (rank, n) = rank_size(c);
    let mut bufs = Bufs::new(&op, rank, n);
    assert_eq!(unsafe { dc_barrier(c) }, OK, "{}", last_error());
    if let Ok(ms) = std::env::var("DC_TEST_OP_TIMEOUT_MS") {
        // After init, which keeps the job's longer timeout; the calls start once the victim
        // is stopped (while it runs it could take a message that its receive is not posted for).
        assert_eq!(unsafe { dc_comm_set_timeout(c, ms.parse().unwrap()) }, OK, "{}", last_error());
        if rank != victim {
            wait_until_stopped(&PathBuf::from(env("DC_TEST_DIR")).join("stopping"));
        }
    }
    if rank == victim {
        if slow {
            std::thread::sleep(Duration::from_millis(3 * PEER_TIMEOUT_MS));
        } else {
            let me = std::process::id();
            Command::new("sh").args(["-c", &format!("sleep 12; kill -KILL {me}")]).spawn().unwrap();
            std::thread::sleep(Duration::from_millis(200));
            println!("FAULT what=stopping at={}", now_ms());
            std::fs::write(PathBuf::from(env("DC_TEST_DIR")).join("stopping"), me.to_string()).unwrap();
            unsafe { libc::raise(libc::SIGSTOP) };
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    for _ in 0..20 {
        let t0 = Instant::now();
        let st = bufs.run(c);
        if st != OK {
            report(
                "result",
                &[("status", (st as u32).to_string()), ("at", now_ms().to_string()), ("call_ms", t0.elapsed().as_millis().to_string())],
                Some(&last_error()),
            );
            let dir = PathBuf::from(env("DC_TEST_DIR"));
            File::create(dir.join(format!("done{rank}"))).unwrap();
            let t = Instant::now();
            while (0..n).filter(|&r| r != victim).any(|r| !dir.join(format!("done{r}")).exists()) && t.elapsed() < Duration::from_secs(8) {
                std::thread::sleep(Duration::from_millis(5));
            }
            unsafe { dc_comm_destroy(c) };
            return 0;
        }
        std::thread::sleep(Duration::from_micros(300));
    }
    report("all_ok", &[], None);
    assert_eq!(unsafe { dc_comm_destroy(c) }, OK, "{}", last_error());
    0
}

/// Waits (up to 10 s) until the process whose pid the victim wrote to `file` is stopped.
fn wait_until_stopped(file: &Path) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if let Ok(pid) = std::fs::read_to_string(file) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T')) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the victim did not stop within 10 s");
}

/// Runs a stop job of 3 ranks (see `child_stop`) with `env` added; its outcome.
fn stop_job(op: &str, transport: &str, victim: usize, env: &[(&str, String)]) -> Outcome {
    let mut job = Job::new("stop", 3, 30_000).env("DC_TEST_OP", op).env("DC_TEST_VICTIM", victim).env("DC_TRANSPORT", transport);
    for (k, v) in env {
        job = job.env(k, v);
    }
    job.start_all().wait(Duration::from_secs(40))
}

/// A stopped rank of 3 is lost after the peer timeout: the survivors fail with PEER_LOST
/// naming it as stopped (or, for one that only waits on a survivor, with what that one did),
/// long before the operation timeout; the same job with a slow victim finishes every call.
fn check_stop(op: &str, transport: &str, victim: usize) {
    let n = 3;
    let ctx = format!("op {op}, transport {transport}, victim {victim}");
    let o = stop_job(op, transport, victim, &[("DC_PEER_TIMEOUT_MS", PEER_TIMEOUT_MS.to_string())]);
    assert_eq!(o.codes[&victim], None, "{ctx}: the victim should have been killed at last\n{}", o.logs);
    let stopped = o.one(victim, "stopping").num("at") as i64;
    let mut named = 0;
    for r in (0..n).filter(|&r| r != victim) {
        assert_eq!(o.codes[&r], Some(0), "{ctx}: rank {r} exit code\n{}", o.logs);
        let l = o.one(r, "result");
        let st = l.status();
        assert!([PEER_LOST, ABORTED].contains(&st), "{ctx}: rank {r} returned status {st}: {}\n{}", l.msg(), o.logs);
        let after = l.num("at") as i64 - stopped;
        let bound = PEER_TIMEOUT_MS as i64 + 3000;
        assert!(after < bound, "{ctx}: rank {r} failed {after} ms after the stop (bound {bound} ms): {}\n{}", l.msg(), o.logs);
        if st == PEER_LOST && l.msg().contains(&format!("rank {victim}")) && l.msg().contains("stopped") {
            named += 1;
        }
    }
    assert!(named > 0, "{ctx}: no survivor said rank {victim} is stopped\n{}", o.logs);

    let o = stop_job(op, transport, victim, &[("DC_TEST_MODE", "slow".to_string()), ("DC_PEER_TIMEOUT_MS", PEER_TIMEOUT_MS.to_string())]);
    for r in 0..n {
        assert_eq!(o.codes[&r], Some(0), "{ctx}, slow victim: rank {r} exit code\n{}", o.logs);
        o.one(r, "all_ok");
    }
}

#[test]
fn a_stopped_rank_is_lost_after_the_peer_timeout_on_shared_memory() {
    check_stop("allreduce_small", "auto", 1);
    check_stop("sendrecv", "auto", 2);
}

#[test]
fn a_stopped_rank_is_lost_after_the_peer_timeout_on_sockets() {
    check_stop("allreduce_large", "socket", 0);
    check_stop("sendrecv", "socket", 1);
}

/// The operation timeout of `check_stop_timeout` (the peer timeout is off there).
const OP_TIMEOUT_MS: u64 = 1000;

/// With the peer timeout off, a stopped rank of 3 makes the calls that need it fail with
/// DC_ERR_TIMEOUT soon after the operation timeout: a large same-host send the stopped rank
/// may be reading is given a tenth of the timeout to be let go of (then revoked), not more.
fn check_stop_timeout(op: &str, transport: &str, victim: usize) {
    let n = 3;
    let ctx = format!("op {op}, transport {transport}, victim {victim}, timeout {OP_TIMEOUT_MS} ms");
    let o = stop_job(op, transport, victim, &[("DC_PEER_TIMEOUT_MS", "0".to_string()), ("DC_TEST_OP_TIMEOUT_MS", OP_TIMEOUT_MS.to_string())]);
    for r in (0..n).filter(|&r| r != victim) {
        assert_eq!(o.codes[&r], Some(0), "{ctx}: rank {r} exit code\n{}", o.logs);
        let l = o.one(r, "result");
        assert_eq!(l.status(), TIMEOUT, "{ctx}: rank {r}: {}\n{}", l.msg(), o.logs);
        let took = l.num("call_ms");
        let bound = OP_TIMEOUT_MS + OP_TIMEOUT_MS / 10 + 400;
        assert!(took >= OP_TIMEOUT_MS - 50 && took < bound, "{ctx}: rank {r}'s call took {took} ms (bound {bound}): {}\n{}", l.msg(), o.logs);
    }
}

#[test]
fn a_stopped_rank_makes_calls_time_out_on_time() {
    check_stop_timeout("sendrecv_large", "auto", 1);
    check_stop_timeout("allreduce_small", "auto", 2);
    check_stop_timeout("sendrecv_large", "socket", 0);
}

// ---- abort from another thread ---------------------------------------------------------------

const ABORT_KINDS: [&str; 17] = [
    "allreduce_small",
    "allreduce_large",
    "broadcast",
    "reduce",
    "allgather",
    "allgatherv",
    "gather",
    "scatter",
    "reduce_scatter",
    "alltoall",
    "alltoallv",
    "barrier",
    "recv",
    "wait_irecv",
    "wait_icoll",
    "wait_all",
    "split",
];

/// Runs `kind` on `c` in a way that cannot complete (the third rank never joins it).
unsafe fn blocked_call(kind: &str, c: C, rank: usize, n: usize) -> dc_status {
    let mut b = [0f32; 16];
    let peer = ((rank + 1) % n) as i32;
    match kind {
        "recv" => dc_recv(b.as_mut_ptr() as *mut c_void, 16, DC_FLOAT32, peer, 4242, c, std::ptr::null_mut()),
        "wait_irecv" => {
            let mut q: *mut Request = std::ptr::null_mut();
            assert_eq!(dc_irecv(b.as_mut_ptr() as *mut c_void, 16, DC_FLOAT32, peer, 4242, c, &mut q), OK);
            let st = dc_request_wait(q);
            let msg = last_error();
            dc_request_free(q);
            distcomm::ffi::set_last_error(&msg);
            st
        }
        "wait_icoll" | "wait_all" => {
            let mut q: *mut Request = std::ptr::null_mut();
            let mut out = [0f32; 16];
            assert_eq!(dc_iallreduce(b.as_ptr() as *const c_void, out.as_mut_ptr() as *mut c_void, 16, DC_FLOAT32, DC_SUM, c, &mut q), OK);
            let st = if kind == "wait_icoll" {
                dc_request_wait(q)
            } else {
                let mut q2: *mut Request = std::ptr::null_mut();
                assert_eq!(dc_irecv(b.as_mut_ptr() as *mut c_void, 16, DC_FLOAT32, peer, 4242, c, &mut q2), OK);
                let st = dc_request_wait_all(2, [q2, q].as_ptr());
                let msg = last_error();
                dc_request_free(q2);
                distcomm::ffi::set_last_error(&msg);
                st
            };
            let msg = last_error();
            dc_request_free(q);
            distcomm::ffi::set_last_error(&msg);
            st
        }
        "split" => {
            let mut out: C = std::ptr::null_mut();
            dc_comm_split(c, 0, 0, &mut out)
        }
        op => {
            // Roots chosen so that rank 0 must receive something from the absent rank 2.
            let mut b = Bufs::new(op, rank, n);
            b.root = match op {
                "broadcast" | "scatter" => Some(2),
                "reduce" | "gather" => Some(0),
                _ => None,
            };
            b.run(c)
        }
    }
}

/// One rank of the abort job. For every kind of call, on a fresh subgroup of all ranks: rank 0
/// enters the call, rank 1 too where that blocks it (else it receives from rank 2), rank 2 blocks
/// in a receive nobody serves; after 150 ms a second thread of rank 0 calls dc_comm_abort. All
/// three must return DC_ERR_ABORTED; the world comm goes on.
fn child_abort() -> i32 {
    let w = init_world();
    let (rank, n) = rank_size(w);
    for kind in ABORT_KINDS {
        let mut sub: C = std::ptr::null_mut();
        assert_eq!(unsafe { dc_comm_split(w, 0, rank as i32, &mut sub) }, OK, "{}", last_error());
        let aborter = (rank == 0).then(|| {
            let p = sub as usize;
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(150));
                let at = now_ms();
                let t = Instant::now();
                let st = unsafe { dc_comm_abort(p as C) };
                (at, st, t.elapsed())
            })
        });
        let st = unsafe {
            match (rank, kind) {
                (2, _) | (1, "reduce" | "gather") => blocked_call("recv", sub, rank, n),
                _ => blocked_call(kind, sub, rank, n),
            }
        };
        let at = now_ms();
        let msg = last_error();
        let mut fields = vec![("kind", kind.to_string()), ("status", (st as u32).to_string()), ("at", at.to_string())];
        if let Some(a) = aborter {
            let (abort_at, ast, took) = a.join().unwrap();
            assert_eq!(ast, OK);
            assert!(took < Duration::from_millis(100), "dc_comm_abort itself blocked for {took:?}");
            fields.push(("abort_at", abort_at.to_string()));
        }
        report("abort", &fields, Some(&msg));
        assert_eq!(unsafe { dc_comm_destroy(sub) }, OK);
        // Everything still works on the parent.
        assert_eq!(unsafe { dc_barrier(w) }, OK, "after {kind}: {}", last_error());
    }
    assert_eq!(unsafe { dc_comm_destroy(w) }, OK);
    0
}

#[test]
fn abort_from_another_thread_in_every_kind_of_call() {
    let o = Job::new("abort", 3, 20_000).start_all().wait(Duration::from_secs(60));
    for r in 0..3 {
        assert_eq!(o.codes[&r], Some(0), "rank {r}\n{}", o.logs);
    }
    let mut worst_local = 0;
    let mut worst_peer = 0;
    for kind in ABORT_KINDS {
        let pick = |r: usize| o.of(r, "abort").into_iter().find(|l| l.get("kind") == kind).unwrap_or_else(|| panic!("no {kind} result of rank {r}\n{}", o.logs));
        let l0 = pick(0);
        let abort_at = l0.num("abort_at") as i64;
        for r in 0..3 {
            let l = pick(r);
            assert_eq!(l.status(), ABORTED, "{kind}: rank {r}: {}\n{}", l.msg(), o.logs);
            let after = l.num("at") as i64 - abort_at;
            if r == 0 {
                assert!(after < 500, "{kind}: the local waiter returned {after} ms after the abort");
                worst_local = worst_local.max(after);
            } else {
                assert!(after < 1500, "{kind}: rank {r} returned {after} ms after the abort");
                assert!(l.msg().contains("rank 0"), "{kind}: rank {r}'s message does not say who aborted: {}", l.msg());
                worst_peer = worst_peer.max(after);
            }
        }
    }
    eprintln!("abort: local waiters returned within {worst_local} ms, peers within {worst_peer} ms ({:?})", o.wall);
}

// ---- a missing rank ---------------------------------------------------------------------------

fn child_init_only() -> i32 {
    let me = std::env::var("RANK").ok();
    // The variable names this rank, or "all".
    let picked = |k: &str| std::env::var(k).ok().is_some_and(|v| v == "all" || Some(v) == me);
    if picked("DC_TEST_ENCRYPT_RANK") {
        std::env::set_var("DC_ENCRYPT", "1");
    }
    // The same choices through dc_init_options (issue 17: init options beside the variables).
    let mut o = dc_init_options::default();
    unsafe { dc_init_options_default(&mut o) };
    let own_token = std::ffi::CString::new("a token of its own").unwrap();
    if picked("DC_TEST_OPTS_ENCRYPT_RANK") {
        o.encrypt = 1;
    }
    if picked("DC_TEST_OPTS_TOKEN_RANK") {
        o.token = own_token.as_ptr();
    }
    let t = Instant::now();
    let mut c: C = std::ptr::null_mut();
    let st = unsafe { dc_init(&o, &mut c) };
    report("init", &[("status", (st as u32).to_string()), ("ms", t.elapsed().as_millis().to_string())], Some(&last_error()));
    if st == OK {
        unsafe { dc_comm_destroy(c) };
    }
    0
}

#[test]
fn a_missing_rank_fails_init_with_a_timeout_naming_it() {
    for missing in [2usize, 0] {
        let mut job = Job::new("init_only", 3, 1500);
        for r in (0..3).filter(|&r| r != missing) {
            job.start(r);
        }
        let o = job.wait(Duration::from_secs(20));
        for r in (0..3).filter(|&r| r != missing) {
            assert_eq!(o.codes[&r], Some(0), "{}", o.logs);
            let l = o.one(r, "init");
            assert_eq!(l.status(), TIMEOUT, "rank {r}: {}", l.msg());
            assert!(l.msg().contains(&format!("rank {missing}")), "rank {r}'s message does not name rank {missing}: {}", l.msg());
            assert!(l.num("ms") < 1500 + 2000, "rank {r} took {} ms", l.num("ms"));
        }
    }
}

#[test]
fn ranks_that_disagree_on_dc_encrypt_fail_init_saying_so() {
    for odd in [1usize, 0] {
        let o = Job::new("init_only", 2, 3000).env("DC_TEST_ENCRYPT_RANK", odd).start_all().wait(Duration::from_secs(20));
        let l = o.one(1, "init");
        assert_eq!(l.status(), dc_status::DC_ERR_INVALID_USAGE as u32, "{}", o.logs);
        assert!(l.msg().contains("DC_ENCRYPT") && l.msg().contains("alike"), "{}", l.msg());
        assert_ne!(o.one(0, "init").status(), 0, "rank 0 cannot form the job without rank 1: {}", o.logs);
    }
}

#[test]
fn init_options_encrypt_and_token_are_honoured() {
    // opts->encrypt = 1 on one rank only: the same refusal as DC_ENCRYPT on one rank.
    let o = Job::new("init_only", 2, 3000).env("DC_TEST_OPTS_ENCRYPT_RANK", 1).start_all().wait(Duration::from_secs(20));
    let l = o.one(1, "init");
    assert_eq!(l.status(), dc_status::DC_ERR_INVALID_USAGE as u32, "{}", o.logs);
    assert!(l.msg().contains("opts->encrypt") && l.msg().contains("alike"), "{}", l.msg());
    // opts->token on rank 1 differs from the DC_TOKEN the others use: the store refuses it.
    let o = Job::new("init_only", 2, 3000).env("DC_TEST_OPTS_TOKEN_RANK", 1).start_all().wait(Duration::from_secs(20));
    let l = o.one(1, "init");
    assert_eq!(l.status(), dc_status::DC_ERR_RENDEZVOUS as u32, "{}", o.logs);
    assert!(l.msg().contains("token refused"), "{}", l.msg());
    // Every rank with the same opts->token, and every rank with opts->encrypt = 1: the job forms.
    for (k, v) in [("DC_TEST_OPTS_TOKEN_RANK", "all"), ("DC_TEST_OPTS_ENCRYPT_RANK", "all")] {
        let o = Job::new("init_only", 2, 3000).env(k, v).start_all().wait(Duration::from_secs(20));
        for r in 0..2 {
            assert_eq!(o.one(r, "init").status(), 0, "{k}={v}, rank {r}: {}", o.logs);
        }
    }
}

#[test]
fn a_port_still_in_use_is_a_clear_system_error() {
    let job = Job::new("init_only", 1, 3000);
    let _taken = TcpListener::bind(("127.0.0.1", job.port)).unwrap();
    let mut job = job;
    job.start(0);
    let o = job.wait(Duration::from_secs(20));
    let l = o.one(0, "init");
    assert_eq!(l.status(), dc_status::DC_ERR_SYSTEM as u32, "{}", l.msg());
    assert!(l.msg().contains("already in use"), "{}", l.msg());
    assert!(l.num("ms") < 1000, "took {} ms", l.num("ms"));
}

// ---- strangers during init ---------------------------------------------------------------------

/// A normal job: init, an allreduce whose result is checked, a barrier, destroy.
fn child_work() -> i32 {
    let t = Instant::now();
    let c = init_world();
    let init_ms = t.elapsed().as_millis();
    let (rank, n) = rank_size(c);
    if rank == 0 {
        // The store listens on MASTER_ADDR only, never on every address.
        let port: u16 = env("MASTER_PORT").parse().unwrap();
        let listening = listening_addrs(port);
        assert_eq!(listening, vec!["0100007F".to_string()], "the store listens on {listening:?} (hex, /proc/net/tcp)");
    }
    let send = vec![rank as f32 + 1.0; 100_000];
    let mut recv = vec![0f32; 100_000];
    let st = unsafe { dc_allreduce(send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void, send.len(), DC_FLOAT32, DC_SUM, c) };
    assert_eq!(st, OK, "{}", last_error());
    let want = (n * (n + 1) / 2) as f32;
    assert!(recv.iter().all(|&x| x == want));
    assert_eq!(unsafe { dc_barrier(c) }, OK, "{}", last_error());
    assert_eq!(unsafe { dc_comm_destroy(c) }, OK);
    report("work", &[("init_ms", init_ms.to_string())], None);
    0
}

/// Local addresses (hex, as /proc/net/tcp writes them) of sockets listening on `port`.
fn listening_addrs(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for l in text.lines().skip(1) {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let (Some(local), Some(state)) = (cols.get(1), cols.get(3)) else { continue };
            let Some((addr, p)) = local.rsplit_once(':') else { continue };
            if *state == "0A" && u16::from_str_radix(p, 16) == Ok(port) {
                out.push(addr.to_string());
            }
        }
    }
    out
}

fn wait_listening(addr: SocketAddr, limit: Duration) {
    let t = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        assert!(t.elapsed() < limit, "nobody listens on {addr}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn strangers_at_the_rendezvous_port_during_init_do_not_stop_the_job() {
    let mut job = Job::new("work", 3, 10_000).env("DC_TOKEN", "the job's secret");
    let addr: SocketAddr = format!("127.0.0.1:{}", job.port).parse().unwrap();
    job.start(0);
    wait_listening(addr, Duration::from_secs(10));
    let (keep, slow) = strangers(addr);
    let t = Instant::now();
    job.start(1);
    job.start(2);
    let o = job.wait(Duration::from_secs(30));
    for r in 0..3 {
        assert_eq!(o.codes[&r], Some(0), "rank {r}\n{}", o.logs);
        o.one(r, "work");
    }
    // Served concurrently: not delayed by the 5 s hello timeout of the silent ones.
    assert!(t.elapsed() < Duration::from_secs(4), "the job took {:?}\n{}", t.elapsed(), o.logs);
    drop(keep);
    let _ = slow.join();
}

// ---- CPU while blocked; many ranks; subgroup cycles ------------------------------------------------

fn cpu_ms(who: i32) -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Every rank but the last waits in a barrier for the last, which comes 2 s late.
fn child_cpu() -> i32 {
    let c = init_world();
    let (rank, n) = rank_size(c);
    assert_eq!(unsafe { dc_barrier(c) }, OK);
    if rank == n - 1 {
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(unsafe { dc_barrier(c) }, OK);
    } else {
        let (p0, t0, w) = (cpu_ms(libc::RUSAGE_SELF), cpu_ms(libc::RUSAGE_THREAD), Instant::now());
        assert_eq!(unsafe { dc_barrier(c) }, OK, "{}", last_error());
        let wall = w.elapsed().as_secs_f64() * 1e3;
        let (p, t) = (cpu_ms(libc::RUSAGE_SELF) - p0, cpu_ms(libc::RUSAGE_THREAD) - t0);
        report("cpu", &[("wall_ms", format!("{wall:.0}")), ("process_cpu_ms", format!("{p:.1}")), ("thread_cpu_ms", format!("{t:.1}"))], None);
    }
    assert_eq!(unsafe { dc_comm_destroy(c) }, OK);
    0
}

#[test]
fn a_rank_blocked_for_2s_in_a_barrier_uses_under_10_percent_of_a_core() {
    let o = Job::new("cpu", 3, 20_000).start_all().wait(Duration::from_secs(30));
    for r in 0..2 {
        assert_eq!(o.codes[&r], Some(0), "{}", o.logs);
        let l = o.one(r, "cpu");
        let wall: f64 = l.get("wall_ms").parse().unwrap();
        let p: f64 = l.get("process_cpu_ms").parse().unwrap();
        let t: f64 = l.get("thread_cpu_ms").parse().unwrap();
        assert!(wall > 1500.0, "rank {r} did not wait: {wall} ms");
        eprintln!("rank {r}: blocked {wall:.0} ms, process CPU {p:.1} ms ({:.2}%), waiting thread {t:.1} ms", 100.0 * p / wall);
        assert!(p < 0.10 * wall, "rank {r}: the process used {p} ms of CPU in {wall} ms");
        assert!(t < 0.10 * wall, "rank {r}: the waiting thread used {t} ms of CPU in {wall} ms");
    }
}

/// A few collectives with checked results, at whatever size the job has.
fn child_many() -> i32 {
    let t = Instant::now();
    let c = init_world();
    let (rank, n) = rank_size(c);
    for count in [1usize, 1000, 300_000] {
        let send = vec![rank as f32 + 1.0; count];
        let mut recv = vec![0f32; count];
        let st = unsafe { dc_allreduce(send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void, count, DC_FLOAT32, DC_SUM, c) };
        assert_eq!(st, OK, "{}", last_error());
        assert!(recv.iter().all(|&x| x == (n * (n + 1) / 2) as f32));
    }
    let mut b = vec![if rank == 3 % n { 9u8 } else { 0 }; 100_000];
    assert_eq!(unsafe { dc_broadcast(b.as_mut_ptr() as *mut c_void, b.len(), DC_UINT8, (3 % n) as i32, c) }, OK);
    assert!(b.iter().all(|&x| x == 9));
    let send: Vec<i32> = (0..n).map(|j| (rank * 100 + j) as i32).collect();
    let mut recv = vec![0i32; n];
    assert_eq!(unsafe { dc_alltoall(send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void, 1, DC_INT32, c) }, OK);
    assert!(recv.iter().enumerate().all(|(i, &x)| x == (i * 100 + rank) as i32));
    let mut all = vec![0i32; n];
    let me = [rank as i32];
    assert_eq!(unsafe { dc_allgather(me.as_ptr() as *const c_void, all.as_mut_ptr() as *mut c_void, 1, DC_INT32, c) }, OK);
    assert!(all.iter().enumerate().all(|(i, &x)| x == i as i32));
    assert_eq!(unsafe { dc_barrier(c) }, OK);
    assert_eq!(unsafe { dc_comm_destroy(c) }, OK);
    report("many", &[("ms", t.elapsed().as_millis().to_string())], None);
    0
}

#[test]
fn eight_ranks_on_two_cores() {
    let o = Job::new("many", 8, 30_000).start_all().wait(Duration::from_secs(60));
    for r in 0..8 {
        assert_eq!(o.codes[&r], Some(0), "rank {r}\n{}", o.logs);
        o.one(r, "many");
    }
    eprintln!("8 ranks: {:?}", o.wall);
    assert!(o.wall < Duration::from_secs(30), "8 ranks took {:?}", o.wall);
}

fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

/// `cycles` times: a subgroup (split and new_group alternately) runs a blocking and a
/// non-blocking collective and is destroyed. Reports threads, live contexts and RSS.
fn child_cycles() -> i32 {
    let cycles = env_usize("DC_TEST_CYCLES");
    let c = init_world();
    let (rank, n) = rank_size(c);
    let world = unsafe { &*(c as *const Comm) };
    let one = |i: usize| unsafe {
        let mut g: C = std::ptr::null_mut();
        let st = if i.is_multiple_of(2) {
            dc_comm_split(c, 0, rank as i32, &mut g)
        } else {
            let ranks: Vec<i32> = (0..n as i32).rev().collect();
            dc_comm_new_group(c, ranks.as_ptr(), n as i32, &mut g)
        };
        assert_eq!(st, OK, "{}", last_error());
        let x = [i as f32; 8];
        let mut y = [0f32; 8];
        assert_eq!(dc_allreduce(x.as_ptr() as *const c_void, y.as_mut_ptr() as *mut c_void, 8, DC_FLOAT32, DC_SUM, g), OK);
        let mut q: *mut Request = std::ptr::null_mut();
        assert_eq!(dc_iallreduce(x.as_ptr() as *const c_void, y.as_mut_ptr() as *mut c_void, 8, DC_FLOAT32, DC_SUM, g, &mut q), OK);
        assert_eq!(dc_request_wait(q), OK);
        dc_request_free(q);
        assert_eq!(y[0], (i * n) as f32);
        assert_eq!(dc_comm_destroy(g), OK);
    };
    for i in 0..50 {
        one(i);
    }
    assert_eq!(unsafe { dc_barrier(c) }, OK);
    let (th0, rss0, ctx0) = (threads_now(), rss_kb(), world.world().transport.live_contexts());
    let t = Instant::now();
    for i in 0..cycles {
        one(i);
    }
    assert_eq!(unsafe { dc_barrier(c) }, OK);
    std::thread::sleep(Duration::from_millis(50));
    let (th1, rss1, ctx1) = (threads_now(), rss_kb(), world.world().transport.live_contexts());
    report(
        "cycles",
        &[
            ("threads_before", th0.to_string()),
            ("threads_after", th1.to_string()),
            ("rss_before_kb", rss0.to_string()),
            ("rss_after_kb", rss1.to_string()),
            ("ctx_before", ctx0.to_string()),
            ("ctx_after", ctx1.to_string()),
            ("ms", t.elapsed().as_millis().to_string()),
        ],
        None,
    );
    assert_eq!(unsafe { dc_comm_destroy(c) }, OK);
    0
}

#[test]
fn a_thousand_subgroup_cycles_leak_nothing() {
    let o = Job::new("cycles", 2, 30_000).env("DC_TEST_CYCLES", 1000).start_all().wait(Duration::from_secs(120));
    for r in 0..2 {
        assert_eq!(o.codes[&r], Some(0), "rank {r}\n{}", o.logs);
        let l = o.one(r, "cycles");
        eprintln!("rank {r}: {:?}", l.kv);
        assert_eq!(l.num("threads_after"), l.num("threads_before"), "rank {r}: threads leak");
        assert_eq!(l.num("ctx_after"), l.num("ctx_before"), "rank {r}: contexts leak");
        let grew = l.num("rss_after_kb") as i64 - l.num("rss_before_kb") as i64;
        assert!(grew < 4096, "rank {r}: RSS grew by {grew} KiB over 1000 cycles");
    }
}

// ---- mismatched collectives ---------------------------------------------------------------------

/// DC_DEBUG=DETAIL: each case is a disagreement; every rank must get DC_ERR_MISMATCH with a
/// message naming the ranks and what differed, and the comm stays usable.
fn child_mismatch_detail() -> i32 {
    let c = init_world();
    let (rank, n) = rank_size(c);
    let x = vec![1f32; 64];
    let mut y = vec![0f32; 64 * n];
    let (xs, ys) = (x.as_ptr() as *const c_void, y.as_mut_ptr() as *mut c_void);
    type Case<'a> = (&'a str, Box<dyn Fn() -> dc_status + 'a>);
    let cases: Vec<Case> = vec![
        ("count", Box::new(|| unsafe { dc_allreduce(xs, ys, if rank == 1 { 10 } else { 12 }, DC_FLOAT32, DC_SUM, c) })),
        ("dtype", Box::new(|| unsafe { dc_allreduce(xs, ys, 12, if rank == 2 { DC_INT32 } else { DC_FLOAT32 }, DC_SUM, c) })),
        ("op", Box::new(|| unsafe { dc_allreduce(xs, ys, 12, DC_FLOAT32, if rank == 0 { DC_MAX } else { DC_SUM }, c) })),
        ("kind", Box::new(|| unsafe { if rank == 2 { dc_broadcast(ys, 12, DC_FLOAT32, 0, c) } else { dc_allreduce(xs, ys, 12, DC_FLOAT32, DC_SUM, c) } })),
        ("root", Box::new(|| unsafe { dc_reduce(xs, ys, 12, DC_FLOAT32, DC_SUM, if rank == 0 { 1 } else { 0 }, c) })),
        ("allgatherv", Box::new(|| unsafe {
            let counts: Vec<usize> = (0..n).map(|i| if rank == 2 && i == 0 { 3 } else { 2 }).collect();
            let displs: Vec<usize> = (0..n).map(|i| 4 * i).collect();
            dc_allgatherv(xs, counts[rank], ys, counts.as_ptr(), displs.as_ptr(), DC_FLOAT32, c)
        })),
        ("alltoallv", Box::new(|| unsafe {
            let sc: Vec<usize> = (0..n).map(|j| if rank == 0 && j == 1 { 5 } else { 4 }).collect();
            let rc = vec![4usize; n];
            let d: Vec<usize> = (0..n).map(|i| 8 * i).collect();
            dc_alltoallv(xs, sc.as_ptr(), d.as_ptr(), ys, rc.as_ptr(), d.as_ptr(), DC_FLOAT32, c)
        })),
    ];
    for (name, f) in &cases {
        let st = f();
        report("mismatch", &[("case", name.to_string()), ("status", (st as u32).to_string())], Some(&last_error()));
        // The comm is still usable: everybody agreed that the call failed.
        let st = unsafe { dc_allreduce(xs, ys, 4, DC_FLOAT32, DC_SUM, c) };
        assert_eq!(st, OK, "after {name}: {}", last_error());
        assert_eq!(y[0], n as f32);
    }
    // Legitimately different v-form counts are not a mismatch.
    let counts: Vec<usize> = (0..n).map(|i| i + 1).collect();
    let displs: Vec<usize> = (0..n).map(|i| 4 * i).collect();
    let st = unsafe { dc_allgatherv(xs, rank + 1, ys, counts.as_ptr(), displs.as_ptr(), DC_FLOAT32, c) };
    assert_eq!(st, OK, "{}", last_error());
    assert_eq!(unsafe { dc_comm_destroy(c) }, OK);
    0
}

#[test]
fn detail_mode_names_mismatched_ranks_on_every_member() {
    // DETAIL is the check of the socket path; shared memory compares every call's arguments
    // anyway (its own message format is tested in tests/threads.rs).
    let o = Job::new("mismatch_detail", 3, 10_000)
        .env("DC_DEBUG", "DETAIL")
        .env("DC_TRANSPORT", "socket")
        .start_all()
        .wait(Duration::from_secs(30));
    let expect: [(&str, &[&str]); 7] = [
        ("count", &["rank 1", "count=10", "count=12"]),
        ("dtype", &["rank 2", "int32", "float32"]),
        ("op", &["rank 0", "max", "sum"]),
        ("kind", &["rank 2", "broadcast", "allreduce"]),
        ("root", &["rank 0", "root=1", "root=0"]),
        ("allgatherv", &["rank 0 contributes 2", "rank 2 expects 3", "recvcounts[0] = 3"]),
        ("alltoallv", &["rank 0 sends 5", "to rank 1", "rank 1 expects 4"]),
    ];
    for r in 0..3 {
        assert_eq!(o.codes[&r], Some(0), "rank {r}\n{}", o.logs);
        for (case, words) in expect {
            let l = o.of(r, "mismatch").into_iter().find(|l| l.get("case") == case).unwrap_or_else(|| panic!("no {case}\n{}", o.logs));
            assert_eq!(l.status(), MISMATCH, "{case}, rank {r}: {}", l.msg());
            for w in words {
                assert!(l.msg().contains(w), "{case}, rank {r}: {w:?} missing in: {}", l.msg());
            }
        }
    }
    eprintln!("{}", o.of(0, "mismatch").iter().map(|l| l.msg().to_string()).collect::<Vec<_>>().join("\n"));
}

/// The same mismatches on shared memory with ranks outnumbering cores, where small broadcasts
/// and reduces would go eagerly over the rings: with DETAIL they stay on the steps, so every
/// member still gets DC_ERR_MISMATCH and the comm stays usable (the child checks that).
#[test]
fn detail_mode_catches_mismatches_on_crowded_shared_memory() {
    let o = Job::new("mismatch_detail", 3, 10_000)
        .env("DC_DEBUG", "DETAIL")
        .env("DC_TRANSPORT", "shm")
        .env("LOCAL_WORLD_SIZE", "64")
        .start_all()
        .wait(Duration::from_secs(30));
    for r in 0..3 {
        assert_eq!(o.codes[&r], Some(0), "rank {r}\n{}", o.logs);
        for case in ["count", "dtype", "op", "kind", "root", "allgatherv", "alltoallv"] {
            let l = o.of(r, "mismatch").into_iter().find(|l| l.get("case") == case).unwrap_or_else(|| panic!("no {case}\n{}", o.logs));
            assert_eq!(l.status(), MISMATCH, "{case}, rank {r}: {}", l.msg());
        }
    }
}

/// Without DETAIL: rank 1 passes a smaller count to a large (ring) allreduce and a gather. No
/// rank writes outside its buffer, and all fail fast (the detecting rank aborts the comm).
fn child_count_mismatch() -> i32 {
    let c = init_world();
    let (rank, n) = rank_size(c);
    let count = if rank == 1 { 300_000 } else { 400_000 };
    const GUARD: usize = 4096;
    let send = vec![1f32; count];
    let mut recv = vec![-7f32; count + 2 * GUARD];
    let t = Instant::now();
    let st = unsafe { dc_allreduce(send.as_ptr() as *const c_void, recv.as_mut_ptr().add(GUARD) as *mut c_void, count, DC_FLOAT32, DC_SUM, c) };
    let ms = t.elapsed().as_millis();
    let clean = recv[..GUARD].iter().chain(&recv[GUARD + count..]).all(|&x| x == -7.0);
    report("count_mismatch", &[("status", (st as u32).to_string()), ("ms", ms.to_string()), ("guards_clean", clean.to_string())], Some(&last_error()));
    let _ = n;
    assert_eq!(unsafe { dc_comm_destroy(c) }, OK);
    0
}

#[test]
fn a_count_mismatch_without_detail_fails_fast_and_in_bounds() {
    let o = Job::new("count_mismatch", 3, 20_000).start_all().wait(Duration::from_secs(40));
    for r in 0..3 {
        assert_eq!(o.codes[&r], Some(0), "rank {r}\n{}", o.logs);
        let l = o.one(r, "count_mismatch");
        assert_eq!(l.get("guards_clean"), "true", "rank {r} wrote outside its buffer");
        assert!([MISMATCH, ABORTED].contains(&l.status()), "rank {r}: {}", l.msg());
        assert!(l.num("ms") < 3000, "rank {r} took {} ms (timeout is 20 s): {}", l.num("ms"), l.msg());
        eprintln!("rank {r}: {} ms: {}", l.num("ms"), l.msg());
    }
}

// =============================================================================================

/// What a rank process does, by role; the exit code is the rank's verdict.
// ---- panics in the library --------------------------------------------------------------------

const INTERNAL: u32 = dc_status::DC_ERR_INTERNAL as u32;

/// Rank 1 panics (`panics::arm`) in one allreduce (blocking for site "collective", non-blocking
/// for "worker"); each rank reports that call's status and how long it took.
fn child_panic() -> i32 {
    let site = env("PANIC_SITE");
    let w = init_world();
    let (rank, _) = rank_size(w);
    assert_eq!(unsafe { dc_barrier(w) }, OK, "{}", last_error());
    if rank == 1 {
        distcomm::panics::arm(Some(match site.as_str() {
            "worker" => "worker",
            "progress" => "progress",
            _ => "collective",
        }));
        if site == "progress" {
            // The progress thread loops at least every second: let it reach the site.
            std::thread::sleep(Duration::from_millis(1500));
        }
    }
    let send = [1.0f32; 4];
    let mut recv = [0.0f32; 4];
    let (s, r) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void);
    let t = Instant::now();
    let st = unsafe {
        if site == "worker" {
            let mut req: *mut Request = std::ptr::null_mut();
            assert_eq!(dc_iallreduce(s, r, 4, DC_FLOAT32, DC_SUM, w, &mut req), OK);
            let st = dc_request_wait(req);
            let msg = last_error();
            dc_request_free(req);
            report("panic", &[("status", (st as u32).to_string()), ("ms", t.elapsed().as_millis().to_string())], Some(&msg));
            st
        } else {
            let st = dc_allreduce(s, r, 4, DC_FLOAT32, DC_SUM, w);
            report("panic", &[("status", (st as u32).to_string()), ("ms", t.elapsed().as_millis().to_string())], Some(&last_error()));
            st
        }
    };
    // The comm is aborted everywhere now; a second call says so at once.
    let again = unsafe { dc_barrier(w) };
    report("after", &[("status", (again as u32).to_string())], Some(&last_error()));
    let _ = (rank, st);
    unsafe { dc_comm_destroy(w) };
    0
}

#[test]
fn a_panic_in_a_collective_aborts_the_comm_and_names_the_panic() {
    for (site, transport) in [("collective", "auto"), ("collective", "socket"), ("worker", "auto"), ("worker", "socket"), ("progress", "socket")] {
        let o = Job::new("panic", 3, 20_000).env("PANIC_SITE", site).env("DC_TRANSPORT", transport).start_all().wait(Duration::from_secs(60));
        for r in 0..3 {
            assert_eq!(o.codes[&r], Some(0), "{site}/{transport}: rank {r}\n{}", o.logs);
            let l = o.one(r, "panic");
            // Well within the 20 s timeout: nobody waits for the panicked rank.
            assert!(l.num("ms") < 3000, "{site}/{transport}: rank {r} took {} ms\n{}", l.num("ms"), o.logs);
            if r == 1 && site == "progress" {
                // Its communicators were aborted when its progress thread panicked.
                assert_eq!(l.status(), ABORTED, "{site}/{transport}: {}", l.msg());
                assert!(l.msg().contains("a panic in the progress thread"), "{site}/{transport}: {}", l.msg());
            } else if r == 1 {
                assert_eq!(l.status(), INTERNAL, "{site}/{transport}: {}", l.msg());
                assert!(l.msg().contains("a panic in") && l.msg().contains("injected at site"), "{site}/{transport}: {}", l.msg());
            } else {
                assert_eq!(l.status(), ABORTED, "{site}/{transport}: rank {r}: {}\n{}", l.msg(), o.logs);
                assert!(l.msg().contains("rank 1"), "{site}/{transport}: rank {r}: {}", l.msg());
            }
            assert_eq!(o.one(r, "after").status(), ABORTED, "{site}/{transport}: rank {r}");
        }
    }
}

/// Every rank: an allreduce, then (once the parent has stopped the launcher's store) a split
/// and an allreduce on the new comm: nothing after init needs the store.
fn child_store_gone() -> i32 {
    let c = init_world();
    let (r, n) = rank_size(c);
    let allreduce = |comm: C| {
        let (x, mut y) = (1.0f32, 0.0f32);
        let st = unsafe { dc_allreduce(&x as *const f32 as *const c_void, &mut y as *mut f32 as *mut c_void, 1, DC_FLOAT32, DC_SUM, comm) };
        (st, y)
    };
    assert_eq!(allreduce(c), (OK, n as f32));
    report("ready", &[], None);
    let gone = PathBuf::from(env("DC_TEST_DIR")).join("store_gone");
    while !gone.exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    let mut sub: C = std::ptr::null_mut();
    let st = unsafe { dc_comm_split(c, (r % 2) as i32, r as i32, &mut sub) };
    let msg = last_error();
    let (st2, sum) = if st == OK { allreduce(sub) } else { (st, 0.0) };
    report("split", &[("status", (st as u32).to_string()), ("allreduce", (st2 as u32).to_string()), ("sum", sum.to_string()), ("ms", t.elapsed().as_millis().to_string())], Some(&msg));
    unsafe {
        if st == OK {
            dc_comm_destroy(sub);
        }
        dc_comm_destroy(c);
    }
    0
}

/// The launcher's store (dcrun's) goes away after init, as when its host dies: new comms and
/// their collectives go on without it, within the timeout (none of them needs the store).
#[test]
fn the_store_gone_after_init_stops_no_split() {
    let token = "faults-store-gone-token-0123456789";
    let mut job = Job::new("store_gone", 4, 5000).env("DC_LAUNCHER_STORE", 1).env("DC_TOKEN", token);
    let addr: SocketAddr = format!("127.0.0.1:{}", job.port).parse().unwrap();
    let store = distcomm::rendezvous::StoreServer::start(addr, token.as_bytes().to_vec()).unwrap();
    job = job.start_all();
    let ready = |job: &Job| (0..4).all(|r| std::fs::read_to_string(job.dir.join(format!("r{r}.log"))).is_ok_and(|t| t.contains("what=ready")));
    let t0 = Instant::now();
    while !ready(&job) && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(store);
    File::create(job.dir.join("store_gone")).unwrap();
    let o = job.wait(Duration::from_secs(30));
    for r in 0..4 {
        assert_eq!(o.codes[&r], Some(0), "{}", o.logs);
        let l = o.one(r, "split");
        assert_eq!((l.status(), l.num("allreduce")), (OK as u32, OK as u64), "rank {r}: {}\n{}", l.msg(), o.logs);
        assert_eq!(l.get("sum"), "2", "rank {r}");
        assert!(l.num("ms") < 5000, "rank {r} took {} ms", l.num("ms"));
    }
}

#[test]
fn child_entry() {
    let Ok(role) = std::env::var("DC_TEST_ROLE") else { return };
    let code = match role.as_str() {
        "kill" => child_kill(),
        "stop" => child_stop(),
        "abort" => child_abort(),
        "init_only" => child_init_only(),
        "work" => child_work(),
        "cpu" => child_cpu(),
        "many" => child_many(),
        "cycles" => child_cycles(),
        "mismatch_detail" => child_mismatch_detail(),
        "count_mismatch" => child_count_mismatch(),
        "panic" => child_panic(),
        "store_gone" => child_store_gone(),
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}
