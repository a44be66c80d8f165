//! Functional tests of `dc-bench` under `dcrun`: every op runs, every result checks out, the CSV
//! parses, the check notices damaged results, and the plot is drawn. Tiny sizes and few
//! iterations: these test the tool, they measure nothing.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DCRUN: &str = env!("CARGO_BIN_EXE_dcrun");
const DCBENCH: &str = env!("CARGO_BIN_EXE_dc-bench");
const HEADER: &str = "op,bytes,count,type,redop,root,inplace,time_us,algbw,busbw,wrong,ranks,impl";

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs a command with a deadline (a hang fails the test instead of stalling the suite).
fn run(cmd: &mut Command, env: &[(&str, &str)]) -> Out {
    cmd.env_remove("DC_TOKEN").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn");
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        so.read_to_string(&mut s).unwrap();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        se.read_to_string(&mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within 240 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out { code: status.code(), stdout: t_out.join().unwrap(), stderr: t_err.join().unwrap() }
}

/// A scratch directory per test, removed when the test is done.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("dc-bench-test-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dc_bench(ranks: &str, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(DCRUN);
    cmd.args(["-n", ranks, DCBENCH]).args(args);
    run(&mut cmd, env)
}

/// CSV rows as field vectors, after checking the header and the field types.
fn parse_csv(path: &PathBuf) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(HEADER));
    let rows: Vec<Vec<String>> = lines.map(|l| l.split(',').map(str::to_string).collect()).collect();
    for r in &rows {
        assert_eq!(r.len(), 13, "{r:?}");
        for i in [1, 2, 5, 6, 10, 11] {
            r[i].parse::<i64>().unwrap_or_else(|_| panic!("field {i} of {r:?} is not an integer"));
        }
        for i in [7, 8, 9] {
            let v: f64 = r[i].parse().unwrap_or_else(|_| panic!("field {i} of {r:?} is not a number"));
            assert!(v.is_finite() && v >= 0.0, "{r:?}");
        }
        assert!(r[6] == "0" || r[6] == "1");
    }
    rows
}

/// The #wrong columns of rank 0's table (out-of-place and in-place; "N/A" where absent).
fn table_wrongs(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[0]"))
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 13, "{l}");
            vec![f[8].to_string(), f[12].to_string()]
        })
        .collect()
}

#[test]
fn every_op_checks_out_and_the_csv_parses() {
    let dir = Scratch::new("all");
    let csv = dir.path("all.csv");
    let o = dc_bench("2", &["-b", "8", "-e", "64K", "-f", "8", "-o", "all", "-n", "2", "-w", "1", "-c", "1", "--csv", csv.to_str().unwrap()], &[]);
    assert_eq!(o.code, Some(0), "stdout:\n{}\nstderr:\n{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("[0] # dc-bench: distcomm"), "{}", o.stdout);
    assert!(o.stdout.contains("2 ranks, transport "), "{}", o.stdout);
    assert!(o.stdout.contains("# wrong elements: 0 (OK)"), "{}", o.stdout);
    assert!(!o.stdout.lines().any(|l| l.starts_with("[1]")), "only rank 0 prints: {}", o.stdout);
    let wrongs = table_wrongs(&o.stdout);
    assert!(!wrongs.is_empty());
    assert!(wrongs.iter().all(|w| w == "0" || w == "N/A"), "{wrongs:?}");

    let rows = parse_csv(&csv);
    assert!(rows.iter().all(|r| r[10] == "0" && r[11] == "2" && r[12] == "distcomm"), "{rows:?}");
    let every = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "sendrecv", "barrier", "gather", "scatter", "allgatherv", "alltoallv"];
    for op in every {
        assert!(rows.iter().any(|r| r[0] == op), "no {op} rows");
    }
    // 8 B .. 64 KiB by 8: five sizes; in-place rows where the C API has an in-place form.
    let n = |op: &str, ip: &str| rows.iter().filter(|r| r[0] == op && r[6] == ip).count();
    assert_eq!(n("allreduce", "0"), 5);
    assert_eq!(n("allreduce", "1"), 5);
    assert_eq!(n("alltoall", "1"), 0);
    assert_eq!(n("barrier", "0"), 1);
    // Sizes as nccl-tests counts them; busbw = algbw x factor.
    let ar = rows.iter().find(|r| r[0] == "allreduce" && r[1] == "4096").unwrap();
    assert_eq!(ar[2], "1024");
    let (alg, bus): (f64, f64) = (ar[8].parse().unwrap(), ar[9].parse().unwrap());
    assert!((bus - alg).abs() <= 1e-6 + alg * 1e-3, "allreduce at 2 ranks: busbw = algbw ({alg} vs {bus})");

    // The plot, from the CSV alone.
    let svg = dir.path("all.svg");
    let o = run(Command::new(DCBENCH).args(["--no-run", "--plot", svg.to_str().unwrap(), "--compare", csv.to_str().unwrap()]), &[]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("<polyline") && text.contains("allreduce: bus bandwidth"));
}

/// Large alltoall, allgather and sendrecv at 3 ranks of one host, every result checked, both
/// ways the library moves them: with single-copy reads of the peers' memory allowed (alltoall
/// from 64 KiB) and with it off (`DC_CMA_MIN=0`: staged through the arena, sockets).
#[test]
fn large_transfers_check_out_with_and_without_single_copy() {
    for env in [&[][..], &[("DC_CMA_MIN", "0")][..]] {
        let o = dc_bench("3", &["-b", "16K", "-e", "4M", "-f", "16", "-o", "alltoall,allgather,sendrecv", "-n", "2", "-w", "1", "-c", "2"], env);
        assert_eq!(o.code, Some(0), "{env:?}: stdout:\n{}\nstderr:\n{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("# wrong elements: 0 (OK)"), "{env:?}: {}", o.stdout);
        let wrongs = table_wrongs(&o.stdout);
        assert_eq!(wrongs.len(), 2 * 3 * 3, "{env:?}: {}", o.stdout);
        assert!(wrongs.iter().all(|w| w == "0" || w == "N/A"), "{env:?}: {wrongs:?}");
    }
}

#[test]
fn every_type_and_reduction_checks_out_at_three_ranks() {
    let dir = Scratch::new("types");
    let csv = dir.path("types.csv");
    let svg = dir.path("types.svg");
    let o = dc_bench(
        "3",
        &[
            "-b", "1", "-e", "1K", "-f", "32", "-o", "allreduce,reduce,reduce_scatter,allgather", "-d", "all", "--redop", "all", "-r", "2",
            "-n", "1", "-w", "0", "-c", "2", "--csv", csv.to_str().unwrap(), "--plot", svg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.code, Some(0), "stdout:\n{}\nstderr:\n{}", o.stdout, o.stderr);
    let rows = parse_csv(&csv);
    assert!(rows.iter().all(|r| r[10] == "0"), "wrong elements: {:?}", rows.iter().filter(|r| r[10] != "0").collect::<Vec<_>>());
    for t in ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"] {
        assert!(rows.iter().any(|r| r[3] == t && r[4] == "avg"), "no avg rows for {t}");
    }
    // Bitwise ops only for integers; the root as given.
    assert!(!rows.iter().any(|r| r[4] == "bxor" && (r[3] == "float" || r[3] == "half")));
    assert!(rows.iter().any(|r| r[4] == "bxor" && r[3] == "uint64"));
    assert!(rows.iter().filter(|r| r[0] == "reduce").all(|r| r[5] == "2"));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<polyline"));
}

/// Gather, scatter and the v forms at 3 ranks with the last rank as root, every type, each result
/// checked twice, through the sizes where the library changes its way (mailboxes, staged,
/// single-copy reads).
#[test]
fn gathers_scatters_and_v_forms_check_out_at_three_ranks() {
    let dir = Scratch::new("vcoll");
    let csv = dir.path("vcoll.csv");
    let o = dc_bench(
        "3",
        &["-b", "3", "-e", "6M", "-f", "16", "-o", "gather,scatter,allgatherv,alltoallv", "-d", "all", "-r", "2", "-n", "1", "-w", "0", "-c", "2", "--csv", csv.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.code, Some(0), "stdout:\n{}\nstderr:\n{}", o.stdout, o.stderr);
    let rows = parse_csv(&csv);
    assert!(rows.iter().all(|r| r[10] == "0" && r[6] == "0"), "{rows:?}");
    for op in ["gather", "scatter", "allgatherv", "alltoallv"] {
        // 3 B .. 3 MiB by 16 (6 sizes), each rounded down to 3 blocks of whole elements: 3 B
        // only for the two 1-byte types, the other 5 sizes for all 10.
        assert_eq!(rows.iter().filter(|r| r[0] == op).count(), 2 + 5 * 10, "{op}: {rows:?}");
    }
    assert!(rows.iter().filter(|r| r[0] == "gather" || r[0] == "scatter").all(|r| r[5] == "2"));
    assert!(rows.iter().filter(|r| r[0] == "allgatherv" || r[0] == "alltoallv").all(|r| r[5] == "-1"));
}

#[test]
fn damaged_results_are_counted() {
    let dir = Scratch::new("inject");
    let csv = dir.path("inject.csv");
    let o = dc_bench("2", &["-b", "64", "-e", "64", "-o", "all", "-n", "1", "-w", "0", "--csv", csv.to_str().unwrap()], &[("DC_BENCH_INJECT_WRONG", "1")]);
    assert_eq!(o.code, Some(3), "stdout:\n{}\nstderr:\n{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("(FAILED)"));
    let rows = parse_csv(&csv);
    for r in rows.iter().filter(|r| r[0] != "barrier") {
        assert_eq!(r[10], "1", "{r:?}");
    }
}

#[test]
fn usage_errors() {
    let o = run(Command::new(DCBENCH).args(["--op", "nope"]), &[]);
    assert_eq!(o.code, Some(2));
    assert!(o.stderr.contains("unknown op"), "{}", o.stderr);
    let o = run(Command::new(DCBENCH).args(["-b", "2M", "-e", "1M"]), &[]);
    assert_eq!(o.code, Some(2));
    let o = run(Command::new(DCBENCH).arg("--help"), &[]);
    assert_eq!(o.code, Some(0));
    assert!(o.stdout.contains("--stepfactor"));
    let o = dc_bench("2", &["-r", "5", "-o", "broadcast", "-b", "8", "-e", "8"], &[]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
}
