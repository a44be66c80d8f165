//! `DC_DEBUG=DETAIL`: before each collective the members compare what they are calling, and a
//! disagreement fails the call on every member with `DC_ERR_MISMATCH`, naming the ranks and
//! what differed ("rank 1 called allreduce(float32, sum, count=10) where rank 0 called
//! allreduce(float32, sum, count=12)"). No data of the collective moves, so the communicator
//! stays usable.
//!
//! Two rounds of small fixed-size messages on the call's own `Link` (the caller gives it a tag
//! space apart from the collective's data, keyed by the same sequence number):
//! 1. every rank sends every other rank a [`Fingerprint`] of its call as seen from that pair:
//!    kind, dtype, op, root, count, and for the v-forms what it sends to / expects from that
//!    peer. Each rank checks what it received against its own call.
//! 2. every rank sends everyone its verdict (empty, or a description of what it found). All
//!    ranks then report the verdict of the lowest rank that found something, so every member
//!    returns the same message.
//!
//! Cost: 2(n-1) messages of at most [`FP_LEN`] / [`MAX_VERDICT`] bytes per rank per
//! collective; memory O(n). Only with `DC_DEBUG=DETAIL`.

use crate::coll::Link;
use crate::collective::CollArgs;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result, Status};
use once_cell::sync::Lazy;

static DETAIL: Lazy<bool> = Lazy::new(|| crate::params::get().detail());

/// Whether `DC_DEBUG=DETAIL` asked for the check.
pub fn enabled() -> bool {
    *DETAIL
}

/// Signature word of the check's frames (a kind no collective uses).
pub const CHECK_SIG: u32 = 31 << 27;
/// Encoded size of a fingerprint.
pub const FP_LEN: usize = 40;
/// Longest verdict text sent in round 2.
pub const MAX_VERDICT: usize = 1024;
const MAGIC: u8 = 0xD7;
const NONE8: u8 = 0xFF;
const NO_ROOT: u32 = u32::MAX;

const KINDS: [&str; 11] = [
    "allreduce", "broadcast", "reduce", "allgather", "allgatherv", "gather", "scatter", "reduce_scatter", "alltoall", "alltoallv", "barrier",
];
const ALLGATHERV: u8 = 4;
const ALLTOALLV: u8 = 9;

/// One rank's call, as seen by one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// Index into the collective kinds ("allreduce" = 0 ... "barrier" = 10).
    pub kind: u8,
    /// `DType` value, or 0xFF (barrier).
    pub dtype: u8,
    /// `ReduceOp` value, or 0xFF.
    pub op: u8,
    /// Root rank, or `u32::MAX`.
    pub root: u32,
    /// The call's count argument in elements (0 for the v-forms and barrier).
    pub count: u64,
    /// v-forms: elements this rank sends to the peer.
    pub to_peer: u64,
    /// v-forms: elements this rank expects from the peer.
    pub from_peer: u64,
}

impl Fingerprint {
    /// The fingerprint of `args` at `rank` of `n` as sent to `peer`.
    pub fn of(args: &CollArgs, n: usize, rank: usize, peer: usize) -> Fingerprint {
        use CollArgs::*;
        let n = n.max(1);
        let el = |bytes: usize, dt: &DType| (bytes / dt.size()) as u64;
        let (kind, dt, op, root, count, to_peer, from_peer): (u8, Option<DType>, Option<ReduceOp>, Option<usize>, u64, u64, u64) = match args {
            Allreduce { recv, dt, op, .. } => (0, Some(*dt), Some(*op), None, el(recv.len(), dt), 0, 0),
            Broadcast { buf, dt, root } => (1, Some(*dt), None, Some(*root), el(buf.len(), dt), 0, 0),
            Reduce { bytes, dt, op, root, .. } => (2, Some(*dt), Some(*op), Some(*root), el(*bytes, dt), 0, 0),
            Allgather { recv, dt, .. } => (3, Some(*dt), None, None, el(recv.len() / n, dt), 0, 0),
            Allgatherv { send, counts, dt, .. } => {
                let mine = send.map_or(counts.get(rank).copied().unwrap_or(0), |s| s.len());
                (ALLGATHERV, Some(*dt), None, None, 0, el(mine, dt), el(counts.get(peer).copied().unwrap_or(0), dt))
            }
            Gather { send, dt, root, .. } => (5, Some(*dt), None, Some(*root), el(send.len(), dt), 0, 0),
            Scatter { recv, dt, root, .. } => (6, Some(*dt), None, Some(*root), el(recv.len(), dt), 0, 0),
            ReduceScatter { send, recv, dt, op } => {
                let block = if send.is_some() { recv.len() } else { recv.len() / n };
                (7, Some(*dt), Some(*op), None, el(block, dt), 0, 0)
            }
            Alltoall { send, dt, .. } => (8, Some(*dt), None, None, el(send.len() / n, dt), 0, 0),
            Alltoallv { scounts, rcounts, dt, .. } => {
                let at = |v: &Vec<usize>| v.get(peer).copied().unwrap_or(0);
                (ALLTOALLV, Some(*dt), None, None, 0, el(at(scounts), dt), el(at(rcounts), dt))
            }
            Barrier => (10, None, None, None, 0, 0, 0),
        };
        Fingerprint {
            kind,
            dtype: dt.map_or(NONE8, |d| d as u8),
            op: op.map_or(NONE8, |o| o as u8),
            root: root.map_or(NO_ROOT, |r| r as u32),
            count,
            to_peer,
            from_peer,
        }
    }

    pub fn encode(&self) -> [u8; FP_LEN] {
        let mut b = [0u8; FP_LEN];
        b[0] = MAGIC;
        b[1] = self.kind;
        b[2] = self.dtype;
        b[3] = self.op;
        b[4..8].copy_from_slice(&self.root.to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..24].copy_from_slice(&self.to_peer.to_le_bytes());
        b[24..32].copy_from_slice(&self.from_peer.to_le_bytes());
        b
    }

    /// Parses bytes from a peer; `None` for anything that is not an encoded fingerprint.
    pub fn decode(b: &[u8]) -> Option<Fingerprint> {
        if b.len() != FP_LEN || b[0] != MAGIC || b[32..].iter().any(|&x| x != 0) {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let fp = Fingerprint {
            kind: b[1],
            dtype: b[2],
            op: b[3],
            root: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            count: u64_at(8),
            to_peer: u64_at(16),
            from_peer: u64_at(24),
        };
        (usize::from(fp.kind) < KINDS.len()).then_some(fp)
    }

    /// What must be equal on every rank.
    fn common(&self) -> (u8, u8, u8, u32, u64) {
        (self.kind, self.dtype, self.op, self.root, self.count)
    }

    fn is_v(&self) -> bool {
        self.kind == ALLGATHERV || self.kind == ALLTOALLV
    }

    /// "allreduce(float32, sum, count=12)", "reduce(int8, max, root=1, count=3)".
    pub fn describe(&self) -> String {
        let name = KINDS.get(usize::from(self.kind)).copied().unwrap_or("unknown");
        let mut parts = Vec::new();
        if let Some(d) = DType::from_raw(i64::from(self.dtype)) {
            parts.push(d.name().to_string());
        }
        if let Some(o) = ReduceOp::from_raw(i64::from(self.op)) {
            parts.push(o.name().to_string());
        }
        if self.root != NO_ROOT {
            parts.push(format!("root={}", self.root));
        }
        if !self.is_v() && self.kind != 10 {
            parts.push(format!("count={}", self.count));
        }
        format!("{name}({})", parts.join(", "))
    }
}

/// What rank `me` finds wrong in `theirs[i]` (rank i's fingerprint as sent to `me`) compared with
/// its own call (`mine[i]`: its fingerprint as sent to rank i). Empty: nothing.
pub fn judge(me: usize, mine: &[Fingerprint], theirs: &[Option<Fingerprint>]) -> String {
    let mut calls: Vec<(String, Vec<usize>)> = Vec::new();
    let mut pairs: Vec<String> = Vec::new();
    for (i, t) in theirs.iter().enumerate() {
        if i == me {
            continue;
        }
        let Some(t) = t else {
            pairs.push(format!("rank {i} sent a malformed fingerprint"));
            continue;
        };
        let m = &mine[i];
        if t.common() != m.common() {
            let d = t.describe();
            match calls.iter_mut().find(|(x, _)| *x == d) {
                Some((_, ranks)) => ranks.push(i),
                None => calls.push((d, vec![i])),
            }
            continue;
        }
        // Same v-form on both sides: what one sends must be what the other expects.
        let (what_s, what_r) = if t.kind == ALLGATHERV { ("contributes", "recvcounts") } else { ("sends", "recvcounts") };
        for (from, to, sent, expected) in [(i, me, t.to_peer, m.from_peer), (me, i, m.to_peer, t.from_peer)] {
            if t.is_v() && sent != expected {
                let target = if t.kind == ALLTOALLV { format!(" to rank {to}") } else { String::new() };
                pairs.push(format!(
                    "rank {from} {what_s} {sent} elements{target} but rank {to} expects {expected} ({what_r}[{from}] = {expected})"
                ));
            }
        }
    }
    let mine_desc = mine.iter().enumerate().find(|(i, _)| *i != me).map(|(_, m)| m.describe()).unwrap_or_default();
    let mut out: Vec<String> = calls
        .into_iter()
        .map(|(d, ranks)| format!("{} called {d} where rank {me} called {mine_desc}", crate::rendezvous::fmt_ranks(&ranks)))
        .collect();
    out.extend(pairs);
    let mut s = out.join("; ");
    if s.len() > MAX_VERDICT {
        let mut cut = MAX_VERDICT - 4;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str(" ...");
    }
    s
}

/// Runs the check over `link` (a tag space of its own) before `args` runs. `Ok` when every
/// member agrees; `DC_ERR_MISMATCH` on every member when any two disagree.
pub fn verify(link: &dyn Link, args: &CollArgs) -> Result<()> {
    let (n, me) = (link.size(), link.rank());
    if n < 2 {
        return Ok(());
    }
    let peers: Vec<usize> = (1..n).map(|k| (me + k) % n).collect();
    let mine: Vec<Fingerprint> = (0..n).map(|p| Fingerprint::of(args, n, me, p)).collect();
    let sent: Vec<[u8; FP_LEN]> = mine.iter().map(|f| f.encode()).collect();

    // Round 1: fingerprints.
    let mut got = vec![[0u8; FP_LEN]; n];
    let mut lens = vec![0usize; n];
    {
        let mut recvs = Vec::with_capacity(n);
        for (p, b) in got.iter_mut().enumerate().filter(|(p, _)| *p != me) {
            recvs.push((p, link.recv(p, &mut b[..])?));
        }
        let sends = peers.iter().map(|&p| link.send(p, &sent[p])).collect::<Result<Vec<_>>>()?;
        for (p, r) in recvs {
            lens[p] = r.wait()?;
        }
        for s in sends {
            s.wait()?;
        }
    }
    let theirs: Vec<Option<Fingerprint>> = (0..n).map(|p| if p == me { None } else { Fingerprint::decode(&got[p][..lens[p]]) }).collect();
    let verdict = judge(me, &mine, &theirs);

    // Round 2: verdicts, so that every member reports the same thing.
    let mut verdicts = vec![vec![0u8; MAX_VERDICT]; n];
    {
        let mut recvs = Vec::with_capacity(n);
        for (p, b) in verdicts.iter_mut().enumerate().filter(|(p, _)| *p != me) {
            recvs.push((p, link.recv(p, &mut b[..])?));
        }
        let sends = peers.iter().map(|&p| link.send(p, verdict.as_bytes())).collect::<Result<Vec<_>>>()?;
        for (p, r) in recvs {
            lens[p] = r.wait()?;
        }
        for s in sends {
            s.wait()?;
        }
    }
    for p in 0..n {
        let text = if p == me { verdict.clone() } else { String::from_utf8_lossy(&verdicts[p][..lens[p]]).into_owned() };
        if !text.is_empty() {
            let by = if p == me { String::new() } else { format!(" (found by rank {p})") };
            return Err(Error::new(Status::Mismatch, format!("DC_DEBUG=DETAIL: mismatched collective arguments: {text}{by}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::{ConstBuf, MutBuf};

    fn allreduce(count: usize, dt: DType, op: ReduceOp, buf: &mut [u8]) -> CollArgs {
        let recv = MutBuf::from_slice(&mut buf[..count * dt.size()]);
        CollArgs::Allreduce { send: None, recv, dt, op }
    }

    #[test]
    fn fingerprints_round_trip_and_describe_themselves() {
        let mut b = vec![0u8; 4096];
        let f = Fingerprint::of(&allreduce(12, DType::Float32, ReduceOp::Sum, &mut b), 3, 0, 1);
        assert_eq!(Fingerprint::decode(&f.encode()), Some(f));
        assert_eq!(f.describe(), "allreduce(float32, sum, count=12)");
        let mut e = f.encode();
        e[0] = 0;
        assert_eq!(Fingerprint::decode(&e), None);
        assert_eq!(Fingerprint::decode(&f.encode()[..39]), None);
        let mut e = f.encode();
        e[1] = 11;
        assert_eq!(Fingerprint::decode(&e), None);
        let bar = Fingerprint::of(&CollArgs::Barrier, 3, 0, 1);
        assert_eq!(bar.describe(), "barrier()");
    }

    #[test]
    fn judging_names_ranks_and_differences() {
        let mut b = vec![0u8; 4096];
        let a12 = Fingerprint::of(&allreduce(12, DType::Float32, ReduceOp::Sum, &mut b), 3, 0, 1);
        let a10 = Fingerprint::of(&allreduce(10, DType::Float32, ReduceOp::Sum, &mut b), 3, 1, 0);
        let v = judge(0, &[a12; 3], &[None, Some(a10), Some(a12)]);
        assert_eq!(v, "rank 1 called allreduce(float32, sum, count=10) where rank 0 called allreduce(float32, sum, count=12)");
        assert_eq!(judge(0, &[a12; 3], &[None, Some(a12), Some(a12)]), "");
        let v = judge(0, &[a12; 3], &[None, Some(a10), Some(a10)]);
        assert!(v.starts_with("ranks 1, 2 called allreduce(float32, sum, count=10)"), "{v}");
        // alltoallv: rank 0 sends 5 to rank 1, which expects 4.
        let send = vec![0u8; 64];
        let mut recv = vec![0u8; 64];
        let a2av = |sc: Vec<usize>, rc: Vec<usize>, recv: &mut [u8]| CollArgs::Alltoallv {
            send: ConstBuf::from_slice(&send),
            scounts: sc,
            sdispls: vec![0; 2],
            recv: MutBuf::from_slice(recv),
            rcounts: rc,
            rdispls: vec![0; 2],
            dt: DType::Int8,
        };
        let r0: Vec<Fingerprint> = (0..2).map(|p| Fingerprint::of(&a2av(vec![4, 5], vec![4, 4], &mut recv), 2, 0, p)).collect();
        let r1: Vec<Fingerprint> = (0..2).map(|p| Fingerprint::of(&a2av(vec![4, 4], vec![4, 4], &mut recv), 2, 1, p)).collect();
        let v0 = judge(0, &r0, &[None, Some(r1[0])]);
        let v1 = judge(1, &r1, &[Some(r0[1]), None]);
        assert_eq!(v0, "rank 0 sends 5 elements to rank 1 but rank 1 expects 4 (recvcounts[0] = 4)");
        assert_eq!(v1, v0);
        assert_eq!(judge(1, &r1, &[None, None]), "rank 0 sent a malformed fingerprint");
    }
}
