//! RPC between workers: ranks as threads (each calls `RpcAgent::init` over a tcp:// rendezvous
//! on loopback), and ranks as processes for a worker that dies mid-call.

mod common;
use common::{free_port, wait_all};

use distcomm::rendezvous::config::InitOptions;
use distcomm::rpc::{Agent, Handler, RpcAgent, RpcConfig};
use distcomm::{Result, Status};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};


const TOKEN: &str = "rpc-test-token";

fn opts(port: u16, rank: usize, n: usize, timeout_ms: i64) -> InitOptions {
    InitOptions {
        init_method: Some(format!("tcp://127.0.0.1:{port}")),
        rank: rank as i32,
        world_size: n as i32,
        timeout_ms,
        backend: Some("socket".into()),
        token: Some(TOKEN.into()),
        ..Default::default()
    }
}

/// Runs `f(rank, agent)` on one thread per name; `config(rank)` sets each agent's limits. The
/// store is served here on a port held from the start (a port found free and bound later may
/// be taken meanwhile).
fn workers_with<T: Send + 'static>(
    names: &[&str],
    timeout_ms: i64,
    config: impl Fn(usize) -> RpcConfig + Send + Sync + 'static,
    f: impl Fn(usize, Result<RpcAgent>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let store = distcomm::rendezvous::serve_store_here("127.0.0.1:0".parse().unwrap(), TOKEN.as_bytes()).unwrap();
    let port = store.local_addr().port();
    let n = names.len();
    let (f, config) = (Arc::new(f), Arc::new(config));
    let handles: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(r, name)| {
            let (f, config, name) = (f.clone(), config.clone(), name.to_string());
            std::thread::spawn(move || f(r, RpcAgent::init_with(&name, &opts(port, r, n, timeout_ms), config(r))))
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().unwrap()).collect();
    drop(store);
    out
}

fn workers<T: Send + 'static>(names: &[&str], f: impl Fn(usize, RpcAgent) -> T + Send + Sync + 'static) -> Vec<T> {
    workers_with(names, 30_000, |_| RpcConfig::from_env().unwrap(), move |r, a| f(r, a.unwrap_or_else(|e| panic!("rank {r}: init failed: {e}"))))
}

fn handler(f: impl Fn(&Agent, &[u8]) -> std::result::Result<Vec<u8>, String> + Send + Sync + 'static) -> Handler {
    Arc::new(f)
}

fn echo() -> Handler {
    handler(|_, req| Ok(req.to_vec()))
}

fn name_of(i: usize) -> String {
    format!("w{i}")
}

#[test]
fn three_workers_call_each_other_concurrently_with_nesting() {
    workers(&["w0", "w1", "w2"], |me, agent| {
        let agent = Arc::new(agent);
        let next = name_of((me + 1) % 3);
        agent.register("echo", echo()).unwrap();
        agent.register("square", handler(|_, req| {
            let v = u64::from_le_bytes(req.try_into().map_err(|_| "want 8 bytes".to_string())?);
            Ok(v.wrapping_mul(v).to_le_bytes().to_vec())
        }))
        .unwrap();
        let n1 = next.clone();
        agent.register("relay", handler(move |a, req| {
            let r = a.call(&n1, "echo", req, 0).map_err(|e| e.to_string())?;
            Ok([b"relayed:".as_slice(), &r].concat())
        }))
        .unwrap();
        let n2 = next.clone();
        agent.register("relay2", handler(move |a, req| a.call(&n2, "relay", req, 0).map_err(|e| e.to_string()))).unwrap();

        let threads: Vec<_> = (0..2)
            .map(|t| {
                let agent = agent.clone();
                std::thread::spawn(move || {
                    let mut calls = 0;
                    for i in 0..60u64 {
                        let to = name_of((me + i as usize + t) % 3);
                        let v = (me as u64) * 1_000_000 + (t as u64) * 1000 + i;
                        match i % 4 {
                            0 => {
                                let payload = v.to_le_bytes().repeat(1 + (i as usize % 7) * 50);
                                assert_eq!(agent.call(&to, "echo", &payload, 0).unwrap(), payload);
                            }
                            1 => {
                                let r = agent.call(&to, "square", &v.to_le_bytes(), 0).unwrap();
                                assert_eq!(u64::from_le_bytes(r.try_into().unwrap()), v.wrapping_mul(v));
                            }
                            2 => {
                                let p = format!("x{v}");
                                assert_eq!(agent.call(&to, "relay", p.as_bytes(), 0).unwrap(), format!("relayed:x{v}").into_bytes());
                            }
                            _ => {
                                let p = format!("y{v}");
                                assert_eq!(agent.call(&to, "relay2", p.as_bytes(), 0).unwrap(), format!("relayed:y{v}").into_bytes());
                            }
                        }
                        calls += 1;
                    }
                    // A batch of asynchronous calls in flight together, nested ones among them.
                    let reqs: Vec<_> = (0..20u64)
                        .map(|i| {
                            let f = if i % 2 == 0 { "echo" } else { "relay2" };
                            let p = format!("a{me}-{t}-{i}");
                            (i, agent.call_async(&name_of(i as usize % 3), f, p.as_bytes(), 0).unwrap())
                        })
                        .collect();
                    for (i, r) in reqs {
                        r.wait().unwrap();
                        let want = if i % 2 == 0 { format!("a{me}-{t}-{i}") } else { format!("relayed:a{me}-{t}-{i}") };
                        assert_eq!(r.take_reply().unwrap(), want.into_bytes());
                        calls += 1;
                    }
                    calls
                })
            })
            .collect();
        let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(total, 160);
        Arc::try_unwrap(agent).ok().expect("no other owner").shutdown().unwrap();
    });
}

#[test]
fn failures_unknown_names_and_worker_infos() {
    workers(&["a", "b"], |me, agent| {
        agent.register("echo", echo()).unwrap();
        agent.register("fail", handler(|_, _| Err("boom: bad input 42".into()))).unwrap();
        agent.register("panic", handler(|_, _| panic!("kaboom"))).unwrap();
        // A call of our own settles registration: unknown functions fail from now on.
        assert_eq!(agent.worker_info(None).unwrap().name, if me == 0 { "a" } else { "b" });
        let infos = agent.all_worker_infos();
        assert_eq!(infos.iter().map(|w| (w.name.as_str(), w.rank)).collect::<Vec<_>>(), vec![("a", 0), ("b", 1)]);
        assert!(infos.iter().all(|w| !w.host.is_empty() && w.port > 0), "{infos:?}");
        assert_eq!(agent.worker_info(Some("b")).unwrap(), infos[1]);
        assert_eq!(agent.worker_info(Some("zz")).unwrap_err().status, Status::InvalidArgument);
        if me == 0 {
            let e = agent.call("b", "fail", b"", 0).unwrap_err();
            assert_eq!(e.status, Status::Remote, "{e}");
            assert!(e.msg.contains("boom: bad input 42"), "{e}");
            let e = agent.call("b", "nope", b"", 0).unwrap_err();
            assert_eq!(e.status, Status::Remote, "{e}");
            assert!(e.msg.contains("\"nope\""), "{e}");
            let e = agent.call("b", "panic", b"", 0).unwrap_err();
            assert_eq!(e.status, Status::Remote, "{e}");
            assert!(e.msg.contains("kaboom"), "{e}");
            let e = agent.call("ghost", "echo", b"", 0).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument, "{e}");
            assert!(e.msg.contains("ghost"), "{e}");
            assert_eq!(agent.call("b", "", b"", 0).unwrap_err().status, Status::InvalidArgument);
            // Still usable, also calling itself.
            assert_eq!(agent.call("b", "echo", b"ok", 0).unwrap(), b"ok");
            assert_eq!(agent.call("a", "echo", b"self", 0).unwrap(), b"self");
            let r = agent.call_async("b", "fail", b"", 0).unwrap();
            assert_eq!(r.wait().unwrap_err().status, Status::Remote);
            assert_eq!(r.take_reply().unwrap_err().status, Status::Remote);
            assert_eq!(r.recv_info().unwrap_err().status, Status::InvalidUsage);
        }
        agent.shutdown().unwrap();
    });
}

#[test]
fn a_duplicate_name_fails_on_the_duplicate_only() {
    let out = workers_with(&["a", "b", "a"], 30_000, |_| RpcConfig::from_env().unwrap(), |me, agent| match agent {
        Err(e) => {
            assert_eq!(me, 2);
            assert_eq!(e.status, Status::InvalidArgument, "{e}");
            assert!(e.msg.contains("already taken by rank 0"), "{e}");
            false
        }
        Ok(agent) => {
            agent.register("echo", echo()).unwrap();
            let names: Vec<_> = agent.all_worker_infos().into_iter().map(|w| (w.name, w.rank)).collect();
            assert_eq!(names, vec![("a".to_string(), 0), ("b".to_string(), 1)]);
            let other = if me == 0 { "b" } else { "a" };
            assert_eq!(agent.call(other, "echo", b"hi", 0).unwrap(), b"hi");
            agent.shutdown().unwrap();
            true
        }
    });
    assert_eq!(out, vec![true, true, false]);
}

#[test]
fn timeouts_leave_the_agent_usable_and_late_replies_are_dropped() {
    workers(&["a", "b"], |me, agent| {
        agent.register("echo", echo()).unwrap();
        agent.register("slow", handler(|_, req| {
            std::thread::sleep(Duration::from_millis(1200));
            Ok([b"late:".as_slice(), req].concat())
        }))
        .unwrap();
        if me == 0 {
            let t0 = Instant::now();
            let e = agent.call("b", "slow", b"1", 200).unwrap_err();
            assert_eq!(e.status, Status::Timeout, "{e}");
            assert!(t0.elapsed() < Duration::from_millis(1000), "timeout took {:?}", t0.elapsed());
            assert_eq!(agent.call("b", "echo", b"still here", 0).unwrap(), b"still here");

            let r = agent.call_async("b", "slow", b"2", 200).unwrap();
            assert_eq!(r.wait().unwrap_err().status, Status::Timeout);
            assert!(r.is_completed());
            assert_eq!(r.wait().unwrap_err().status, Status::Timeout, "wait repeats its status");

            // A slow call that is given time: not complete at first, then complete without a wait.
            let r = agent.call_async("b", "slow", b"3", 10_000).unwrap();
            assert_eq!(r.take_reply().unwrap_err().status, Status::InvalidUsage);
            let t0 = Instant::now();
            while !r.is_completed() {
                assert!(t0.elapsed() < Duration::from_secs(10));
                std::thread::sleep(Duration::from_millis(5));
            }
            r.wait().unwrap();
            assert_eq!(r.take_reply().unwrap(), b"late:3");
            assert_eq!(r.take_reply().unwrap_err().status, Status::InvalidUsage, "taken twice");
            // The late replies of the timed-out calls came back meanwhile and went nowhere.
            for i in 0..20 {
                let p = format!("e{i}");
                assert_eq!(agent.call("b", "echo", p.as_bytes(), 0).unwrap(), p.as_bytes());
            }
        }
        // Shutdown waits for the slow handlers that are still running.
        agent.shutdown().unwrap();
    });
}

#[test]
fn size_limits_on_requests_and_replies() {
    let out = workers_with(&["small", "big"], 30_000, |r| RpcConfig { max_bytes: if r == 0 { 1024 } else { 1 << 20 } }, |me, agent| {
        let agent = agent.unwrap();
        agent.register("echo", echo()).unwrap();
        agent.register("big", handler(|_, _| Ok(vec![7u8; 4096]))).unwrap();
        agent.worker_info(None).unwrap();
        if me == 0 {
            assert_eq!(agent.call("big", "echo", &[1u8; 2048], 0).unwrap_err().status, Status::InvalidArgument);
            assert_eq!(agent.call("big", "echo", &[1u8; 1024], 0).unwrap().len(), 1024);
            let e = agent.call("big", "big", b"", 0).unwrap_err();
            assert_eq!(e.status, Status::Remote, "{e}");
            assert!(e.msg.contains("exceeds the limit of 1024 bytes"), "{e}");
        } else {
            let e = agent.call("small", "echo", &[1u8; 2048], 0).unwrap_err();
            assert_eq!(e.status, Status::Remote, "{e}");
            assert!(e.msg.contains("exceeds the limit of 1024 bytes"), "{e}");
            let e = agent.call("small", "big", b"", 0).unwrap_err();
            assert_eq!(e.status, Status::Remote, "the callee refuses to send a reply over its limit: {e}");
            assert_eq!(agent.call("small", "echo", b"fine", 0).unwrap(), b"fine");
        }
        agent.shutdown().is_ok()
    });
    assert_eq!(out, vec![true, true]);
}

#[test]
fn shutdown_keeps_serving_until_every_worker_is_done() {
    let out = workers(&["w0", "w1", "w2"], |me, agent| {
        agent.register("echo", echo()).unwrap();
        agent.register("relay", handler(|a, req| a.call("w1", "echo", req, 0).map_err(|e| e.to_string()))).unwrap();
        let t0 = Instant::now();
        if me != 0 {
            // w0 is already in shutdown: it serves these, and its handler still calls w1.
            std::thread::sleep(Duration::from_millis(100));
            for i in 0..40 {
                let p = format!("{me}:{i}");
                let f = if i % 2 == 0 { "echo" } else { "relay" };
                assert_eq!(agent.call("w0", f, p.as_bytes(), 0).unwrap(), p.as_bytes());
            }
        }
        agent.shutdown().unwrap();
        t0.elapsed()
    });
    assert!(out.iter().all(|t| *t < Duration::from_secs(20)), "{out:?}");
}

#[test]
fn user_calls_after_shutdown_began_are_refused() {
    workers(&["w0", "w1"], |me, agent| {
        agent.register("echo", echo()).unwrap();
        let handle: Agent = (*agent).clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let r = handle.call(if me == 0 { "w1" } else { "w0" }, "echo", b"x", 0);
            (r.map_err(|e| e.status), handle)
        });
        if me == 1 {
            std::thread::sleep(Duration::from_millis(1000));
        }
        agent.shutdown().unwrap();
        let (r, handle) = late.join().unwrap();
        if me == 0 {
            // w0 was shutting down: its own user calls are refused...
            assert_eq!(r.unwrap_err(), Status::InvalidUsage);
        } else {
            // ...while it still served w1, which had not begun shutting down.
            assert_eq!(r.unwrap(), b"x");
        }
        assert_eq!(handle.call("w0", "echo", b"", 0).unwrap_err().status, Status::InvalidUsage);
    });
}

// ---- ranks as processes ------------------------------------------------------------------------

fn spawn_job(role: &str, n: usize) -> Vec<Child> {
    let port = free_port().to_string();
    (0..n)
        .map(|r| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "rpc_child_entry", "--nocapture", "--test-threads=1"])
                .env("DC_TEST_RPC_ROLE", role)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("DC_TIMEOUT_MS", "60000")
                .env("DC_PEER_TIMEOUT_MS", "1500")
                .spawn()
                .unwrap()
        })
        .collect()
}


/// What a worker process does, by role. Exit code 0 means its checks passed.
#[test]
fn rpc_child_entry() {
    let Ok(role) = std::env::var("DC_TEST_RPC_ROLE") else { return };
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    if role == "listener_panics" && rank == 1 {
        // Before the agent exists: a request may reach w1's listener as soon as it does.
        distcomm::panics::arm(Some("rpc"));
    }
    let agent = RpcAgent::init(&name_of(rank), &InitOptions::from_env()).expect("init");
    agent.register("echo", echo()).unwrap();
    agent.register("die", handler(|_, _| {
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        Ok(Vec::new())
    }))
    .unwrap();
    agent.register("stop", handler(|_, _| {
        // Stopped as by a debugger; killed later so the job ends.
        let me = std::process::id();
        Command::new("sh").args(["-c", &format!("sleep 10; kill -KILL {me}")]).spawn().unwrap();
        unsafe { libc::raise(libc::SIGSTOP) };
        Ok(Vec::new())
    }))
    .unwrap();
    agent.register("sleep", handler(|_, _| {
        std::thread::sleep(Duration::from_secs(30));
        Ok(Vec::new())
    }))
    .unwrap();
    // Set when the other survivor has finished its checks (it calls "done" here).
    let other_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = other_done.clone();
    agent.register("done", handler(move |_, _| {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(Vec::new())
    }))
    .unwrap();
    match role.as_str() {
        "dies" => {
            if rank == 1 {
                // Serve until killed by our own "die" handler.
                std::thread::sleep(Duration::from_secs(50));
                std::process::exit(4);
            }
            let t0 = Instant::now();
            let f = if rank == 0 { "die" } else { "sleep" };
            let e = agent.call("w1", f, b"", 0).expect_err("the call outlived its callee");
            assert_eq!(e.status, Status::PeerLost, "{e}");
            assert!(t0.elapsed() < Duration::from_secs(20), "noticed after {:?}", t0.elapsed());
            // The others are still reachable.
            let other = if rank == 0 { "w2" } else { "w0" };
            assert_eq!(agent.call(other, "echo", b"alive", 0).unwrap(), b"alive");
            assert_eq!(agent.call("w1", "echo", b"", 0).unwrap_err().status, Status::PeerLost);
            agent.call(other, "done", b"", 0).unwrap();
            while !other_done.load(std::sync::atomic::Ordering::SeqCst) {
                assert!(t0.elapsed() < Duration::from_secs(30), "the other survivor never finished");
                std::thread::sleep(Duration::from_millis(5));
            }
            // Shutdown cannot complete without w1: it fails instead of hanging.
            let e = agent.shutdown().expect_err("shutdown without w1");
            assert!(matches!(e.status, Status::PeerLost | Status::Timeout), "{e}");
        }
        "stopped" => {
            // w1 stops itself inside the call: w0 learns it within the peer timeout (1.5 s;
            // its process is looked at), not at the call's timeout (60 s).
            if rank == 1 {
                std::thread::sleep(Duration::from_secs(50));
                std::process::exit(4);
            }
            let t0 = Instant::now();
            let e = agent.call("w1", "stop", b"", 0).expect_err("the callee is stopped");
            assert_eq!(e.status, Status::PeerLost, "{e}");
            assert!(e.msg.contains("stopped") && e.msg.contains("rank 1"), "{e}");
            assert!(t0.elapsed() < Duration::from_secs(6), "noticed after {:?}", t0.elapsed());
            std::process::exit(0);
        }
        "listener_panics" => {
            // w1's request listener panics on the first request it reads: w0's call to it
            // fails well within the timeout (60 s), and w1 is left with an aborted agent.
            agent.call("w2", "echo", b"warm", 0).unwrap();
            if rank == 0 {
                let t0 = Instant::now();
                let e = agent.call("w1", "echo", b"x", 0).expect_err("w1 cannot answer");
                assert!(matches!(e.status, Status::Aborted | Status::PeerLost), "{e}");
                assert!(e.msg.contains("rank 1") || e.msg.contains("w1"), "{e}");
                assert!(t0.elapsed() < Duration::from_secs(10), "noticed after {:?}", t0.elapsed());
            } else {
                // Until w1's agent is aborted (its listener's panic aborts it).
                let t0 = Instant::now();
                while agent.call("w0", "echo", b"", 0).is_ok() {
                    assert!(t0.elapsed() < Duration::from_secs(20), "rank {rank}: the agent never noticed");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let _ = agent.shutdown();
        }
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

#[test]
fn a_worker_dying_mid_call_is_peer_lost() {
    let codes = wait_all(spawn_job("dies", 3), Duration::from_secs(60));
    assert_eq!(codes, vec![0, -1, 0], "exit codes");
}

#[test]
fn a_stopped_callee_is_peer_lost_after_the_peer_timeout() {
    let codes = wait_all(spawn_job("stopped", 2), Duration::from_secs(40));
    assert_eq!(codes, vec![0, -1], "exit codes");
}

#[test]
fn a_panic_in_a_listener_aborts_the_agent_instead_of_hanging() {
    let codes = wait_all(spawn_job("listener_panics", 3), Duration::from_secs(60));
    assert_eq!(codes, vec![0, 0, 0], "exit codes");
}

/// Requests for a function the callee has not registered yet are held (it may be about to), but
/// not without bound: beyond 1024 they are refused at once, and the held ones are served once
/// the function is registered.
#[test]
fn requests_held_for_an_unregistered_function_are_bounded() {
    static FLOODED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    workers(&["a", "b"], |me, agent| {
        if me == 0 {
            let reqs: Vec<_> = (0..1030u32).map(|i| agent.call_async("b", "later", &i.to_le_bytes(), 0).unwrap()).collect();
            // The last six are refused without waiting for "later" to exist.
            for r in &reqs[1024..] {
                let e = r.wait().unwrap_err();
                assert_eq!(e.status, Status::Remote, "{e}");
                assert!(e.msg.contains("already holds 1024 requests"), "{e}");
            }
            FLOODED.store(true, std::sync::atomic::Ordering::SeqCst);
            for (i, r) in reqs[..1024].iter().enumerate() {
                r.wait().unwrap_or_else(|e| panic!("held request {i}: {e}"));
                assert_eq!(r.take_reply().unwrap(), (i as u32).to_le_bytes());
            }
        } else {
            // Makes no call (which would settle registration) until the flood is in.
            while !FLOODED.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            agent.register("later", echo()).unwrap();
        }
        agent.shutdown().unwrap();
    });
}
