//! Store and rendezvous tests: TCP store (concurrency, waits, token, hostile clients), file store
//! (locking across processes, stale files, generations), exchange and rendezvous.

mod common;

use common::free_port;
use distcomm::rendezvous::tcp_store::raw;
use distcomm::rendezvous::{
    exchange, rendezvous, resolve, FileStore, InitOptions, MemStore, PrefixStore, Store, StoreServer, TcpStore,
};
use distcomm::Status;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

const TOKEN: &[u8] = b"test-token";

fn server() -> StoreServer {
    StoreServer::start("127.0.0.1:0".parse().unwrap(), TOKEN.to_vec()).unwrap()
}

fn client(s: &StoreServer) -> TcpStore {
    TcpStore::connect("127.0.0.1", s.local_addr().port(), TOKEN, secs(5)).unwrap()
}

fn secs(n: u64) -> Instant {
    Instant::now() + Duration::from_secs(n)
}

fn ms(n: u64) -> Instant {
    Instant::now() + Duration::from_millis(n)
}

fn tmp_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("distcomm-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// A raw, authenticated connection to `s`.
fn raw_conn(s: &StoreServer) -> TcpStream {
    let mut c = TcpStream::connect(s.local_addr()).unwrap();
    assert_eq!(raw::authenticate(&mut c, TOKEN).unwrap(), 0, "welcome");
    c
}

// ------------------------------------------------------------------------------------------
// TCP store
// ------------------------------------------------------------------------------------------

#[test]
fn tcp_set_get_add_across_threads() {
    let s = server();
    let port = s.local_addr().port();
    let threads: Vec<_> = (0..6)
        .map(|i| {
            std::thread::spawn(move || {
                let c = TcpStore::connect("127.0.0.1", port, TOKEN, secs(5)).unwrap();
                c.set(&format!("k/{i}"), format!("v{i}").as_bytes()).unwrap();
                for _ in 0..50 {
                    c.add("ctr", 1).unwrap();
                }
                for j in 0..6 {
                    assert_eq!(c.get(&format!("k/{j}"), secs(5)).unwrap(), format!("v{j}").into_bytes());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let c = client(&s);
    assert_eq!(c.add("ctr", 0).unwrap(), 300);
    assert_eq!(c.get("ctr", secs(1)).unwrap(), b"300");
    assert_eq!(c.add("neg", -5).unwrap(), -5);
    assert_eq!(c.try_get("absent").unwrap(), None);
    c.set("text", b"x").unwrap();
    let e = c.add("text", 1).unwrap_err();
    assert!(e.msg.contains("not an integer"), "{e}");
    // The client still works after a refused request.
    c.set("empty", b"").unwrap();
    assert_eq!(c.try_get("empty").unwrap(), Some(vec![]));
}

#[test]
fn tcp_one_client_shared_by_threads() {
    let s = server();
    let c = Arc::new(client(&s));
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let c = c.clone();
            std::thread::spawn(move || {
                for _ in 0..25 {
                    c.add("n", 2).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(c.add("n", 0).unwrap(), 200);
}

#[test]
fn tcp_get_waits_then_times_out() {
    let s = server();
    let port = s.local_addr().port();
    let c = client(&s);
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        let c2 = TcpStore::connect("127.0.0.1", port, TOKEN, secs(5)).unwrap();
        c2.set("late", b"here").unwrap();
    });
    let t0 = Instant::now();
    assert_eq!(c.get("late", secs(5)).unwrap(), b"here");
    assert!(t0.elapsed() >= Duration::from_millis(100));
    setter.join().unwrap();

    let t0 = Instant::now();
    let e = c.get("never", ms(250)).unwrap_err();
    let took = t0.elapsed();
    assert_eq!(e.status, Status::Timeout, "{e}");
    assert!(e.msg.contains("never"), "{e}");
    assert!(took >= Duration::from_millis(240) && took < Duration::from_secs(3), "{took:?}");
    // A past deadline: one look, then the timeout.
    assert_eq!(c.get("never", Instant::now()).unwrap_err().status, Status::Timeout);
    assert_eq!(c.get("late", Instant::now()).unwrap(), b"here");
}

#[test]
fn tcp_wrong_token_is_refused() {
    let s = server();
    let e = TcpStore::connect("127.0.0.1", s.local_addr().port(), b"wrong", secs(5)).unwrap_err();
    assert_eq!(e.status, Status::Rendezvous, "{e}");
    assert!(e.msg.contains("token refused"), "{e}");
}

#[test]
fn tcp_connect_times_out_when_nobody_listens() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t0 = Instant::now();
    let e = TcpStore::connect("127.0.0.1", port, TOKEN, ms(300)).unwrap_err();
    assert_eq!(e.status, Status::Timeout, "{e}");
    assert!(e.msg.contains("unreachable") && e.msg.contains(&port.to_string()), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[test]
fn tcp_connect_retries_until_the_server_starts() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let h = std::thread::spawn(move || TcpStore::connect("127.0.0.1", port, TOKEN, secs(10)));
    std::thread::sleep(Duration::from_millis(300));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let s = StoreServer::start(addr, TOKEN.to_vec()).unwrap();
    let c = h.join().unwrap().unwrap();
    c.set("a", b"1").unwrap();
    assert_eq!(s.num_keys(), 1);
}

#[test]
fn tcp_hostile_clients_do_not_disturb_others() {
    let s = server();
    // A silent connection that never sends its hello.
    let silent = TcpStream::connect(s.local_addr()).unwrap();
    // Garbage instead of a hello.
    let mut garbage = TcpStream::connect(s.local_addr()).unwrap();
    garbage.write_all(&[0xAB; 72]).unwrap();
    // Half a hello, then silence.
    let mut half = TcpStream::connect(s.local_addr()).unwrap();
    let nonce = raw::read_challenge(&mut half).unwrap();
    half.write_all(&raw::hello(TOKEN, &nonce)[..10]).unwrap();
    // A stranger with the wrong token.
    let mut stranger = TcpStream::connect(s.local_addr()).unwrap();
    let nonce = raw::read_challenge(&mut stranger).unwrap();
    stranger.write_all(&raw::hello(b"nope", &nonce)).unwrap();
    // A replay: a genuine client's hello (it answered another connection's challenge).
    let mut genuine = TcpStream::connect(s.local_addr()).unwrap();
    let nonce = raw::read_challenge(&mut genuine).unwrap();
    let recorded = raw::hello(TOKEN, &nonce);
    let mut replay = TcpStream::connect(s.local_addr()).unwrap();
    raw::read_challenge(&mut replay).unwrap();
    replay.write_all(&recorded).unwrap();

    // A legitimate client is served at once (not after the 5 s hello timeout).
    let t0 = Instant::now();
    let c = client(&s);
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k", secs(1)).unwrap(), b"v");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());

    // The garbage sender and the stranger get a short refusal and are disconnected.
    garbage.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    garbage.read_to_end(&mut buf).unwrap();
    assert_eq!(&buf[..4], b"DCSC", "the challenge comes first");
    assert_eq!(&buf[raw::CHALLENGE_LEN..], b"DCSR\x02");
    for (who, mut conn) in [("stranger", stranger), ("replay", replay)] {
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        conn.read_to_end(&mut buf).unwrap();
        assert_eq!(buf, b"DCSR\x01", "{who}");
    }
    drop(genuine);
    drop(silent);
    drop(half);
    assert_eq!(c.get("k", secs(1)).unwrap(), b"v");
}

/// A rogue store (it does not know the token) that welcomes every client: the client refuses it,
/// since the welcome lacks a proof over the client's own nonce.
#[test]
fn tcp_a_store_that_cannot_prove_the_token_is_refused() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let rogue = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut challenge = b"DCSC\x02\x00\x00\x00".to_vec();
        challenge.extend_from_slice(&[9u8; 32]);
        s.write_all(&challenge).unwrap();
        let mut hello = [0u8; 72];
        s.read_exact(&mut hello).unwrap();
        // "Welcome", and a proof it cannot have computed.
        let mut reply = b"DCSR\x00".to_vec();
        reply.extend_from_slice(&[0u8; 32]);
        s.write_all(&reply).unwrap();
        s
    });
    let e = TcpStore::connect("127.0.0.1", port, TOKEN, secs(5)).err().expect("the rogue store is refused");
    assert_eq!(e.status, Status::Rendezvous, "{e}");
    assert!(e.msg.contains("could not prove"), "{e}");
    drop(rogue.join().unwrap());
}

#[test]
fn tcp_huge_lengths_are_refused_without_allocating() {
    let s = server();
    let c = client(&s);
    // A value length of 2^62 bytes: answered with an error and the connection is closed.
    let mut r = raw_conn(&s);
    r.write_all(&raw::set_header("k", 1 << 62)).unwrap();
    r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let _ = r.read_to_end(&mut buf);
    assert_eq!(buf[0], 2, "error answer expected");
    assert!(String::from_utf8_lossy(&buf[9..]).contains("exceeds"));
    // A key length of 4 GiB - 1.
    let mut r = raw_conn(&s);
    let mut m = vec![2u8];
    m.extend_from_slice(&u32::MAX.to_le_bytes());
    r.write_all(&m).unwrap();
    r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let _ = r.read_to_end(&mut buf);
    assert_eq!(buf[0], 2);
    // An unknown operation.
    let mut r = raw_conn(&s);
    r.write_all(&[99, 0, 0, 0, 0]).unwrap();
    let mut buf = Vec::new();
    let _ = r.read_to_end(&mut buf);
    assert_eq!(buf[0], 2);
    // Others are unaffected.
    c.set("still", b"fine").unwrap();
    assert_eq!(c.try_get("still").unwrap(), Some(b"fine".to_vec()));
    // The client refuses oversized keys itself.
    let e = c.set(&"x".repeat(5000), b"").unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
}

#[test]
fn tcp_set_wakes_only_the_waiters_of_its_key() {
    let s = server();
    let port = s.local_addr().port();
    let waiter = |key: &'static str| {
        std::thread::spawn(move || {
            let c = TcpStore::connect("127.0.0.1", port, TOKEN, secs(5)).unwrap();
            let t0 = Instant::now();
            let v = c.get(key, secs(10)).unwrap();
            (v, t0.elapsed())
        })
    };
    let on_a = waiter("a");
    let on_b = waiter("b");
    std::thread::sleep(Duration::from_millis(200));
    let c = client(&s);
    c.set("a", b"for a").unwrap();
    let (v, _) = on_a.join().unwrap();
    assert_eq!(v, b"for a");
    // The waiter on b was not answered by a's SET: it is still parked, and gets b's value.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!on_b.is_finished(), "a SET of another key answered the waiter on b");
    c.set("b", b"for b").unwrap();
    let (v, took) = on_b.join().unwrap();
    assert_eq!(v, b"for b");
    assert!(took >= Duration::from_millis(450), "{took:?}");
}

#[test]
fn tcp_a_client_that_does_not_read_its_answers_does_not_stall_others() {
    let s = server();
    let c = client(&s);
    c.set("big", &vec![7u8; 1 << 20]).unwrap();
    // 500 pipelined GETs of 1 MiB each, never read: the server queues a bounded amount for this
    // connection, then stops reading its requests.
    let mut r = raw_conn(&s);
    let mut m = Vec::new();
    for _ in 0..500 {
        m.push(2u8);
        m.extend_from_slice(&3u32.to_le_bytes());
        m.extend_from_slice(b"big");
        m.extend_from_slice(&0u32.to_le_bytes());
    }
    r.write_all(&m).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    for i in 0..50 {
        c.set(&format!("k{i}"), b"v").unwrap();
        assert_eq!(c.get(&format!("k{i}"), secs(1)).unwrap(), b"v");
    }
    assert_eq!(c.get("big", secs(1)).unwrap().len(), 1 << 20);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // The stuck reader still gets its answers, in order, once it reads.
    let mut head = [0u8; 9];
    r.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0);
    assert_eq!(u64::from_le_bytes(head[1..].try_into().unwrap()), 1 << 20);
}

#[test]
fn tcp_a_flooding_client_does_not_starve_others() {
    let s = server();
    let c = client(&s);
    let flood = raw_conn(&s);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // One thread writes SETs as fast as it can, another drains their answers.
    let mut w = flood.try_clone().unwrap();
    let stop_w = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut batch = Vec::new();
        for _ in 0..1000 {
            batch.extend_from_slice(&raw::set_header("flood", 8));
            batch.extend_from_slice(&[1; 8]);
        }
        while !stop_w.load(std::sync::atomic::Ordering::Relaxed) {
            if w.write_all(&batch).is_err() {
                return;
            }
        }
    });
    let mut r = flood;
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    for i in 0..200 {
        c.set(&format!("k{i}"), b"v").unwrap();
        assert_eq!(c.try_get(&format!("k{i}")).unwrap(), Some(b"v".to_vec()));
    }
    let took = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    drop(s);
    reader.join().unwrap();
    assert!(took < Duration::from_secs(3), "400 requests took {took:?} beside a flooding client");
}

#[test]
fn tcp_a_hello_trickling_in_is_cut_off_after_5_s() {
    let s = server();
    let mut slow = TcpStream::connect(s.local_addr()).unwrap();
    let nonce = raw::read_challenge(&mut slow).unwrap();
    let mut w = slow.try_clone().unwrap();
    let t0 = Instant::now();
    // One byte every 250 ms: 18 s for the whole hello, but the server allows 5 s in all.
    let writer = std::thread::spawn(move || {
        for b in raw::hello(TOKEN, &nonce) {
            if w.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    let mut r = slow;
    r.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut x = [0u8; 8];
    match r.read(&mut x) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the server to close the connection, got {other:?}"),
    }
    let cut = t0.elapsed();
    assert!(cut >= Duration::from_millis(4500) && cut < Duration::from_secs(8), "{cut:?}");
    // Meanwhile others are served.
    client(&s).set("k", b"v").unwrap();
    writer.join().unwrap();
}

/// 1024 clients, each its own connection, against one server: each sets its key and takes part in
/// one exchange among all 1024.
#[test]
fn tcp_1024_clients_exchange_through_one_server() {
    const N: usize = 1024;
    raise_nofile_limit(2 * N as u64 + 256);
    let s = server();
    let port = s.local_addr().port();
    let t0 = Instant::now();
    let barrier = Arc::new(std::sync::Barrier::new(N));
    let hs: Vec<_> = (0..N)
        .map(|rank| {
            let barrier = barrier.clone();
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    barrier.wait();
                    let c = TcpStore::connect("127.0.0.1", port, TOKEN, secs(60)).unwrap();
                    c.set(&format!("own/{rank}"), format!("{rank}").as_bytes()).unwrap();
                    let all = exchange(&c, "addr", rank, N, format!("addr-of-{rank}").as_bytes(), secs(60)).unwrap();
                    assert_eq!(all.len(), N);
                    for (r, v) in all.iter().enumerate() {
                        assert_eq!(v, format!("addr-of-{r}").as_bytes(), "rank {rank} got a wrong value for rank {r}");
                    }
                })
                .unwrap()
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let took = t0.elapsed();
    eprintln!("tcp_1024_clients_exchange_through_one_server: {N} clients connected, set and exchanged in {:.2} s", took.as_secs_f64());
    // N own keys, N exchange keys, one gathered value.
    assert_eq!(s.num_keys(), 2 * N + 1);
}

/// Raises the soft open-files limit towards the hard one (a thousand connections have two ends here).
fn raise_nofile_limit(want: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && (lim.rlim_cur as u64) < want {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[test]
fn tcp_dead_server_is_reported() {
    let s = server();
    let c = Arc::new(client(&s));
    c.set("a", b"1").unwrap();
    let c2 = c.clone();
    let waiter = std::thread::spawn(move || c2.get("never", secs(20)));
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    drop(s); // joins its threads, closes connections
    let e = waiter.join().unwrap().unwrap_err();
    assert_eq!(e.status, Status::Rendezvous, "{e}");
    assert!(e.msg.contains("closed the connection"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    let e = c.set("b", b"2").unwrap_err();
    assert_eq!(e.status, Status::Rendezvous, "{e}");
}

#[test]
fn tcp_port_in_use_is_a_system_error() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let e = StoreServer::start(l.local_addr().unwrap(), TOKEN.to_vec()).unwrap_err();
    assert_eq!(e.status, Status::System);
    assert!(e.msg.contains("already in use"), "{e}");
}

#[test]
fn prefix_store_separates_groups() {
    let s = server();
    let base: Arc<dyn Store> = Arc::new(client(&s));
    let a = PrefixStore::new(base.clone(), "ga/0");
    let b = PrefixStore::new(base.clone(), "gb/0");
    a.set("k", b"a").unwrap();
    b.set("k", b"b").unwrap();
    assert_eq!(a.get("k", secs(1)).unwrap(), b"a");
    assert_eq!(b.get("k", secs(1)).unwrap(), b"b");
    assert_eq!(a.add("n", 1).unwrap(), 1);
    assert_eq!(b.try_get("n").unwrap(), None);
    assert_eq!(base.try_get("ga/0/k").unwrap(), Some(b"a".to_vec()));
}

// ------------------------------------------------------------------------------------------
// File store
// ------------------------------------------------------------------------------------------

#[test]
fn file_store_basics_across_threads() {
    let p = tmp_path("basics");
    let hs: Vec<_> = (0..4)
        .map(|i| {
            let p = p.clone();
            std::thread::spawn(move || {
                let f = FileStore::open(&p, TOKEN, secs(10)).unwrap();
                f.set(&format!("k/{i}"), &vec![i as u8; 1000]).unwrap();
                for _ in 0..20 {
                    f.add("ctr", 1).unwrap();
                }
                for j in 0..4 {
                    assert_eq!(f.get(&format!("k/{j}"), secs(10)).unwrap(), vec![j as u8; 1000]);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let f = FileStore::open(&p, TOKEN, secs(10)).unwrap();
    assert_eq!(f.add("ctr", 0).unwrap(), 80);
    let t0 = Instant::now();
    let e = f.get("never", ms(200)).unwrap_err();
    assert_eq!(e.status, Status::Timeout);
    assert!(t0.elapsed() < Duration::from_secs(2));
    let _ = std::fs::remove_file(&p);
}

/// Child half of `file_store_locks_across_processes` (does nothing unless started by it).
#[test]
fn file_store_child_helper() {
    let Ok(path) = std::env::var("DC_TEST_FILE_STORE_CHILD") else { return };
    let f = FileStore::open(&path, TOKEN, secs(20)).unwrap();
    for _ in 0..100 {
        f.add("ctr", 1).unwrap();
    }
    f.set(&format!("child/{}", std::process::id()), b"done").unwrap();
}

#[test]
fn file_store_locks_across_processes() {
    let p = tmp_path("procs");
    // Create the store first so every process joins the same generation.
    let f = FileStore::open(&p, TOKEN, secs(20)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let kids: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--exact", "file_store_child_helper", "--test-threads=1", "-q"])
                .env("DC_TEST_FILE_STORE_CHILD", &p)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for _ in 0..100 {
        f.add("ctr", 1).unwrap();
    }
    for mut k in kids {
        assert!(k.wait().unwrap().success());
    }
    assert_eq!(f.add("ctr", 0).unwrap(), 400);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn file_store_joins_a_live_generation() {
    let p = tmp_path("live");
    let a = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    a.set("k", b"from a").unwrap();
    let b = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    assert_eq!(a.generation(), b.generation());
    assert_eq!(b.try_get("k").unwrap(), Some(b"from a".to_vec()));
    let _ = std::fs::remove_file(&p);
}

#[test]
fn file_store_completed_generation_is_not_reused() {
    let p = tmp_path("complete");
    let a = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    let a2 = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    a.set("k", b"old job").unwrap();
    a.job_done().unwrap();
    // Not complete while a2 has not finished.
    let x = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "other").unwrap();
    assert_eq!(x.generation(), a.generation());
    x.job_done().unwrap();
    a2.job_done().unwrap();
    // Now every job that joined is done: a newcomer starts afresh.
    let b = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    assert_eq!(b.generation(), a.generation() + 1);
    assert_eq!(b.try_get("k").unwrap(), None);
    // The old job's instances keep working in their own generation.
    assert_eq!(a.try_get("k").unwrap(), Some(b"old job".to_vec()));
    a.set("k2", b"x").unwrap();
    assert_eq!(b.try_get("k2").unwrap(), None);
    let _ = std::fs::remove_file(&p);
}

fn set_mtime_ago(p: &std::path::Path, ago: Duration) {
    let f = std::fs::File::options().write(true).open(p).unwrap();
    f.set_modified(SystemTime::now() - ago).unwrap();
}

#[test]
fn file_store_stale_leftover_is_reset() {
    let p = tmp_path("stale");
    // A job that joined, wrote, and then went quiet for an hour.
    let old = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    old.set("k", b"stale").unwrap();
    old.add("g/arrivals", 3).unwrap();
    set_mtime_ago(&p, Duration::from_secs(3600));
    let new = FileStore::open_job(&p, TOKEN, Duration::from_secs(10), "g").unwrap();
    assert_eq!(new.try_get("k").unwrap(), None);
    assert_eq!(new.add("g/arrivals", 1).unwrap(), 1);
    // The old epoch's instance learns the file is no longer its own.
    let e = old.try_get("k").unwrap_err();
    assert_eq!(e.status, Status::Rendezvous);
    assert!(e.msg.contains("reset"), "{e}");
    let _ = std::fs::remove_file(&p);
}

#[test]
fn file_store_generation_with_a_dead_member_is_abandoned() {
    let p = tmp_path("dead");
    let mut kid = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = kid.id();
    kid.wait().unwrap();
    // A rank on this host that registered and was killed before it finished.
    let f = FileStore::open(&p, TOKEN, secs(60)).unwrap();
    let host = distcomm::log::hostname();
    f.set(&format!("__dc/member/g/{host}/{dead_pid}/0"), b"open").unwrap();
    f.set("k", b"of the killed job").unwrap();
    let live = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    assert_eq!(live.generation(), f.generation() + 1);
    assert_eq!(live.try_get("k").unwrap(), None);
    // A live member keeps the generation joinable.
    let other = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    assert_eq!(other.generation(), live.generation());
    let _ = std::fs::remove_file(&p);
}

#[test]
fn file_store_silent_generation_is_abandoned_but_heartbeats_keep_it() {
    let p = tmp_path("silent");
    let a = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    set_mtime_ago(&p, Duration::from_secs(30));
    let b = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    assert_eq!(b.generation(), a.generation() + 1, "30 s of silence: abandoned");

    // A member waiting in get() touches the file, so a newcomer joins it.
    let p2 = tmp_path("heartbeat");
    let a = Arc::new(FileStore::open_job(&p2, TOKEN, Duration::from_secs(3), "g").unwrap());
    let a2 = a.clone();
    let waiter = std::thread::spawn(move || a2.get("never", ms(1600)));
    set_mtime_ago(&p2, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1300));
    let b = FileStore::open_job(&p2, TOKEN, Duration::from_secs(3), "g").unwrap();
    assert_eq!(b.generation(), a.generation());
    assert_eq!(waiter.join().unwrap().unwrap_err().status, Status::Timeout);
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_file(&p2);
}

#[test]
fn file_store_never_overwrites_a_foreign_file() {
    let p = tmp_path("foreign");
    std::fs::write(&p, b"precious data, not a store").unwrap();
    let e = FileStore::open(&p, TOKEN, secs(1)).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.msg.contains("not a distcomm store file"), "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), b"precious data, not a store");
    let _ = std::fs::remove_file(&p);
}

#[test]
fn file_store_drops_a_torn_record() {
    let p = tmp_path("torn");
    let a = FileStore::open(&p, TOKEN, secs(10)).unwrap();
    a.set("k", b"v").unwrap();
    // A writer that crashed half-way through a record.
    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(&[40, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(f);
    assert_eq!(a.try_get("k").unwrap(), Some(b"v".to_vec()));
    a.set("k2", b"v2").unwrap();
    let b = FileStore::open(&p, TOKEN, secs(10)).unwrap();
    assert_eq!(b.try_get("k2").unwrap(), Some(b"v2".to_vec()));
    let _ = std::fs::remove_file(&p);
}

/// Two jobs with different tokens on one file: neither reads the other's keys nor counts in the
/// other's counters (so neither joins the other's job), and a writer without the token cannot
/// roll a job's counter back by replaying one of its records.
#[test]
fn file_store_jobs_with_different_tokens_stay_apart() {
    let p = tmp_path("tokens");
    let a = FileStore::open_job(&p, b"token a", Duration::from_secs(60), "g").unwrap();
    a.set("k", b"of a").unwrap();
    assert_eq!(a.add("g/arrivals", 1).unwrap(), 1);
    let b = FileStore::open_job(&p, b"token b", Duration::from_secs(60), "g").unwrap();
    assert_eq!(b.try_get("k").unwrap(), None, "B reads A's key");
    assert_eq!(b.add("g/arrivals", 1).unwrap(), 1, "B counts in A's arrivals");
    b.set("k", b"of b").unwrap();
    assert_eq!(a.try_get("k").unwrap(), Some(b"of a".to_vec()), "B overwrote A's key");
    assert_eq!(a.add("g/arrivals", 0).unwrap(), 1);
    // A's next rank still finds A's job, whatever B wrote.
    let a2 = FileStore::open_job(&p, b"token a", Duration::from_secs(60), "g").unwrap();
    assert_eq!(a2.generation(), a.generation());
    assert_eq!(a2.try_get("k").unwrap(), Some(b"of a".to_vec()));
    assert_eq!(b.try_get("k").unwrap(), Some(b"of b".to_vec()));

    // A record of A's counter, copied to the end of the file by someone without the token.
    let len = |p: &PathBuf| std::fs::metadata(p).unwrap().len() as usize;
    let before = len(&p);
    assert_eq!(a.add("ctr", 1).unwrap(), 1);
    let record = std::fs::read(&p).unwrap()[before..].to_vec();
    assert_eq!(a.add("ctr", 1).unwrap(), 2);
    std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(&record).unwrap();
    assert_eq!(a.add("ctr", 0).unwrap(), 2, "a replayed record rolled the counter back");
    assert_eq!(a2.add("ctr", 0).unwrap(), 2);
    for s in [a, a2, b] {
        s.job_done().unwrap();
    }
    let _ = std::fs::remove_file(&p);
}

// ------------------------------------------------------------------------------------------
// exchange and rendezvous
// ------------------------------------------------------------------------------------------

#[test]
fn exchange_returns_values_in_rank_order() {
    let st = Arc::new(MemStore::new());
    let hs: Vec<_> = (0..4)
        .map(|r| {
            let st = st.clone();
            std::thread::spawn(move || exchange(st.as_ref(), "addr", r, 4, format!("v{r}").as_bytes(), secs(5)))
        })
        .collect();
    for h in hs {
        let all = h.join().unwrap().unwrap();
        assert_eq!(all, vec![b"v0".to_vec(), b"v1".to_vec(), b"v2".to_vec(), b"v3".to_vec()]);
    }
}

#[test]
fn exchange_names_missing_ranks() {
    let st = Arc::new(MemStore::new());
    let st1 = st.clone();
    let h = std::thread::spawn(move || exchange(st1.as_ref(), "join", 1, 4, b"x", ms(300)));
    let e = exchange(st.as_ref(), "join", 0, 4, b"x", ms(300)).unwrap_err();
    assert_eq!(e.status, Status::Timeout);
    assert!(e.msg.contains("ranks 2, 3 never joined"), "{e}");
    let e = h.join().unwrap().unwrap_err();
    assert!(e.msg.contains("ranks 2, 3 never joined"), "{e}");
    assert_eq!(distcomm::rendezvous::fmt_ranks(&[5]), "rank 5");
    assert_eq!(distcomm::rendezvous::fmt_ranks(&[0, 1, 2, 3, 7, 9, 10]), "ranks 0-3, 7, 9, 10");
}

fn env_cfg(pairs: &[(&str, String)], opts: &InitOptions) -> distcomm::rendezvous::JobConfig {
    let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    resolve(opts, &move |k: &str| m.get(k).cloned()).unwrap()
}


#[test]
fn rendezvous_env_rank0_hosts_and_reinit_gets_fresh_keys() {
    let port = free_port();
    let run = |rank: usize| {
        let env = vec![
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", port.to_string()),
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", "3".to_string()),
            ("DC_TIMEOUT_MS", "10000".to_string()),
        ];
        std::thread::spawn(move || {
            let cfg = env_cfg(&env, &InitOptions::from_env());
            let rv = rendezvous(&cfg).unwrap();
            assert_eq!(rv.rank, rank);
            assert_eq!(rv.world_size, 3);
            assert_eq!(rv.server.is_some(), rank == 0);
            assert_eq!(rv.bind_ip.to_string(), "127.0.0.1");
            let all = exchange(rv.store.as_ref(), "addr", rank, 3, &[rank as u8], secs(10)).unwrap();
            assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
            // Second init of the same group in the same "process" while the first is alive.
            let rv2 = rendezvous(&cfg).unwrap();
            assert!(rv2.store.try_get(&format!("addr/{rank}")).unwrap().is_none());
            let all = exchange(rv2.store.as_ref(), "addr", rank, 3, &[10 + rank as u8], secs(10)).unwrap();
            assert_eq!(all, vec![vec![10], vec![11], vec![12]]);
            (rv, rv2)
        })
    };
    let hs: Vec<_> = (0..3).map(run).collect();
    // Keep every result (rank 0's holds the store server) until all ranks are through.
    let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results[0].0.server.is_some());
}

#[test]
fn rendezvous_times_out_naming_missing_ranks() {
    let port = free_port();
    let mk = |rank: usize| {
        vec![
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", port.to_string()),
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", "4".to_string()),
            ("DC_TIMEOUT_MS", "700".to_string()),
        ]
    };
    let e1 = mk(1);
    let h = std::thread::spawn(move || rendezvous(&env_cfg(&e1, &InitOptions::from_env())).map(|_| ()));
    let e = rendezvous(&env_cfg(&mk(0), &InitOptions::from_env())).unwrap_err();
    assert_eq!(e.status, Status::Timeout, "{e}");
    assert!(e.msg.contains("ranks 2, 3 never joined"), "{e}");
    let e = h.join().unwrap().unwrap_err();
    // Rank 1 either saw the same, or lost the store when rank 0 gave up.
    assert!(e.status == Status::Timeout || e.status == Status::Rendezvous, "{e}");
}

#[test]
fn rendezvous_rank0_port_in_use() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let env = vec![
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", port.to_string()),
        ("RANK", "0".to_string()),
        ("WORLD_SIZE", "2".to_string()),
    ];
    let e = rendezvous(&env_cfg(&env, &InitOptions::from_env())).unwrap_err();
    assert_eq!(e.status, Status::System);
    assert_eq!(e.msg, format!("MASTER_PORT {port} on 127.0.0.1 is already in use (another job?)"));
}

#[test]
fn rendezvous_with_launcher_store_and_tcp_url() {
    let s = server();
    let port = s.local_addr().port();
    let hs: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let env = vec![
                    ("DC_LAUNCHER_STORE", "1".to_string()),
                    ("DC_TOKEN", String::from_utf8(TOKEN.to_vec()).unwrap()),
                    ("DC_TIMEOUT_MS", "10000".to_string()),
                ];
                let opts = InitOptions {
                    init_method: Some(format!("tcp://127.0.0.1:{port}")),
                    rank,
                    world_size: 2,
                    group_name: Some("grp".into()),
                    ..InitOptions::from_env()
                };
                let rv = rendezvous(&env_cfg(&env, &opts)).unwrap();
                assert!(rv.server.is_none());
                rv.rank
            })
        })
        .collect();
    let ranks: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(ranks, vec![0, 1]);
    // The generation counters live in the launcher's store.
    let c = client(&s);
    assert_eq!(c.try_get("grp/gen/0").unwrap(), Some(b"1".to_vec()));
}

#[test]
fn rendezvous_file_assigns_ranks_in_arrival_order() {
    let p = tmp_path("arrival");
    let url = format!("file://{}", p.display());
    let round = |url: String| {
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let url = url.clone();
                std::thread::spawn(move || {
                    let opts = InitOptions {
                        init_method: Some(url),
                        world_size: 3,
                        timeout_ms: 10_000,
                        ..InitOptions::from_env()
                    };
                    let rv = rendezvous(&env_cfg(&[], &opts)).unwrap();
                    let all = exchange(rv.store.as_ref(), "x", rv.rank, 3, &[rv.rank as u8], secs(10)).unwrap();
                    assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
                    rv.rank
                })
            })
            .collect();
        let mut ranks: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        ranks.sort();
        assert_eq!(ranks, vec![0, 1, 2]);
    };
    round(url.clone());
    round(url); // a second job on the same (now complete) file
    let _ = std::fs::remove_file(&p);
}

/// Two jobs of two ranks on one file (ranks on arrival) with different tokens, one given as the
/// `token` option and one as `DC_TOKEN`, arriving in turns (A, B, A, B): each job forms of its
/// own ranks only and completes. Sharing one set of keys, A's and B's first arrivals would form
/// a job together.
#[test]
fn rendezvous_file_jobs_with_different_tokens_stay_apart() {
    let p = tmp_path("two-jobs");
    let url = format!("file://{}", p.display());
    let arrive = |job: u8| {
        let url = url.clone();
        std::thread::spawn(move || {
            let env = if job == b'B' { vec![("DC_TOKEN", "token of job B".to_string())] } else { vec![] };
            let opts = InitOptions {
                init_method: Some(url),
                world_size: 2,
                timeout_ms: 10_000,
                token: (job == b'A').then(|| "token of job A".to_string()),
                ..InitOptions::from_env()
            };
            let rv = rendezvous(&env_cfg(&env, &opts)).unwrap();
            let all = exchange(rv.store.as_ref(), "who", rv.rank, 2, &[job], secs(10)).unwrap();
            (job, rv.rank, all)
        })
    };
    let mut hs = Vec::new();
    for job in [b'A', b'B', b'A', b'B'] {
        hs.push(arrive(job));
        // Each arrival takes its place in the file before the next comes.
        std::thread::sleep(Duration::from_millis(150));
    }
    let mut ranks: HashMap<u8, Vec<usize>> = HashMap::new();
    for h in hs {
        let (job, rank, all) = h.join().unwrap();
        assert_eq!(all, vec![vec![job], vec![job]], "job {} met another job's rank", job as char);
        ranks.entry(job).or_default().push(rank);
    }
    for (job, mut r) in ranks {
        r.sort();
        assert_eq!(r, vec![0, 1], "job {}", job as char);
    }
    let _ = std::fs::remove_file(&p);
}

/// A file of the first store format (unsigned records): refused while it may be in use, reset
/// once stale.
#[test]
fn file_store_first_format_is_refused_while_fresh_and_reset_when_stale() {
    let p = tmp_path("format1");
    let mut old = b"DCFSTOR1".to_vec();
    old.extend_from_slice(&7u64.to_le_bytes());
    std::fs::write(&p, &old).unwrap();
    let e = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap_err();
    assert_eq!(e.status, Status::Rendezvous, "{e}");
    assert!(e.msg.contains("older distcomm"), "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), old, "a file in use was changed");
    set_mtime_ago(&p, Duration::from_secs(3600));
    let f = FileStore::open_job(&p, TOKEN, Duration::from_secs(60), "g").unwrap();
    f.set("k", b"v").unwrap();
    assert_eq!(FileStore::open(&p, TOKEN, secs(10)).unwrap().try_get("k").unwrap(), Some(b"v".to_vec()));
    let _ = std::fs::remove_file(&p);
}
