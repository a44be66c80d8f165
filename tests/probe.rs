//! Probes, matched probes, synchronous sends and withdrawing unmatched receives, through the
//! engine's Rust API (what the MPI layer calls): ranks as threads over TCP only and over
//! shared memory (rings, single-copy), and ranks as processes (the binary re-runs itself as
//! each rank, env `DC_TEST_ROLE`).

mod common;
use common::{free_port, wait_all};

use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::comm::{Comm, P2pOp, Probed};
use distcomm::error::Error;
use distcomm::rendezvous::config::InitOptions;
use distcomm::Status;
use std::process::Command;
use std::time::{Duration, Instant};

/// Large enough to be announced (single-copy or streamed) rather than sent whole.
const BIG: usize = 1 << 20;

fn pattern(who: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + who * 31 + k * 101) as u8).collect()
}

fn wait(c: &Comm, op: &P2pOp) -> distcomm::Result<distcomm::completion::Done> {
    c.wait_p2p(op, c.op_deadline(), &|| "p2p".into())
}

fn send(c: &Comm, data: &[u8], to: usize, tag: u32) {
    wait(c, &c.post_send(ConstBuf::from_slice(data), to, tag).unwrap()).unwrap();
}

fn recv(c: &Comm, len: usize, from: Option<usize>, tag: Option<u32>) -> Vec<u8> {
    let mut b = vec![0u8; len];
    let d = wait(c, &c.post_recv(MutBuf::from_slice(&mut b), from, tag).unwrap()).unwrap();
    b.truncate(d.bytes);
    b
}

/// Rank 1 sends to rank 0; the other ranks (if any) also send to rank 0 on other tags, so the
/// wildcards see more than one sender.
fn probes_and_matched_probes(c: &Comm) {
    let me = c.rank();
    if me == 0 {
        // Rank 1's small message (tag 7) comes before its large one (tag 8).
        let p = c.probe(Some(1), Some(8)).unwrap();
        assert_eq!(p, Probed { source: 1, tag: 8, bytes: BIG }, "the announced size");
        assert_eq!(c.probe(Some(1), None).unwrap(), Probed { source: 1, tag: 7, bytes: 16 }, "first sent, first probed");
        assert_eq!(c.iprobe(Some(1), None).unwrap().map(|p| p.tag), Some(7), "a probe takes nothing");
        assert_eq!(c.iprobe(Some(1), Some(99)).unwrap(), None);
        // Take the large one: no probe sees it any more, then receive the small one normally.
        let (p, big) = c.mprobe(None, Some(8)).unwrap();
        assert_eq!((p.source, p.bytes), (1, BIG));
        assert_eq!(c.iprobe(Some(1), Some(8)).unwrap(), None);
        assert_eq!(recv(c, 16, Some(1), Some(7)), vec![7u8; 16]);
        // Two more of one tag: taken in order, received out of order, each its own.
        let (p1, m1) = c.mprobe(Some(1), Some(9)).unwrap();
        let m2 = loop {
            if let Some((p2, m2)) = c.improbe(Some(1), Some(9)).unwrap() {
                assert_eq!((p1.bytes, p2.bytes), (BIG, 3));
                break m2;
            }
        };
        let mut small = [0u8; 3];
        wait(c, &c.post_recv_matched(m2, MutBuf::from_slice(&mut small)).unwrap()).unwrap();
        assert_eq!(small, [9, 9, 9]);
        let mut b = vec![0u8; BIG];
        let d = wait(c, &c.post_recv_matched(m1, MutBuf::from_slice(&mut b)).unwrap()).unwrap();
        assert_eq!((d.bytes, d.tag), (BIG, 9));
        assert!(b == pattern(1, 2, BIG), "the second large message");
        let mut b = vec![0u8; BIG];
        wait(c, &c.post_recv_matched(big, MutBuf::from_slice(&mut b)).unwrap()).unwrap();
        assert!(b == pattern(1, 1, BIG), "the first large message");
        // A matched message longer than its receive: truncated, nothing written past the end.
        let (_, m) = c.mprobe(Some(1), Some(10)).unwrap();
        let mut short = vec![0u8; BIG + 8];
        let e = wait(c, &c.post_recv_matched(m, MutBuf::from_slice(&mut short[..100])).unwrap()).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
        assert!(short[100..].iter().all(|&x| x == 0));
        // Any source: every other rank's message comes.
        let mut from: Vec<usize> = (2..c.size()).map(|_| c.mprobe(None, Some(11)).unwrap()).map(|(p, m)| {
            let mut b = [0u8; 1];
            wait(c, &c.post_recv_matched(m, MutBuf::from_slice(&mut b)).unwrap()).unwrap();
            assert_eq!(b[0] as usize, p.source);
            p.source
        }).collect();
        from.sort();
        assert_eq!(from, (2..c.size()).collect::<Vec<_>>());
    } else if me == 1 {
        // (The buffers outlive the sends.)
        let (s7, b8) = ([7u8; 16], pattern(1, 1, BIG));
        let ops = [c.post_send(ConstBuf::from_slice(&s7), 0, 7).unwrap(), c.post_send(ConstBuf::from_slice(&b8), 0, 8).unwrap()];
        let (b2, s3, b4) = (pattern(1, 2, BIG), [9u8; 3], pattern(1, 3, BIG));
        let more = [
            c.post_send(ConstBuf::from_slice(&b2), 0, 9).unwrap(),
            c.post_send(ConstBuf::from_slice(&s3), 0, 9).unwrap(),
            c.post_send(ConstBuf::from_slice(&b4), 0, 10).unwrap(),
        ];
        for op in ops.iter().chain(more.iter()) {
            wait(c, op).unwrap();
        }
    } else {
        send(c, &[me as u8], 0, 11);
    }
    c.collective(CollArgs::Barrier).unwrap();
}

/// A synchronous send is not done before a receive (or a matched probe) matched it.
fn synchronous_sends(c: &Comm) {
    let me = c.rank();
    for len in [4usize, BIG] {
        if me == 0 {
            let data = pattern(0, len, len);
            let op = c.post_ssend(ConstBuf::from_slice(&data), 1, 1).unwrap();
            let until = Instant::now() + Duration::from_millis(100);
            while Instant::now() < until {
                assert!(!c.p2p_is_done(&op), "done before rank 1 posted its receive");
                std::thread::yield_now();
            }
            send(c, &[1], 1, 2);
            wait(c, &op).unwrap();
            // Matched by a probe that takes it: done before the receive (when small: a large
            // message still in our memory is done only once it is fetched).
            let op = c.post_ssend(ConstBuf::from_slice(&data), 1, 3).unwrap();
            if len < 1000 {
                wait(c, &op).unwrap();
            }
            send(c, &[1], 1, 4);
            wait(c, &op).unwrap();
        } else if me == 1 {
            recv(c, 1, Some(0), Some(2));
            assert!(recv(c, len, Some(0), Some(1)) == pattern(0, len, len));
            let (p, m) = c.mprobe(Some(0), Some(3)).unwrap();
            assert_eq!((p.tag, p.bytes), (3, len));
            recv(c, 1, Some(0), Some(4));
            let mut b = vec![0u8; len];
            wait(c, &c.post_recv_matched(m, MutBuf::from_slice(&mut b)).unwrap()).unwrap();
            assert!(b == pattern(0, len, len));
        }
    }
    // Both ways at once, receives posted first; and to ourselves.
    let (next, prev) = ((me + 1) % c.size(), (me + c.size() - 1) % c.size());
    let mut b = [0u8; 1];
    let r = c.post_recv(MutBuf::from_slice(&mut b), Some(prev), Some(5)).unwrap();
    let s = c.post_ssend(ConstBuf::from_slice(&[me as u8]), next, 5).unwrap();
    wait(c, &s).unwrap();
    wait(c, &r).unwrap();
    assert_eq!(b[0] as usize, prev);
    let r = c.post_recv(MutBuf::from_slice(&mut b), Some(me), Some(6)).unwrap();
    wait(c, &c.post_ssend(ConstBuf::from_slice(&[42]), me, 6).unwrap()).unwrap();
    assert_eq!(wait(c, &r).unwrap().tag, 6, "a receiver sees the user tag");
    assert_eq!(b[0], 42);
    c.collective(CollArgs::Barrier).unwrap();
}

/// Withdrawing a receive works only while nothing matched it; a probe that waits too long
/// times out and leaves no trace.
fn withdrawing(c: &Comm) {
    let me = c.rank();
    let cancelled = || Error::new(Status::Aborted, "cancelled");
    let mut b = [0u8; 4];
    let op = c.post_recv(MutBuf::from_slice(&mut b), None, Some(20)).unwrap();
    assert!(c.cancel_unmatched(&op, cancelled));
    assert_eq!(c.p2p_result(&op).unwrap().unwrap_err().status, Status::Aborted);

    let op = c.post_recv(MutBuf::from_slice(&mut b), Some(me), Some(21)).unwrap();
    send(c, &[1, 2, 3, 4], me, 21);
    assert!(!c.cancel_unmatched(&op, cancelled), "it matched");
    assert_eq!(wait(c, &op).unwrap().bytes, 4);

    c.set_timeout_ms(200);
    let e = c.probe(None, Some(22)).unwrap_err();
    assert_eq!(e.status, Status::Timeout, "{e}");
    let e = c.mprobe(Some(me), Some(22)).unwrap_err();
    assert_eq!(e.status, Status::Timeout, "{e}");
    c.set_timeout_ms(20_000);
    send(c, &[5], me, 22);
    assert_eq!(recv(c, 1, Some(me), Some(22)), vec![5]);
    c.collective(CollArgs::Barrier).unwrap();
}

fn scenario(c: &Comm) {
    probes_and_matched_probes(c);
    synchronous_sends(c);
    withdrawing(c);
}

fn job_on(backend: &'static str, n: usize, f: fn(&Comm)) {
    common::thread_ranks(backend, n, 20_000, move |c| f(&c));
}

/// The C surface: dc_probe, dc_iprobe (element counts, bad arguments), dc_ssend.
fn c_surface(c: &Comm) {
    use distcomm::ffi::p2p::{dc_iprobe, dc_probe, dc_recv, dc_recv_info, dc_sendrecv, dc_ssend};
    use distcomm::ffi::types::{dc_status, DC_ANY_SOURCE, DC_ANY_TAG};
    let p = c as *const Comm as *mut Comm;
    let (me, other) = (c.rank(), 1 - c.rank());
    let f32_dt = distcomm::ffi::types::DC_FLOAT32;
    let ok = dc_status::DC_SUCCESS;
    unsafe {
        if me == 0 {
            let v = [1.5f32; 10];
            assert_eq!(dc_ssend(v.as_ptr().cast(), 10, f32_dt, 1, 4, p), ok);
            assert_eq!(dc_ssend(v.as_ptr().cast(), 1, f32_dt, 2, 4, p), dc_status::DC_ERR_INVALID_ARGUMENT, "rank out of range");
        } else {
            let mut info = dc_recv_info::default();
            assert_eq!(dc_probe(DC_ANY_SOURCE, DC_ANY_TAG, f32_dt, p, &mut info), ok);
            assert_eq!((info.source, info.tag, info.count), (other as i32, 4, 10));
            let mut flag = false;
            assert_eq!(dc_iprobe(other as i32, 4, distcomm::ffi::types::DC_UINT8, p, &mut flag, &mut info), ok);
            assert!(flag && info.count == 40, "bytes as uint8 elements");
            assert_eq!(dc_iprobe(other as i32, 5, f32_dt, p, &mut flag, std::ptr::null_mut()), ok);
            assert!(!flag);
            assert_eq!(dc_iprobe(7, 5, f32_dt, p, &mut flag, std::ptr::null_mut()), dc_status::DC_ERR_INVALID_ARGUMENT);
            assert_eq!(dc_iprobe(0, -9, f32_dt, p, &mut flag, std::ptr::null_mut()), dc_status::DC_ERR_INVALID_ARGUMENT);
            assert_eq!(dc_iprobe(0, 5, f32_dt, p, std::ptr::null_mut(), std::ptr::null_mut()), dc_status::DC_ERR_INVALID_ARGUMENT);
            let mut got = [0f32; 10];
            assert_eq!(dc_recv(got.as_mut_ptr().cast(), 10, f32_dt, other as i32, 4, p, &mut info), ok);
            assert_eq!(got, [1.5f32; 10]);
        }
        // dc_sendrecv between the two, small and large (each sends before the other's receive
        // is known to be there), with a bad call before that must leave no receive behind.
        let u8_dt = distcomm::ffi::types::DC_UINT8;
        let mut stray = [0u8; 4];
        let bad = dc_sendrecv(stray.as_ptr().cast(), 4, u8_dt, other as i32, 8, stray.as_mut_ptr().cast(), 4, u8_dt, other as i32, -3, p, std::ptr::null_mut());
        assert_eq!(bad, dc_status::DC_ERR_INVALID_ARGUMENT, "negative receive tag (not DC_ANY_TAG)");
        for len in [4usize, BIG] {
            let out = pattern(me, len, len);
            let mut got = vec![0u8; len];
            let mut info = dc_recv_info::default();
            let st = dc_sendrecv(out.as_ptr().cast(), len, u8_dt, other as i32, 8, got.as_mut_ptr().cast(), len, u8_dt, DC_ANY_SOURCE, 8, p, &mut info);
            assert_eq!(st, ok);
            assert_eq!((info.source, info.tag, info.count), (other as i32, 8, len));
            assert!(got == pattern(other, len, len), "{len} bytes from rank {other}");
        }
        assert_eq!(stray, [0u8; 4]);
        // A receive nobody sends to: the call times out once and leaves no receive open to
        // take the next message on its tag.
        c.set_timeout_ms(300);
        let mut got = [0u8; 4];
        let t = Instant::now();
        let st = dc_sendrecv([7u8; 4].as_ptr().cast(), 4, u8_dt, other as i32, 30, got.as_mut_ptr().cast(), 4, u8_dt, other as i32, 31, p, std::ptr::null_mut());
        assert_eq!(st, dc_status::DC_ERR_TIMEOUT);
        assert!(t.elapsed() < Duration::from_millis(1500), "took {:?}", t.elapsed());
        c.set_timeout_ms(20_000);
        c.collective(CollArgs::Barrier).unwrap();
        assert_eq!(dc_recv(got.as_mut_ptr().cast(), 4, u8_dt, other as i32, 30, p, std::ptr::null_mut()), ok);
        let mine = [me as u8 + 10; 4];
        let st = dc_sendrecv(mine.as_ptr().cast(), 4, u8_dt, other as i32, 31, got.as_mut_ptr().cast(), 4, u8_dt, other as i32, 31, p, std::ptr::null_mut());
        assert_eq!((st, got), (ok, [other as u8 + 10; 4]));
    }
    c.collective(CollArgs::Barrier).unwrap();
}

#[test]
fn the_c_surface_probes_and_sends_synchronously() {
    job_on("shm", 2, c_surface);
}

#[test]
fn probes_synchronous_sends_and_withdrawals_on_thread_ranks_over_tcp() {
    for n in [2, 3] {
        job_on("socket", n, scenario);
    }
}

#[test]
fn probes_synchronous_sends_and_withdrawals_on_thread_ranks_over_shared_memory() {
    for n in [2, 3] {
        job_on("shm", n, scenario);
    }
}

#[test]
fn probes_synchronous_sends_and_withdrawals_on_process_ranks() {
    for (n, transport) in [(2, "auto"), (3, "auto"), (2, "socket")] {
        let port = free_port().to_string();
        let children = (0..n)
            .map(|r| {
                Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
                    .env("DC_TEST_ROLE", "probe")
                    .env("RANK", r.to_string())
                    .env("WORLD_SIZE", n.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", &port)
                    .env("DC_TIMEOUT_MS", "20000")
                    .env("DC_TRANSPORT", transport)
                    .spawn()
                    .unwrap()
            })
            .collect();
        let codes = wait_all(children, Duration::from_secs(120));
        assert!(codes.iter().all(|&c| c == 0), "n={n} {transport}: exit codes {codes:?}");
    }
}

/// A rank process (see the process test).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("DC_TEST_ROLE") else { return };
    assert_eq!(role, "probe");
    let comm = distcomm::init::init(&InitOptions::from_env()).expect("init from the environment");
    scenario(&comm);
    comm.destroy();
}
