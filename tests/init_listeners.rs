//! Strangers at a rank's data listener during init (issue 4), alone in its own test binary: it
//! checks that the listener is closed once the mesh is up by connecting to its port, and a
//! concurrent test (or its child ranks) could otherwise take the freed port and answer.

mod common;
use common::strangers;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

#[test]
fn strangers_at_a_data_listener_during_init_do_not_stop_the_job() {
    use distcomm::transport::handshake::token_digest;
    use distcomm::transport::socket::{Listener, MeshConfig, SocketTransport};
    let n = 3;
    let listeners: Vec<Listener> = (0..n).map(|_| Listener::bind("127.0.0.1".parse().unwrap(), n).unwrap()).collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    // Rank 0 accepts ranks 1 and 2; strangers get there first.
    let (keep, slow) = strangers(addrs[0]);
    let (keep1, slow1) = strangers(addrs[1]);
    let t = Instant::now();
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let addrs = addrs.clone();
            std::thread::spawn(move || {
                let cfg = MeshConfig {
                    rank: r as u32,
                    size: n as u32,
                    token_digest: token_digest(b"secret"),
                    job_id: 42,
                    deadline: Instant::now() + Duration::from_secs(10),
                    cma_pids: vec![None; n],
                };
                SocketTransport::connect_mesh(l, &addrs, &cfg).unwrap_or_else(|e| panic!("rank {r}: {e}"))
            })
        })
        .collect();
    let ts: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "connecting took {took:?}");
    // The data listeners only listen during init: they are closed now.
    for (r, a) in addrs.iter().enumerate() {
        assert!(TcpStream::connect_timeout(a, Duration::from_millis(500)).is_err(), "rank {r}'s data listener still accepts");
    }
    for t in &ts {
        t.shutdown(Instant::now() + Duration::from_secs(2));
    }
    drop((keep, keep1));
    let _ = slow.join();
    let _ = slow1.join();
}
