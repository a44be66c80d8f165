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

/// Rank `rank` of a job of 2 on "another host" than its peer (no single-copy, no rings).
pub(super) fn mesh(rank: u32, peer_timeout: Option<Duration>, encrypt: bool) -> MeshConfig {
    MeshConfig {
        rank,
        size: 2,
        token_digest: handshake::token_digest(b"t"),
        job_id: 9,
        deadline: Instant::now(),
        cma_peers: vec![None; 2],
        host_pids: vec![None; 2],
        peer_timeout,
        encrypt,
    }
}

/// Rank 1, connected to `rank0`.
pub(super) fn rank1(rank0: SocketAddr, peer_timeout: Option<Duration>) -> Arc<SocketTransport> {
    rank1_as(rank0, mesh(1, peer_timeout, false))
}

/// Rank 1 configured by `cfg`, connected to `rank0`.
pub(super) fn rank1_as(rank0: SocketAddr, cfg: MeshConfig) -> Arc<SocketTransport> {
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
        if let Some((_, why)) = t.lost_among(&[0], &[]) {
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

    /// A single-copy message its sender revoked (let go of without the receiver's `Fin`, see
    /// `cma::revoke`) is not delivered: the bytes read are discarded, the receive fails saying
    /// why, and the sender is told the message was not read; a message announced beside it and
    /// not revoked arrives whole. (The fake rank 0 is this process, so rank 1 reads its memory
    /// and its revocation table as it would a real sender's.)
    #[test]
    fn a_revoked_single_copy_message_is_discarded_not_delivered() {
        use super::super::cma;
        use super::super::ops::{CtxState, TagMatch};
        use crate::completion::WaitOutcome;
        use std::io::Read;
        const LEN: usize = 300_000;
        let data: &'static [u8] = Box::leak((0..LEN).map(|i| (i * 7) as u8).collect::<Vec<u8>>().into_boxed_slice());
        let (kept, revoked) = (cma::new_cookie(), cma::new_cookie());
        cma::publish(kept);
        cma::publish(revoked);
        cma::revoke(revoked);
        let (go, started) = std::sync::mpsc::channel::<()>();
        let (a, fake) = fake_rank0(move |mut s| {
            started.recv().unwrap();
            for (tag, cookie) in [(1, revoked), (2, kept)] {
                let mut rts = frame(FrameKind::Rts, tag, RTS_LEN as u64).to_vec();
                rts.extend_from_slice(&super::super::protocol::Rts { cookie, addr: data.as_ptr() as u64, len: LEN as u64 }.encode());
                s.write_all(&rts).unwrap();
            }
            let mut fins = Vec::new();
            for _ in 0..2 {
                let mut h = [0u8; HEADER_LEN];
                s.read_exact(&mut h).unwrap();
                let f = Header::decode(&h).unwrap();
                fins.push((f.kind, f.tag, f.check));
            }
            fins
        });
        let mut cfg = mesh(1, None, false);
        cfg.cma_peers[0] = cma::probe(&cma::advertisement());
        let t = rank1_as(a, cfg);
        let ctx = CtxState::new(7, None);
        t.register_ctx(&ctx);
        let (mut b1, mut b2) = (vec![0u8; LEN], vec![0u8; LEN]);
        let r1 = t.post_recv(&ctx, Some(0), TagMatch::Exact(1), 0, crate::buffer::MutBuf::from_slice(&mut b1)).unwrap();
        let r2 = t.post_recv(&ctx, Some(0), TagMatch::Exact(2), 0, crate::buffer::MutBuf::from_slice(&mut b2)).unwrap();
        go.send(()).unwrap();
        let limit = Instant::now() + Duration::from_secs(10);
        match r1.comp.wait(limit, &|| None) {
            WaitOutcome::Finished(Err(e)) => assert!(e.msg.contains("let go of it") && e.msg.contains("rank 0"), "{e}"),
            o => panic!("the revoked message was not refused: {o:?}"),
        }
        match r2.comp.wait(limit, &|| None) {
            WaitOutcome::Finished(Ok(d)) => assert_eq!(d.bytes, LEN),
            o => panic!("the message beside it did not arrive: {o:?}"),
        }
        assert!(b2 == data, "the kept message is wrong");
        assert_eq!(fake.join().unwrap(), vec![(FrameKind::Fin, revoked, 1), (FrameKind::Fin, kept, 0)], "the sender hears which was read");
        t.shutdown(Instant::now() + Duration::from_millis(100));
    }

    /// A peer that offers a message, is asked for it, and then goes: the receive of any source
    /// that took the offer fails with the peer's loss at once (it waits for no rank in
    /// particular, so only the lost connection can end it before its timeout).
    #[test]
    fn a_receive_waiting_for_an_offer_fails_when_its_sender_goes() {
        use super::super::ops::{CtxState, TagMatch};
        use crate::completion::WaitOutcome;
        use std::io::Read;
        let (a, fake) = fake_rank0(|mut s| {
            let mut offer = frame(FrameKind::Offer, 5, RTS_LEN as u64).to_vec();
            offer.extend_from_slice(&super::super::protocol::Rts { cookie: 42, addr: 0, len: 1 << 20 }.encode());
            s.write_all(&offer).unwrap();
            // The receive asks for what it takes; then we are gone without sending it.
            let mut h = [0u8; HEADER_LEN];
            s.read_exact(&mut h).unwrap();
            let ask = Header::decode(&h).unwrap();
            (ask.kind, ask.tag, ask.ctx)
        });
        let t = rank1(a, None);
        let ctx = CtxState::new(7, None);
        t.register_ctx(&ctx);
        let mut buf = vec![0u8; 1 << 20];
        let op = t.post_recv(&ctx, None, TagMatch::AnyUser, 0, crate::buffer::MutBuf::from_slice(&mut buf)).unwrap();
        assert_eq!(fake.join().unwrap(), (FrameKind::Ask, 42, 1 << 20), "the receive asks for its offer, all of it");
        let t0 = Instant::now();
        match op.comp.wait(Instant::now() + Duration::from_secs(10), &|| None) {
            WaitOutcome::Finished(Err(e)) => assert!(e.status == crate::error::Status::PeerLost && e.msg.contains("rank 0"), "{e}"),
            o => panic!("the receive did not fail with the loss: {o:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(3), "took {:?}", t0.elapsed());
        t.shutdown(Instant::now() + Duration::from_millis(100));
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

    /// Large and small messages back to back, in one write and in pieces, arrive whole, with
    /// their receive posted before or only after they came: the reader switches between
    /// reading a header alone (after a large body) and reading many frames at once.
    #[test]
    fn large_and_small_messages_back_to_back_arrive_whole() {
        use super::super::ops::{CtxState, TagMatch};
        use crate::completion::WaitOutcome;
        const SIZES: [usize; 10] = [100_000, 10, 70_000, 0, 50_000, 49_152, 3, 200_000, 64, 65_536];
        fn body(k: usize, n: usize) -> Vec<u8> {
            (0..n).map(|i| (i * 13 + k) as u8).collect()
        }
        let (go, started) = std::sync::mpsc::channel::<()>();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let (a, fake) = fake_rank0(move |mut s| {
            started.recv().unwrap();
            let mut all = Vec::new();
            for round in 0..2 {
                for (k, &n) in SIZES.iter().enumerate() {
                    all.extend_from_slice(&frame(FrameKind::Data, (round * SIZES.len() + k) as u64, n as u64));
                    all.extend_from_slice(&body(k, n));
                }
            }
            // The first round in one write, the second in uneven pieces.
            let half = all.len() / 2;
            s.write_all(&all[..half]).unwrap();
            for piece in all[half..].chunks(7_777) {
                s.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
            finished.recv().unwrap();
        });
        let t = rank1(a, None);
        let ctx = CtxState::new(7, None);
        t.register_ctx(&ctx);
        let count = 2 * SIZES.len();
        let mut bufs: Vec<Vec<u8>> = (0..count).map(|k| vec![0xEEu8; SIZES[k % SIZES.len()]]).collect();
        let post = |k: usize, b: &mut Vec<u8>| t.post_recv(&ctx, Some(0), TagMatch::Exact(k as u64), 0, crate::buffer::MutBuf::from_slice(b)).unwrap();
        // Every other receive is posted before anything is sent; the rest arrive unexpected.
        let mut ops: Vec<_> = bufs.iter_mut().enumerate().map(|(k, b)| (k % 2 == 0).then(|| post(k, b))).collect();
        go.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        for (k, b) in bufs.iter_mut().enumerate() {
            if ops[k].is_none() {
                ops[k] = Some(post(k, b));
            }
        }
        let limit = Instant::now() + Duration::from_secs(10);
        for (k, op) in ops.iter().enumerate() {
            match op.as_ref().unwrap().comp.wait(limit, &|| None) {
                WaitOutcome::Finished(Ok(d)) => assert_eq!(d.bytes, SIZES[k % SIZES.len()], "message {k}"),
                o => panic!("message {k}: {o:?}"),
            }
        }
        for (k, b) in bufs.iter().enumerate() {
            assert!(*b == body(k % SIZES.len(), SIZES[k % SIZES.len()]), "message {k} ({} bytes) differs", SIZES[k % SIZES.len()]);
        }
        done.send(()).unwrap();
        fake.join().unwrap();
        t.shutdown(Instant::now() + Duration::from_millis(100));
    }

    /// A peer that aborts a communicator and then says goodbye: the thread that read the abort
    /// may not have acted on it yet when another thread reads the goodbye and fails the
    /// receives from that peer. The context is aborted as the abort is read, so those receives
    /// report the abort, not a closed connection (CI once saw the latter).
    #[test]
    fn an_abort_read_before_a_goodbye_is_what_the_receives_report() {
        use super::super::endpoint::Event;
        use super::super::ops::{CtxState, TagMatch};
        use super::super::protocol::Frame;
        use super::super::tcp_io::Sink;
        use crate::completion::WaitOutcome;
        let (a, fake) = fake_rank0(|s| s);
        let t = rank1(a, None);
        let ctx = CtxState::new(7, None);
        t.register_ctx(&ctx);
        let mut buf = [0u8; 8];
        let op = t.post_recv(&ctx, Some(0), TagMatch::AnyUser, 0, crate::buffer::MutBuf::from_slice(&mut buf)).unwrap();
        let peer = t.peer(0).clone();
        // The reading thread reads the abort (its events not handled yet) ...
        let (mut sink, mut read_first) = (Sink::Idle, Vec::new());
        t.on_frame(&peer, Frame::Abort { ctx: 7, code: 0 }, &mut sink, &mut read_first);
        assert!(ctx.is_aborted(), "aborted as soon as read");
        // ... another reads the goodbye and acts on it first.
        t.handle_events(&peer, &mut vec![Event::Closed]);
        match op.comp.wait(Instant::now() + Duration::from_secs(5), &|| None) {
            WaitOutcome::Finished(Err(e)) => assert!(e.status == crate::error::Status::Aborted && e.msg.contains("rank 0 aborted"), "{e}"),
            o => panic!("the receive did not fail with the abort: {o:?}"),
        }
        t.handle_events(&peer, &mut read_first);
        drop(fake.join().unwrap());
        t.shutdown(Instant::now() + Duration::from_millis(100));
    }
}

#[cfg(test)]
mod sealed_tests {
    use super::super::ops::{CtxState, TagMatch};
    use super::*;
    use crate::buffer::{ConstBuf, MutBuf};
    use crate::completion::WaitOutcome;

    /// Two real endpoints "on different hosts" (no host pids), connections encrypted.
    fn pair(encrypt: bool) -> Vec<Arc<SocketTransport>> {
        let listeners: Vec<Listener> = (0..2).map(|_| Listener::bind("127.0.0.1".parse().unwrap(), 2).unwrap()).collect();
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        listeners
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let cfg = mesh(r as u32, None, encrypt);
                SocketTransport::start(l, &addrs, &cfg, Duration::from_secs(10)).unwrap()
            })
            .collect()
    }

    /// Rank 1 reaches rank 0 through a relay that copies both ways, flipping one bit of what
    /// rank 1 sends once `flip_after` bytes went by (None: none), and reports whether `needle`
    /// was ever seen in clear in what rank 1 sent.
    fn relayed(encrypt: bool, flip_after: Option<usize>, needle: Vec<u8>) -> (Vec<Arc<SocketTransport>>, std::thread::JoinHandle<bool>) {
        use std::io::Read;
        let listeners: Vec<Listener> = (0..2).map(|_| Listener::bind("127.0.0.1".parse().unwrap(), 2).unwrap()).collect();
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let relay = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let via = relay.local_addr().unwrap();
        let to0 = addrs[0];
        let seen = std::thread::spawn(move || {
            let (mut from1, _) = relay.accept().unwrap();
            let mut to_0 = TcpStream::connect(to0).unwrap();
            let (mut back_from, mut back_to) = (to_0.try_clone().unwrap(), from1.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut back_from, &mut back_to);
            });
            let (mut all, mut b, mut flipped) = (Vec::new(), [0u8; 65536], false);
            while let Ok(n) = from1.read(&mut b) {
                if n == 0 {
                    break;
                }
                let start = all.len();
                all.extend_from_slice(&b[..n]);
                if let Some(at) = flip_after.filter(|&at| !flipped && all.len() > at) {
                    b[at - start.min(at)] ^= 1;
                    flipped = true;
                }
                if to_0.write_all(&b[..n]).is_err() {
                    break;
                }
            }
            all.windows(needle.len()).any(|w| w == needle.as_slice())
        });
        let ts = listeners
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let mut book = addrs.clone();
                book[0] = via;
                let cfg = mesh(r as u32, None, encrypt);
                SocketTransport::start(l, &book, &cfg, Duration::from_secs(10)).unwrap()
            })
            .collect::<Vec<_>>();
        ts[1].connect(0).unwrap();
        (ts, seen)
    }

    fn send_1_to_0(ts: &[Arc<SocketTransport>], data: &[u8]) -> (Vec<u8>, WaitOutcome) {
        let ctx: Vec<_> = (0..2).map(|_| CtxState::new(5, None)).collect();
        for (i, t) in ts.iter().enumerate() {
            t.register_ctx(&ctx[i]);
        }
        let mut got = vec![0u8; data.len()];
        // SAFETY: both buffers outlive the ops (waited for, or failed, below).
        let r = ts[0].post_recv(&ctx[0], Some(1), TagMatch::Exact(3), 0, unsafe { MutBuf::new(got.as_mut_ptr(), got.len()) }).unwrap();
        let _s = ts[1].post_send(&ctx[1], 0, 3, 0, unsafe { ConstBuf::new(data.as_ptr(), data.len()) }).unwrap();
        let out = r.comp.wait(Instant::now() + Duration::from_secs(10), &|| ts[0].check_alive(1));
        (got, out)
    }

    #[test]
    fn an_encrypted_connection_carries_no_clear_text_and_a_flipped_bit_loses_the_peer() {
        let secret: Vec<u8> = b"the quick brown fox jumps over the lazy dog ".repeat(2000);
        // In clear, the relay sees the message; encrypted, it does not, and it arrives intact.
        let (ts, seen) = relayed(false, None, secret[..64].to_vec());
        let (got, out) = send_1_to_0(&ts, &secret);
        assert!(matches!(out, WaitOutcome::Finished(Ok(_))) && got == secret);
        ts.iter().for_each(|t| t.shutdown(Instant::now() + Duration::from_millis(300)));
        assert!(seen.join().unwrap(), "the relay must see clear text without encryption");
        let (ts, seen) = relayed(true, None, secret[..64].to_vec());
        let (got, out) = send_1_to_0(&ts, &secret);
        assert!(matches!(out, WaitOutcome::Finished(Ok(_))) && got == secret);
        ts.iter().for_each(|t| t.shutdown(Instant::now() + Duration::from_millis(300)));
        assert!(!seen.join().unwrap(), "clear text on an encrypted connection");
        // A bit flipped in the middle of the message: rank 1 is lost to rank 0, which never
        // completes the receive with altered data.
        let (ts, _seen) = relayed(true, Some(40_000), vec![0]);
        let (_, out) = send_1_to_0(&ts, &secret);
        match out {
            WaitOutcome::Interrupted(e) => assert!(e.msg.contains("failed authentication") && e.msg.contains("rank 1"), "{e}"),
            WaitOutcome::Finished(Err(e)) => assert!(e.msg.contains("rank 1"), "{e}"),
            o => panic!("the altered message was not refused: {o:?}"),
        }
        ts.iter().for_each(|t| t.shutdown(Instant::now() + Duration::from_millis(300)));
    }

    fn wait(c: &crate::completion::Completion) -> crate::completion::Done {
        match c.wait(Instant::now() + Duration::from_secs(20), &|| None) {
            WaitOutcome::Finished(r) => r.unwrap(),
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn messages_of_every_size_cross_an_encrypted_connection_both_ways_intact() {
        let ts = pair(true);
        let ctx: Vec<_> = (0..2).map(|_| CtxState::new(5, None)).collect();
        for (i, t) in ts.iter().enumerate() {
            t.register_ctx(&ctx[i]);
        }
        for (k, n) in [0usize, 1, 31, 32, 100, 65_536, 65_537, 1 << 20, 3 << 22].into_iter().enumerate() {
            for (from, to) in [(0usize, 1usize), (1, 0)] {
                let data: Vec<u8> = (0..n).map(|i| (i * 7 + k + from) as u8).collect();
                let mut got = vec![0u8; n];
                // SAFETY: both buffers outlive the ops, which are waited for below.
                let r = ts[to].post_recv(&ctx[to], Some(from as u32), TagMatch::Exact(k as u64), 0, unsafe { MutBuf::new(got.as_mut_ptr(), n) }).unwrap();
                let s = ts[from].post_send(&ctx[from], to as u32, k as u64, 0, unsafe { ConstBuf::new(data.as_ptr(), n) }).unwrap();
                assert_eq!(wait(&r.comp).bytes, n);
                wait(&s.comp);
                assert!(got == data, "{n} bytes from {from} to {to} differ");
            }
        }
        assert!(ts.iter().all(|t| t.peer_if_known(1 - t.rank()).is_some_and(|p| p.sealed.get().is_some())), "both ends encrypted");
        for t in &ts {
            t.shutdown(Instant::now() + Duration::from_millis(500));
        }
    }
}
