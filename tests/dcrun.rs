//! Integration tests of the `dcrun` launcher.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const DCRUN: &str = env!("CARGO_BIN_EXE_dcrun");

fn dcrun(args: &[&str]) -> Output {
    Command::new(DCRUN).args(args).env_remove("DC_TOKEN").output().unwrap()
}

fn stdout_lines(o: &Output) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect();
    v.sort();
    v
}

#[test]
fn environment_reaches_every_rank_with_prefixes() {
    let o = dcrun(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $DC_LAUNCHER_STORE ${#DC_TOKEN}\"; \
         echo \"port=$MASTER_PORT\"; echo to-stderr >&2",
    ]);
    assert!(o.status.success(), "{o:?}");
    let lines = stdout_lines(&o);
    let ports: Vec<&String> = lines.iter().filter(|l| l.contains("port=")).collect();
    assert_eq!(ports.len(), 3);
    let port = ports[0].split("port=").nth(1).unwrap().to_string();
    assert!(port.parse::<u16>().unwrap() > 0);
    assert!(ports.iter().all(|l| l.ends_with(&format!("port={port}"))), "{ports:?}");
    let info: Vec<&String> = lines.iter().filter(|l| !l.contains("port=")).collect();
    assert_eq!(
        info,
        vec![
            "[0] 0 3 0 3 127.0.0.1 1 32",
            "[1] 1 3 1 3 127.0.0.1 1 32",
            "[2] 2 3 2 3 127.0.0.1 1 32",
        ]
    );
    let err = String::from_utf8_lossy(&o.stderr);
    for r in 0..3 {
        assert!(err.contains(&format!("[{r}] to-stderr")), "{err}");
    }
}

#[test]
fn no_prefix_and_given_token() {
    let o = Command::new(DCRUN)
        .args(["-n", "2", "--no-prefix", "sh", "-c", "echo \"tok=$DC_TOKEN\""])
        .env("DC_TOKEN", "my-token")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(stdout_lines(&o), vec!["tok=my-token", "tok=my-token"]);
}

#[test]
fn multi_node_ranks_and_token_rule() {
    // Node 1 of 2: ranks 2 and 3; the store is node 0's (not started here).
    let o = Command::new(DCRUN)
        .args(["-n", "2", "--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.1:1"])
        .args(["sh", "-c", "echo \"$RANK/$WORLD_SIZE $LOCAL_RANK $MASTER_ADDR:$MASTER_PORT\""])
        .env("DC_TOKEN", "shared")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout_lines(&o), vec!["[2] 2/4 0 127.0.0.1:1", "[3] 3/4 1 127.0.0.1:1"]);
    // Without a shared token, multi-node refuses to start.
    let o = dcrun(&["-n", "1", "--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.1:1", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("DC_TOKEN"));
}

#[test]
fn failing_rank_tears_down_the_others() {
    let t0 = Instant::now();
    let o = dcrun(&["-n", "3", "sh", "-c", "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 30"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank 1") && err.contains("status 3"), "{err}");
}

#[test]
fn a_job_past_its_time_limit_is_stopped() {
    let t0 = Instant::now();
    let o = dcrun(&["-n", "2", "--time-limit", "1", "sh", "-c", "if [ \"$RANK\" = 1 ]; then trap '' TERM; fi; exec sleep 30"]);
    assert_eq!(o.status.code(), Some(124), "{o:?}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(String::from_utf8_lossy(&o.stderr).contains("time limit of 1 s"), "{o:?}");
    let quick = dcrun(&["-n", "2", "--time-limit", "20", "true"]);
    assert_eq!(quick.status.code(), Some(0), "{quick:?}");
}

#[test]
fn keep_going_leaves_the_others_running() {
    let o = dcrun(&["-n", "3", "--keep-going", "sh", "-c", "if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; sleep 0.5; echo done $RANK"]);
    assert_eq!(o.status.code(), Some(137), "{o:?}");
    assert_eq!(stdout_lines(&o), vec!["[0] done 0", "[2] done 2"], "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("the others go on (--keep-going)"), "{o:?}");
}

#[test]
fn stubborn_rank_is_killed_after_the_grace_period() {
    let t0 = Instant::now();
    let o = dcrun(&["-n", "2", "sh", "-c", "if [ \"$RANK\" = 0 ]; then sleep 0.5; exit 4; fi; trap '' TERM; sleep 30"]);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn exit_status_propagates() {
    assert_eq!(dcrun(&["-n", "2", "true"]).status.code(), Some(0));
    let o = dcrun(&["-n", "2", "sh", "-c", "exit $((RANK * 7))"]);
    assert_eq!(o.status.code(), Some(7));
    let o = dcrun(&["-n", "2", "sh", "-c", "[ \"$RANK\" = 1 ] && kill -9 $$; exit 0"]);
    assert_eq!(o.status.code(), Some(137));
    assert!(String::from_utf8_lossy(&o.stderr).contains("SIGKILL"));
    let o = dcrun(&["-n", "1", "/nonexistent/program"]);
    assert_eq!(o.status.code(), Some(127));
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &[][..],
        &["-n"][..],
        &["-n", "x", "true"][..],
        &["-n", "0", "true"][..],
        &["-n", "2"][..],
        &["--bogus", "-n", "1", "true"][..],
        &["-n", "1", "--nnodes", "2", "true"][..],
        &["-n", "1", "--nnodes", "2", "--node-rank", "2", "--master", "h:1", "true"][..],
        &["-n", "1", "--master", "nohostport", "true"][..],
    ] {
        let o = dcrun(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("usage:"), "{args:?}");
    }
    let o = dcrun(&["--help"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--nnodes"));
    let o = dcrun(&["--version"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("dcrun"));
    // Options after the program belong to the program.
    let o = dcrun(&["-n1", "echo", "-n", "x"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[0] x\n");
}

#[test]
fn sigterm_is_forwarded() {
    use std::io::{BufRead, BufReader, Read};
    let mut child = Command::new(DCRUN)
        .args(["-n", "2", "sh", "-c", "trap 'echo got-term; exit 9' TERM; echo ready; sleep 30 & wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Signal only once both ranks have their trap in place (a loaded machine starts them late).
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ready = 0;
    let mut line = String::new();
    while ready < 2 {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "dcrun ended before its ranks were ready");
        ready += usize::from(line.trim_end().ends_with("ready"));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(9), "{rest}");
    let mut lines: Vec<&str> = rest.lines().collect();
    lines.sort();
    assert_eq!(lines, vec!["[0] got-term", "[1] got-term"]);
}

/// Run by `ranks_rendezvous_through_the_launcher_store` as each rank (does nothing otherwise).
#[test]
fn child_rank_helper() {
    if std::env::var("DC_TEST_DCRUN_CHILD").is_err() {
        return;
    }
    use distcomm::rendezvous::{exchange, rendezvous_from_env, InitOptions};
    let rv = rendezvous_from_env(&InitOptions::from_env()).expect("rendezvous");
    if std::env::var("DC_TEST_RANK0_STORE").is_ok() {
        // --rank0-store: rank 0 serves the store itself, as under torchrun.
        assert!(std::env::var("DC_LAUNCHER_STORE").is_err(), "DC_LAUNCHER_STORE is not set");
        assert_eq!(rv.server.is_some(), rv.rank == 0, "rank 0 serves the store");
    } else {
        assert!(rv.server.is_none(), "the launcher serves the store");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let all = exchange(rv.store.as_ref(), "hello", rv.rank, rv.world_size, format!("r{}", rv.rank).as_bytes(), deadline)
        .expect("exchange");
    let all: Vec<String> = all.into_iter().map(|v| String::from_utf8(v).unwrap()).collect();
    println!("RDV rank={} all={}", rv.rank, all.join(","));
    if rv.server.is_some() {
        // Rank 0 serves the store: it stays until every other rank has read what it needs.
        for r in 1..rv.world_size {
            rv.store.get(&format!("left/{r}"), deadline).expect("the others leave");
        }
    } else if std::env::var("DC_TEST_RANK0_STORE").is_ok() {
        rv.store.set(&format!("left/{}", rv.rank), b"1").expect("set");
    }
}

#[test]
fn ranks_rendezvous_through_the_launcher_store() {
    rendezvous_under_dcrun(false);
}

#[test]
fn ranks_rendezvous_through_rank_0s_store_with_rank0_store() {
    rendezvous_under_dcrun(true);
}

fn rendezvous_under_dcrun(rank0_store: bool) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(DCRUN);
    cmd.args(["-n", "3"]);
    if rank0_store {
        cmd.arg("--rank0-store").env("DC_TEST_RANK0_STORE", "1");
    }
    let o = cmd
        .arg("--")
        .arg(&exe)
        .args(["--exact", "child_rank_helper", "--nocapture", "--test-threads=1", "-q"])
        .env("DC_TEST_DCRUN_CHILD", "1")
        .env("DC_TIMEOUT_MS", "20000")
        .env_remove("DC_TOKEN")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let rdv: Vec<String> = stdout_lines(&o).into_iter().filter(|l| l.contains("RDV")).collect();
    assert_eq!(
        rdv,
        vec![
            "[0] RDV rank=0 all=r0,r1,r2",
            "[1] RDV rank=1 all=r0,r1,r2",
            "[2] RDV rank=2 all=r0,r1,r2",
        ],
        "{o:?}"
    );
}
