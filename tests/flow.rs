//! Flow control over connections (`transport::flow`): ranks as threads over TCP only, with
//! single-copy off, a bound of 1 MiB of unexpected eager bytes per peer and rendezvous from
//! 256 KiB (set for the whole binary before any rank starts).

mod common;

use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::comm::{Comm, P2pOp, Probed};
use distcomm::Status;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

const BOUND: usize = 1 << 20;
const RENDEZVOUS: usize = 256 << 10;

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY (edition 2024 asks): set once, before any thread of the library reads them.
        unsafe {
            std::env::set_var("DC_CMA_MIN", "0");
            std::env::set_var("DC_MAX_UNEXPECTED_BYTES", BOUND.to_string());
            std::env::set_var("DC_RENDEZVOUS_BYTES", RENDEZVOUS.to_string());
        }
    });
}

fn job<T: Send + 'static>(n: usize, f: impl Fn(Arc<Comm>) -> T + Send + Sync + 'static) -> Vec<T> {
    setup();
    common::thread_ranks("socket", n, 30_000, f)
}

fn pattern(k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + k * 7 + 1) as u8).collect()
}

fn wait(c: &Comm, op: &P2pOp) -> distcomm::Result<distcomm::completion::Done> {
    c.wait_p2p(op, c.op_deadline(), &|| "p2p".into())
}

fn recv(c: &Comm, len: usize, from: usize, tag: Option<u32>) -> (Vec<u8>, distcomm::completion::Done) {
    let mut b = vec![0u8; len];
    let d = wait(c, &c.post_recv(MutBuf::from_slice(&mut b), Some(from), tag).unwrap()).unwrap();
    b.truncate(d.bytes);
    (b, d)
}

fn held(c: &Comm, from: usize) -> usize {
    c.world().transport.held_from(c.members()[from])
}

/// A sender far ahead of its receiver: eager messages stop at the bound (the rest are offered
/// and wait in the sender's memory), and credit comes back as the receiver consumes them, so a
/// second flood is bounded the same way.
#[test]
fn a_flood_of_eager_messages_is_held_within_the_bound() {
    const LEN: usize = 64 << 10;
    const N: usize = 64; // 4 MiB: four times the bound
    let out = job(2, |c| {
        for round in 0..2 {
            if c.rank() == 0 {
                let data: Vec<Vec<u8>> = (0..N).map(|k| pattern(k + round, LEN)).collect();
                let ops: Vec<P2pOp> = data.iter().enumerate().map(|(k, d)| c.post_send(ConstBuf::from_slice(d), 1, k as u32).unwrap()).collect();
                std::thread::sleep(Duration::from_millis(300));
                let done = ops.iter().filter(|op| c.p2p_is_done(op)).count();
                assert!(done <= BOUND / LEN, "round {round}: {done} sends of {LEN} bytes finished before any receive: past the bound");
                assert!(done >= 4, "round {round}: only {done} went eagerly");
                for op in &ops {
                    wait(&c, op).unwrap();
                }
            } else {
                // Once the first message is here, the sender had time to run ahead.
                c.probe(Some(0), Some(0)).unwrap();
                std::thread::sleep(Duration::from_millis(500));
                let h = held(&c, 0);
                assert!(h <= BOUND && h >= 4 * LEN, "round {round}: {h} bytes held from rank 0 (bound {BOUND})");
                for k in 0..N {
                    let (b, d) = recv(&c, LEN, 0, Some(k as u32));
                    assert_eq!(d.bytes, LEN);
                    assert!(b == pattern(k + round, LEN), "round {round}: message {k}");
                }
            }
            // Both rounds start together, and neither rank starts the next one before the other
            // has checked that nothing it received is still held (else the next flood could be
            // counted: seen in CI on a loaded machine). The second step's message lands in a
            // receive posted before the check, so it is never held itself.
            let peer = 1 - c.rank();
            let mut go = [0u8];
            let next = c.post_recv(MutBuf::from_slice(&mut go), Some(peer), Some(998)).unwrap();
            let s = c.post_send(ConstBuf::from_slice(&[1]), peer, 999).unwrap();
            recv(&c, 1, peer, Some(999));
            wait(&c, &s).unwrap();
            assert_eq!(held(&c, peer), 0, "round {round}: everything received was taken");
            let s = c.post_send(ConstBuf::from_slice(&[1]), peer, 998).unwrap();
            wait(&c, &next).unwrap();
            wait(&c, &s).unwrap();
        }
        true
    });
    assert!(out.iter().all(|&x| x));
}

/// A message at the rendezvous size waits in the sender's memory until its receive is posted:
/// the receiver holds none of its bytes meanwhile, and the send finishes only after.
#[test]
fn large_messages_wait_for_their_receive() {
    const LEN: usize = 4 << 20;
    static POSTED: AtomicBool = AtomicBool::new(false);
    job(2, |c| {
        if c.rank() == 0 {
            let data = pattern(3, LEN);
            let op = c.post_send(ConstBuf::from_slice(&data), 1, 5).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            assert!(!c.p2p_is_done(&op), "finished before its receive was posted");
            wait(&c, &op).unwrap();
            assert!(POSTED.load(Ordering::SeqCst));
        } else {
            std::thread::sleep(Duration::from_millis(200));
            let p = c.probe(Some(0), Some(5)).unwrap();
            assert_eq!(p, Probed { source: 0, tag: 5, bytes: LEN }, "a probe sees the offered size");
            assert_eq!(held(&c, 0), 0, "an offer holds no bytes");
            // Well past the sender's look at its send (300 ms after it posted it).
            std::thread::sleep(Duration::from_millis(800));
            POSTED.store(true, Ordering::SeqCst);
            let (b, _) = recv(&c, LEN, 0, Some(5));
            assert!(b == pattern(3, LEN));
        }
    });
}

/// Two ranks that both send (large messages, and more small ones than the bound) before they
/// receive still pass each other: a rank waiting for its send takes the peer's offers.
#[test]
fn ranks_that_both_send_before_they_receive_pass() {
    job(2, |c| {
        let me = c.rank();
        let peer = 1 - me;
        let big = pattern(me, 8 << 20);
        wait(&c, &c.post_send(ConstBuf::from_slice(&big), peer, 1).unwrap()).unwrap();
        let small: Vec<Vec<u8>> = (0..40).map(|k| pattern(me * 100 + k, 64 << 10)).collect();
        for s in &small {
            wait(&c, &c.post_send(ConstBuf::from_slice(s), peer, 2).unwrap()).unwrap();
        }
        let (b, _) = recv(&c, 8 << 20, peer, Some(1));
        assert!(b == pattern(peer, 8 << 20));
        for k in 0..40 {
            let (b, _) = recv(&c, 64 << 10, peer, Some(2));
            assert!(b == pattern(peer * 100 + k, 64 << 10), "small message {k}");
        }
    });
}

/// Offered and eager messages of one tag arrive in the order sent, whichever way each went;
/// a matched probe takes an offered one and its receive gets it whole.
#[test]
fn offered_messages_keep_their_order_among_eager_ones() {
    let sizes = [16usize, 1 << 20, 100, 300 << 10, 0, 2 << 20, 7];
    job(2, move |c| {
        if c.rank() == 0 {
            let data: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(k, &n)| pattern(k, n)).collect();
            let ops: Vec<P2pOp> = data.iter().map(|d| c.post_send(ConstBuf::from_slice(d), 1, 3).unwrap()).collect();
            let extra = pattern(50, 1 << 20);
            let m = c.post_send(ConstBuf::from_slice(&extra), 1, 4).unwrap();
            for op in ops.iter().chain([&m]) {
                wait(&c, op).unwrap();
            }
        } else {
            std::thread::sleep(Duration::from_millis(100));
            for (k, &n) in sizes.iter().enumerate() {
                let (b, d) = recv(&c, 4 << 20, 0, None);
                assert_eq!((d.bytes, d.tag), (n, 3), "message {k}");
                assert!(b == pattern(k, n), "message {k}'s bytes");
            }
            let (p, m) = c.mprobe(Some(0), Some(4)).unwrap();
            assert_eq!(p.bytes, 1 << 20);
            let mut b = vec![0u8; 1 << 20];
            wait(&c, &c.post_recv_matched(m, MutBuf::from_slice(&mut b)).unwrap()).unwrap();
            assert!(b == pattern(50, 1 << 20));
        }
    });
}

/// A receive shorter than an offered message asks for only what it takes: truncation error,
/// nothing written past it, and the sender's send finishes; the next message comes intact.
#[test]
fn a_short_receive_of_an_offered_message_takes_only_its_length() {
    job(2, |c| {
        if c.rank() == 0 {
            let big = pattern(1, 8 << 20);
            let after = pattern(2, 1000);
            let a = c.post_send(ConstBuf::from_slice(&big), 1, 7).unwrap();
            let b = c.post_send(ConstBuf::from_slice(&after), 1, 7).unwrap();
            wait(&c, &a).unwrap();
            wait(&c, &b).unwrap();
        } else {
            std::thread::sleep(Duration::from_millis(50));
            let mut short = vec![0u8; (1 << 20) + 8];
            let e = wait(&c, &c.post_recv(MutBuf::from_slice(&mut short[..1 << 20]), Some(0), Some(7)).unwrap()).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument, "{e}");
            assert!(short[..1 << 20] == pattern(1, 8 << 20)[..1 << 20] && short[1 << 20..].iter().all(|&x| x == 0));
            let (b, _) = recv(&c, 1000, 0, Some(7));
            assert!(b == pattern(2, 1000));
        }
    });
}
