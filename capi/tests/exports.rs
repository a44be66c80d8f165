//! The shared library exports the C API and nothing else, under its soname.
//!
//! Reads the `libdistcomm.so` cargo built next to this test (target/<profile>/) with
//! `nm -D --defined-only` and `readelf -d` (binutils). Without them the test prints SKIPPED,
//! or fails under DC_TEST_STRICT=1 (scripts/test.sh).

#[path = "../../build_support/scan.rs"]
mod scan;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

fn skip_or_fail(what: &str, why: &str) {
    if std::env::var("DC_TEST_STRICT").as_deref() == Ok("1") {
        panic!("{what}: {why} (DC_TEST_STRICT=1 makes this a failure)");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED {what}: {why}");
}

/// The `libdistcomm.so` of this package (capi/), as cargo last built it: in
/// target/<profile>/deps/ beside this test, or copied up to target/<profile>/. `cargo test`
/// does not build a library that is only a cdylib and a staticlib for its tests:
/// `cargo build -p distcomm-c` does (scripts/test.sh runs it first). None (skipped, or failed
/// under DC_TEST_STRICT=1) if there is none.
fn shared_lib() -> Option<PathBuf> {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let found = [deps.join("libdistcomm.so"), deps.join("../libdistcomm.so")].into_iter().find(|p| p.exists());
    if found.is_none() {
        skip_or_fail("exports", &format!("no libdistcomm.so in {}: build it first (cargo build --release -p distcomm-c)", deps.display()));
    }
    found
}

fn run(tool: &str, args: &[&str]) -> Option<String> {
    let what = format!("exports ({tool})");
    match Command::new(tool).args(args).output() {
        Err(e) => {
            skip_or_fail(&what, &format!("{tool} not runnable ({e}); install binutils"));
            None
        }
        Ok(o) if !o.status.success() => {
            panic!("{tool} {args:?} failed: {}", String::from_utf8_lossy(&o.stderr))
        }
        Ok(o) => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
    }
}

#[test]
#[cfg(target_os = "linux")]
fn only_dc_symbols_are_exported() {
    let Some(lib) = shared_lib() else { return };
    let Some(out) = run("nm", &["-D", "--defined-only", lib.to_str().unwrap()]) else { return };
    // Lines are "ADDRESS TYPE NAME"; a name may carry a version suffix (name@@VERSION).
    let names: BTreeSet<String> = out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(|n| n.split('@').next().unwrap().to_string())
        .collect();
    let foreign: Vec<&String> = names.iter().filter(|n| !n.starts_with("dc_")).collect();
    assert!(
        foreign.is_empty(),
        "{} exports symbols outside dc_*: {foreign:?}\n(a #[no_mangle] fn without the dc_ prefix, \
         here or in a dependency: make it dc_* or drop #[no_mangle])",
        lib.display()
    );

    // Every exported Rust function is in the .so, and nothing else is.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../src/lib.rs");
    let scan = scan::scan_crate(&root).expect("sources parse");
    let expected: BTreeSet<String> = scan.functions.iter().map(|f| f.name.clone()).collect();
    let missing: Vec<&String> = expected.difference(&names).collect();
    let extra: Vec<&String> = names.difference(&expected).collect();
    assert!(missing.is_empty(), "exported in the sources but not in the .so: {missing:?}");
    assert!(extra.is_empty(), "in the .so but not a #[no_mangle] fn in the sources: {extra:?}");
    assert!(!names.is_empty(), "no dc_* symbol exported at all");
}

#[test]
#[cfg(target_os = "linux")]
fn soname_is_major_versioned() {
    let Some(lib) = shared_lib() else { return };
    let Some(out) = run("readelf", &["-d", lib.to_str().unwrap()]) else { return };
    let major = env!("DISTCOMM_VERSION").split('.').next().unwrap();
    let want = format!("[libdistcomm.so.{major}]");
    let soname = out.lines().find(|l| l.contains("(SONAME)"));
    assert!(
        soname.is_some_and(|l| l.contains(&want)),
        "SONAME of {} should be {want}, readelf says: {soname:?}",
        lib.display()
    );
}
