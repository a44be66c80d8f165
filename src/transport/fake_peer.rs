//! Tests with a fake peer: rank 0 of 2 played by a test thread on a socket of its own (on
//! "another host": no single-copy, no rings), which proves the token, accepts rank 1's
//! connection and then sends whatever the test wants, hostile bytes included. Rank 1 is a real
//! endpoint. What a peer sends must never crash rank 1 or make it allocate what the peer
//! claims: each broken frame loses that peer, with a message that says what came.

use super::endpoint::SocketTransport;
use super::frame::{FrameKind, Header, HEADER_LEN, RTS_LEN};
use super::handshake;
use super::tcp::{Listener, MeshConfig};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Rank 0: accepts one connection, runs the handshake, answers "accepted", then `script`.
pub(super) fn fake_rank0<R: Send + 'static>(script: impl FnOnce(TcpStream) -> R + Send + 'static) -> (SocketAddr, JoinHandle<R>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        handshake::serve_blocking(&mut s, &handshake::token_digest(b"t"), 9, 0, 2).unwrap().expect("rank 1 proves the token");
        s.write_all(&[1]).unwrap();
        script(s)
    });
    (a, t)
}

/// Rank 1, connected to `rank0`.
pub(super) fn rank1(rank0: SocketAddr, peer_timeout: Option<Duration>) -> Arc<SocketTransport> {
    let cfg = MeshConfig {
        rank: 1,
        size: 2,
        token_digest: handshake::token_digest(b"t"),
        job_id: 9,
        deadline: Instant::now(),
        cma_pids: vec![None; 2],
        host_pids: vec![None; 2],
        peer_timeout,
    };
    let listener = Listener::bind("127.0.0.1".parse().unwrap(), 2).unwrap();
    let addrs = vec![rank0, listener.local_addr().unwrap()];
    let t = SocketTransport::start(listener, &addrs, &cfg, Duration::from_secs(10)).unwrap();
    t.connect(0).unwrap();
    t
}

/// Why rank 0 is lost to `t`, once it is (None: not within `limit`).
pub(super) fn lost_within(t: &SocketTransport, limit: Duration) -> Option<String> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some((_, why)) = t.lost_among(&[0]) {
            return Some(why);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

pub(super) fn frame(kind: FrameKind, tag: u64, len: u64) -> [u8; HEADER_LEN] {
    Header { kind, check: 0, ctx: 7, tag, len }.encode()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 0 writes `bytes` and keeps the connection open for `hold`; rank 1 must lose it,
    /// saying something that contains `says`.
    fn hostile(bytes: Vec<u8>, says: &str) {
        let (a, fake) = fake_rank0(move |mut s| {
            let _ = s.write_all(&bytes);
            std::thread::sleep(Duration::from_millis(1500));
        });
        let t = rank1(a, None);
        let why = lost_within(&t, Duration::from_secs(3)).unwrap_or_else(|| panic!("rank 0 should be lost after sending what should say {says:?}"));
        assert!(why.contains(says), "{why}");
        assert!(t.check_alive(0).is_some_and(|e| e.status == crate::error::Status::PeerLost && e.msg.contains("rank 0")));
        fake.join().unwrap();
        t.shutdown(Instant::now() + Duration::from_millis(100));
    }

    #[test]
    fn a_frame_with_a_bad_magic_loses_the_peer() {
        let mut f = frame(FrameKind::Data, 1, 4).to_vec();
        f[0] ^= 0xff;
        hostile(f, "bad magic");
    }

    #[test]
    fn a_frame_of_an_unknown_kind_loses_the_peer() {
        let mut f = frame(FrameKind::Data, 1, 0).to_vec();
        f[1] = 99;
        hostile(f, "unknown kind 99");
    }

    #[test]
    fn a_body_over_the_cap_loses_the_peer_before_anything_is_allocated() {
        hostile(frame(FrameKind::Data, 1, u64::MAX).to_vec(), "over the cap");
        hostile(frame(FrameKind::Data, 1, (1 << 40) + 1).to_vec(), "over the cap");
    }

    #[test]
    fn a_control_frame_with_a_body_loses_the_peer() {
        hostile(frame(FrameKind::Close, 0, 8).to_vec(), "Close frame with a 8-byte body");
    }

    #[test]
    fn a_stream_chunk_over_the_socket_loses_the_peer() {
        hostile(frame(FrameKind::Chunk, 1, 16).to_vec(), "chunks go through the ring only");
    }

    #[test]
    fn a_single_copy_announcement_from_another_host_loses_the_peer() {
        let rts = |len: u64| {
            let mut f = frame(FrameKind::Rts, 1, RTS_LEN as u64).to_vec();
            // cookie 1, an address in the sender, the length: nothing is read or allocated.
            f.extend_from_slice(&1u64.to_le_bytes());
            f.extend_from_slice(&0x7fff_0000u64.to_le_bytes());
            f.extend_from_slice(&len.to_le_bytes());
            f
        };
        hostile(rts(1 << 62), "over the cap");
        hostile(rts(1 << 20), "no single-copy path");
    }

    /// A header that claims 512 GiB (under the cap) and then a trickle: memory grows with
    /// what arrives, never with what the header claims; the peer's end is then a loss.
    #[test]
    fn a_huge_claimed_body_costs_only_what_arrives() {
        let rss_kb = || -> u64 {
            let s = std::fs::read_to_string("/proc/self/status").unwrap();
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).unwrap().parse().unwrap()
        };
        let before = rss_kb();
        let (a, fake) = fake_rank0(|mut s| {
            s.write_all(&frame(FrameKind::Data, 1, 1 << 39)).unwrap();
            for _ in 0..16 {
                s.write_all(&vec![7u8; 64 << 10]).unwrap();
            }
            std::thread::sleep(Duration::from_millis(300));
        });
        let t = rank1(a, None);
        let why = lost_within(&t, Duration::from_secs(3)).expect("its end loses it");
        assert!(why.contains("connection closed"), "{why}");
        let grew = rss_kb().saturating_sub(before);
        assert!(grew < 64 << 10, "the process grew by {grew} KiB for 1 MiB that arrived");
        fake.join().unwrap();
        t.shutdown(Instant::now() + Duration::from_millis(100));
    }
}
