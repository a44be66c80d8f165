//! Ranks as processes: the test binary re-runs itself as each rank (env `DC_TEST_ROLE`), with
//! only the torch variables set, as a user launching by hand would.

mod common;
use common::{free_port, wait_all};

use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::rendezvous::config::InitOptions;
use distcomm::{DType, ReduceOp, Status};
use std::process::{Child, Command};
use std::time::{Duration, Instant};


fn spawn_job(role: &str, n: usize, timeout_ms: &str) -> Vec<Child> {
    spawn_job_with(role, n, timeout_ms, &[])
}

fn spawn_job_with(role: &str, n: usize, timeout_ms: &str, env: &[(&str, &str)]) -> Vec<Child> {
    let port = free_port().to_string();
    (0..n)
        .map(|r| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
                .env("DC_TEST_ROLE", role)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("DC_TIMEOUT_MS", timeout_ms)
                .envs(env.iter().copied())
                .spawn()
                .unwrap()
        })
        .collect()
}


/// What a rank process does, by role. Exit code 0 means its checks passed.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("DC_TEST_ROLE") else { return };
    let comm = distcomm::init::init(&InitOptions::from_env()).expect("init from the environment");
    let (rank, size) = (comm.rank(), comm.size());
    let allreduce = |v: &[u8], out: &mut [u8]| {
        comm.collective(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(v)), recv: MutBuf::from_slice(out), dt: DType::Uint8, op: ReduceOp::Max })
    };
    match role.as_str() {
        "allreduce" => {
            let v = vec![rank as u8; 1 << 20];
            let mut out = vec![0u8; 1 << 20];
            allreduce(&v, &mut out).unwrap();
            assert!(out.iter().all(|&b| b as usize == size - 1));
        }
        "one_dies" => {
            // Rank 2 vanishes without destroying; the others must see DC_ERR_PEER_LOST quickly.
            let v = vec![1u8; 1 << 16];
            let mut out = vec![0u8; 1 << 16];
            allreduce(&v, &mut out).unwrap();
            if rank == 2 {
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            let t0 = Instant::now();
            let mut r = Ok(());
            for _ in 0..100 {
                r = allreduce(&v, &mut out);
                if r.is_err() {
                    break;
                }
            }
            let e = r.expect_err("collectives kept succeeding without rank 2");
            let took = t0.elapsed();
            assert!(matches!(e.status, Status::PeerLost | Status::Timeout), "{e}");
            assert!(took < Duration::from_secs(5), "noticed only after {took:?}: {e}");
            let code = if e.status == Status::PeerLost || e.msg.contains("rank 2") { 0 } else { 3 };
            // Destroying after a lost peer returns promptly (queueing the goodbye for the lost
            // peer once deadlocked on the peer's state lock).
            let t1 = Instant::now();
            comm.destroy();
            drop(comm);
            assert!(t1.elapsed() < Duration::from_secs(10), "destroy took {:?}", t1.elapsed());
            std::process::exit(code);
        }
        "broadcasts" => {
            // Small broadcasts and reduces with every root (eager, along a tree over the rings,
            // when ranks outnumber cores), between other collectives and larger broadcasts (1 MiB:
            // the root writes pieces into the others' buffers while they read), back to back.
            for round in 0..300usize {
                for (len, root) in [(1usize, round % size), (700, (round + 1) % size), (2048, 0), (5000, size - 1), ((1 << 20) + 3, round % size)] {
                    let mut b: Vec<u8> = if rank == root { (0..len).map(|i| (i + round + root) as u8).collect() } else { vec![0xEE; len] };
                    comm.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b), dt: DType::Uint8, root }).unwrap();
                    assert!(b.iter().enumerate().all(|(i, &x)| x == (i + round + root) as u8), "round {round}: broadcast of {len} from {root}");
                }
                // Small reduces to every root, likewise.
                for (len, root) in [(3usize, round % size), (2048, (round + 2) % size)] {
                    let v: Vec<u8> = (0..len).map(|i| (i + rank + round) as u8).collect();
                    let mut out = vec![0u8; len];
                    let recv = if rank == root { Some(MutBuf::from_slice(&mut out)) } else { None };
                    comm.collective(CollArgs::Reduce { send: Some(ConstBuf::from_slice(&v)), recv, bytes: len, dt: DType::Uint8, op: ReduceOp::Sum, root }).unwrap();
                    if rank == root {
                        let want = |i: usize| (0..size).map(|r| (i + r + round) as u8).fold(0u8, |a, b| a.wrapping_add(b));
                        assert!(out.iter().enumerate().all(|(i, &x)| x == want(i)), "round {round}: reduce of {len} to {root}");
                    }
                }
                if round % 50 == 0 {
                    let v = vec![rank as u8; 1000];
                    let mut out = vec![0u8; 1000];
                    allreduce(&v, &mut out).unwrap();
                    assert!(out.iter().all(|&b| b as usize == size - 1));
                }
            }
        }
        "crowded_exchanges" => {
            // Around the ring, bodies past the inline limit (`inline_max_unpicked`): the way
            // they go (inline or single-copy) switches as the exchanges try both. Large
            // messages too, which the receiver reads once or has streamed.
            let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
            let far = Instant::now() + Duration::from_secs(60);
            for round in 0..300usize {
                let len = [40 * 1024 + 3, 64 * 1024, 300 * 1024 + 5, 20 * 1024 + 1][round % 4];
                let out: Vec<u8> = (0..len).map(|i| (i * 7 + rank * 13 + round) as u8).collect();
                let mut got = vec![0xEEu8; len];
                let (send_what, recv_what) = (|| format!("round {round}: send"), || format!("round {round}: receive"));
                let what: (&dyn Fn() -> String, &dyn Fn() -> String) = (&send_what, &recv_what);
                match comm.sendrecv((ConstBuf::from_slice(&out), next, 5), (MutBuf::from_slice(&mut got), Some(prev), Some(5)), &|| far, what) {
                    distcomm::comm::Exchanged::Both { sent: Ok(()), got: Ok(d) } => assert_eq!(d.bytes, len, "round {round}"),
                    _ => panic!("round {round}: the exchange failed"),
                }
                assert!(got.iter().enumerate().all(|(i, &x)| x == (i * 7 + prev * 13 + round) as u8), "round {round}: {len} bytes from {prev}");
            }
        }
        _ => panic!("unknown role {role}"),
    }
    comm.destroy();
}

#[test]
fn broadcasts_and_reduces_back_to_back_with_ranks_outnumbering_cores() {
    // LOCAL_WORLD_SIZE above the core count is what a launcher sets on a crowded host.
    for n in [3, 4] {
        let codes = wait_all(spawn_job_with("broadcasts", n, "30000", &[("LOCAL_WORLD_SIZE", "64")]), Duration::from_secs(120));
        assert!(codes.iter().all(|&c| c == 0), "n={n}: exit codes {codes:?}");
    }
}

#[test]
fn exchanges_past_the_inline_limit_arrive_whole_whichever_way_they_go() {
    // Crowded (4 ranks said to share a host of fewer cores) and not (2 ranks, 2 a host).
    for (n, local) in [(4, "64"), (2, "2")] {
        let codes = wait_all(spawn_job_with("crowded_exchanges", n, "30000", &[("LOCAL_WORLD_SIZE", local), ("DC_LOCAL_CORES", "2")]), Duration::from_secs(120));
        assert!(codes.iter().all(|&c| c == 0), "{n} ranks: exit codes {codes:?}");
    }
}

#[test]
fn allreduce_across_processes() {
    for n in [2, 3, 4] {
        let codes = wait_all(spawn_job("allreduce", n, "30000"), Duration::from_secs(60));
        assert!(codes.iter().all(|&c| c == 0), "n={n}: exit codes {codes:?}");
    }
}

#[test]
fn a_killed_rank_is_noticed_by_the_others() {
    let codes = wait_all(spawn_job("one_dies", 3, "60000"), Duration::from_secs(30));
    assert_eq!(codes[0], 0, "{codes:?}");
    assert_eq!(codes[1], 0, "{codes:?}");
    assert_eq!(codes[2], -1, "rank 2 should have been killed: {codes:?}");
}
