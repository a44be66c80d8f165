//! Accepting the data connections of higher ranks during init, so that strangers can neither
//! stall nor break the job: one thread and no thread per connection. Every accepted connection
//! is a non-blocking socket polled with the others; it must deliver its fixed-size hello (see
//! `handshake`) within `hello_wait` of being accepted, however it trickles the bytes; nothing is
//! read before or beyond the hello and nothing is allocated from what a stranger sends; at most
//! [`MAX_PENDING`] connections wait for their hello at once (a newcomer pushes out the oldest);
//! accept errors (descriptor exhaustion, connections aborted in the backlog) are transient.

use super::handshake::{self, HELLO_LEN};
use super::socket::MeshConfig;
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Connections waiting for their hello, at most.
pub const MAX_PENDING: usize = 128;

struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    buf: [u8; HELLO_LEN],
    got: usize,
    deadline: Instant,
}

/// What became of a pending connection after a read.
enum Step {
    Wait,
    Drop(&'static str),
    Hello,
}

impl Pending {
    fn read(&mut self) -> Step {
        loop {
            match self.stream.read(&mut self.buf[self.got..]) {
                Ok(0) => return Step::Drop("closed before its hello"),
                Ok(n) => {
                    self.got += n;
                    if self.got == HELLO_LEN {
                        return Step::Hello;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Wait,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Drop("read error before its hello"),
            }
        }
    }
}

fn missing(cfg: &MeshConfig, out: &[Option<TcpStream>]) -> Vec<u32> {
    ((cfg.rank + 1)..cfg.size).filter(|&r| out[r as usize].is_none()).collect()
}

/// Accepts connections from every rank above ours (into `out[rank]`) until all arrived or
/// `cfg.deadline` passes (`DC_ERR_TIMEOUT` naming the ranks that never connected).
pub fn accept_ranks(listener: &TcpListener, cfg: &MeshConfig, out: &mut [Option<TcpStream>], hello_wait: Duration) -> Result<()> {
    listener.set_nonblocking(true).map_err(|e| Error::system("listener", e))?;
    let mut pending: Vec<Pending> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut warned_accept = false;
    loop {
        let left = missing(cfg, out);
        if left.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= cfg.deadline {
            let who: Vec<String> = left.iter().map(|r| r.to_string()).collect();
            return Err(Error::new(Status::Timeout, format!("ranks {} never connected to rank {}", who.join(", "), cfg.rank)));
        }
        pending.retain(|p| {
            let keep = p.deadline > now;
            if !keep {
                dc_log!(Level::Warn, Some(cfg.rank as usize), "dropped a data connection from {}: no hello within {hello_wait:?}", p.from);
            }
            keep
        });

        // Wait for a newcomer, hello bytes, or the next deadline.
        let next = pending.iter().map(|p| p.deadline).min().unwrap_or(cfg.deadline).min(cfg.deadline);
        let wait_ms = next.saturating_duration_since(now).as_millis().clamp(1, 100) as libc::c_int;
        fds.clear();
        fds.push(libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        fds.extend(pending.iter().map(|p| libc::pollfd { fd: p.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 }));
        // SAFETY: fds is a valid array of pollfd for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if n <= 0 {
            continue;
        }

        // Hello bytes first (indices shift once the newcomers are pushed).
        let ready: Vec<bool> = fds[1..].iter().map(|f| f.revents != 0).collect();
        let mut i = 0;
        let mut k = 0;
        while i < pending.len() {
            let was_ready = ready.get(k).copied().unwrap_or(false);
            k += 1;
            if !was_ready {
                i += 1;
                continue;
            }
            match pending[i].read() {
                Step::Wait => i += 1,
                Step::Drop(why) => {
                    let p = pending.remove(i);
                    dc_log!(Level::Warn, Some(cfg.rank as usize), "dropped a data connection from {}: {why}", p.from);
                }
                Step::Hello => {
                    let mut p = pending.remove(i);
                    match handshake::verify(&p.buf, &cfg.token_digest, cfg.job_id) {
                        Some(h) if h.rank > cfg.rank && h.rank < cfg.size && h.world_size == cfg.size && out[h.rank as usize].is_none() => {
                            let _ = p.stream.set_nonblocking(false);
                            if handshake::accept(&mut p.stream).is_ok() {
                                out[h.rank as usize] = Some(p.stream);
                            }
                        }
                        Some(h) => {
                            dc_log!(Level::Warn, Some(cfg.rank as usize), "refused a data connection from {} claiming rank {} of {}", p.from, h.rank, h.world_size);
                            handshake::refuse(&mut p.stream);
                        }
                        None => {
                            dc_log!(Level::Warn, Some(cfg.rank as usize), "refused a data connection from {}: no valid job token", p.from);
                            handshake::refuse(&mut p.stream);
                        }
                    }
                }
            }
        }

        // Then newcomers.
        if fds[0].revents != 0 {
            loop {
                match listener.accept() {
                    Ok((stream, from)) => {
                        if stream.set_nonblocking(true).is_err() {
                            continue;
                        }
                        if pending.len() >= MAX_PENDING {
                            let old = pending.remove(0);
                            dc_log!(Level::Warn, Some(cfg.rank as usize), "too many data connections without a hello; dropped the one from {}", old.from);
                        }
                        pending.push(Pending { stream, from, buf: [0; HELLO_LEN], got: 0, deadline: Instant::now() + hello_wait });
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // EMFILE/ENFILE: free a descriptor; other errors concern one connection.
                        if !warned_accept {
                            dc_log!(Level::Warn, Some(cfg.rank as usize), "accept on the data listener failed: {e}");
                            warned_accept = true;
                        }
                        if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
                            if pending.is_empty() {
                                std::thread::sleep(Duration::from_millis(10));
                            } else {
                                pending.remove(0);
                            }
                        }
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::handshake::{token_digest, Hello};
    use std::io::Write;

    fn cfg(rank: u32, size: u32, secs: u64) -> MeshConfig {
        MeshConfig { rank, size, token_digest: token_digest(b"t"), job_id: 9, deadline: Instant::now() + Duration::from_secs(secs), cma_pids: vec![None; size as usize] }
    }

    fn hello(rank: u32, size: u32) -> [u8; HELLO_LEN] {
        Hello { digest: token_digest(b"t"), job_id: 9, rank, world_size: size }.encode()
    }

    #[test]
    fn strangers_are_dropped_and_ranks_get_in() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let mut strangers = Vec::new();
        for bytes in [&[][..], &[0u8; 100][..], &hello(1, 3)[..10]] {
            let mut s = TcpStream::connect(a).unwrap();
            s.write_all(bytes).unwrap();
            strangers.push(s);
        }
        let mut wrong = TcpStream::connect(a).unwrap();
        let mut h = hello(1, 3);
        h[20] ^= 1;
        wrong.write_all(&h).unwrap();
        let mut liar = TcpStream::connect(a).unwrap();
        liar.write_all(&hello(0, 3)).unwrap();
        // A slow sender: one byte now, the rest never.
        let mut slow = TcpStream::connect(a).unwrap();
        slow.write_all(&hello(2, 3)[..1]).unwrap();
        let t = std::thread::spawn(move || {
            let c = cfg(0, 3, 10);
            let mut out: Vec<Option<TcpStream>> = (0..3).map(|_| None).collect();
            let t0 = Instant::now();
            accept_ranks(&l, &c, &mut out, Duration::from_millis(300)).unwrap();
            (out.iter().filter(|s| s.is_some()).count(), t0.elapsed())
        });
        let offer = |r: u32| {
            let mut s = TcpStream::connect(a).unwrap();
            handshake::offer(&mut s, &Hello { digest: token_digest(b"t"), job_id: 9, rank: r, world_size: 3 }, 0, Duration::from_secs(5)).map(|_| s)
        };
        let k1 = offer(1).unwrap();
        let k2 = offer(2).unwrap();
        let (got, took) = t.join().unwrap();
        assert_eq!(got, 2);
        assert!(took < Duration::from_secs(2), "{took:?}");
        let mut b = [9u8; 1];
        wrong.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(wrong.read(&mut b).unwrap(), 1);
        assert_eq!(b[0], 0, "a wrong token is refused");
        liar.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(liar.read(&mut b).unwrap(), 1);
        assert_eq!(b[0], 0, "a lower rank is refused");
        drop((k1, k2, strangers, slow));
    }

    #[test]
    fn a_missing_rank_times_out_by_name_despite_a_slow_sender() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut slow = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let t = std::thread::spawn(move || {
            for b in hello(1, 2) {
                if slow.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let c = MeshConfig { deadline: Instant::now() + Duration::from_millis(800), ..cfg(0, 2, 1) };
        let mut out: Vec<Option<TcpStream>> = (0..2).map(|_| None).collect();
        let t0 = Instant::now();
        let e = accept_ranks(&l, &c, &mut out, Duration::from_millis(300)).unwrap_err();
        assert_eq!(e.status, Status::Timeout);
        assert!(e.msg.contains("ranks 1 never connected"), "{}", e.msg);
        assert!(t0.elapsed() < Duration::from_secs(2));
        t.join().unwrap();
    }
}
