//! Ranks as threads in one process: each thread calls `init` (tcp:// rendezvous on loopback)
//! and exercises the engine through the Rust API that the C surface uses.

mod common;

use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;
use distcomm::{DType, ReduceOp, Status};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `f(comm)` on `n` thread-ranks of a fresh job and returns their results in rank order.
fn job<T: Send + 'static>(n: usize, timeout_ms: i64, f: impl Fn(Arc<Comm>) -> T + Send + Sync + 'static) -> Vec<T> {
    job_on("socket", n, timeout_ms, f)
}

fn job_on<T: Send + 'static>(backend: &'static str, n: usize, timeout_ms: i64, f: impl Fn(Arc<Comm>) -> T + Send + Sync + 'static) -> Vec<T> {
    common::thread_ranks(backend, n, timeout_ms, f)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn allreduce_and_friends_on_thread_ranks() {
    for (backend, n) in [("socket", 1), ("socket", 2), ("socket", 3), ("socket", 4), ("shm", 2), ("shm", 3), ("shm", 4)] {
        let out = job_on(backend, n, 20_000, move |c| {
            if n > 1 {
                assert_eq!(c.backend().to_str().unwrap(), backend);
            }
            let r = c.rank() as f32;
            let count = 100_003;
            let send = f32_bytes(&vec![r + 1.0; count]);
            let mut recv = vec![0u8; send.len()];
            c.collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Float32, op: ReduceOp::Sum })
                .unwrap();
            let mut bcast = if c.rank() == 0 { vec![7u8; 1000] } else { vec![0u8; 1000] };
            c.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut bcast), dt: DType::Uint8, root: 0 }).unwrap();
            assert!(bcast.iter().all(|&b| b == 7));
            c.collective(CollArgs::Barrier).unwrap();
            recv
        });
        let want = f32_bytes(&vec![(n * (n + 1) / 2) as f32; 100_003]);
        for r in &out {
            assert_eq!(r, &want, "n={n}");
        }
    }
}

#[test]
fn nonblocking_collectives_progress_in_the_background() {
    job(3, 20_000, |c| {
        let send = vec![1u8; 1 << 20];
        let mut recv = vec![0u8; 1 << 20];
        let req = c
            .start_collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Uint8, op: ReduceOp::Sum })
            .unwrap();
        let t0 = Instant::now();
        while !req.is_completed() {
            assert!(t0.elapsed() < Duration::from_secs(10), "never completed without a wait");
            std::thread::sleep(Duration::from_millis(1));
        }
        req.wait().unwrap();
        drop(req);
        assert!(recv.iter().all(|&b| b == 3));
    });
}

#[test]
fn point_to_point_any_source_and_truncation() {
    job(3, 20_000, |c| {
        if c.rank() == 0 {
            let mut seen = vec![];
            for _ in 0..2 {
                let mut b = [0u8; 4];
                let op = c.post_recv(MutBuf::from_slice(&mut b), None, Some(3)).unwrap();
                let d = c.wait_p2p(&op, c.op_deadline(), &|| "recv".into()).unwrap();
                seen.push((c.comm_rank_of(d.source), b[0]));
            }
            seen.sort();
            assert_eq!(seen, vec![(1, 10), (2, 20)]);
            let mut small = [0u8; 2];
            let op = c.post_recv(MutBuf::from_slice(&mut small), Some(1), Some(5)).unwrap();
            let e = c.wait_p2p(&op, c.op_deadline(), &|| "recv".into()).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument, "{e}");
        } else {
            let b = [c.rank() as u8 * 10; 4];
            let op = c.post_send(ConstBuf::from_slice(&b), 0, 3).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "send".into()).unwrap();
            if c.rank() == 1 {
                let op = c.post_send(ConstBuf::from_slice(&b), 0, 5).unwrap();
                c.wait_p2p(&op, c.op_deadline(), &|| "send".into()).unwrap();
            }
        }
        c.collective(CollArgs::Barrier).unwrap();
    });
}

#[test]
fn abort_from_another_thread_unblocks_a_waiter_and_its_peers() {
    let out = job(2, 30_000, |c| {
        let t0 = Instant::now();
        let r = if c.rank() == 0 {
            let c2 = c.clone();
            let aborter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                c2.abort();
            });
            let mut b = [0u8; 4];
            // Nobody sends this: only the abort can end the wait.
            let op = c.post_recv(MutBuf::from_slice(&mut b), Some(1), Some(99)).unwrap();
            let r = c.wait_p2p(&op, c.op_deadline(), &|| "recv".into());
            aborter.join().unwrap();
            r.map(|_| ())
        } else {
            let mut b = [0u8; 4];
            let op = c.post_recv(MutBuf::from_slice(&mut b), Some(0), Some(98)).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "recv".into()).map(|_| ())
        };
        (r.unwrap_err().status, t0.elapsed())
    });
    for (status, took) in out {
        assert_eq!(status, Status::Aborted);
        assert!(took < Duration::from_secs(10), "abort took {took:?}");
    }
}

#[test]
fn timeouts_name_the_peer() {
    job(2, 300, |c| {
        if c.rank() == 0 {
            let mut b = [0u8; 4];
            let op = c.post_recv(MutBuf::from_slice(&mut b), Some(1), Some(1)).unwrap();
            let e = c.wait_p2p(&op, c.op_deadline(), &|| "waiting for rank 1".into()).unwrap_err();
            assert_eq!(e.status, Status::Timeout);
            assert!(e.msg.contains("rank 1"), "{}", e.msg);
        }
        c.set_timeout_ms(20_000);
        c.collective(CollArgs::Barrier).unwrap();
    });
}

#[test]
fn groups_split_and_new_group() {
    job(4, 20_000, |c| {
        let g = c.split((c.rank() % 2) as i32, 0).unwrap().unwrap();
        assert_eq!(g.size(), 2);
        let send = [c.rank() as u8];
        let mut recv = [0u8; 1];
        g.collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Uint8, op: ReduceOp::Sum }).unwrap();
        assert_eq!(recv[0] as usize, if c.rank() % 2 == 0 { 2 } else { 4 });
        let rev = c.new_group(&[3, 2, 1, 0]).unwrap().unwrap();
        assert_eq!(rev.rank(), 3 - c.rank());
        rev.destroy();
        g.destroy();
    });
}

/// A new group's arena is made at its first collective: none for a group that never runs one;
/// non-blocking first collectives on two new groups, started in opposite orders on the two
/// ranks, do not wait for each other's set-up; a blocking one after a queued set-up waits for
/// it; then every group is on shared memory.
#[test]
fn new_groups_set_up_shared_memory_at_their_first_collective() {
    job_on("shm", 2, 20_000, |c| {
        let unused = c.new_group(&[0, 1]).unwrap().unwrap();
        assert_eq!(unused.backend().to_str().unwrap(), "shm");
        assert_eq!(unused.shm_bytes().0, 0, "no arena before a collective");
        unused.destroy();
        let (a, b) = (c.new_group(&[0, 1]).unwrap().unwrap(), c.new_group(&[0, 1]).unwrap().unwrap());
        let sum = |g: &Arc<Comm>, send: &[u8; 4], recv: &mut [u8; 4]| {
            g.start_collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(send)), recv: MutBuf::from_slice(recv), dt: DType::Int32, op: ReduceOp::Sum }).unwrap()
        };
        let (sa, sb) = ((c.rank() as i32 + 1).to_le_bytes(), (10 * (c.rank() as i32 + 1)).to_le_bytes());
        let (mut ra, mut rb) = ([0u8; 4], [0u8; 4]);
        let (qa, qb) = if c.rank() == 0 { let qa = sum(&a, &sa, &mut ra); (qa, sum(&b, &sb, &mut rb)) } else { let qb = sum(&b, &sb, &mut rb); (sum(&a, &sa, &mut ra), qb) };
        // Opposite order again: the waits must not depend on the other group's set-up.
        if c.rank() == 0 { qa.wait().unwrap(); qb.wait().unwrap(); } else { qb.wait().unwrap(); qa.wait().unwrap(); }
        drop((qa, qb));
        assert_eq!((i32::from_le_bytes(ra), i32::from_le_bytes(rb)), (3, 30));
        // A blocking call right behind a queued set-up.
        let g = c.new_group(&[1, 0]).unwrap().unwrap();
        let mut r = [0u8; 4];
        let q = sum(&g, &sa, &mut r);
        let mut x = [0u8; 4];
        g.collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&sb)), recv: MutBuf::from_slice(&mut x), dt: DType::Int32, op: ReduceOp::Sum }).unwrap();
        q.wait().unwrap();
        drop(q);
        assert_eq!((i32::from_le_bytes(r), i32::from_le_bytes(x)), (3, 30));
        for g in [a, b, g] {
            assert!(g.shm_bytes().0 > 0, "the arena is made");
            g.destroy();
        }
    });
}

/// A new group of the same members takes over the arena of one that every member destroyed (no
/// new segment), with its flags and mailboxes as new: 30 such groups in a row get right results
/// through the mailboxes and through staging. Where one member still has the old group, the
/// next gets an arena of its own.
#[test]
fn new_groups_take_over_the_arenas_of_destroyed_ones() {
    job_on("shm", 3, 20_000, |c| {
        let me = c.rank() as f32;
        let mut ids = Vec::new();
        for round in 0..30 {
            let g = c.new_group(&[0, 1, 2]).unwrap().unwrap();
            for len in [1usize, 700, 100_000] {
                let v: Vec<f32> = (0..len).map(|i| (round * 7 + i % 13) as f32 + me).collect();
                let got = allreduce_f32(&g, &v).unwrap();
                assert!(got.iter().enumerate().all(|(i, &x)| x == 3.0 * (round * 7 + i % 13) as f32 + 3.0), "round {round}, {len} floats");
            }
            ids.push(g.arena_id().expect("an arena"));
            g.destroy();
        }
        assert!(ids.iter().all(|&id| id == ids[0]), "every group took over the first one's arena: {ids:x?}");
        // Rank 2 keeps its group for now: the next group cannot have that arena.
        let kept = c.new_group(&[0, 1, 2]).unwrap().unwrap();
        allreduce_f32(&kept, &[me]).unwrap();
        let kept_id = kept.arena_id().unwrap();
        if c.rank() != 2 {
            kept.destroy();
        }
        let g = c.new_group(&[0, 1, 2]).unwrap().unwrap();
        assert_eq!(allreduce_f32(&g, &[me; 3000]).unwrap(), vec![3.0; 3000]);
        assert_ne!(g.arena_id().unwrap(), kept_id);
        if c.rank() == 2 {
            kept.destroy();
        }
        g.destroy();
        // Destroyed in different orders: rank 0 destroys two groups, rank 1 only the older
        // one for now; the next group takes over the older one, which everyone keeps.
        let (older, newer) = (c.new_group(&[0, 1, 2]).unwrap().unwrap(), c.new_group(&[0, 1, 2]).unwrap().unwrap());
        allreduce_f32(&older, &[me]).unwrap();
        allreduce_f32(&newer, &[me]).unwrap();
        let (older_id, newer_id) = (older.arena_id().unwrap(), newer.arena_id().unwrap());
        older.destroy();
        if c.rank() != 1 {
            newer.destroy();
        }
        let g = c.new_group(&[0, 1, 2]).unwrap().unwrap();
        assert_eq!(allreduce_f32(&g, &[me; 5]).unwrap(), vec![3.0; 5]);
        assert_eq!(g.arena_id().unwrap(), older_id, "the arena all members keep ({newer_id:x} is still rank 1's)");
        g.destroy();
        if c.rank() == 1 {
            newer.destroy();
        }
        // Other members: an arena of its own, then taken over by the next group of them.
        let mut pair_ids = Vec::new();
        for _ in 0..2 {
            if let Some(p) = c.new_group(&[0, 1]).unwrap() {
                assert_eq!(allreduce_f32(&p, &[me; 10]).unwrap(), vec![1.0; 10]);
                pair_ids.push(p.arena_id().unwrap());
                p.destroy();
            }
        }
        if c.rank() < 2 {
            assert!(pair_ids[0] != ids[0] && pair_ids[1] == pair_ids[0], "{pair_ids:x?}");
        }
        c.collective(CollArgs::Barrier).unwrap();
    });
}

fn allreduce_f32(c: &Comm, v: &[f32]) -> distcomm::Result<Vec<f32>> {
    let send = f32_bytes(v);
    let mut recv = vec![0u8; send.len()];
    c.collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Float32, op: ReduceOp::Sum })?;
    Ok(recv.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
}

#[test]
fn shared_memory_mismatches_fail_on_every_rank_and_the_comm_keeps_working() {
    let out = job_on("shm", 3, 20_000, |c| {
        // rank 2 passes a different count
        let n = if c.rank() == 2 { 12 } else { 10 };
        let e = allreduce_f32(&c, &vec![1.0; n]).unwrap_err();
        assert_eq!(e.status, Status::Mismatch, "{e}");
        assert!(e.msg.contains("rank 2") || c.rank() == 2, "{}", e.msg);
        // rank 0 calls a barrier where the others allreduce
        let r = if c.rank() == 0 { c.collective(CollArgs::Barrier) } else { allreduce_f32(&c, &[1.0]).map(|_| ()) };
        assert_eq!(r.unwrap_err().status, Status::Mismatch);
        // afterwards the ranks agree again and it works
        allreduce_f32(&c, &vec![1.0; 100_000]).unwrap()
    });
    for v in out {
        assert!(v.iter().all(|&x| x == 3.0));
    }
}

/// Small broadcasts and reduces go through per-rank mailboxes on shared memory: roots (and
/// reduce contributors) run ahead of the readers by up to the mailbox count, and every result is
/// right. A reader whose size disagrees with the root's gets DC_ERR_MISMATCH; so does a rank
/// that skipped a collective, at its next one (it meets the others' previous call), while the
/// others wait for it: they fail when it leaves (DC_ERR_PEER_LOST naming it), or at their
/// timeout. (DC_DEBUG=DETAIL catches that on every rank.)
#[test]
fn small_broadcasts_and_reduces_run_ahead_and_disagreements_are_caught() {
    job_on("shm", 3, 20_000, |c| {
        let (me, n) = (c.rank(), c.size());
        for k in 0..300u32 {
            let root = (k as usize / 50) % n;
            let mut b = if me == root { (k * 3).to_le_bytes() } else { [0u8; 4] };
            c.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b), dt: DType::Uint8, root }).unwrap();
            assert_eq!(u32::from_le_bytes(b), k * 3, "rank {me}: broadcast {k}");
            let mine = ((me as u32 + 1) * k).to_le_bytes();
            let mut sum = [0u8; 4];
            let recv = (me == root).then(|| MutBuf::from_slice(&mut sum));
            c.collective(CollArgs::Reduce { send: Some(ConstBuf::from_slice(&mine)), recv, bytes: 4, dt: DType::Uint32, op: ReduceOp::Sum, root }).unwrap();
            if me == root {
                assert_eq!(u32::from_le_bytes(sum), 6 * k, "reduce {k}");
            }
        }
        // rank 2 expects 12 bytes where the root sends 10
        let mut b = vec![7u8; if me == 2 { 12 } else { 10 }];
        let r = c.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b), dt: DType::Uint8, root: 0 });
        if me == 2 {
            let e = r.unwrap_err();
            assert_eq!(e.status, Status::Mismatch, "{e}");
            assert!(e.msg.contains("rank 0"), "{}", e.msg);
        } else {
            r.unwrap();
        }
        // still in step: this works everywhere
        assert_eq!(allreduce_f32(&c, &[1.0; 5]).unwrap(), vec![3.0; 5]);
        // a large allreduce with one rank disagreeing on the size: every rank notices
        let e = allreduce_f32(&c, &vec![1.0; if me == 1 { 5000 } else { 6000 }]).unwrap_err();
        assert_eq!(e.status, Status::Mismatch, "rank {me}: {e}");
        // and a small one against a large one (mailbox against steps): likewise
        let e = allreduce_f32(&c, &vec![1.0; if me == 2 { 5 } else { 6000 }]).unwrap_err();
        assert_eq!(e.status, Status::Mismatch, "rank {me}: {e}");
        // rank 1 skips a broadcast: its allreduce meets the others' broadcast
        if me != 1 {
            let mut b = [0u8; 8];
            c.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b), dt: DType::Uint8, root: 0 }).unwrap();
        }
        match allreduce_f32(&c, &[1.0; 5]) {
            Err(e) if me == 1 => assert_eq!(e.status, Status::Mismatch, "{e}"),
            Err(e) => assert!(e.status == Status::PeerLost && e.msg.contains("rank 1"), "rank {me}: {e}"),
            Ok(v) => panic!("rank {me}: a skipped collective went unnoticed: {v:?}"),
        }
    });
}

#[test]
fn shared_memory_large_and_inexact_results_are_identical_everywhere() {
    let out = job_on("shm", 3, 20_000, |c| {
        let r = c.rank() as f32;
        let v: Vec<f32> = (0..300_001).map(|i| (i as f32 * 0.37 + r).sin() * 1e3).collect();
        let sum = allreduce_f32(&c, &v).unwrap();
        // the non-blocking form on the worker thread interleaves with blocking calls in order
        let send = f32_bytes(&v);
        let mut recv = vec![0u8; send.len()];
        let req = c
            .start_collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Float32, op: ReduceOp::Sum })
            .unwrap();
        let again = allreduce_f32(&c, &v).unwrap();
        req.wait().unwrap();
        drop(req);
        assert_eq!(f32_bytes(&sum), recv);
        assert_eq!(sum, again);
        sum
    });
    assert_eq!(f32_bytes(&out[0]), f32_bytes(&out[1]));
    assert_eq!(f32_bytes(&out[0]), f32_bytes(&out[2]));
}

#[test]
fn abort_reaches_a_rank_waiting_on_shared_memory() {
    let out = job_on("shm", 2, 30_000, |c| {
        let t0 = Instant::now();
        let r = if c.rank() == 0 {
            std::thread::sleep(Duration::from_millis(300));
            c.abort();
            Err(distcomm::Error::new(Status::Aborted, "self"))
        } else {
            // waits in the step protocol for rank 0, which never comes
            c.collective(CollArgs::Barrier)
        };
        (r.unwrap_err().status, t0.elapsed())
    });
    assert_eq!(out[1].0, Status::Aborted);
    assert!(out[1].1 < Duration::from_secs(5), "{:?}", out[1].1);
}

#[test]
fn shared_memory_large_broadcasts_from_every_root() {
    // From 64 KiB the others read the root's buffer directly, from 256 KiB with the root
    // writing pieces too; below, it is staged (every size, every root, the buffer's old bytes
    // overwritten everywhere but at the root).
    job_on("shm", 3, 20_000, |c| {
        let (n, me) = (c.size(), c.rank());
        for len in [64 * 1024 - 8, 64 * 1024, 256 * 1024 - 1, 256 * 1024, 700_001, (3 << 20) + 1] {
            for root in 0..n {
                let want: Vec<u8> = (0..len).map(|i| (i * 11 + root * 5 + len) as u8).collect();
                let mut b = if me == root { want.clone() } else { vec![0xEE; len] };
                c.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b), dt: DType::Uint8, root }).unwrap();
                assert!(b == want, "rank {me}: broadcast of {len} bytes from {root}");
            }
        }
    });
}

/// Staged broadcasts (above the mailbox size, below the direct read) let the root go on once it
/// has staged: it runs ahead of readers that dawdle, yet never overwrites a staging slot before
/// they copied it out, also when a staged allgather follows. A reader whose size disagrees gets
/// DC_ERR_MISMATCH naming the root.
#[test]
fn staged_broadcast_roots_run_ahead_without_overwriting_unread_data() {
    job_on("shm", 3, 20_000, |c| {
        let (n, me) = (c.size(), c.rank());
        for k in 0..60usize {
            let root = (k / 7) % n;
            let len = [4096, 8192 + 8, 20_000, 40_000][k % 4];
            if me != root && k % 3 == me {
                std::thread::sleep(Duration::from_millis(2));
            }
            let want: Vec<u8> = (0..len).map(|i| (i * 7 + k * 13 + root) as u8).collect();
            let mut b = if me == root { want.clone() } else { vec![0xEE; len] };
            c.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b), dt: DType::Uint8, root }).unwrap();
            assert!(b == want, "rank {me}: broadcast {k} of {len} bytes from {root}");
            if k % 5 == 4 {
                let block = 3000;
                let mine: Vec<u8> = (0..block).map(|i| (i + me * 31 + k) as u8).collect();
                let mut all = vec![0u8; n * block];
                c.collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&mine)), recv: MutBuf::from_slice(&mut all), dt: DType::Uint8 }).unwrap();
                for r in 0..n {
                    assert!((0..block).all(|i| all[r * block + i] == (i + r * 31 + k) as u8), "rank {me}: allgather {k} block {r}");
                }
            }
        }
        let mut b = vec![1u8; if me == 2 { 5000 } else { 6000 }];
        let r = c.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b), dt: DType::Uint8, root: 0 });
        if me == 2 {
            let e = r.unwrap_err();
            assert_eq!(e.status, Status::Mismatch, "{e}");
            assert!(e.msg.contains("rank 0"), "{}", e.msg);
        }
    });
}

/// Allgather blocks from 32 to 128 KiB are read straight from the others' buffers, smaller and
/// larger ones staged: blocks on both sides of both limits, out of place and in place, every
/// byte checked.
#[test]
fn allgather_blocks_around_the_direct_range() {
    job_on("shm", 3, 20_000, |c| {
        for block in [32 * 1024 - 8, 32 * 1024, 64 * 1024 + 8, 128 * 1024, 128 * 1024 + 8] {
            allgather_both_ways(&c, block, |r, i| (i * 5 + r * 77 + block) as u8);
        }
    });
}

/// An allgather of `block`-byte blocks out of place and one in place, every byte checked
/// (`byte(r, i)`: byte `i` of rank `r`'s block).
fn allgather_both_ways(c: &Comm, block: usize, byte: impl Fn(usize, usize) -> u8) {
    let (n, me) = (c.size(), c.rank());
    let mine: Vec<u8> = (0..block).map(|i| byte(me, i)).collect();
    let mut all = vec![0u8; n * block];
    c.collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&mine)), recv: MutBuf::from_slice(&mut all), dt: DType::Uint8 }).unwrap();
    assert!((0..n * block).all(|k| all[k] == byte(k / block, k % block)), "rank {me}: allgather of {block}-byte blocks");
    let mut inplace = vec![0u8; n * block];
    inplace[me * block..(me + 1) * block].copy_from_slice(&mine);
    c.collective(CollArgs::Allgather { send: None, recv: MutBuf::from_slice(&mut inplace), dt: DType::Uint8 }).unwrap();
    assert!(inplace == all, "rank {me}: in-place allgather of {block}-byte blocks");
}

/// Large allgathers are staged or read directly, whichever rank 0 measured to be faster lately
/// (the first call stages, the second reads directly, then the faster with the other now and
/// then): a run of them, out of place and in place, every byte checked.
#[test]
fn large_allgathers_either_way_arrive_whole() {
    job_on("shm", 3, 20_000, |c| {
        for k in 0..8 {
            allgather_both_ways(&c, (1 << 20) + 8 * k, |r, i| (i * 3 + r * 101 + k) as u8);
        }
    });
}

/// Large allreduces and reduce_scatters are staged or read once, whichever rank 0 measured to
/// be faster lately (the allgathers' way of choosing): a run of them, in and out of place, each
/// result the very bits of the inputs summed in rank order, whichever way it went.
#[test]
fn large_reductions_either_way_give_the_same_bits() {
    job_on("shm", 3, 20_000, |c| {
        let (n, me) = (c.size(), c.rank());
        let value = |r: usize, i: usize| ((i * 7 + r * 13) % 1000) as f32 * 0.37 + r as f32 * 1e-3;
        let summed = |i: usize| (1..n).fold(value(0, i), |acc, r| acc + value(r, i));
        let sum = ReduceOp::Sum;
        for k in 0..8 {
            let count = (1 << 18) + 5 * k;
            let mine = f32_bytes(&(0..count).map(|i| value(me, i)).collect::<Vec<_>>());
            let want = f32_bytes(&(0..count).map(summed).collect::<Vec<_>>());
            let mut out = vec![0u8; mine.len()];
            c.collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&mine)), recv: MutBuf::from_slice(&mut out), dt: DType::Float32, op: sum }).unwrap();
            assert!(out == want, "rank {me}: allreduce {k} of {count} floats");
            let mut inplace = mine.clone();
            c.collective(CollArgs::Allreduce { send: None, recv: MutBuf::from_slice(&mut inplace), dt: DType::Float32, op: sum }).unwrap();
            assert!(inplace == want, "rank {me}: in-place allreduce {k} of {count} floats");

            let block = ((1 << 18) / n + 1 + k) * 4;
            let input = f32_bytes(&(0..n * block / 4).map(|i| value(me, i)).collect::<Vec<_>>());
            let want = f32_bytes(&(me * block / 4..(me + 1) * block / 4).map(summed).collect::<Vec<_>>());
            let mut out = vec![0u8; block];
            c.collective(CollArgs::ReduceScatter { send: Some(ConstBuf::from_slice(&input)), recv: MutBuf::from_slice(&mut out), dt: DType::Float32, op: sum }).unwrap();
            assert!(out == want, "rank {me}: reduce_scatter {k} of {block}-byte blocks");
            let mut inplace = input.clone();
            c.collective(CollArgs::ReduceScatter { send: None, recv: MutBuf::from_slice(&mut inplace), dt: DType::Float32, op: sum }).unwrap();
            assert!(inplace[me * block..(me + 1) * block] == want[..], "rank {me}: in-place reduce_scatter {k} of {block}-byte blocks");
        }
    });
}

#[test]
fn shared_memory_large_alltoall_and_allgather() {
    // Large blocks: the alltoall reads them from the peers' memory, the allgather stages them
    // through the arena in several pieces (larger than a slot's share).
    let block = 300 * 1024 + 8;
    job_on("shm", 3, 20_000, move |c| {
        let (n, me) = (c.size(), c.rank());
        let send: Vec<u8> = (0..n * block).map(|i| (i * 7 + me * 13) as u8).collect();
        let mut recv = vec![0u8; n * block];
        c.collective(CollArgs::Alltoall { send: ConstBuf::from_slice(&send), recv: MutBuf::from_slice(&mut recv), dt: DType::Uint8 }).unwrap();
        for r in 0..n {
            for i in (0..block).step_by(997) {
                assert_eq!(recv[r * block + i], ((me * block + i) * 7 + r * 13) as u8, "alltoall block {r} byte {i}");
            }
        }
        let mine: Vec<u8> = (0..block).map(|i| (i + me * 31) as u8).collect();
        let mut all = vec![0u8; n * block];
        c.collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&mine)), recv: MutBuf::from_slice(&mut all), dt: DType::Uint8 }).unwrap();
        for r in 0..n {
            for i in (0..block).step_by(991) {
                assert_eq!(all[r * block + i], (i + r * 31) as u8, "allgather block {r} byte {i}");
            }
        }
        // alltoallv with uneven blocks, and a receiver that expects the wrong count
        let counts: Vec<usize> = (0..n).map(|j| (me + j) % 3 * 1000).collect();
        let displs: Vec<usize> = counts.iter().scan(0, |acc, &c| { let d = *acc; *acc += c; Some(d) }).collect();
        let rcounts: Vec<usize> = (0..n).map(|r| (r + me) % 3 * 1000).collect();
        let rdispls: Vec<usize> = rcounts.iter().scan(0, |acc, &c| { let d = *acc; *acc += c; Some(d) }).collect();
        let mut out = vec![0u8; rcounts.iter().sum()];
        c.collective(CollArgs::Alltoallv {
            send: ConstBuf::from_slice(&send),
            scounts: counts.clone(),
            sdispls: displs.clone(),
            recv: MutBuf::from_slice(&mut out),
            rcounts: rcounts.clone(),
            rdispls: rdispls.clone(),
            dt: DType::Uint8,
        })
        .unwrap();
        for r in 0..n {
            let their_displ: usize = (0..me).map(|j| (r + j) % 3 * 1000).sum();
            for i in 0..rcounts[r] {
                assert_eq!(out[rdispls[r] + i], ((their_displ + i) * 7 + r * 13) as u8);
            }
        }
    });
}

/// Between ranks with shared-memory rings, bodies up to 32 KiB go inside the ring and larger
/// ones (up to the ring's inline limit and beyond) single-copy: sizes on both sides of both
/// limits, several in flight each way before any is awaited, arrive whole and in order.
#[test]
fn ring_messages_around_the_inline_limits_arrive_whole_and_in_order() {
    job_on("shm", 2, 20_000, |c| {
        let (me, other) = (c.rank(), 1 - c.rank());
        let sizes = [32 * 1024 - 1, 32 * 1024, 32 * 1024 + 1, 48 * 1024, 64 * 1024, 64 * 1024 + 1, 300_000];
        let body = |who: usize, k: usize, len: usize| -> Vec<u8> { (0..len).map(|i| (i * 13 + who * 7 + k * 29) as u8).collect() };
        let wait = |op: &distcomm::comm::P2pOp| c.wait_p2p(op, c.op_deadline(), &|| "p2p".into()).unwrap();
        for round in 0..3 {
            let mine: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(k, &len)| body(me, k + round, len)).collect();
            let sends: Vec<_> = mine.iter().map(|m| c.post_send(ConstBuf::from_slice(m), other, 5).unwrap()).collect();
            for (k, &len) in sizes.iter().enumerate() {
                let mut got = vec![0u8; len];
                let d = wait(&c.post_recv(MutBuf::from_slice(&mut got), Some(other), Some(5)).unwrap());
                assert_eq!(d.bytes, len, "rank {me}: message {k} of round {round}");
                assert!(got == body(other, k + round, len), "rank {me}: message {k} ({len} bytes) of round {round} is wrong or out of order");
            }
            sends.iter().for_each(|op| {
                wait(op);
            });
        }
    });
}

/// Single-copy messages (above the 256 KiB threshold, read with process_vm_readv) whose receive
/// comes late are parked in the sender's memory: a receive posted soon copies them from there, a
/// receive that does not come frees the sender after a millisecond (two ranks that both send
/// first do not deadlock), per-pair-and-tag order holds, and a withdrawn receive gives its
/// message back.
#[test]
fn late_receives_of_single_copy_messages() {
    const LEN: usize = 1 << 20;
    let pattern = |who: usize, k: usize| -> Vec<u8> { (0..LEN).map(|i| (i * 7 + who * 31 + k * 101) as u8).collect() };
    // Single-copy needs a same-host transport choice (the socket backend turns it off).
    job_on("shm", 2, 20_000, move |c| {
        let me = c.rank();
        let other = 1 - me;
        let wait = |op: &distcomm::comm::P2pOp| c.wait_p2p(op, c.op_deadline(), &|| "p2p".into()).unwrap();
        // Both send before either receives.
        let mine = pattern(me, 0);
        wait(&c.post_send(ConstBuf::from_slice(&mine), other, 1).unwrap());
        let mut got = vec![0u8; LEN];
        wait(&c.post_recv(MutBuf::from_slice(&mut got), Some(other), Some(1)).unwrap());
        assert!(got == pattern(other, 0), "rank {me}: the crossed message is wrong");
        c.collective(CollArgs::Barrier).unwrap();
        if me == 1 {
            // Three large messages and a small one on tag 2, none awaited yet, then a note on
            // tag 3: it arrives after them on the same connection.
            let msgs: Vec<Vec<u8>> = (1..4).map(|k| pattern(1, k)).chain([vec![9u8; 16]]).collect();
            let ops: Vec<_> = msgs.iter().map(|m| c.post_send(ConstBuf::from_slice(m), 0, 2).unwrap()).collect();
            wait(&c.post_send(ConstBuf::from_slice(&[1u8]), 0, 3).unwrap());
            ops.iter().for_each(|op| {
                wait(op);
            });
        } else {
            let mut note = [0u8; 1];
            wait(&c.post_recv(MutBuf::from_slice(&mut note), Some(1), Some(3)).unwrap());
            // The three are parked now (unless this thread lost its core for over a
            // millisecond). A receive claims the first and is withdrawn before any wait makes
            // the copy: the message goes back, first in line. (If the progress thread copied
            // it first, or, between ranks with shared-memory rings, the claim asked the sender
            // to stream it, the receive completed and has it: then the others follow.)
            let mut first = vec![0u8; LEN];
            let op = c.post_recv(MutBuf::from_slice(&mut first), Some(1), Some(2)).unwrap();
            c.cancel_p2p(&op, || distcomm::error::Error::new(Status::Aborted, "withdrawn"));
            let took_it = matches!(c.p2p_result(&op), Some(Ok(_)));
            if took_it {
                assert!(first == pattern(1, 1), "message 1 is wrong");
            } else {
                assert!(first.iter().all(|&b| b == 0), "a withdrawn receive was written");
            }
            for k in (if took_it { 2 } else { 1 })..4 {
                if k == 2 {
                    // Past the parking limit the rest are copied out, and still come in order.
                    std::thread::sleep(Duration::from_millis(20));
                }
                let mut b = vec![0u8; LEN];
                let d = wait(&c.post_recv(MutBuf::from_slice(&mut b), Some(1), Some(2)).unwrap());
                assert_eq!(d.bytes, LEN);
                assert!(b == pattern(1, k), "message {k} is wrong or out of order");
            }
            let mut small = [0u8; 16];
            assert_eq!(wait(&c.post_recv(MutBuf::from_slice(&mut small), Some(1), Some(2)).unwrap()).bytes, 16);
            assert_eq!(small, [9u8; 16]);
        }
        c.collective(CollArgs::Barrier).unwrap();
    });
}

#[path = "common/large_p2p.rs"]
mod large_p2p;

/// Large messages between ranks of one host, read from the sender's memory (the same tests
/// with the messages streamed through the rings: tests/ring_streams.rs).
#[test]
fn large_messages_arrive_whole_and_truncate_safely() {
    large_p2p::arrive_whole_and_truncate_safely();
}

#[test]
fn a_withdrawn_large_send_is_never_read_after_it_ends() {
    large_p2p::a_withdrawn_large_send_is_never_read_after_it_ends(2);
}

/// The same over the sockets of a same-host pair without rings (34 ranks on the host).
#[test]
fn a_withdrawn_large_send_over_a_socket_is_never_read_after_it_ends() {
    large_p2p::a_withdrawn_large_send_is_never_read_after_it_ends(34);
}

#[test]
fn an_abort_ends_a_large_message() {
    large_p2p::an_abort_ends_a_large_message();
}

#[test]
fn ring_messages_keep_order_in_both_directions() {
    large_p2p::keep_order_in_both_directions();
}

/// A blocking receive takes a small message straight from its ring only where MPI's order
/// allows: a receive posted before it gets the first message, a message filed as unexpected
/// comes before one still in the ring, a synchronous send's message is matched (and answered)
/// the usual way, and a message too long for the buffer is a clean truncation. The later
/// message is sent just as the receive starts (the ring's first look sees it arrive), many
/// times over; each case fails if it is taken regardless (checked by breaking
/// `Matcher::clear_for` and the tag test).
#[test]
fn blocking_receives_taken_from_the_ring_keep_mpi_order() {
    job_on("shm", 2, 20_000, |c| {
        let send = |b: &[u8], tag: u32| {
            let op = c.post_send(ConstBuf::from_slice(b), 1 - c.rank(), tag).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "send".into()).unwrap();
        };
        let recv = |tag: u32| -> Result<u8, distcomm::Error> {
            let mut b = [0u8; 4];
            let by = c.op_deadline();
            c.recv_blocking(MutBuf::from_slice(&mut b), Some(1 - c.rank()), Some(tag), &|| by, &|| "recv".into()).map(|_| b[0])
        };
        for k in 0..100u8 {
            let k = k * 2;
            if c.rank() == 0 {
                // A receive posted first takes the first message.
                let mut early = [0u8; 4];
                let posted = c.post_recv(MutBuf::from_slice(&mut early), Some(1), Some(5)).unwrap();
                send(&[k], 1);
                assert_eq!(recv(5).unwrap(), k + 1, "round {k}: the blocking receive took the posted receive's message");
                c.wait_p2p(&posted, c.op_deadline(), &|| "posted".into()).unwrap();
                assert_eq!(early[0], k);
                // A message filed as unexpected (the receive of tag 9 read past it) comes first.
                assert_eq!(recv(9).unwrap(), 90);
                send(&[k], 1);
                assert_eq!(recv(5).unwrap(), k, "round {k}: a message still in the ring overtook an unexpected one");
                assert_eq!(recv(5).unwrap(), k + 1);
                // A synchronous send's message is matched and answered as usual.
                send(&[k], 1);
                assert_eq!(recv(5).unwrap(), k, "round {k}: the synchronous send's message was passed over");
                assert_eq!(recv(5).unwrap(), k + 1);
                // Too long for the buffer: truncated, and the next message is intact.
                send(&[k], 1);
                let mut small = [0u8; 2];
                let by = c.op_deadline();
                let e = c.recv_blocking(MutBuf::from_slice(&mut small), Some(1), Some(5), &|| by, &|| "recv".into()).unwrap_err();
                assert_eq!(e.status, Status::InvalidArgument, "{e}");
                assert_eq!(recv(5).unwrap(), k + 1);
            } else {
                recv(1).unwrap();
                send(&[k; 4], 5);
                send(&[k + 1; 4], 5);
                send(&[k; 4], 5);
                send(&[90; 4], 9);
                recv(1).unwrap();
                send(&[k + 1; 4], 5);
                recv(1).unwrap();
                let sync = c.post_ssend(ConstBuf::from_slice(&[k; 4]), 0, 5).unwrap();
                send(&[k + 1; 4], 5);
                c.wait_p2p(&sync, c.op_deadline(), &|| "ssend".into()).unwrap();
                recv(1).unwrap();
                send(&[k; 4], 5);
                send(&[k + 1; 4], 5);
            }
        }
        c.collective(CollArgs::Barrier).unwrap();
    });
}

/// Over sockets a waiting thread reads and writes the connections itself while it spins, and
/// the progress thread stands aside: data that another thread of the rank queued (a send
/// larger than the socket buffer) must still go out while this one waits, and after it stops.
#[test]
fn a_spinning_waiter_moves_another_threads_queued_send() {
    const BIG: usize = 48 << 20;
    let out = job(2, 20_000, |c| {
        if c.rank() == 0 {
            let waiter = {
                let c = c.clone();
                std::thread::spawn(move || {
                    // Answered only after rank 1 has the whole big message.
                    let mut got = [0u8; 4];
                    let op = c.post_recv(MutBuf::from_slice(&mut got), Some(1), Some(1)).unwrap();
                    c.wait_p2p(&op, c.op_deadline(), &|| "reply".into()).unwrap();
                    got
                })
            };
            std::thread::sleep(Duration::from_millis(50));
            let big: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
            // Started, not waited for: while the waiter spins, only it (or the progress thread,
            // once the waiter sleeps) moves the rest of the message.
            let op = c.post_send(ConstBuf::from_slice(&big), 1, 2).unwrap();
            let got = waiter.join().unwrap().to_vec();
            c.wait_p2p(&op, c.op_deadline(), &|| "big send".into()).unwrap();
            got
        } else {
            let mut big = vec![0u8; BIG];
            let op = c.post_recv(MutBuf::from_slice(&mut big), Some(0), Some(2)).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "big recv".into()).unwrap();
            assert!(big.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            let reply = [9u8; 4];
            let op = c.post_send(ConstBuf::from_slice(&reply), 0, 1).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "reply".into()).unwrap();
            Vec::new()
        }
    });
    assert_eq!(out[0], vec![9u8; 4]);
}

/// Over sockets a receive posted while a large message for it is already arriving takes it
/// over mid-way (the rest lands in place): contents and order must come out as sent.
#[test]
fn a_receive_posted_while_its_message_arrives_gets_it_whole_and_in_order() {
    const BIG: usize = 40 << 20;
    let pattern = |k: usize, i: usize| ((i * 7 + k * 13) % 251) as u8;
    let out = job(2, 20_000, move |c| {
        if c.rank() == 0 {
            let msgs: Vec<Vec<u8>> = (0..3).map(|k| (0..BIG).map(|i| pattern(k, i)).collect()).collect();
            let go = [1u8];
            let op = c.post_send(ConstBuf::from_slice(&go), 1, 1).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "go".into()).unwrap();
            let ops: Vec<_> = msgs.iter().map(|m| c.post_send(ConstBuf::from_slice(m), 1, 7).unwrap()).collect();
            for op in &ops {
                c.wait_p2p(op, c.op_deadline(), &|| "send".into()).unwrap();
            }
            true
        } else {
            // Let the first message start arriving with no receive posted.
            let mut go = [0u8];
            let op = c.post_recv(MutBuf::from_slice(&mut go), Some(0), Some(1)).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "go".into()).unwrap();
            std::thread::sleep(Duration::from_millis(3));
            let mut bufs = vec![vec![0u8; BIG]; 3];
            let (a, rest) = bufs.split_at_mut(1);
            let (b, c2) = rest.split_at_mut(1);
            let ops = [
                c.post_recv(MutBuf::from_slice(&mut a[0]), Some(0), Some(7)).unwrap(),
                c.post_recv(MutBuf::from_slice(&mut b[0]), None, Some(7)).unwrap(),
                c.post_recv(MutBuf::from_slice(&mut c2[0]), None, None).unwrap(),
            ];
            for op in &ops {
                let d = c.wait_p2p(op, c.op_deadline(), &|| "recv".into()).unwrap();
                assert_eq!(d.bytes, BIG);
            }
            bufs.iter().enumerate().all(|(k, b)| b.iter().enumerate().all(|(i, &x)| x == pattern(k, i)))
        }
    });
    assert!(out.iter().all(|&ok| ok), "messages arrive whole and in the order sent");
}

/// A receive too small for a large message that is already arriving: the message is cut
/// (truncation error, nothing written past the buffer) and the next message on the connection
/// arrives intact.
#[test]
fn a_too_small_receive_posted_while_its_message_arrives_is_truncated_cleanly() {
    const BIG: usize = 40 << 20;
    let out = job(2, 20_000, move |c| {
        if c.rank() == 0 {
            let big = vec![3u8; BIG];
            let after = [5u8; 100];
            let go = [1u8];
            let op = c.post_send(ConstBuf::from_slice(&go), 1, 1).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "go".into()).unwrap();
            let ops = [c.post_send(ConstBuf::from_slice(&big), 1, 7).unwrap(), c.post_send(ConstBuf::from_slice(&after), 1, 7).unwrap()];
            for op in &ops {
                c.wait_p2p(op, c.op_deadline(), &|| "send".into()).unwrap();
            }
            Ok(())
        } else {
            let mut go = [0u8];
            let op = c.post_recv(MutBuf::from_slice(&mut go), Some(0), Some(1)).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "go".into()).unwrap();
            std::thread::sleep(Duration::from_millis(3));
            let mut small = vec![0u8; (1 << 20) + 8];
            let op = c.post_recv(MutBuf::from_slice(&mut small[..1 << 20]), Some(0), Some(7)).unwrap();
            let e = c.wait_p2p(&op, c.op_deadline(), &|| "recv".into()).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument, "{}", e.msg);
            assert!(small[..1 << 20].iter().all(|&b| b == 3) && small[1 << 20..].iter().all(|&b| b == 0));
            let mut next = [0u8; 100];
            let op = c.post_recv(MutBuf::from_slice(&mut next), Some(0), Some(7)).unwrap();
            c.wait_p2p(&op, c.op_deadline(), &|| "recv".into()).unwrap();
            assert!(next.iter().all(|&b| b == 5));
            Ok::<(), String>(())
        }
    });
    assert!(out.iter().all(|r| r.is_ok()));
}

/// Checks allreduce (eager, one-step and chunked), allgather and alltoall (eager and staged,
/// blocks over several pieces), and a ring of point-to-point messages (inline, streamed or
/// single-copy), on any size of job; returns this rank's shared-memory bytes.
fn collectives_and_neighbours(c: &Comm) -> (usize, usize) {
    let (n, me) = (c.size(), c.rank());
    for count in [4usize, 2048, 262_147] {
        let send = f32_bytes(&(0..count).map(|i| (me + i % 7) as f32).collect::<Vec<_>>());
        let mut recv = vec![0u8; send.len()];
        c.collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Float32, op: ReduceOp::Sum }).unwrap();
        let want = f32_bytes(&(0..count).map(|i| (n * (n - 1) / 2 + n * (i % 7)) as f32).collect::<Vec<_>>());
        assert!(recv == want, "rank {me}: allreduce of {count} floats on {n} ranks");
    }
    for block in [100usize, 3000, 70_001] {
        let mine: Vec<u8> = (0..block).map(|i| (i + me * 31) as u8).collect();
        let mut all = vec![0u8; n * block];
        c.collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&mine)), recv: MutBuf::from_slice(&mut all), dt: DType::Uint8 }).unwrap();
        for r in 0..n {
            assert!((0..block).all(|i| all[r * block + i] == (i + r * 31) as u8), "rank {me}: allgather block {block} from {r}");
        }
    }
    for block in [8usize, 600, 9001] {
        let send: Vec<u8> = (0..n * block).map(|i| (i * 7 + me * 13) as u8).collect();
        let mut recv = vec![0u8; n * block];
        c.collective(CollArgs::Alltoall { send: ConstBuf::from_slice(&send), recv: MutBuf::from_slice(&mut recv), dt: DType::Uint8 }).unwrap();
        for r in 0..n {
            assert!((0..block).all(|i| recv[r * block + i] == ((me * block + i) * 7 + r * 13) as u8), "rank {me}: alltoall block {block} from {r}");
        }
    }
    for len in [100usize, 100_000, 1 << 20] {
        let (to, from) = ((me + 1) % n, (me + n - 1) % n);
        let out: Vec<u8> = (0..len).map(|i| (i * 3 + me) as u8).collect();
        let mut got = vec![0u8; len];
        let r = c.post_recv(MutBuf::from_slice(&mut got), Some(from), Some(9)).unwrap();
        let s = c.post_send(ConstBuf::from_slice(&out), to, 9).unwrap();
        c.wait_p2p(&s, c.op_deadline(), &|| "send".into()).unwrap();
        c.wait_p2p(&r, c.op_deadline(), &|| "recv".into()).unwrap();
        assert!((0..len).all(|i| got[i] == (i * 3 + from) as u8), "rank {me}: {len} bytes from {from}");
    }
    c.collective(CollArgs::Barrier).unwrap();
    c.shm_bytes()
}

/// 64 thread ranks with the default backend: right results on the arena, whose size is the
/// formula's (`transport::shm`) and within its cap, and no point-to-point rings (64 ranks on a
/// host would need more than the rings' cap; messages go over sockets).
#[test]
fn sixty_four_thread_ranks_stay_within_the_shared_memory_budget() {
    use distcomm::transport::{ring, shm};
    let n = 64;
    let out = job_on("auto", n, 120_000, |c| {
        assert_eq!(c.backend().to_str().unwrap(), "shm");
        collectives_and_neighbours(&c)
    });
    let arena = out[0].0;
    assert!(out.iter().all(|&(a, rings)| a == arena && rings == 0), "{out:?}");
    assert_eq!(arena, shm::arena_bytes(n, shm::chunk_for(n, None)));
    assert!(arena <= shm::ARENA_CAP, "{arena} bytes");
    assert_eq!(ring::ring_bytes_for(n), None);
}

/// 24 thread ranks: rings of the smallest size (32 KiB: inline bodies up to 8 KiB, larger ones
/// streamed in 8 KiB chunks), all of them together within the rings' cap.
#[test]
fn twenty_four_thread_ranks_use_the_smallest_rings() {
    use distcomm::transport::{ring, shm};
    let n = 24;
    let out = job_on("auto", n, 120_000, |c| collectives_and_neighbours(&c));
    let rb = ring::ring_bytes_for(n).unwrap();
    assert_eq!(rb, ring::MIN_RING_BYTES);
    assert!(out.iter().all(|&(a, r)| a == shm::arena_bytes(n, shm::chunk_for(n, None)) && r == ring::segment_bytes(n - 1, rb)), "{out:?}");
    let rings: usize = out.iter().map(|o| o.1).sum();
    assert_eq!(rings, ring::host_bytes(n, rb));
    assert!(rings <= ring::RING_CAP);
}

/// Non-blocking collectives queued back to back and waited for last first: the waiting caller
/// runs what is still queued itself (see `comm::executor`), in call order, so every result is
/// the one its own call asked for; on both backends.
#[test]
fn queued_nonblocking_collectives_waited_out_of_order_keep_their_results() {
    for backend in ["shm", "socket"] {
        job_on(backend, 3, 20_000, move |c| {
            let r = c.rank() as u32;
            let sends: Vec<Vec<u8>> = (0..24u32).map(|k| (0..1000u32).flat_map(|i| (i + k * 10 + r).to_le_bytes()).collect()).collect();
            let mut recvs: Vec<Vec<u8>> = sends.iter().map(|s| vec![0u8; s.len()]).collect();
            let reqs: Vec<_> = sends
                .iter()
                .zip(recvs.iter_mut())
                .map(|(s, rv)| c.start_collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(s)), recv: MutBuf::from_slice(rv), dt: DType::Uint32, op: ReduceOp::Sum }).unwrap())
                .collect();
            for req in reqs.iter().rev() {
                req.wait().unwrap();
            }
            drop(reqs);
            for (k, rv) in recvs.iter().enumerate() {
                let want: Vec<u8> = (0..1000u32).flat_map(|i| (3 * (i + k as u32 * 10) + 3).to_le_bytes()).collect();
                assert!(rv == &want, "{backend}: call {k}");
            }
        });
    }
}

/// A non-blocking collective progresses while its caller computes and neither waits nor tests
/// (the worker takes a job nobody came for, see `comm::executor`): the peer's blocking call
/// ends long before the caller looks again. And one that is only tested, in a loop, finishes.
#[test]
fn nonblocking_collectives_progress_without_wait_and_under_test_loops() {
    for backend in ["shm", "socket"] {
        let out = job_on(backend, 2, 20_000, move |c| {
            let send = vec![c.rank() as u8 + 1; 4096];
            let mut recv = vec![0u8; send.len()];
            let allreduce = |recv: &mut Vec<u8>| CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(recv), dt: DType::Uint8, op: ReduceOp::Sum };
            let t0 = Instant::now();
            let peer_took = if c.rank() == 0 {
                let req = c.start_collective(allreduce(&mut recv)).unwrap();
                std::thread::sleep(Duration::from_millis(600)); // computing, not looking
                req.wait().unwrap();
                None
            } else {
                c.collective(allreduce(&mut recv)).unwrap();
                Some(t0.elapsed())
            };
            assert!(recv.iter().all(|&b| b == 3), "{backend}: first");
            // Only tested: the test loop must see it finish.
            let req = c.start_collective(allreduce(&mut recv)).unwrap();
            while !req.is_completed() {
                std::thread::yield_now();
            }
            drop(req);
            assert!(recv.iter().all(|&b| b == 3), "{backend}: second");
            peer_took
        });
        let took = out[1].expect("rank 1 timed its call");
        assert!(took < Duration::from_millis(400), "{backend}: the peer's call waited {took:?} for a caller that did not look");
    }
}
