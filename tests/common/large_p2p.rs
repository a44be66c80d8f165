//! Large point-to-point messages between ranks of one host, the tests that run both ways a
//! message larger than the single-copy size can travel: read from the sender's memory (the
//! default, tests/threads.rs) and streamed through the ring in chunks (where ranks outnumber
//! the cores, tests/ring_streams.rs). Included with `#[path]` beside `mod common;`.

use crate::common;
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;
use distcomm::Status;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn job_on<T: Send + 'static>(backend: &'static str, n: usize, timeout_ms: i64, f: impl Fn(Arc<Comm>) -> T + Send + Sync + 'static) -> Vec<T> {
    common::thread_ranks(backend, n, timeout_ms, f)
}

/// Large messages to a receive that is already posted (several at once, in both directions)
/// arrive whole;
/// one longer than its receive fails that receive with InvalidArgument without writing past
/// it, and the messages after it are intact.
pub fn arrive_whole_and_truncate_safely() {
    const LEN: usize = 3 * 1024 * 1024 + 12_345;
    let pattern = |who: usize, k: usize, len: usize| -> Vec<u8> { (0..len).map(|i| (i * 13 + who * 7 + k * 31) as u8).collect() };
    job_on("shm", 2, 20_000, move |c| {
        let (me, other) = (c.rank(), 1 - c.rank());
        let wait = |op: &distcomm::comm::P2pOp| c.wait_p2p(op, c.op_deadline(), &|| "p2p".into());
        // Receives first, then a barrier: every message finds its receive posted.
        let mut bufs: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; LEN]).collect();
        let recvs: Vec<_> = bufs.iter_mut().map(|b| c.post_recv(MutBuf::from_slice(b), Some(other), Some(7)).unwrap()).collect();
        let mut short = vec![0u8; LEN + 64];
        let short_recv = c.post_recv(MutBuf::from_slice(&mut short[..LEN / 2]), Some(other), Some(8)).unwrap();
        let mut after = vec![0u8; 100_000];
        let after_recv = c.post_recv(MutBuf::from_slice(&mut after), Some(other), Some(9)).unwrap();
        c.collective(CollArgs::Barrier).unwrap();
        let out: Vec<Vec<u8>> = (0..3).map(|k| pattern(me, k, LEN)).collect();
        let long = pattern(me, 5, LEN);
        let tail = pattern(me, 6, 100_000);
        let sends: Vec<_> = out.iter().map(|m| c.post_send(ConstBuf::from_slice(m), other, 7).unwrap()).collect();
        let long_send = c.post_send(ConstBuf::from_slice(&long), other, 8).unwrap();
        let tail_send = c.post_send(ConstBuf::from_slice(&tail), other, 9).unwrap();
        for (k, op) in recvs.iter().enumerate() {
            assert_eq!(wait(op).unwrap().bytes, LEN);
            assert!(bufs[k] == pattern(other, k, LEN), "rank {me}: large message {k} is wrong");
        }
        let e = wait(&short_recv).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
        assert!(short[..LEN / 2] == pattern(other, 5, LEN)[..LEN / 2], "the kept part of a truncated message is wrong");
        assert!(short[LEN / 2..].iter().all(|&b| b == 0), "a truncated message was written past its receive");
        assert_eq!(wait(&after_recv).unwrap().bytes, 100_000);
        assert!(after == pattern(other, 6, 100_000), "the message after a truncated one is wrong");
        for op in sends.iter().chain([&long_send, &tail_send]) {
            wait(op).unwrap();
        }
        c.collective(CollArgs::Barrier).unwrap();
    });
}

/// An abort in the middle of a large message (the receiver is not waiting, so only its
/// progress thread moves it) ends both sides promptly: no side waits for data that stops
/// coming, and the comm is destroyed cleanly.
pub fn an_abort_ends_a_large_message() {
    const LEN: usize = 64 << 20;
    let out = job_on("shm", 2, 30_000, |c| {
        let t0 = Instant::now();
        let r = if c.rank() == 0 {
            let big = vec![7u8; LEN];
            let c2 = c.clone();
            let aborter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                c2.abort();
            });
            let op = c.post_send(ConstBuf::from_slice(&big), 1, 5).unwrap();
            let r = c.wait_p2p(&op, c.op_deadline(), &|| "send".into());
            aborter.join().unwrap();
            r.map(|_| ())
        } else {
            let mut b = vec![0u8; LEN];
            let op = c.post_recv(MutBuf::from_slice(&mut b), Some(0), Some(5)).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            c.wait_p2p(&op, c.op_deadline(), &|| "recv".into()).map(|_| ())
        };
        (r.err().map(|e| e.status), t0.elapsed())
    });
    for (r, (status, took)) in out.iter().enumerate() {
        assert!(status.is_none_or(|s| s == Status::Aborted), "rank {r}: {status:?}");
        assert!(*took < Duration::from_secs(10), "rank {r} took {took:?}");
    }
    // (Here the send is still streaming when the abort comes: Aborted on both sides. A machine
    // fast enough to finish 64 MiB first sees Ok, which is fine too.)
}

/// Point-to-point between ranks of one host goes through shared-memory rings: a stream of
/// messages larger than a ring holds (so frames wait in the sender for room), of every size
/// class (inline; single-copy above 64 KiB, or above 24 KiB where ranks outnumber cores), in
/// both directions at once, arrives whole and in order; a receive from any source takes ring
/// traffic too.
pub fn keep_order_in_both_directions() {
    // Around the limits of inline bodies (24 KiB where ranks outnumber cores, else 64 KiB).
    let sizes = [0usize, 1, 100, 4096, 24_576, 24_577, 40_000, 65_536, 65_537, 300_000];
    let msg = move |from: usize, k: usize| -> Vec<u8> { (0..sizes[k % sizes.len()]).map(|i| (i + from * 7 + k * 13) as u8).collect() };
    job_on("shm", 2, 30_000, move |c| {
        let me = c.rank();
        let other = 1 - me;
        let count = 700;
        let outgoing: Vec<Vec<u8>> = (0..count).map(|k| msg(me, k)).collect();
        let sends: Vec<_> = outgoing.iter().map(|m| c.post_send(ConstBuf::from_slice(m), other, 4).unwrap()).collect();
        // Receive only once everything is sent: the rings fill and frames wait for room.
        for k in 0..count {
            let want = msg(other, k);
            let mut b = vec![0u8; want.len()];
            let src = if k % 3 == 0 { None } else { Some(other) };
            let op = c.post_recv(MutBuf::from_slice(&mut b), src, Some(4)).unwrap();
            let d = c.wait_p2p(&op, c.op_deadline(), &|| "recv".into()).unwrap();
            assert_eq!((d.bytes, c.comm_rank_of(d.source)), (want.len(), other as i32), "message {k}");
            assert!(b == want, "rank {me}: message {k} is wrong");
        }
        for op in &sends {
            c.wait_p2p(op, c.op_deadline(), &|| "send".into()).unwrap();
        }
        c.collective(CollArgs::Barrier).unwrap();
    });
}

/// A large send whose receive never comes and that its sender gives up on (a timeout) is
/// withdrawn: the wait ends with the timeout, not with the withdrawal's grace; the receiver
/// lets go of the message (a receive posted later does not get it, so no receive can read
/// the sender's buffer after the sender reused or freed it), and the pair goes on working.
/// 24 MiB is over the receiver's bound of unexpected bytes (16 MiB): the message stays in the
/// sender's memory instead of being copied out by the receiver's progress thread. Ranks 0 and 1
/// of `n` take part (the others only meet them in the barriers): from 33 ranks on a host there
/// are no rings, and the pair's messages go single-copy over its socket.
pub fn a_withdrawn_large_send_is_never_read_after_it_ends(n: usize) {
    const LEN: usize = 24 << 20;
    job_on("shm", n, 30_000, |c| {
        let me = c.rank();
        if me > 1 {
            c.collective(CollArgs::Barrier).unwrap();
            c.collective(CollArgs::Barrier).unwrap();
            return;
        }
        let other = 1 - me;
        if me == 0 {
            let mut big = vec![7u8; LEN];
            let op = c.post_send(ConstBuf::from_slice(&big), 1, 5).unwrap();
            let t0 = Instant::now();
            let e = c.wait_p2p(&op, Instant::now() + Duration::from_millis(300), &|| "send".into()).unwrap_err();
            let took = t0.elapsed();
            assert_eq!(e.status, Status::Timeout, "{e}");
            assert!(took < Duration::from_millis(1500), "the withdrawal took {took:?}: the receiver did not answer it");
            // The buffer is ours again: reused, then freed.
            big.iter_mut().for_each(|b| *b = 0xEE);
            drop(big);
        }
        c.collective(CollArgs::Barrier).unwrap();
        if me == 1 {
            let mut b = vec![0u8; LEN];
            let op = c.post_recv(MutBuf::from_slice(&mut b), Some(0), Some(5)).unwrap();
            let r = c.wait_p2p(&op, Instant::now() + Duration::from_millis(300), &|| "recv".into());
            assert_eq!(r.map_err(|e| e.status).err(), Some(Status::Timeout), "a withdrawn message was received");
            assert!(b.iter().all(|&x| x == 0), "a withdrawn message was written into a receive");
        }
        // The pair still works, both ways, with large messages.
        let mine: Vec<u8> = (0..LEN / 8).map(|i| (i * 3 + me) as u8).collect();
        let mut got = vec![0u8; LEN / 8];
        let r = c.post_recv(MutBuf::from_slice(&mut got), Some(other), Some(6)).unwrap();
        let s = c.post_send(ConstBuf::from_slice(&mine), other, 6).unwrap();
        c.wait_p2p(&s, c.op_deadline(), &|| "send".into()).unwrap();
        c.wait_p2p(&r, c.op_deadline(), &|| "recv".into()).unwrap();
        assert!(got.iter().enumerate().all(|(i, &x)| x == (i * 3 + other) as u8), "rank {me}: the message after a withdrawal is wrong");
        c.collective(CollArgs::Barrier).unwrap();
    });
}
