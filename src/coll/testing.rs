//! Test-only in-process `Link`: ranks are threads, one mailbox per ordered pair.
//!
//! A send copies its bytes into the pair's mailbox and completes at once (an eager, buffered
//! transport). A receive takes a per-pair sequence number when it is POSTED; its `wait` takes
//! exactly that message, so receives may be waited out of order. A message longer than the
//! receive buffer fails (truncation). Waits time out so a buggy algorithm fails instead of hanging.
//! The hub can place ranks on hosts (`Link::host_of`) and records which peers each rank touched
//! (sent to or posted a receive from): with connections opened on demand, that is what a
//! collective costs in connections.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Link, Pending, PendingOp};
use crate::error::{Result, Status};
use crate::{bail, err};

const WAIT_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Default)]
struct PairState {
    sent: u64,
    posted: u64,
    msgs: HashMap<u64, Vec<u8>>,
}

#[derive(Default)]
struct Pair {
    st: Mutex<PairState>,
    cv: Condvar,
}

/// The shared state of one group of in-process ranks.
pub(crate) struct Hub {
    n: usize,
    pairs: Vec<Pair>,
    /// Host of each rank (None: every rank its own host, the `Link` default).
    hosts: Option<Vec<usize>>,
    /// `touched[a * n + b]`: rank a sent to or posted a receive from rank b.
    touched: Vec<AtomicBool>,
}

impl Hub {
    pub fn new(n: usize) -> Hub {
        Hub::with_hosts(n, None)
    }

    pub fn with_hosts(n: usize, hosts: Option<Vec<usize>>) -> Hub {
        if let Some(h) = &hosts {
            assert_eq!(h.len(), n);
        }
        Hub {
            n,
            pairs: (0..n * n).map(|_| Pair::default()).collect(),
            hosts,
            touched: (0..n * n).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn touch(&self, a: usize, b: usize) {
        self.touched[a * self.n + b].store(true, Ordering::Relaxed);
    }

    /// For each rank, the number of distinct peers it touched or was touched by (a connection
    /// has two ends: a rank that only receives from a sender still holds that connection).
    pub fn distinct_peers(&self) -> Vec<usize> {
        let n = self.n;
        let t = |a: usize, b: usize| self.touched[a * n + b].load(Ordering::Relaxed);
        (0..n)
            .map(|a| (0..n).filter(|&b| b != a && (t(a, b) || t(b, a))).count())
            .collect()
    }

    fn pair(&self, from: usize, to: usize) -> &Pair {
        &self.pairs[from * self.n + to]
    }

    /// Panics unless every message sent was received by a posted receive.
    pub fn assert_drained(&self) {
        for from in 0..self.n {
            for to in 0..self.n {
                let st = self.pair(from, to).st.lock().unwrap();
                assert!(
                    st.msgs.is_empty() && st.sent == st.posted,
                    "pair {from}->{to}: {} sent, {} receives posted, {} undelivered",
                    st.sent,
                    st.posted,
                    st.msgs.len()
                );
            }
        }
    }
}

pub(crate) struct MockLink<'h> {
    hub: &'h Hub,
    rank: usize,
}

struct Done(usize);
impl PendingOp for Done {
    fn wait(&mut self) -> Result<usize> {
        Ok(self.0)
    }
}

struct RecvOp<'a> {
    pair: &'a Pair,
    seq: u64,
    buf: &'a mut [u8],
    peer: usize,
}

impl PendingOp for RecvOp<'_> {
    fn wait(&mut self) -> Result<usize> {
        let deadline = Instant::now() + WAIT_TIMEOUT;
        let mut st = self.pair.st.lock().unwrap();
        loop {
            if let Some(m) = st.msgs.remove(&self.seq) {
                if m.len() > self.buf.len() {
                    bail!(
                        Status::InvalidArgument,
                        "message of {} bytes from rank {} truncated to {}",
                        m.len(),
                        self.peer,
                        self.buf.len()
                    );
                }
                self.buf[..m.len()].copy_from_slice(&m);
                return Ok(m.len());
            }
            let now = Instant::now();
            if now >= deadline {
                bail!(
                    Status::Timeout,
                    "mock: receive #{} from rank {} timed out",
                    self.seq,
                    self.peer
                );
            }
            st = self.pair.cv.wait_timeout(st, deadline - now).unwrap().0;
        }
    }
}

impl<'h> Link for MockLink<'h> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.hub.n
    }
    fn host_of(&self, peer: usize) -> usize {
        self.hub.hosts.as_ref().map_or(peer, |h| h[peer])
    }
    fn send<'a>(&'a self, peer: usize, buf: &'a [u8]) -> Result<Pending<'a>> {
        if peer >= self.hub.n || peer == self.rank {
            return Err(err!(
                Status::InvalidArgument,
                "mock: send to bad peer {peer}"
            ));
        }
        self.hub.touch(self.rank, peer);
        let pair = self.hub.pair(self.rank, peer);
        let mut st = pair.st.lock().unwrap();
        let seq = st.sent;
        st.sent += 1;
        st.msgs.insert(seq, buf.to_vec());
        pair.cv.notify_all();
        Ok(Pending::new(Done(buf.len())))
    }
    fn recv<'a>(&'a self, peer: usize, buf: &'a mut [u8]) -> Result<Pending<'a>> {
        if peer >= self.hub.n || peer == self.rank {
            return Err(err!(
                Status::InvalidArgument,
                "mock: recv from bad peer {peer}"
            ));
        }
        self.hub.touch(self.rank, peer);
        let pair = self.hub.pair(peer, self.rank);
        let seq = {
            let mut st = pair.st.lock().unwrap();
            st.posted += 1;
            st.posted - 1
        };
        Ok(Pending::new(RecvOp {
            pair,
            seq,
            buf,
            peer,
        }))
    }
}

/// Runs `f` on `n` ranks (threads) over a fresh hub; returns each rank's result in rank order.
/// When every rank succeeded, also checks that no message was left undelivered.
pub(crate) fn run<R: Send>(n: usize, f: impl Fn(&dyn Link) -> Result<R> + Sync) -> Vec<Result<R>> {
    run_counting(n, f).0
}

/// `run`, also returning how many messages were sent in all.
pub(crate) fn run_counting<R: Send>(
    n: usize,
    f: impl Fn(&dyn Link) -> Result<R> + Sync,
) -> (Vec<Result<R>>, u64) {
    let (out, st) = run_on(Hub::new(n), f);
    (out, st.sent)
}

/// What a run cost.
pub(crate) struct Stats {
    /// Messages sent in all.
    pub sent: u64,
    /// Per rank: distinct peers touched (see `Hub::distinct_peers`).
    pub peers: Vec<usize>,
}

/// `run_ok` with ranks placed on hosts (`hosts[rank]`).
pub(crate) fn run_ok_hosts<R: Send>(
    hosts: &[usize],
    f: impl Fn(&dyn Link) -> Result<R> + Sync,
) -> Vec<R> {
    let (out, _) = run_on(Hub::with_hosts(hosts.len(), Some(hosts.to_vec())), f);
    unwrap_all(out)
}

/// `run_ok`, also returning what the run cost.
pub(crate) fn run_stats<R: Send>(
    hub: Hub,
    f: impl Fn(&dyn Link) -> Result<R> + Sync,
) -> (Vec<R>, Stats) {
    let (out, st) = run_on(hub, f);
    (unwrap_all(out), st)
}

fn unwrap_all<R>(out: Vec<Result<R>>) -> Vec<R> {
    out.into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|e| panic!("rank {i}: {e}")))
        .collect()
}

/// Runs `f` on every rank of `hub` (threads).
pub(crate) fn run_on<R: Send>(
    hub: Hub,
    f: impl Fn(&dyn Link) -> Result<R> + Sync,
) -> (Vec<Result<R>>, Stats) {
    let n = hub.n;
    let out: Vec<Result<R>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (hub, f) = (&hub, &f);
                s.spawn(move || f(&MockLink { hub, rank }))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    });
    if out.iter().all(|r| r.is_ok()) {
        hub.assert_drained();
    }
    let sent = hub.pairs.iter().map(|p| p.st.lock().unwrap().sent).sum();
    let peers = hub.distinct_peers();
    (out, Stats { sent, peers })
}

/// `run`, unwrapping every rank's result.
pub(crate) fn run_ok<R: Send>(n: usize, f: impl Fn(&dyn Link) -> Result<R> + Sync) -> Vec<R> {
    unwrap_all(run(n, f))
}
