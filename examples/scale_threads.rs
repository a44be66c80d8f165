//! The scale check: N ranks as threads of one process (`init` once per thread, tcp:// rendezvous
//! on loopback), as a 1024-rank job is simulated on a small machine. Each rank runs init, a
//! 16 B and a 1 MiB allreduce, a ring send/recv, a barrier and destroy; every result is
//! checked. Prints one line of `key=value` fields (and `--csv FILE` appends a row):
//! init time (slowest rank), descriptors the process holds per rank after init and after the
//! operations, the most `/dev/shm` held meanwhile (sampled every 20 ms, against what it held
//! before), and the time of each operation (slowest rank, median of `--iters` runs).
//!
//! usage: scale_threads --ranks N [--backend auto|socket|shm] [--iters K] [--csv FILE]
//!        [--timeout-ms MS]
//! Exit status 0 when every rank succeeded and every result was right, 1 otherwise.

use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;
use distcomm::rendezvous::config::InitOptions;
use distcomm::{DType, ReduceOp};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

struct Args {
    ranks: usize,
    backend: String,
    iters: usize,
    csv: Option<String>,
    timeout_ms: i64,
}

fn parse_args() -> Args {
    let mut a = Args { ranks: 64, backend: "auto".into(), iters: 5, csv: None, timeout_ms: 120_000 };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| usage(&format!("{k} needs a value")));
        match k.as_str() {
            "--ranks" | "-n" => a.ranks = v().parse().unwrap_or_else(|_| usage("bad --ranks")),
            "--backend" => a.backend = v(),
            "--iters" => a.iters = v().parse().unwrap_or_else(|_| usage("bad --iters")),
            "--csv" => a.csv = Some(v()),
            "--timeout-ms" => a.timeout_ms = v().parse().unwrap_or_else(|_| usage("bad --timeout-ms")),
            _ => usage(&format!("unknown argument {k}")),
        }
    }
    a
}

fn usage(why: &str) -> ! {
    eprintln!("scale_threads: {why}\nusage: scale_threads --ranks N [--backend auto|socket|shm] [--iters K] [--csv FILE] [--timeout-ms MS]");
    std::process::exit(2)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// Bytes in use on the filesystem of /dev/shm.
fn shm_used() -> u64 {
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and a struct to fill.
    if unsafe { libc::statvfs(c"/dev/shm".as_ptr(), &mut st) } != 0 {
        return 0;
    }
    (st.f_blocks - st.f_bfree) as u64 * st.f_frsize as u64
}

/// The slowest rank's time of `f`, as the median over `iters` runs (ranks start each run
/// together at a barrier of the threads).
struct Timer {
    gate: Barrier,
    slowest: Mutex<Vec<Duration>>,
}

impl Timer {
    fn run(&self, iters: usize, rank: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<(), String> {
        for i in 0..iters {
            self.gate.wait();
            let t = Instant::now();
            f()?;
            let took = t.elapsed();
            {
                let mut s = self.slowest.lock().unwrap();
                if s.len() <= i {
                    s.resize(i + 1, Duration::ZERO);
                }
                s[i] = s[i].max(took);
            }
            let _ = rank;
        }
        Ok(())
    }

    /// Median of the slowest times, then forgets them for the next measurement.
    fn take_median(&self) -> Duration {
        let mut s = std::mem::take(&mut *self.slowest.lock().unwrap());
        s.sort();
        s.get(s.len() / 2).copied().unwrap_or_default()
    }
}

fn allreduce(c: &Comm, v: &[f32]) -> Result<Vec<f32>, String> {
    let send: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = vec![0u8; send.len()];
    c.collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut out), dt: DType::Float32, op: ReduceOp::Sum })
        .map_err(|e| format!("allreduce: {e}"))?;
    Ok(out.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
}

fn main() {
    let a = parse_args();
    let n = a.ranks;
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let shm_before = shm_used();
    let shm_peak = Arc::new(AtomicU64::new(shm_before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, on) = (shm_peak.clone(), sampling.clone());
        std::thread::spawn(move || {
            while on.load(Ordering::Relaxed) {
                peak.fetch_max(shm_used(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let fds_before = open_fds();
    let gate = Arc::new(Barrier::new(n));
    let timer = Arc::new(Timer { gate: Barrier::new(n), slowest: Mutex::new(Vec::new()) });
    let results = Arc::new(Mutex::new(Vec::<(&'static str, Duration)>::new()));
    let fds = Arc::new(Mutex::new((0usize, 0usize)));
    let init_slowest = Arc::new(Mutex::new(Duration::ZERO));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (gate, timer, results, fds, init_slowest, backend) = (gate.clone(), timer.clone(), results.clone(), fds.clone(), init_slowest.clone(), a.backend.clone());
            let (iters, timeout_ms) = (a.iters, a.timeout_ms);
            std::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn(move || -> Result<(), String> {
                    let opts = InitOptions {
                        init_method: Some(format!("tcp://127.0.0.1:{port}")),
                        rank: r as i32,
                        world_size: n as i32,
                        timeout_ms,
                        backend: Some(backend),
                        ..Default::default()
                    };
                    let c = distcomm::init::init(&opts).map_err(|e| format!("rank {r}: init: {e}"))?;
                    {
                        let mut s = init_slowest.lock().unwrap();
                        *s = (*s).max(t0.elapsed());
                    }
                    gate.wait();
                    if r == 0 {
                        fds.lock().unwrap().0 = open_fds();
                    }
                    gate.wait();
                    let me = r as f32;
                    let want = (n * (n - 1) / 2) as f32;
                    let small = [me; 4];
                    timer.run(iters, r, || {
                        let got = allreduce(&c, &small)?;
                        if got != [want; 4] {
                            return Err(format!("rank {r}: 16 B allreduce gave {got:?}, want {want}"));
                        }
                        Ok(())
                    })?;
                    if r == 0 {
                        results.lock().unwrap().push(("allreduce_16B_us", timer.take_median()));
                    }
                    let big = vec![1.0f32; 256 * 1024];
                    timer.run(iters, r, || {
                        let got = allreduce(&c, &big)?;
                        if got.iter().any(|&x| x != n as f32) {
                            return Err(format!("rank {r}: 1 MiB allreduce gave a wrong element"));
                        }
                        Ok(())
                    })?;
                    if r == 0 {
                        results.lock().unwrap().push(("allreduce_1MiB_us", timer.take_median()));
                    }
                    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
                    timer.run(iters, r, || {
                        let mine = (r as u64).to_le_bytes();
                        let mut got = [0u8; 8];
                        let rq = c.post_recv(MutBuf::from_slice(&mut got), Some(left), Some(7)).map_err(|e| format!("rank {r}: irecv: {e}"))?;
                        let sq = c.post_send(ConstBuf::from_slice(&mine), right, 7).map_err(|e| format!("rank {r}: send: {e}"))?;
                        c.wait_p2p_started(&sq, &|| "ring send".into()).map_err(|e| format!("rank {r}: send: {e}"))?;
                        c.wait_p2p_started(&rq, &|| "ring recv".into()).map_err(|e| format!("rank {r}: recv: {e}"))?;
                        if u64::from_le_bytes(got) != left as u64 {
                            return Err(format!("rank {r}: ring message from {left} is wrong"));
                        }
                        Ok(())
                    })?;
                    if r == 0 {
                        results.lock().unwrap().push(("ring_sendrecv_us", timer.take_median()));
                    }
                    timer.run(iters, r, || c.collective(CollArgs::Barrier).map_err(|e| format!("rank {r}: barrier: {e}")))?;
                    if r == 0 {
                        results.lock().unwrap().push(("barrier_us", timer.take_median()));
                    }
                    gate.wait();
                    if r == 0 {
                        fds.lock().unwrap().1 = open_fds();
                    }
                    gate.wait();
                    c.destroy();
                    Ok(())
                })
                .expect("spawn a rank")
        })
        .collect();
    let mut failed = 0;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failed += 1;
                if failed <= 5 {
                    eprintln!("{e}");
                }
            }
            Err(_) => failed += 1,
        }
    }
    let total = t0.elapsed();
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.join();
    let (fds_init, fds_ops) = *fds.lock().unwrap();
    let per_rank = |f: usize| f.saturating_sub(fds_before) as f64 / n as f64;
    let shm_mib = shm_peak.load(Ordering::Relaxed).saturating_sub(shm_before) as f64 / (1 << 20) as f64;
    let mut fields = vec![
        ("ranks", n.to_string()),
        ("backend", a.backend.clone()),
        ("ok", (failed == 0).to_string()),
        ("init_s", format!("{:.2}", init_slowest.lock().unwrap().as_secs_f64())),
        ("fds_per_rank_init", format!("{:.2}", per_rank(fds_init))),
        ("fds_per_rank_ops", format!("{:.2}", per_rank(fds_ops))),
        ("shm_peak_MiB", format!("{shm_mib:.1}")),
    ];
    for (k, d) in results.lock().unwrap().iter() {
        fields.push((k, format!("{:.1}", d.as_secs_f64() * 1e6)));
    }
    fields.push(("total_s", format!("{:.2}", total.as_secs_f64())));
    println!("{}", fields.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "));
    if let Some(path) = a.csv {
        use std::io::Write;
        let new = !std::path::Path::new(&path).exists();
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("open --csv file");
        if new {
            writeln!(f, "{}", fields.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(",")).unwrap();
        }
        writeln!(f, "{}", fields.iter().map(|(_, v)| v.as_str()).collect::<Vec<_>>().join(",")).unwrap();
    }
    if failed > 0 {
        eprintln!("scale_threads: {failed} of {n} ranks failed");
        std::process::exit(1);
    }
}
