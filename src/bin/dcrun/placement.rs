//! Where dcrun keeps more ranks than cores (`--bind auto`, the default): bound round robin while
//! nothing else runs on the host, left to the scheduler while other work does.
//!
//! Why both: alone on the host, ranks bound round robin are faster (4 ranks on 2 cores, 16 B
//! ring exchange: 1.7 us bound against 2.4 us unbound; the other points level); beside a busy
//! process the two ranks bound to its core cannot leave it, while unbound ones are moved away
//! (unbound/bound time with one busy process: 16 B exchange 0.20, allreduce 0.57-0.70, 16 B
//! broadcast 0.03). So dcrun looks at the host every [`EVERY`]: the CPU time of the whole host
//! (`/proc/stat`) less that of its ranks (`/proc/PID/stat`, all their threads) is other work;
//! where that is more than [`BUSY_CORES`] of a core it unbinds every thread of every rank at
//! once, and it binds them again after [`QUIET_LOOKS`] looks in a row without. Threads a rank
//! starts inherit the mask of the thread that starts them; a rank's own affinity calls while
//! bound are overridden at the next look.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the host is looked at.
pub const EVERY: Duration = Duration::from_millis(100);
/// Other work above this many cores' worth of CPU time over a look makes the host busy (a busy
/// loop is 1.0; dcrun's own threads and the kernel's housekeeping stay well under 0.1).
const BUSY_CORES: f64 = 0.3;
/// Looks in a row without other work before the ranks are bound again (a busy process that
/// pauses for a moment should not make them move twice).
const QUIET_LOOKS: u32 = 5;

/// The decision, look by look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judge {
    pub bound: bool,
    quiet: u32,
}

impl Judge {
    pub fn new(bound: bool) -> Judge {
        Judge { bound, quiet: if bound { QUIET_LOOKS } else { 0 } }
    }

    /// One look, with `other` cores' worth of other work since the last: Some(bound) when the
    /// ranks should change.
    pub fn look(&mut self, other: f64) -> Option<bool> {
        if other > BUSY_CORES {
            self.quiet = 0;
            if self.bound {
                self.bound = false;
                return Some(false);
            }
            return None;
        }
        self.quiet = self.quiet.saturating_add(1);
        if !self.bound && self.quiet >= QUIET_LOOKS {
            self.bound = true;
            return Some(true);
        }
        None
    }
}

/// CPU time of the whole host so far, in clock ticks: the busy fields of `/proc/stat`'s `cpu`
/// line (user, nice, system, irq, softirq, steal; not idle or iowait).
fn host_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    host_ticks_of(stat.lines().next()?)
}

fn host_ticks_of(line: &str) -> Option<u64> {
    let mut f = line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.map(|x| x.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    Some([0, 1, 2, 5, 6, 7].iter().map(|&i| v.get(i).copied().unwrap_or(0)).sum())
}

/// CPU time of process `pid` (all its threads) so far, in clock ticks; None once it is gone.
fn process_ticks(pid: libc::pid_t) -> Option<u64> {
    process_ticks_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn process_ticks_of(stat: &str) -> Option<u64> {
    // The command name, in parentheses, may hold spaces: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is f[0]; utime and stime are fields 14 and 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Sets the affinity of every thread of `pid` (threads that end meanwhile are skipped).
fn set_process_mask(pid: libc::pid_t, mask: &libc::cpu_set_t) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for tid in tasks.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<libc::pid_t>().ok())) {
        // SAFETY: a valid set of the size passed; a thread that is gone gives ESRCH.
        unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), mask) };
    }
}

/// Other work on the host over one look, in cores: what the host ran less what the ranks ran.
struct Meter {
    pids: Vec<libc::pid_t>,
    host: u64,
    ranks: Vec<u64>,
    per_look: f64,
}

impl Meter {
    fn new(pids: Vec<libc::pid_t>, every: Duration) -> Meter {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let ranks = pids.iter().map(|&p| process_ticks(p).unwrap_or(0)).collect();
        Meter { pids, host: host_ticks().unwrap_or(0), ranks, per_look: hz * every.as_secs_f64() }
    }

    /// Other work since the last reading, in cores (None: /proc could not be read).
    fn read(&mut self) -> Option<f64> {
        let host = host_ticks()?;
        let mut ranks_ran = 0u64;
        for (i, &pid) in self.pids.iter().enumerate() {
            // A rank that ended keeps its last count (its time is in the host's before).
            let now = process_ticks(pid).unwrap_or(self.ranks[i]);
            ranks_ran += now.saturating_sub(self.ranks[i]);
            self.ranks[i] = now;
        }
        let host_ran = host.saturating_sub(std::mem::replace(&mut self.host, host));
        Some(host_ran.saturating_sub(ranks_ran) as f64 / self.per_look)
    }
}

/// Whether other work runs on the host now: one look of `span` before the ranks start.
pub fn host_busy_now(span: Duration) -> bool {
    let mut m = Meter::new(Vec::new(), span);
    std::thread::sleep(span);
    m.read().is_some_and(|other| other > BUSY_CORES)
}

/// Watches the host for the ranks `pids` (bound to `shares` when it is quiet, else to `all`)
/// until `stop`; `bound`: how they started.
pub fn watch(pids: Vec<libc::pid_t>, shares: Vec<libc::cpu_set_t>, all: libc::cpu_set_t, bound: bool, stop: Arc<AtomicBool>) {
    let mut meter = Meter::new(pids.clone(), EVERY);
    let mut judge = Judge::new(bound);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(EVERY);
        let Some(other) = meter.read() else { return };
        let change = judge.look(other);
        // While bound, every look binds again: threads started or moved since are put back.
        if change.is_some() || judge.bound {
            for (pid, share) in pids.iter().zip(&shares) {
                set_process_mask(*pid, if judge.bound { share } else { &all });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_unbinds_at_once_and_quiet_binds_after_a_while() {
        let mut j = Judge::new(true);
        assert_eq!(j.look(0.05), None);
        assert_eq!(j.look(0.9), Some(false), "a busy loop beside the ranks: unbound at once");
        assert_eq!(j.look(1.0), None);
        for _ in 1..QUIET_LOOKS {
            assert_eq!(j.look(0.0), None, "quiet, but not for long enough yet");
        }
        assert_eq!(j.look(0.1), Some(true));
        let mut j = Judge::new(false);
        for _ in 0..QUIET_LOOKS - 1 {
            j.look(0.0);
        }
        assert_eq!(j.look(0.5), None, "a busy look starts the count again");
        assert!(!j.bound && (0..QUIET_LOOKS).filter_map(|_| j.look(0.0)).eq([true]));
    }

    #[test]
    fn reads_the_kernels_counters() {
        assert_eq!(host_ticks_of("cpu  10 1 5 900 7 2 3 4 0 0"), Some(10 + 1 + 5 + 2 + 3 + 4));
        assert_eq!(host_ticks_of("cpu0 10 1 5 900"), None);
        let stat = "4242 (a (strange) name) R 1 4242 4242 0 -1 4194560 100 0 0 0 37 12 0 0 20 0 3 0 5000";
        assert_eq!(process_ticks_of(stat), Some(37 + 12));
        assert_eq!(process_ticks_of("4242 (x) R 1"), None);
        // This process, as the kernel writes it.
        assert!(process_ticks(std::process::id() as libc::pid_t).is_some() && host_ticks().is_some());
    }
}
