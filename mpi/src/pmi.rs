//! A PMI-1 client (the "simple" wire protocol of MPICH's Hydra and other launchers): under
//! `mpiexec` of MPICH the job is formed through it. Rank 0 publishes the address of the
//! engine's rendezvous store in the launcher's key-value space, everyone meets at a PMI
//! barrier, then all start the engine with `tcp://` that address.

use crate::abi_gen::*;
use crate::err::MpiErr;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::sync::Mutex;

pub struct Pmi {
    out: std::fs::File,
    inp: BufReader<std::fs::File>,
    kvs: String,
    pub rank: usize,
    pub size: usize,
}

/// The connection, kept for MPI_Finalize and MPI_Abort.
pub static PMI: Mutex<Option<Pmi>> = Mutex::new(None);

fn fail(what: &str, detail: impl std::fmt::Display) -> MpiErr {
    MpiErr::new(MPI_ERR_OTHER, format!("PMI-1 ({what}): {detail}"))
}

/// `key=value` of a PMI reply line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

impl Pmi {
    fn call(&mut self, cmd: &str, expect: &str) -> Result<String, MpiErr> {
        self.out.write_all(cmd.as_bytes()).and_then(|_| self.out.write_all(b"\n")).map_err(|e| fail(cmd, e))?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.inp.read_line(&mut line).map_err(|e| fail(cmd, e))? == 0 {
                return Err(fail(cmd, "the launcher closed the connection"));
            }
            if field(&line, "cmd") == Some(expect) {
                break;
            }
        }
        if let Some(rc) = field(&line, "rc") {
            if rc != "0" {
                return Err(fail(cmd, format!("the launcher answered {}", line.trim())));
            }
        }
        Ok(line.trim().to_string())
    }

    /// Connects through PMI_FD (None when this process was not started by a PMI-1 launcher).
    pub fn connect() -> Result<Option<Pmi>, MpiErr> {
        let Some(fd) = std::env::var("PMI_FD").ok().and_then(|v| v.trim().parse::<i32>().ok()) else { return Ok(None) };
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse::<usize>().ok()).ok_or_else(|| fail("environment", format!("{k} is not set")));
        let (rank, size) = (num("PMI_RANK")?, num("PMI_SIZE")?);
        // SAFETY: PMI_FD is the socket the launcher opened for this process; we own it now.
        let f = unsafe { std::fs::File::from_raw_fd(fd) };
        let inp = BufReader::new(f.try_clone().map_err(|e| fail("PMI_FD", e))?);
        let mut p = Pmi { out: f, inp, kvs: String::new(), rank, size };
        p.call("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init")?;
        p.call("cmd=get_maxes", "maxes")?;
        let r = p.call("cmd=get_my_kvsname", "my_kvsname")?;
        p.kvs = field(&r, "kvsname").ok_or_else(|| fail("get_my_kvsname", r.clone()))?.to_string();
        Ok(Some(p))
    }

    pub fn put(&mut self, key: &str, value: &str) -> Result<(), MpiErr> {
        let cmd = format!("cmd=put kvsname={} key={key} value={value}", self.kvs);
        self.call(&cmd, "put_result").map(|_| ())
    }

    pub fn get(&mut self, key: &str) -> Result<String, MpiErr> {
        let cmd = format!("cmd=get kvsname={} key={key}", self.kvs);
        let r = self.call(&cmd, "get_result")?;
        field(&r, "value").map(str::to_string).ok_or_else(|| fail("get", r.clone()))
    }

    pub fn barrier(&mut self) -> Result<(), MpiErr> {
        self.call("cmd=barrier_in", "barrier_out").map(|_| ())
    }

    pub fn finalize(&mut self) {
        let _ = self.call("cmd=finalize", "finalize_ack");
    }

    pub fn abort(&mut self, code: i32, msg: &str) {
        let m: String = msg.chars().map(|c| if c.is_whitespace() || c == '=' { '_' } else { c }).collect();
        let _ = writeln!(self.out, "cmd=abort exitcode={code} error_msg={m}");
    }
}

/// A fresh random job token (hex), for DC_TOKEN.
pub fn random_token() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        b[..16].copy_from_slice(&(t ^ ((std::process::id() as u128) << 64)).to_le_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The store address every rank should use: rank 0 picks a free port and publishes it, with a
/// fresh job token (the launcher's key-value space is private to the job), which becomes
/// DC_TOKEN unless the environment sets one already.
pub fn store_address(p: &mut Pmi) -> Result<String, MpiErr> {
    const KEY: &str = "distcomm-store";
    const TOKEN: &str = "distcomm-token";
    if p.rank == 0 {
        p.put(TOKEN, &random_token())?;
        // One host (all ranks local): loopback; else this host's name, which the others resolve.
        let local = std::env::var("MPI_LOCALNRANKS").ok().and_then(|v| v.parse::<usize>().ok()) == Some(p.size);
        let host = if local { "127.0.0.1".to_string() } else { distcomm::log::hostname() };
        let port = std::net::TcpListener::bind((if local { "127.0.0.1" } else { "0.0.0.0" }, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| fail("store port", e))?;
        p.put(KEY, &format!("{host}:{port}"))?;
    }
    p.barrier()?;
    if std::env::var_os("DC_TOKEN").is_none_or(|t| t.is_empty()) {
        let t = p.get(TOKEN)?;
        // MPI_Init runs before the program starts threads that read the environment.
        std::env::set_var("DC_TOKEN", t);
    }
    p.get(KEY)
}
