//! Helpers shared by the integration tests that start jobs (included with `mod common;`).

#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1, for a job's store to listen on. Taken below
/// the kernel's ephemeral range: a port the kernel handed out (`bind(":0")`) could be handed
/// out again, to another test's listener or outgoing connection, before the job binds it (CI
/// once failed on that: "port ... is already in use"). Each call tries the next candidate
/// from a point that depends on the process, so parallel tests and test binaries spread out.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<u32>().ok()))
        .unwrap_or(32768);
    if low > 12_000 {
        let (first, span) = (10_000u32, low - 10_000);
        let start = std::process::id().wrapping_mul(7919) % span;
        for _ in 0..span.min(2000) {
            let port = (first + (start + NEXT.fetch_add(1, Ordering::Relaxed) * 13) % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Waits for every child and returns their exit codes (-1: killed by a signal). Past `limit`,
/// kills every child still running (none outlives the test holding its pipes) and panics.
pub fn wait_all(mut children: Vec<Child>, limit: Duration) -> Vec<i32> {
    let t0 = Instant::now();
    let mut codes: Vec<Option<i32>> = vec![None; children.len()];
    while codes.iter().any(Option::is_none) {
        for (c, code) in children.iter_mut().zip(codes.iter_mut()) {
            if code.is_none() {
                *code = c.try_wait().unwrap().map(|s| s.code().unwrap_or(-1));
            }
        }
        if codes.iter().any(Option::is_none) && t0.elapsed() > limit {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("children did not finish within {limit:?}: exit codes so far {codes:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    codes.into_iter().map(Option::unwrap).collect()
}

/// Opens the hostile connections against `addr`; they stay open as long as the returned
/// streams live.
pub fn strangers(addr: SocketAddr) -> (Vec<TcpStream>, std::thread::JoinHandle<()>) {
    let mut keep = Vec::new();
    let conn = || TcpStream::connect(addr).unwrap();
    // Silence (a half-open connection that never says anything).
    keep.push(conn());
    // Garbage bytes.
    let mut g = conn();
    let _ = g.write_all(&[0x5Au8; 4096]);
    keep.push(g);
    // Something that looks like a length-prefixed request with a huge length (no hello).
    let mut h = conn();
    let mut m = vec![1u8];
    m.extend_from_slice(&u32::MAX.to_le_bytes());
    m.extend_from_slice(&u64::MAX.to_le_bytes());
    m.extend_from_slice(&[0xFF; 64]);
    let _ = h.write_all(&m);
    keep.push(h);
    // A distcomm-looking hello with the wrong token.
    let mut w = conn();
    let _ = w.write_all(&distcomm::rendezvous::tcp_store::raw::hello(b"not the token", &[0; 32]));
    keep.push(w);
    // A data-connection hello on the store port.
    let mut d = conn();
    let hello = distcomm::transport::handshake::Hello { digest: [7; 32], job_id: 1, rank: 1, world_size: 3 };
    let _ = d.write_all(&hello.encode(&[0; 32]));
    keep.push(d);
    // A flood of 40 silent connections (those the backlog has no room for time out).
    for _ in 0..40 {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            keep.push(s);
        }
    }
    // A slow sender: one byte every 200 ms for 10 s.
    let mut slow = conn();
    let t = std::thread::spawn(move || {
        for _ in 0..50 {
            if slow.write_all(b"D").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    (keep, t)
}


/// A job of `n` ranks as threads of this process over `backend`: each runs `f` on its world
/// comm, which is destroyed after; the results in rank order. The store is served here first,
/// on a port the kernel picks and that stays held (a port found free and bound by rank 0
/// later was taken in between once in CI: "already in use").
pub fn thread_ranks<T: Send + 'static>(backend: &'static str, n: usize, timeout_ms: i64, f: impl Fn(std::sync::Arc<distcomm::comm::Comm>) -> T + Send + Sync + 'static) -> Vec<T> {
    const TOKEN: &str = "thread-ranks-test-token";
    let store = distcomm::rendezvous::serve_store_here("127.0.0.1:0".parse().unwrap(), TOKEN.as_bytes()).unwrap();
    let port = store.local_addr().port();
    let f = std::sync::Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || {
                let opts = distcomm::rendezvous::config::InitOptions {
                    init_method: Some(format!("tcp://127.0.0.1:{port}")),
                    rank: r as i32,
                    world_size: n as i32,
                    timeout_ms,
                    backend: Some(backend.into()),
                    token: Some(TOKEN.into()),
                    ..Default::default()
                };
                let comm = distcomm::init::init(&opts).unwrap_or_else(|e| panic!("rank {r}: init failed: {e}"));
                let out = f(comm.clone());
                comm.destroy();
                out
            })
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().unwrap()).collect();
    drop(store);
    out
}
