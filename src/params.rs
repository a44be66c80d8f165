//! The engine's tuning and diagnostics knobs (`DC_*` beyond the job's own configuration, which
//! `rendezvous::config` resolves per init): read in this one place, once per process, through
//! an injected environment (`Params::from_env`), so each is parsed one way and tests can build
//! them from a table. The README's "Environment variables" lists them.

use once_cell::sync::Lazy;

/// A silent peer is lost after this long unless `DC_PEER_TIMEOUT_MS` says otherwise: long
/// enough for a process starved on a crowded host (its progress thread still runs every few
/// milliseconds), short against the operation timeout (300 s).
pub const DEFAULT_PEER_TIMEOUT_MS: u64 = 10_000;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params {
    /// `DC_DEBUG` as given: a log level (`WARN`, `INFO`, `TRACE`) or `DETAIL`.
    pub debug: Option<String>,
    /// `DC_NCCL=0`: backend "auto" never uses NCCL.
    pub nccl_off: bool,
    /// `DC_NCCL_LIBRARY`: the NCCL library to load (non-empty).
    pub nccl_library: Option<String>,
    /// `DC_RPC_MAX_BYTES` as given (the RPC layer checks it and says what is wrong).
    pub rpc_max_bytes: Option<String>,
    /// `DC_SHM_CHUNK`: bytes per shared-memory staging slot.
    pub shm_chunk: Option<usize>,
    /// `DC_CMA_MIN`: single-copy threshold in bytes (0: off).
    pub cma_min: Option<usize>,
    /// `DC_SOCKET_SNDBUF`: send buffer of every data connection (0: the kernel's autotuning).
    pub socket_sndbuf: Option<usize>,
    /// `DC_LOCAL_CORES`: the host's cores as the launcher saw them (positive).
    pub local_cores: Option<usize>,
    /// Ranks on this host, from the launcher: `LOCAL_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_SIZE`
    /// or `SLURM_NTASKS_PER_NODE`, the first that parses.
    pub local_world_size: Option<usize>,
    /// `DC_SPIN_US`, `DC_SPIN_SLICE_US`: the waits' spin time and yield slice, in microseconds.
    pub spin_us: Option<u64>,
    pub spin_slice_us: Option<u64>,
    /// `DC_LONG_SPIN_US`: how long a waiter apart from the rank it waits for spins while its
    /// own core is not contended (0: never longer than `DC_SPIN_US`).
    pub long_spin_us: Option<u64>,
    /// `DC_PEER_TIMEOUT_MS`: how long a peer may stay silent (no frame, no heartbeat; or its
    /// process stopped) before it is lost. 0: never (waits then end only at their timeout).
    pub peer_timeout_ms: Option<u64>,
    /// `DC_ENCRYPT=1`: connections between hosts are encrypted (see `transport::seal`).
    pub encrypt: bool,
    /// `DC_MAX_UNEXPECTED_BYTES`, `DC_RENDEZVOUS_BYTES`: flow control (see `transport::flow`).
    pub max_unexpected_bytes: Option<usize>,
    pub rendezvous_bytes: Option<usize>,
    /// `DC_PICK=first|second`: every choice made by measure (`crate::pick`) takes that way, for
    /// measuring one way against the other; unset: by measure.
    pub pick_way: Option<bool>,
}

impl Params {
    /// The knobs as `get` (an environment: name -> value) gives them.
    pub fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Params {
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<usize>().ok());
        let us = |k: &str| get(k).and_then(|v| v.trim().parse::<u64>().ok());
        Params {
            debug: get("DC_DEBUG"),
            nccl_off: get("DC_NCCL").is_some_and(|v| v == "0"),
            nccl_library: get("DC_NCCL_LIBRARY").filter(|s| !s.is_empty()),
            rpc_max_bytes: get("DC_RPC_MAX_BYTES"),
            shm_chunk: num("DC_SHM_CHUNK"),
            cma_min: num("DC_CMA_MIN"),
            socket_sndbuf: num("DC_SOCKET_SNDBUF"),
            local_cores: num("DC_LOCAL_CORES").filter(|&n| n > 0),
            local_world_size: ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"].iter().find_map(|k| num(k)),
            spin_us: us("DC_SPIN_US"),
            spin_slice_us: us("DC_SPIN_SLICE_US"),
            long_spin_us: us("DC_LONG_SPIN_US"),
            peer_timeout_ms: us("DC_PEER_TIMEOUT_MS"),
            encrypt: get("DC_ENCRYPT").is_some_and(|v| v.trim() == "1"),
            max_unexpected_bytes: num("DC_MAX_UNEXPECTED_BYTES"),
            rendezvous_bytes: num("DC_RENDEZVOUS_BYTES"),
            pick_way: get("DC_PICK").and_then(|v| match v.trim() {
                "first" => Some(false),
                "second" => Some(true),
                _ => None,
            }),
        }
    }

    /// How long a peer may be silent before it is lost (`DC_PEER_TIMEOUT_MS`, default 10 s;
    /// None: no limit).
    pub fn peer_timeout(&self) -> Option<std::time::Duration> {
        match self.peer_timeout_ms.unwrap_or(DEFAULT_PEER_TIMEOUT_MS) {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        }
    }

    /// `DC_DEBUG=DETAIL`: every collective's arguments are compared across ranks first.
    pub fn detail(&self) -> bool {
        self.debug.as_deref().is_some_and(|v| v.trim().eq_ignore_ascii_case("DETAIL"))
    }
}

/// This process's knobs, from its environment when first asked.
pub fn get() -> &'static Params {
    static P: Lazy<Params> = Lazy::new(|| Params::from_env(&|k| std::env::var(k).ok()));
    &P
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(pairs: &[(&str, &str)]) -> Params {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Params::from_env(&|k| m.get(k).cloned())
    }

    #[test]
    fn every_knob_is_read_and_bad_numbers_are_ignored() {
        assert_eq!(from(&[]), Params::default());
        let p = from(&[
            ("DC_DEBUG", " detail "),
            ("DC_NCCL", "0"),
            ("DC_NCCL_LIBRARY", ""),
            ("DC_SHM_CHUNK", "65536"),
            ("DC_CMA_MIN", "0"),
            ("DC_SOCKET_SNDBUF", " 1048576 "),
            ("DC_LOCAL_CORES", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "x"),
            ("SLURM_NTASKS_PER_NODE", "8"),
            ("DC_SPIN_US", "-3"),
            ("DC_PEER_TIMEOUT_MS", "0"),
        ]);
        assert!(p.detail() && p.nccl_off);
        assert_eq!(p.nccl_library, None, "an empty library name is no name");
        assert_eq!((p.shm_chunk, p.cma_min, p.socket_sndbuf), (Some(65536), Some(0), Some(1 << 20)));
        assert_eq!(p.local_cores, None, "0 cores means unset");
        assert_eq!(p.local_world_size, Some(8), "the first variable that parses");
        assert_eq!(p.spin_us, None);
        assert_eq!(p.peer_timeout(), None, "0: silent peers are never lost");
        assert_eq!(from(&[]).peer_timeout(), Some(std::time::Duration::from_secs(10)));
        assert_eq!(from(&[("DC_PEER_TIMEOUT_MS", "1500")]).peer_timeout(), Some(std::time::Duration::from_millis(1500)));
        assert!(!from(&[("DC_NCCL", "1")]).nccl_off);
        assert_eq!([" first", "second", "both"].map(|v| from(&[("DC_PICK", v)]).pick_way), [Some(false), Some(true), None]);
        assert!(!from(&[("DC_DEBUG", "INFO")]).detail());
    }
}
