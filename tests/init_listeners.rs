//! Strangers at a rank's data listener during init (issue 4), alone in its own test binary: it
//! checks that the listener is closed once the mesh is up by connecting to its port, and a
//! concurrent test (or its child ranks) could otherwise take the freed port and answer.

mod common;
use common::strangers;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Connections are made on demand: here every rank connects to every other at the same time
/// (each pair from both ends at once), with strangers at two of the listeners.
#[test]
fn strangers_at_a_data_listener_do_not_stop_connections_on_demand() {
    use distcomm::transport::handshake::token_digest;
    use distcomm::transport::socket::{Listener, MeshConfig, SocketTransport};
    let n = 4;
    let listeners: Vec<Listener> = (0..n).map(|_| Listener::bind("127.0.0.1".parse().unwrap(), n).unwrap()).collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let (keep, slow) = strangers(addrs[0]);
    let (keep1, slow1) = strangers(addrs[1]);
    let t = Instant::now();
    let cfg = |r: usize| MeshConfig {
        rank: r as u32,
        size: n as u32,
        token_digest: token_digest(b"secret"),
        job_id: 42,
        deadline: Instant::now() + Duration::from_secs(10),
        cma_peers: vec![None; n],
        host_pids: vec![None; n],
        peer_timeout: None,
        encrypt: false,
    };
    let ts: Vec<_> = listeners.into_iter().enumerate().map(|(r, l)| SocketTransport::start(l, &addrs, &cfg(r), Duration::from_secs(10)).unwrap()).collect();
    assert!(ts.iter().all(|t| t.connected_peers() == 0), "nothing is connected before it is needed");
    let ts = std::sync::Arc::new(ts);
    let handles: Vec<_> = (0..n)
        .flat_map(|r| (0..n).filter(move |&p| p != r).map(move |p| (r, p)))
        .map(|(r, p)| {
            let ts = ts.clone();
            std::thread::spawn(move || ts[r].connect(p as u32).unwrap_or_else(|e| panic!("rank {r} to {p}: {e}")))
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "connecting took {took:?}");
    for (r, t) in ts.iter().enumerate() {
        assert_eq!(t.connected_peers(), n - 1, "rank {r}: one connection per pair");
    }
    for t in ts.iter() {
        t.shutdown(Instant::now() + Duration::from_secs(2));
    }
    // The data listeners listen until the transport shuts down: they are closed now.
    for (r, a) in addrs.iter().enumerate() {
        assert!(TcpStream::connect_timeout(a, Duration::from_millis(500)).is_err(), "rank {r}'s data listener still accepts");
    }
    drop((keep, keep1));
    let _ = slow.join();
    let _ = slow1.join();
}
