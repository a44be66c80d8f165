//! Resolving a job's configuration from `dc_init_options` and the environment.
//!
//! Precedence, for every field: the option in `dc_init_options` (when set), then distcomm's own
//! variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`, as set by
//! `torchrun` and `dcrun`), then the variables of the launcher that started the process.
//!
//! Launchers are consulted in this order: Open MPI (`OMPI_COMM_WORLD_*`), MPICH Hydra
//! (`PMI_RANK`, `PMI_SIZE`), Paddle (`PADDLE_TRAINER_ID`, `PADDLE_TRAINERS_NUM`), Slurm
//! (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`). Slurm comes last because `mpirun` inside a
//! Slurm allocation leaves the batch step's `SLURM_PROCID` in every process it starts; the MPI
//! launcher's variables are the ones that describe the process. Rank and size come from one
//! launcher, never mixed.

use crate::error::{Result, Status};
use crate::auth::hex;
use crate::{bail, dc_log};
use crate::log::Level;
use std::path::PathBuf;
use std::time::Duration;

/// Default rendezvous/operation timeout when neither `timeout_ms` nor `DC_TIMEOUT_MS` is given.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;

/// Longest accepted `DC_TOKEN` (bytes).
pub const MAX_TOKEN_LEN: usize = 4096;

/// Rust mirror of the C `dc_init_options` (the ffi layer converts).
#[derive(Clone, Debug, Default)]
pub struct InitOptions {
    pub init_method: Option<String>,
    pub backend: Option<String>,
    /// -1 (or any negative): from the environment, or assigned by the rendezvous (file://).
    pub rank: i32,
    /// -1 (or any negative): from the environment.
    pub world_size: i32,
    pub group_name: Option<String>,
    /// <= 0: `DC_TIMEOUT_MS`, else 300000.
    pub timeout_ms: i64,
    /// None: `DC_TOKEN`.
    pub token: Option<String>,
    /// None: `DC_ENCRYPT` (on when it is 1).
    pub encrypt: Option<bool>,
}

impl InitOptions {
    /// What `dc_init_options_default` fills in: everything from the environment.
    pub fn from_env() -> InitOptions {
        InitOptions { rank: -1, world_size: -1, ..Default::default() }
    }
}

/// How the ranks find each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Method {
    /// `env://`: `MASTER_ADDR`/`MASTER_PORT` name the TCP store.
    Env,
    /// `tcp://HOST:PORT`: the TCP store's address.
    Tcp { host: String, port: u16 },
    /// `file:///PATH`: a file on a shared file system.
    File { path: PathBuf },
}

/// Everything the rendezvous needs, resolved and validated.
#[derive(Clone, Debug)]
pub struct JobConfig {
    pub method: Method,
    /// Store address for env:// and tcp://.
    pub master: Option<(String, u16)>,
    /// None only for file:// with rank -1 (assigned on arrival).
    pub rank: Option<usize>,
    pub world_size: usize,
    pub local_rank: Option<usize>,
    /// group_name or "default".
    pub group: String,
    /// timeout_ms > 0, else DC_TIMEOUT_MS, else 300000 ms.
    pub timeout: Duration,
    /// The job token (opts.token, else DC_TOKEN, else [`default_token`]).
    pub token: Vec<u8>,
    /// opts.encrypt, else DC_ENCRYPT: connections between hosts are encrypted.
    pub encrypt: bool,
    /// DC_LAUNCHER_STORE=1: the launcher serves the store, rank 0 is a plain client.
    pub launcher_store: bool,
    /// opts.backend, else DC_TRANSPORT, else "auto"; one of auto|shm|socket|nccl.
    pub backend: String,
    /// DC_SOCKET_IFNAME.
    pub socket_ifname: Option<String>,
}

/// The backends a caller may name.
pub const BACKENDS: [&str; 4] = ["auto", "shm", "socket", "nccl"];

struct Launcher {
    name: &'static str,
    rank: &'static str,
    size: &'static [&'static str],
    local_rank: Option<&'static str>,
}

const LAUNCHERS: [Launcher; 4] = [
    Launcher {
        name: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        size: &["OMPI_COMM_WORLD_SIZE"],
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
    },
    Launcher { name: "MPICH Hydra", rank: "PMI_RANK", size: &["PMI_SIZE"], local_rank: None },
    Launcher {
        name: "Paddle",
        rank: "PADDLE_TRAINER_ID",
        size: &["PADDLE_TRAINERS_NUM"],
        local_rank: None,
    },
    Launcher {
        name: "Slurm",
        rank: "SLURM_PROCID",
        size: &["SLURM_NTASKS", "SLURM_NPROCS"],
        local_rank: Some("SLURM_LOCALID"),
    },
];

/// Reads an environment variable, treating an empty value as unset.
fn var(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name).filter(|v| !v.trim().is_empty())
}

fn parse_uint(name: &str, v: &str) -> Result<usize> {
    match v.trim().parse::<usize>() {
        Ok(n) => Ok(n),
        Err(_) => bail!(Status::InvalidArgument, "{name}={v:?} is not a non-negative integer"),
    }
}

/// Parses `HOST:PORT` (`[v6]:PORT` for IPv6 literals). `what` names the source in errors.
pub fn parse_host_port(s: &str, what: &str) -> Result<(String, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            bail!(Status::InvalidArgument, "{what}: unterminated '[' in {s:?}");
        };
        let host = &rest[..end];
        let after = &rest[end + 1..];
        let Some(port) = after.strip_prefix(':') else {
            bail!(Status::InvalidArgument, "{what}: expected [HOST]:PORT, got {s:?}");
        };
        (host.to_string(), port)
    } else {
        let Some((host, port)) = s.rsplit_once(':') else {
            bail!(Status::InvalidArgument, "{what}: expected HOST:PORT, got {s:?}");
        };
        if host.contains(':') {
            bail!(Status::InvalidArgument, "{what}: write IPv6 addresses as [ADDR]:PORT, got {s:?}");
        }
        (host.to_string(), port)
    };
    if host.is_empty() {
        bail!(Status::InvalidArgument, "{what}: empty host in {s:?}");
    }
    let port = parse_port(port, what)?;
    Ok((host, port))
}

/// Parses a TCP port in 1..=65535.
pub fn parse_port(p: &str, what: &str) -> Result<u16> {
    match p.trim().parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(n as u16),
        Ok(n) => bail!(Status::InvalidArgument, "{what}: port {n} is out of range (1..65535)"),
        Err(_) => bail!(Status::InvalidArgument, "{what}: port {p:?} is not a number"),
    }
}

/// Strips IPv6 brackets from a host (`[::1]` -> `::1`); other hosts unchanged.
pub fn unbracket(host: &str) -> &str {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// Parses an init method URL.
pub fn parse_method(url: &str) -> Result<Method> {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!(
            Status::InvalidArgument,
            "init_method {url:?}: expected env://, tcp://HOST:PORT or file:///PATH"
        );
    };
    match scheme.to_ascii_lowercase().as_str() {
        "env" => {
            if !rest.is_empty() {
                bail!(Status::InvalidArgument, "init_method {url:?}: env:// takes no address");
            }
            Ok(Method::Env)
        }
        "tcp" => {
            let rest = rest.trim_end_matches('/');
            let (host, port) = parse_host_port(rest, &format!("init_method {url:?}"))?;
            Ok(Method::Tcp { host, port })
        }
        "file" => {
            if !rest.starts_with('/') || rest.len() < 2 {
                bail!(
                    Status::InvalidArgument,
                    "init_method {url:?}: file:// needs an absolute path (file:///PATH)"
                );
            }
            Ok(Method::File { path: PathBuf::from(rest) })
        }
        other => bail!(
            Status::InvalidArgument,
            "init_method {url:?}: unknown scheme {other:?} (expected env, tcp or file)"
        ),
    }
}

/// The token used when `DC_TOKEN` is not set.
///
/// It is derived deterministically from what every user of the store shares: for env:// and
/// tcp:// the store's port, for file:// the file's path. Everybody who can read the job's
/// environment can compute it, so it is **not a secret**: it keeps strangers, port scanners and
/// other jobs on the same host out of the store and data connections, and makes garbage fail the
/// hello, but it does not keep out an attacker. Export the same random `DC_TOKEN` on every rank
/// for that (`dcrun` does this by itself).
///
/// Host name, world size and group are left out on purpose: several jobs and groups may share
/// one store, and ranks may spell the master's host differently (`node01` vs `10.0.0.1`).
pub fn default_token(method: &Method, master: Option<&(String, u16)>) -> Vec<u8> {
    let (kind, what): (&[u8], String) = match (method, master) {
        (Method::File { path }, _) => (b"file\0", path.to_string_lossy().into_owned()),
        (_, Some((_, port))) => (b"port\0", port.to_string()),
        (_, None) => (b"", String::new()),
    };
    hex(&crate::auth::sha256(&[b"distcomm default token v1\0", kind, what.as_bytes()])).into_bytes()
}

/// Whether a store host is this host's loopback (an IP literal, or `localhost`): only then may a
/// job go without `DC_TOKEN` (no other host can reach the store).
fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Resolves and validates `opts` against the environment. `env` is injected so tests do not
/// touch the process environment (use [`process_env`] for the real one).
pub fn resolve(opts: &InitOptions, env: &dyn Fn(&str) -> Option<String>) -> Result<JobConfig> {
    let url = opts.init_method.as_deref().map(str::trim).filter(|s| !s.is_empty());
    let method = parse_method(url.unwrap_or("env://"))?;

    // Which launcher, if any, describes this process.
    let launcher = LAUNCHERS.iter().find(|l| var(env, l.rank).is_some());

    // World size.
    let world_size: usize = if opts.world_size >= 0 {
        if opts.world_size < 1 {
            bail!(Status::InvalidArgument, "world_size {} < 1", opts.world_size);
        }
        opts.world_size as usize
    } else {
        let found = var(env, "WORLD_SIZE").map(|v| ("WORLD_SIZE", v)).or_else(|| {
            let l = launcher?;
            l.size.iter().find_map(|n| var(env, n).map(|v| (*n, v)))
        });
        let Some((name, v)) = found else {
            bail!(
                Status::InvalidArgument,
                "WORLD_SIZE is not set (nor a launcher's: SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, \
                 PMI_SIZE, PADDLE_TRAINERS_NUM) and dc_init_options.world_size is -1"
            );
        };
        let n = parse_uint(name, &v)?;
        if n < 1 {
            bail!(Status::InvalidArgument, "{name}={n}: WORLD_SIZE < 1");
        }
        n
    };

    // Rank.
    let rank: Option<usize>;
    let rank_src: String;
    if opts.rank >= 0 {
        rank = Some(opts.rank as usize);
        rank_src = "rank".into();
    } else {
        let found = var(env, "RANK")
            .map(|v| ("RANK", v))
            .or_else(|| launcher.and_then(|l| var(env, l.rank).map(|v| (l.rank, v))));
        match found {
            Some((name, v)) => {
                rank = Some(parse_uint(name, &v)?);
                rank_src = name.to_string();
            }
            None => {
                if !matches!(method, Method::File { .. }) {
                    bail!(
                        Status::InvalidArgument,
                        "rank is -1 and RANK is not set (nor a launcher's: SLURM_PROCID, \
                         OMPI_COMM_WORLD_RANK, PMI_RANK, PADDLE_TRAINER_ID); only file:// \
                         assigns ranks on arrival"
                    );
                }
                rank = None;
                rank_src = String::new();
            }
        }
    }
    if let Some(r) = rank {
        if r >= world_size {
            bail!(Status::InvalidArgument, "{rank_src}={r} is not below WORLD_SIZE={world_size}");
        }
    }

    // Local rank: LOCAL_RANK, else the launcher's (when it has one).
    let local_rank = match var(env, "LOCAL_RANK") {
        Some(v) => Some(parse_uint("LOCAL_RANK", &v)?),
        None => match launcher.and_then(|l| l.local_rank.map(|n| (n, var(env, n)))) {
            Some((n, Some(v))) => Some(parse_uint(n, &v)?),
            _ => None,
        },
    };
    if let Some(l) = launcher {
        if var(env, "RANK").is_none() && opts.rank < 0 {
            dc_log!(Level::Info, rank, "rank and world size from the {} launcher's variables", l.name);
        }
    }

    // Store address.
    let master = match &method {
        Method::Env => {
            let Some(addr) = var(env, "MASTER_ADDR") else {
                bail!(Status::InvalidArgument, "env:// needs MASTER_ADDR (the store's host); it is not set");
            };
            let Some(port) = var(env, "MASTER_PORT") else {
                bail!(Status::InvalidArgument, "env:// needs MASTER_PORT (the store's port); it is not set");
            };
            let port = parse_port(&port, "MASTER_PORT")?;
            Some((unbracket(addr.trim()).to_string(), port))
        }
        Method::Tcp { host, port } => Some((host.clone(), *port)),
        Method::File { .. } => None,
    };

    // Timeout.
    let timeout_ms: u64 = if opts.timeout_ms > 0 { opts.timeout_ms as u64 } else { env_timeout_ms(env)?.unwrap_or(DEFAULT_TIMEOUT_MS) };

    // Backend.
    let (backend, backend_src) = match opts.backend.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(b) => (b.to_string(), "backend"),
        None => match var(env, "DC_TRANSPORT") {
            Some(b) => (b.trim().to_string(), "DC_TRANSPORT"),
            None => ("auto".to_string(), ""),
        },
    };
    let backend = backend.to_ascii_lowercase();
    if !BACKENDS.contains(&backend.as_str()) {
        bail!(
            Status::InvalidArgument,
            "{backend_src} {backend:?} is not one of auto, shm, socket, nccl"
        );
    }

    let launcher_store = match var(env, "DC_LAUNCHER_STORE").as_deref().map(str::trim) {
        None | Some("0") => false,
        Some("1") => true,
        Some(v) => bail!(Status::InvalidArgument, "DC_LAUNCHER_STORE={v:?}: expected 0 or 1"),
    };
    if launcher_store && matches!(method, Method::File { .. }) {
        bail!(Status::InvalidArgument, "DC_LAUNCHER_STORE=1 needs env:// or tcp://, not file://");
    }

    let given = opts.token.clone().filter(|t| !t.is_empty()).map(|t| ("opts->token", t));
    let token = match given.or_else(|| env("DC_TOKEN").filter(|t| !t.is_empty()).map(|t| ("DC_TOKEN", t))) {
        Some((what, t)) => {
            if t.len() > MAX_TOKEN_LEN {
                bail!(Status::InvalidArgument, "{what} is longer than {MAX_TOKEN_LEN} bytes");
            }
            t.into_bytes()
        }
        None => {
            if let Some((host, port)) = master.as_ref().filter(|(h, _)| !is_loopback_host(h)) {
                bail!(
                    Status::Rendezvous,
                    "DC_TOKEN is not set and the store at {} is reachable from other hosts: without a \
                     secret token anyone who reaches it could join the job. Export the same random \
                     DC_TOKEN on every rank (for example DC_TOKEN=$(openssl rand -hex 16)), or start \
                     the job with dcrun, which makes one",
                    super::tcp_store::fmt_host_port(host, *port)
                );
            }
            dc_log!(
                Level::Warn,
                rank,
                "DC_TOKEN is not set: using a token derived from the store's address, which keeps \
                 strangers and garbage out but is not a secret (export the same DC_TOKEN on every rank)"
            );
            default_token(&method, master.as_ref())
        }
    };

    let group = match opts.group_name.as_deref().map(str::trim) {
        None | Some("") => "default".to_string(),
        Some(g) => {
            if g.len() > 256 || g.chars().any(|c| c.is_control()) {
                bail!(Status::InvalidArgument, "group_name {g:?}: at most 256 printable characters");
            }
            g.to_string()
        }
    };

    Ok(JobConfig {
        method,
        master,
        rank,
        world_size,
        local_rank,
        group,
        timeout: Duration::from_millis(timeout_ms),
        token,
        encrypt: opts.encrypt.unwrap_or_else(|| crate::params::get().encrypt),
        launcher_store,
        backend,
        socket_ifname: var(env, "DC_SOCKET_IFNAME").map(|s| s.trim().to_string()),
    })
}

/// The process environment, for [`resolve`]. Values that are not UTF-8 are taken lossily.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The environment `pairs`, with a DC_TOKEN unless they name one (an empty value: unset).
    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let mut m: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        m.entry("DC_TOKEN".into()).or_insert_with(|| "test-token".into());
        move |k: &str| m.get(k).cloned()
    }

    fn opts() -> InitOptions {
        InitOptions::from_env()
    }

    fn resolve_with(o: &InitOptions, pairs: &[(&str, &str)]) -> Result<JobConfig> {
        let e = env_of(pairs);
        resolve(o, &e)
    }

    fn err_of(o: &InitOptions, pairs: &[(&str, &str)]) -> crate::error::Error {
        resolve_with(o, pairs).expect_err("expected an error")
    }

    const TORCHRUN: &[(&str, &str)] = &[
        ("MASTER_ADDR", "10.1.2.3"),
        ("MASTER_PORT", "29500"),
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
    ];

    #[test]
    fn env_method_default() {
        let c = resolve_with(&opts(), TORCHRUN).unwrap();
        assert_eq!(c.method, Method::Env);
        assert_eq!(c.master, Some(("10.1.2.3".to_string(), 29500)));
        assert_eq!(c.rank, Some(3));
        assert_eq!(c.world_size, 8);
        assert_eq!(c.local_rank, Some(1));
        assert_eq!(c.group, "default");
        assert_eq!(c.timeout, Duration::from_millis(300_000));
        assert_eq!(c.backend, "auto");
        assert!(!c.launcher_store);
        assert_eq!(c.socket_ifname, None);
        // Same default token for every rank of the job.
        let mut other: Vec<(&str, &str)> = TORCHRUN.to_vec();
        other[2] = ("RANK", "5");
        let c2 = resolve_with(&opts(), &other).unwrap();
        assert_eq!(c.token, c2.token);
        assert!(!c.token.is_empty());
    }

    #[test]
    fn explicit_env_url_and_blank_url() {
        let mut o = opts();
        o.init_method = Some("env://".into());
        assert_eq!(resolve_with(&o, TORCHRUN).unwrap().method, Method::Env);
        o.init_method = Some("".into());
        assert_eq!(resolve_with(&o, TORCHRUN).unwrap().method, Method::Env);
    }

    #[test]
    fn options_override_environment() {
        let mut o = opts();
        o.rank = 0;
        o.world_size = 2;
        o.timeout_ms = 1234;
        o.backend = Some("SHM".into());
        o.group_name = Some("g1".into());
        let c = resolve_with(&o, TORCHRUN).unwrap();
        assert_eq!(c.rank, Some(0));
        assert_eq!(c.world_size, 2);
        assert_eq!(c.timeout, Duration::from_millis(1234));
        assert_eq!(c.backend, "shm");
        assert_eq!(c.group, "g1");
    }

    #[test]
    fn dc_variables() {
        let mut e: Vec<(&str, &str)> = TORCHRUN.to_vec();
        e.extend([
            ("DC_TIMEOUT_MS", "5000"),
            ("DC_TRANSPORT", "socket"),
            ("DC_TOKEN", "s3cret"),
            ("DC_LAUNCHER_STORE", "1"),
            ("DC_SOCKET_IFNAME", "eth0"),
        ]);
        let c = resolve_with(&opts(), &e).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(5000));
        assert_eq!(c.backend, "socket");
        assert_eq!(c.token, b"s3cret".to_vec());
        assert!(c.launcher_store);
        assert_eq!(c.socket_ifname.as_deref(), Some("eth0"));
    }

    #[test]
    fn bad_dc_variables() {
        let mut e: Vec<(&str, &str)> = TORCHRUN.to_vec();
        e.push(("DC_TIMEOUT_MS", "soon"));
        assert!(err_of(&opts(), &e).msg.contains("DC_TIMEOUT_MS"));
        let mut e: Vec<(&str, &str)> = TORCHRUN.to_vec();
        e.push(("DC_TRANSPORT", "carrier-pigeon"));
        let er = err_of(&opts(), &e);
        assert_eq!(er.status, Status::InvalidArgument);
        assert!(er.msg.contains("DC_TRANSPORT"), "{}", er.msg);
        let mut o = opts();
        o.backend = Some("mpi".into());
        assert!(err_of(&o, TORCHRUN).msg.contains("backend"));
        let mut e: Vec<(&str, &str)> = TORCHRUN.to_vec();
        e.push(("DC_LAUNCHER_STORE", "yes"));
        assert!(err_of(&opts(), &e).msg.contains("DC_LAUNCHER_STORE"));
    }

    #[test]
    fn slurm_variables() {
        let e = [
            ("MASTER_ADDR", "n1"),
            ("MASTER_PORT", "1"),
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
            ("SLURM_LOCALID", "2"),
        ];
        let c = resolve_with(&opts(), &e).unwrap();
        assert_eq!((c.rank, c.world_size, c.local_rank), (Some(5), 6, Some(2)));
    }

    #[test]
    fn open_mpi_variables_beat_slurm() {
        let e = [
            ("MASTER_ADDR", "n1"),
            ("MASTER_PORT", "29500"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ];
        let c = resolve_with(&opts(), &e).unwrap();
        assert_eq!((c.rank, c.world_size, c.local_rank), (Some(2), 4, Some(0)));
    }

    #[test]
    fn mpich_and_paddle_variables() {
        let e = [("MASTER_ADDR", "n1"), ("MASTER_PORT", "29500"), ("PMI_RANK", "1"), ("PMI_SIZE", "3")];
        let c = resolve_with(&opts(), &e).unwrap();
        assert_eq!((c.rank, c.world_size, c.local_rank), (Some(1), 3, None));
        let e = [
            ("MASTER_ADDR", "n1"),
            ("MASTER_PORT", "29500"),
            ("PADDLE_TRAINER_ID", "0"),
            ("PADDLE_TRAINERS_NUM", "2"),
        ];
        let c = resolve_with(&opts(), &e).unwrap();
        assert_eq!((c.rank, c.world_size), (Some(0), 2));
    }

    #[test]
    fn rank_and_world_errors() {
        let base = [("MASTER_ADDR", "h"), ("MASTER_PORT", "29500")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            v
        };
        let e = err_of(&opts(), &with(&[("RANK", "one"), ("WORLD_SIZE", "2")]));
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.msg.contains("RANK"), "{}", e.msg);
        let e = err_of(&opts(), &with(&[("RANK", "2"), ("WORLD_SIZE", "2")]));
        assert!(e.msg.contains("RANK=2") && e.msg.contains("WORLD_SIZE=2"), "{}", e.msg);
        let e = err_of(&opts(), &with(&[("RANK", "0"), ("WORLD_SIZE", "0")]));
        assert!(e.msg.contains("WORLD_SIZE"), "{}", e.msg);
        let e = err_of(&opts(), &with(&[("RANK", "0"), ("WORLD_SIZE", "-3")]));
        assert!(e.msg.contains("WORLD_SIZE"), "{}", e.msg);
        let e = err_of(&opts(), &with(&[("RANK", "0")]));
        assert!(e.msg.contains("WORLD_SIZE"), "{}", e.msg);
        let e = err_of(&opts(), &with(&[("WORLD_SIZE", "2")]));
        assert!(e.msg.contains("RANK"), "{}", e.msg);
        let mut o = opts();
        o.world_size = 0;
        assert!(err_of(&o, &with(&[("RANK", "0")])).msg.contains("world_size"));
        let mut o = opts();
        o.rank = 7;
        o.world_size = 4;
        assert!(err_of(&o, &base).msg.contains("rank=7"));
        let e = err_of(&opts(), &with(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2")]));
        assert!(e.msg.contains("SLURM_PROCID"), "{}", e.msg);
        let e = err_of(&opts(), &with(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "z")]));
        assert!(e.msg.contains("LOCAL_RANK"), "{}", e.msg);
    }

    #[test]
    fn env_method_needs_master() {
        let e = err_of(&opts(), &[("MASTER_PORT", "29500"), ("RANK", "0"), ("WORLD_SIZE", "1")]);
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.msg.contains("MASTER_ADDR"), "{}", e.msg);
        let e = err_of(&opts(), &[("MASTER_ADDR", "h"), ("RANK", "0"), ("WORLD_SIZE", "1")]);
        assert!(e.msg.contains("MASTER_PORT"), "{}", e.msg);
        let e = err_of(
            &opts(),
            &[("MASTER_ADDR", "h"), ("MASTER_PORT", "70000"), ("RANK", "0"), ("WORLD_SIZE", "1")],
        );
        assert!(e.msg.contains("MASTER_PORT") && e.msg.contains("out of range"), "{}", e.msg);
        let e = err_of(
            &opts(),
            &[("MASTER_ADDR", "h"), ("MASTER_PORT", "http"), ("RANK", "0"), ("WORLD_SIZE", "1")],
        );
        assert!(e.msg.contains("MASTER_PORT"), "{}", e.msg);
    }

    #[test]
    fn tcp_urls() {
        let mut o = opts();
        o.rank = 1;
        o.world_size = 2;
        for (url, host, port) in [
            ("tcp://10.0.0.1:23456", "10.0.0.1", 23456),
            ("tcp://node-7.cluster:80", "node-7.cluster", 80),
            ("tcp://[::1]:29500", "::1", 29500),
            ("TCP://[fe80::1%eth0]:1/", "fe80::1%eth0", 1),
        ] {
            o.init_method = Some(url.into());
            let c = resolve_with(&o, &[]).unwrap();
            assert_eq!(c.method, Method::Tcp { host: host.into(), port }, "{url}");
            assert_eq!(c.master, Some((host.to_string(), port)));
        }
        for (url, needle) in [
            ("tcp://host:0", "out of range"),
            ("tcp://host:65536", "out of range"),
            ("tcp://host", "HOST:PORT"),
            ("tcp://:80", "empty host"),
            ("tcp://::1:80", "IPv6"),
            ("tcp://[::1:80", "unterminated"),
            ("tcp://host:abc", "not a number"),
            ("udp://host:1", "unknown scheme"),
            ("host:1", "expected env://"),
            ("env://x", "no address"),
        ] {
            o.init_method = Some(url.into());
            let e = err_of(&o, &[]);
            assert_eq!(e.status, Status::InvalidArgument);
            assert!(e.msg.contains(needle), "{url}: {}", e.msg);
            assert!(e.msg.contains("init_method"), "{url}: {}", e.msg);
        }
    }

    #[test]
    fn tcp_rank_from_env_or_error() {
        let mut o = opts();
        o.init_method = Some("tcp://h:1".into());
        let c = resolve_with(&o, &[("RANK", "1"), ("WORLD_SIZE", "3")]).unwrap();
        assert_eq!(c.rank, Some(1));
        let e = err_of(&o, &[("WORLD_SIZE", "3")]);
        assert!(e.msg.contains("rank is -1"), "{}", e.msg);
    }

    #[test]
    fn file_urls_and_arrival_ranks() {
        let mut o = opts();
        o.init_method = Some("file:///shared/job/store".into());
        o.world_size = 4;
        let c = resolve_with(&o, &[]).unwrap();
        assert_eq!(c.method, Method::File { path: PathBuf::from("/shared/job/store") });
        assert_eq!(c.master, None);
        assert_eq!(c.rank, None);
        let c2 = resolve_with(&o, &[("RANK", "2")]).unwrap();
        assert_eq!(c2.rank, Some(2));
        assert_eq!(c.token, c2.token);
        o.init_method = Some("file://relative/path".into());
        assert!(err_of(&o, &[]).msg.contains("absolute"));
        o.init_method = Some("file:///shared/x".into());
        let e = err_of(&o, &[("DC_LAUNCHER_STORE", "1")]);
        assert!(e.msg.contains("DC_LAUNCHER_STORE"));
    }

    #[test]
    fn without_a_token_only_a_loopback_store_is_allowed() {
        let base = |addr: &'static str| vec![("MASTER_ADDR", addr), ("MASTER_PORT", "29500"), ("RANK", "0"), ("WORLD_SIZE", "2"), ("DC_TOKEN", "")];
        for addr in ["10.1.2.3", "node01", "::ffff:10.0.0.1", "192.168.0.1"] {
            let e = err_of(&opts(), &base(addr));
            assert_eq!(e.status, Status::Rendezvous, "{addr}: {e}");
            assert!(e.msg.contains("DC_TOKEN") && e.msg.contains("reachable from other hosts"), "{e}");
        }
        for addr in ["127.0.0.1", "localhost", "::1", "127.0.0.2"] {
            let c = resolve_with(&opts(), &base(addr)).unwrap_or_else(|e| panic!("{addr}: {e}"));
            assert_eq!(c.token, default_token(&Method::Env, Some(&(addr.to_string(), 29500))), "{addr}");
        }
        // With a token, any address.
        let mut with = base("10.1.2.3");
        with.retain(|(k, _)| *k != "DC_TOKEN");
        assert_eq!(resolve_with(&opts(), &with).unwrap().token, b"test-token");
    }

    #[test]
    fn init_options_token_and_encrypt_come_before_the_environment() {
        let base = [("MASTER_ADDR", "10.1.2.3"), ("MASTER_PORT", "29500"), ("RANK", "0"), ("WORLD_SIZE", "2"), ("DC_TOKEN", "")];
        let mut o = opts();
        o.token = Some("from-opts".into());
        assert_eq!(resolve_with(&o, &base).unwrap().token, b"from-opts", "opts->token allows a store on another host");
        let mut with_env = base.to_vec();
        with_env.retain(|(k, _)| *k != "DC_TOKEN");
        assert_eq!(resolve_with(&o, &with_env).unwrap().token, b"from-opts", "opts->token wins over DC_TOKEN");
        o.token = Some(String::new());
        assert_eq!(resolve_with(&o, &with_env).unwrap().token, b"test-token", "an empty opts->token means DC_TOKEN");
        o.token = Some("x".repeat(MAX_TOKEN_LEN + 1));
        let e = err_of(&o, &with_env);
        assert!(e.status == Status::InvalidArgument && e.msg.contains("opts->token"), "{e}");
        let mut o = opts();
        for want in [false, true] {
            o.encrypt = Some(want);
            assert_eq!(resolve_with(&o, &with_env).unwrap().encrypt, want);
        }
    }

    #[test]
    fn default_token_rules() {
        let a = default_token(&Method::Env, Some(&("a".into(), 1)));
        let b = default_token(&Method::Tcp { host: "b".into(), port: 1 }, Some(&("b".into(), 1)));
        let c = default_token(&Method::Env, Some(&("a".into(), 2)));
        assert_eq!(a, b, "host spelling must not matter");
        assert_ne!(a, c);
        let f1 = default_token(&Method::File { path: "/x".into() }, None);
        let f2 = default_token(&Method::File { path: "/y".into() }, None);
        assert_ne!(f1, f2);
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn empty_variables_count_as_unset() {
        let e = [
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "29500"),
            ("RANK", ""),
            ("WORLD_SIZE", ""),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("DC_TOKEN", ""),
        ];
        let c = resolve_with(&opts(), &e).unwrap();
        assert_eq!((c.rank, c.world_size), (Some(1), 2));
        assert_eq!(c.token.len(), 64);
    }
}

/// `DC_TIMEOUT_MS` if set: a positive integer, anything else is an error naming the variable.
fn env_timeout_ms(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<u64>> {
    let Some(v) = var(env, "DC_TIMEOUT_MS") else { return Ok(None) };
    match v.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => bail!(Status::InvalidArgument, "DC_TIMEOUT_MS={v:?} is not a positive integer"),
    }
}

/// The timeout used when none is given: `DC_TIMEOUT_MS` if it is a positive integer, else 300000.
pub fn default_timeout_ms(env: &dyn Fn(&str) -> Option<String>) -> i64 {
    env_timeout_ms(env).ok().flatten().unwrap_or(DEFAULT_TIMEOUT_MS) as i64
}
