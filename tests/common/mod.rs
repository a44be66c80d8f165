//! Helpers shared by the integration tests that start jobs (included with `mod common;`).

#![allow(dead_code)]

use std::net::TcpListener;
use std::process::Child;
use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Waits for every child and returns their exit codes (-1: killed by a signal). Past `limit`,
/// kills every child still running (none outlives the test holding its pipes) and panics.
pub fn wait_all(mut children: Vec<Child>, limit: Duration) -> Vec<i32> {
    let t0 = Instant::now();
    let mut codes: Vec<Option<i32>> = vec![None; children.len()];
    while codes.iter().any(Option::is_none) {
        for (c, code) in children.iter_mut().zip(codes.iter_mut()) {
            if code.is_none() {
                *code = c.try_wait().unwrap().map(|s| s.code().unwrap_or(-1));
            }
        }
        if codes.iter().any(Option::is_none) && t0.elapsed() > limit {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("children did not finish within {limit:?}: exit codes so far {codes:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    codes.into_iter().map(Option::unwrap).collect()
}
