//! Silent peers: a peer that sends nothing for the peer timeout (`DC_PEER_TIMEOUT_MS`, default
//! 10 s) is lost, instead of every wait on it running to the operation timeout.
//!
//! - **Across hosts**, on a connection: each side sends a `Ping` every quarter of the timeout
//!   (the progress thread does), so anything read counts as a sign of life, and a connection
//!   with nothing read for the timeout (nothing waiting in the kernel either) means a host that
//!   died, a network that is cut, or a process that is stopped. `TCP_USER_TIMEOUT` (see
//!   `tcp::tune`) also breaks a connection whose sent data goes unacknowledged that long.
//! - **Across hosts, no connection yet** (they are made on demand): a wait on such a peer that
//!   lasts half the timeout dials it (in the background), so the two cases above apply.
//! - **On our host**: the peer's process is looked at (`/proc`): gone (a zombie too), or
//!   stopped (SIGSTOP, a debugger) for the timeout. A process that runs, however slowly on a
//!   crowded host, is never taken for silent.
//!
//! A loss found this way is one the other ranks may not see (a dead process breaks all its
//! connections; a stopped one breaks none), so it is told to the peers we are connected to
//! (`Lost`, one hop): a rank that waits on one of them, not on the lost one, fails at once
//! with the same cause instead of at its timeout.

use super::endpoint::{lock, Peer, SocketTransport};
use super::frame::{FrameKind, Header};
use crate::dc_log;
use crate::log::Level;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A process's state letter from `/proc/PID/stat` (R, S, D, T, t, Z, X, ...); None when there
/// is no such process.
pub(super) fn process_state(pid: i32) -> Option<char> {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return None;
    }
    // "pid (comm) S ...": the state follows the last parenthesis (comm may hold any byte).
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return Some('?') };
    let state = stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next());
    Some(state.unwrap_or('?'))
}

/// Whether a process in `state` has exited: it no longer exists, or it is a zombie that its
/// parent has not reaped yet.
fn exited(state: Option<char>) -> bool {
    matches!(state, None | Some('Z') | Some('X'))
}

fn stopped(state: Option<char>) -> bool {
    matches!(state, Some('T') | Some('t'))
}

/// Bytes the kernel holds for us on a connection, not read yet.
fn unread_bytes(fd: i32) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } != 0 {
        return 0;
    }
    n.max(0) as usize
}

/// How a peer was lost, as a `Lost` frame tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LossKind {
    Stopped = 1,
    Silent = 2,
    Unreachable = 3,
}

impl LossKind {
    fn from_code(c: u32) -> Option<LossKind> {
        [LossKind::Stopped, LossKind::Silent, LossKind::Unreachable].into_iter().find(|k| *k as u32 == c)
    }

    fn says(self) -> &'static str {
        match self {
            LossKind::Stopped => "its process has been stopped for the peer timeout",
            LossKind::Silent => "it was silent for the peer timeout (no frame, no heartbeat)",
            LossKind::Unreachable => "it could not be connected to within the peer timeout",
        }
    }
}

fn show_ms(ms: u64) -> String {
    if ms % 1000 == 0 { format!("{} s", ms / 1000) } else { format!("{ms} ms") }
}

impl SocketTransport {
    pub(super) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether world rank `r` is on another host (its process cannot be looked at).
    pub(super) fn remote(&self, r: u32) -> bool {
        self.mesh.host_pids.get(r as usize).copied().flatten().is_none()
    }

    /// The progress thread's turn (called every loop): pings the connections to other hosts
    /// and loses the ones that stayed silent. How long until the next turn is due.
    pub(super) fn heartbeat(&self) -> Option<Duration> {
        let limit = self.peer_timeout?;
        let limit_ms = limit.as_millis() as u64;
        let beat_ms = (limit_ms / 4).max(10);
        let now = self.now_ms();
        let due = self.next_beat_ms.load(Ordering::Relaxed);
        if now < due {
            return Some(Duration::from_millis(due - now));
        }
        self.next_beat_ms.store(now + beat_ms, Ordering::Relaxed);
        // This thread did not run for a while (our process was stopped, or starved): what the
        // peers sent meanwhile is still unread, so nobody is judged on this turn.
        let we_paused = due != 0 && now > due + beat_ms.max(1000);
        for p in self.active().iter().filter(|p| p.connected() && self.remote(p.rank)) {
            if p.gone.load(Ordering::Acquire) || p.rx_done.load(Ordering::Acquire) {
                continue;
            }
            if we_paused || unread_bytes(p.fd()) > 0 {
                p.last_heard_ms.fetch_max(now, Ordering::AcqRel);
            }
            let quiet = now.saturating_sub(p.last_heard_ms.load(Ordering::Acquire));
            if quiet > limit_ms {
                self.lose(p, LossKind::Silent, format!(
                    "silent for {} (nothing came over its connection, not even a heartbeat; DC_PEER_TIMEOUT_MS is {}): its host may be down, the network cut, or its process stopped",
                    show_ms(quiet),
                    show_ms(limit_ms)
                ));
            } else {
                let _ = self.send_control(p, Header::control(FrameKind::Ping, 0));
            }
        }
        Some(Duration::from_millis(beat_ms))
    }

    /// For a wait on a peer (see `check_alive`): on our host, whether its process is gone or
    /// has been stopped for the peer timeout; on another host with no connection yet, a dial
    /// once the wait has lasted half the timeout, so that a dead host is noticed.
    pub(super) fn look_at(&self, peer: &Arc<Peer>) {
        let now = self.now_ms();
        let last = peer.alive_checked_ms.load(Ordering::Relaxed);
        if last != 0 && now < last + super::endpoint::ALIVE_CHECK_EVERY.as_millis() as u64 {
            return;
        }
        peer.alive_checked_ms.store(now.max(1), Ordering::Relaxed);
        let Some(pid) = self.mesh.host_pids.get(peer.rank as usize).copied().flatten() else {
            self.probe_if_unheard(peer, now);
            return;
        };
        if pid == std::process::id() as i32 {
            return;
        }
        let state = process_state(pid);
        if !peer.connected() && exited(state) {
            // (With a connection, its end tells us, after what it sent before.)
            // Everyone sees a dead process for themselves: no notice, and what it put in our
            // rings before it died is still read.
            self.mark_lost(peer, format!("its process {pid} is gone (it exited or was killed)"));
            self.fail_peer_ops(peer);
            return;
        }
        let Some(limit) = self.peer_timeout else { return };
        if !stopped(state) {
            peer.stopped_since_ms.store(0, Ordering::Relaxed);
            return;
        }
        let since = peer.stopped_since_ms.load(Ordering::Relaxed);
        if since == 0 {
            peer.stopped_since_ms.store(now.max(1), Ordering::Relaxed);
        } else if now - since >= limit.as_millis() as u64 {
            self.lose(peer, LossKind::Stopped, format!("its process {pid} has been stopped (SIGSTOP, or held by a debugger) for {} (DC_PEER_TIMEOUT_MS)", show_ms(now - since)));
        }
    }

    /// Loses a peer that cannot tell us itself: marked lost, its connection (if any) shut both
    /// ways (should it come back, it finds us gone too rather than half a job), whatever waits
    /// on it failed, and the peers we are connected to told (see the module's comment).
    fn lose(&self, peer: &Arc<Peer>, how: LossKind, why: String) {
        if peer.gone_error().is_some() {
            return;
        }
        self.mark_lost(peer, why);
        self.cut_off(peer);
        let notice = Header { tag: peer.rank as u64, check: how as u32, ..Header::control(FrameKind::Lost, 0) };
        for p in self.active().iter().filter(|p| p.connected() && p.rank != peer.rank && p.gone_error().is_none()) {
            let _ = self.send_control(p, notice);
        }
    }

    fn cut_off(&self, peer: &Arc<Peer>) {
        if let Some(s) = peer.stream.get() {
            // SAFETY: shutdown on a connection we own; the descriptor stays open.
            unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_RDWR) };
        }
        peer.rx_done.store(true, Ordering::Release);
        self.fail_peer_ops(peer);
    }

    /// Rank `from` told us it lost world rank `rank`: so do we (not passed on further).
    pub(super) fn on_lost_elsewhere(&self, from: u32, rank: u64, how: u32) {
        let Some(kind) = LossKind::from_code(how) else { return };
        if rank >= self.size as u64 || rank as u32 == self.rank || rank as u32 == from {
            return;
        }
        let peer = self.peer(rank as u32);
        if peer.gone_error().is_some() {
            return;
        }
        self.mark_lost(peer, format!("rank {from} lost it: {}", kind.says()));
        self.cut_off(peer);
    }

    /// A peer on another host we wait on but have no connection to: after half the peer
    /// timeout of waiting, dial it from a thread of its own; a dial that fails or gets no
    /// answer loses it, one that succeeds puts it under the heartbeat.
    fn probe_if_unheard(&self, peer: &Arc<Peer>, now: u64) {
        let Some(limit) = self.peer_timeout else { return };
        if peer.connected() {
            return;
        }
        let first = peer.unheard_since_ms.load(Ordering::Relaxed);
        if first == 0 {
            peer.unheard_since_ms.store(now.max(1), Ordering::Relaxed);
            return;
        }
        if now - first < limit.as_millis() as u64 / 2 || peer.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(me) = lock(&self.me).upgrade() else { return };
        let p = peer.clone();
        let spawned = std::thread::Builder::new().name(format!("dc-probe-r{}", p.rank)).stack_size(128 << 10).spawn(move || {
            let r = me.connect_peer(&p, limit);
            if let Err(e) = r {
                if p.gone_error().is_none() {
                    me.lose(&p, LossKind::Unreachable, format!("we waited for it without a connection, and dialling it got no connection within {} ({}): its host may be down or the network cut", show_ms(limit.as_millis() as u64), e.msg));
                }
            } else {
                dc_log!(Level::Info, Some(me.rank as usize), "connected to rank {} to watch it while we wait for it", p.rank);
            }
            p.probing.store(false, Ordering::Release);
            p.unheard_since_ms.store(0, Ordering::Relaxed);
        });
        if spawned.is_err() {
            peer.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::fake_peer::{fake_rank0, lost_within, rank1};
    use super::super::frame::HEADER_LEN;
    use std::io::{Read, Write};
    use std::time::Instant;

    /// Rank 0 on another host: reads what comes for `hold`, answering each `Ping` with one of
    /// its own when `answer`. The pings it got.
    fn pinged_rank0(answer: bool, hold: Duration) -> (std::net::SocketAddr, std::thread::JoinHandle<usize>) {
        fake_rank0(move |mut s| {
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let (mut pings, mut hdr, mut got) = (0, [0u8; HEADER_LEN], 0);
            let t0 = Instant::now();
            while t0.elapsed() < hold {
                match s.read(&mut hdr[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(_) => continue,
                }
                if got == hdr.len() {
                    got = 0;
                    if Header::decode(&hdr).is_ok_and(|h| h.kind == FrameKind::Ping) {
                        pings += 1;
                        if answer {
                            s.write_all(&Header::control(FrameKind::Ping, 0).encode()).unwrap();
                        }
                    }
                }
            }
            pings
        })
    }

    #[test]
    fn a_silent_connection_is_lost_after_the_peer_timeout_and_pinged_until_then() {
        let (a, fake) = pinged_rank0(false, Duration::from_secs(3));
        let t = rank1(a, Some(Duration::from_millis(800)));
        let t0 = Instant::now();
        let why = lost_within(&t, Duration::from_secs(5)).expect("the silent peer is lost");
        let took = t0.elapsed();
        assert!(why.contains("silent for") && why.contains("DC_PEER_TIMEOUT_MS"), "{why}");
        assert!(took >= Duration::from_millis(700) && took < Duration::from_millis(2000), "lost after {took:?}");
        assert!(t.check_alive(0).is_some_and(|e| e.status == crate::error::Status::PeerLost));
        // A ping every quarter of the timeout until then; the connection is shut after it.
        let pings = fake.join().unwrap();
        assert!((2..=6).contains(&pings), "{pings} pings");
        t.shutdown(Instant::now() + Duration::from_millis(100));
    }

    #[test]
    fn a_connection_that_carries_only_heartbeats_stays_up() {
        let (a, fake) = pinged_rank0(true, Duration::from_millis(2500));
        let t = rank1(a, Some(Duration::from_millis(600)));
        std::thread::sleep(Duration::from_millis(2000));
        assert!(t.lost_among(&[0], &[]).is_none(), "{:?}", t.lost_among(&[0], &[]));
        assert!(t.check_alive(0).is_none());
        assert!(fake.join().unwrap() >= 6);
        t.shutdown(Instant::now() + Duration::from_millis(100));
    }

    #[test]
    fn process_states_are_read() {
        let me = std::process::id() as i32;
        assert!(matches!(process_state(me), Some('R') | Some('S')), "{:?}", process_state(me));
        assert!(!exited(process_state(me)));
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        // SAFETY: signals to our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let t0 = std::time::Instant::now();
        while !stopped(process_state(pid)) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(stopped(process_state(pid)), "{:?}", process_state(pid));
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let t0 = std::time::Instant::now();
        while !exited(process_state(pid)) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(exited(process_state(pid)), "a zombie counts as gone");
        let _ = child.wait();
        assert!(exited(process_state(pid)));
    }
}
