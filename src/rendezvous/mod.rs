//! Rendezvous: init-method parsing, launcher environment detection, key-value stores, job token.
//!
//! [`config::resolve`] turns `dc_init_options` and the environment into a [`config::JobConfig`];
//! [`rendezvous`] forms the group from it: it finds (or, on rank 0, serves) the store, gives this
//! init a fresh key prefix, and waits until every rank has joined. Later steps (transport address
//! exchange) use [`exchange`] on the returned store.
//!
//! Key layout in a shared store, for group `G`:
//! - `G/gen/R`: how many times rank `R` has initialised group `G` against this store; the n-th
//!   init of every rank uses generation `n-1` (so repeated `dc_init`s of one group against a
//!   long-lived launcher store, or several thread-ranks, get fresh keys);
//! - `G/arrivals`: file:// with rank -1: the n-th arrival is rank `(n-1) % world_size` of
//!   generation `(n-1) / world_size`;
//! - `G/GEN/...`: everything else of that init (through a [`PrefixStore`]), e.g. `G/0/join/T/3`
//!   (an [`exchange`]: `T` names the set of ranks exchanging; see [`exchange_among`]).

pub mod config;
mod file_record;
pub mod file_store;
pub mod mem_store;
pub mod netif;
pub mod prefix_store;
mod store_core;
mod store_server;
pub mod tcp_store;

pub use config::{resolve, InitOptions, JobConfig, Method};
pub use file_store::FileStore;
pub use mem_store::MemStore;
pub use prefix_store::PrefixStore;
pub use tcp_store::{StoreServer, TcpStore};

use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::{bail, dc_log, err};
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A key-value store shared by the ranks of a job during rendezvous.
pub trait Store: Send + Sync {
    /// Sets `key` to `value` (overwrites).
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits until `key` exists, then returns its value; `DC_ERR_TIMEOUT` at `deadline`.
    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>>;
    /// Returns the value if `key` exists now.
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// Adds `delta` to the integer at `key` (missing = 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
}

/// A formed group: who we are, and a store private to this init of this group.
pub struct Rendezvous {
    /// Already prefixed for this job + group + generation.
    pub store: Arc<dyn Store>,
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: Option<usize>,
    pub token: Vec<u8>,
    pub timeout: Duration,
    pub backend: String,
    pub socket_ifname: Option<String>,
    /// The local IP the data listener should bind.
    pub bind_ip: IpAddr,
    /// The store server this process hosts (rank 0 of env:// and tcp:// unless the launcher
    /// serves it). Keep it alive for the job's lifetime. Shared: several inits in one process
    /// against the same address use one server.
    pub server: Option<Arc<StoreServer>>,
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendezvous")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("backend", &self.backend)
            .field("bind_ip", &self.bind_ip)
            .field("server", &self.server.as_ref().map(|s| s.local_addr()))
            .finish()
    }
}

/// Formats a rank list compactly: "rank 2", "ranks 2, 3", "ranks 0-5, 9".
pub fn fmt_ranks(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", ranks[i], ranks[j]));
        } else {
            for r in &ranks[i..=j] {
                parts.push(r.to_string());
            }
        }
        i = j + 1;
    }
    let word = if ranks.len() == 1 { "rank" } else { "ranks" };
    if parts.len() > 20 {
        parts.truncate(20);
        parts.push(format!("... ({} ranks in all)", ranks.len()));
    }
    format!("{word} {}", parts.join(", "))
}

/// Every rank publishes `value` and gets everyone's, in rank order, at O(N) store requests for
/// the whole exchange (see [`exchange_among`]). On timeout: `DC_ERR_TIMEOUT` naming the ranks that
/// never published ("ranks 2, 3 never joined").
pub fn exchange(
    store: &dyn Store,
    key: &str,
    rank: usize,
    world_size: usize,
    value: &[u8],
    deadline: Instant,
) -> Result<Vec<Vec<u8>>> {
    if rank >= world_size {
        bail!(Status::InvalidArgument, "exchange: rank {rank} is not below world size {world_size}");
    }
    let all: Vec<usize> = (0..world_size).collect();
    exchange_among(store, key, rank, &all, value, deadline)
}

/// Gathered values larger than this are split over several keys (a store caps one value at 64 MiB).
const EXCHANGE_PART: usize = 16 << 20;

/// `exchange` among `ranks` only: this rank publishes `value`, and gets the values of `ranks`,
/// in that order (`rank` may be among them or not; init's per-host exchanges list only the
/// peers, so the lists differ from rank to rank).
///
/// Keys: every rank SETs `key/rank` (8 bytes naming its set, then the value). The set of a
/// rank is `S = ranks ∪ {rank}`, sorted; it is named by a 64-bit digest `T` of `S`, so the
/// gathered values of one key exchanged among different subsets (each host's ranks, say) never
/// share keys (two different sets collide with probability 2^-64). The lowest rank `L` of `S`
/// GETs the others' keys in turn, concatenates the values (length-prefixed) and SETs them under
/// `key/T/all` (split into `key/T/all/1`, `/2`, ... past 16 MiB). Every other rank GETs `key/L`
/// (it needs L's value anyway) and, when L names the same set, GETs `key/T/all`: about 3
/// requests per rank for the whole exchange, instead of one per pair. When L's set differs
/// (a rank's list was not symmetric with its peers'), it falls back to one GET per listed rank.
///
/// On timeout, `DC_ERR_TIMEOUT` names the ranks whose key is absent (one look each, only on that
/// failure path), or says that all joined but L did not publish the gathered values.
pub fn exchange_among(store: &dyn Store, key: &str, rank: usize, ranks: &[usize], value: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>> {
    exchange_parts(store, key, rank, ranks, value, deadline, EXCHANGE_PART)
}

const TAG_LEN: usize = 8;

/// The digest that names a set of ranks in exchange keys.
fn subset_tag(members: &[usize]) -> [u8; TAG_LEN] {
    let ranks: Vec<u8> = members.iter().flat_map(|&r| (r as u64).to_le_bytes()).collect();
    crate::auth::sha256(&[b"distcomm exchange ranks v1\0", &ranks])[..TAG_LEN].try_into().unwrap()
}

fn never_joined(start: Instant, key: &str, missing: &[usize], n: usize) -> Error {
    err!(
        Status::Timeout,
        "rendezvous timed out after {:.1} s: {} never joined (waiting for {key:?}, {} of {} present)",
        start.elapsed().as_secs_f64(),
        fmt_ranks(missing),
        n - missing.len(),
        n
    )
}

/// The timeout error after waiting for `ranks[i]`: names it and whichever of the rest (but `me`)
/// have not published either.
fn missing_from(store: &dyn Store, key: &str, me: usize, ranks: &[usize], i: usize, start: Instant) -> Error {
    let mut missing = vec![ranks[i]];
    for &q in &ranks[i + 1..] {
        match store.try_get(&format!("{key}/{q}")) {
            Ok(Some(_)) => {}
            Ok(None) => {
                if q != me && !missing.contains(&q) {
                    missing.push(q)
                }
            }
            Err(e) => return e,
        }
    }
    missing.sort_unstable();
    let mut n: Vec<usize> = ranks.to_vec();
    n.sort_unstable();
    n.dedup();
    never_joined(start, key, &missing, n.len())
}

/// Splits what a rank published into the tag of its set and its value.
fn published(key: &str, r: usize, v: Vec<u8>) -> Result<([u8; TAG_LEN], Vec<u8>)> {
    if v.len() < TAG_LEN {
        bail!(Status::Rendezvous, "exchange: rank {r} published a malformed value under {key:?}");
    }
    Ok((v[..TAG_LEN].try_into().unwrap(), v[TAG_LEN..].to_vec()))
}

fn exchange_parts(
    store: &dyn Store,
    key: &str,
    rank: usize,
    ranks: &[usize],
    value: &[u8],
    deadline: Instant,
    part: usize,
) -> Result<Vec<Vec<u8>>> {
    let start = Instant::now();
    let mut members: Vec<usize> = ranks.iter().copied().chain([rank]).collect();
    members.sort_unstable();
    members.dedup();
    let tag = subset_tag(&members);
    let mut mine = Vec::with_capacity(TAG_LEN + value.len());
    mine.extend_from_slice(&tag);
    mine.extend_from_slice(value);
    store.set(&format!("{key}/{rank}"), &mine)?;
    let base = format!("{key}/{}", crate::auth::hex(&tag));
    let leader = members[0];
    let gathered = if rank == leader {
        let vals = exchange_direct(store, key, rank, &members, value, deadline, start)?;
        publish_gathered(store, &base, &vals, part)?;
        vals
    } else {
        let (their_tag, _) = match store.get(&format!("{key}/{leader}"), deadline) {
            Ok(v) => published(key, leader, v)?,
            Err(e) if e.status == Status::Timeout => return Err(missing_from(store, key, rank, &members, 0, start)),
            Err(e) => return Err(e),
        };
        if their_tag != tag {
            dc_log!(Level::Info, Some(rank), "exchange of {key:?}: rank {leader} lists other ranks than this one; reading each listed rank");
            return exchange_direct(store, key, rank, ranks, value, deadline, start);
        }
        match fetch_gathered(store, &base, members.len(), deadline) {
            Ok(v) => v,
            Err(e) if e.status == Status::Timeout => {
                let mut missing = Vec::new();
                for &q in &members {
                    if q != rank && store.try_get(&format!("{key}/{q}"))?.is_none() {
                        missing.push(q);
                    }
                }
                if missing.is_empty() {
                    bail!(
                        Status::Timeout,
                        "rendezvous timed out after {:.1} s: all {} ranks joined {key:?}, but rank {leader}, which gathers their values, did not publish them",
                        start.elapsed().as_secs_f64(),
                        members.len()
                    );
                }
                return Err(never_joined(start, key, &missing, members.len()));
            }
            Err(e) => return Err(e),
        }
    };
    if ranks == members.as_slice() {
        return Ok(gathered);
    }
    Ok(ranks.iter().map(|r| gathered[members.binary_search(r).expect("a listed rank")].clone()).collect())
}

/// One GET per listed rank: for sets that are not the same on every rank.
fn exchange_direct(store: &dyn Store, key: &str, rank: usize, ranks: &[usize], value: &[u8], deadline: Instant, start: Instant) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(ranks.len());
    for (i, &r) in ranks.iter().enumerate() {
        if r == rank {
            out.push(value.to_vec());
            continue;
        }
        match store.get(&format!("{key}/{r}"), deadline) {
            Ok(v) => out.push(published(key, r, v)?.1),
            Err(e) if e.status == Status::Timeout => return Err(missing_from(store, key, rank, ranks, i, start)),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Stores the gathered values as `u64 count | (u64 len | bytes)*`, in parts of at most `part`
/// bytes: `base/all` holds `u32 parts` and the first, `base/all/i` the i-th (set before `all`,
/// which readers wait for).
fn publish_gathered(store: &dyn Store, base: &str, vals: &[Vec<u8>], part: usize) -> Result<()> {
    let mut blob = Vec::with_capacity(8 + vals.iter().map(|v| 8 + v.len()).sum::<usize>());
    blob.extend_from_slice(&(vals.len() as u64).to_le_bytes());
    for v in vals {
        blob.extend_from_slice(&(v.len() as u64).to_le_bytes());
        blob.extend_from_slice(v);
    }
    let chunks: Vec<&[u8]> = blob.chunks(part.max(1)).collect();
    for (i, c) in chunks.iter().enumerate().skip(1) {
        store.set(&format!("{base}/all/{i}"), c)?;
    }
    let mut first = Vec::with_capacity(4 + chunks[0].len());
    first.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
    first.extend_from_slice(chunks[0]);
    store.set(&format!("{base}/all"), &first)
}

/// Reads back what [`publish_gathered`] stored: `n` values.
fn fetch_gathered(store: &dyn Store, base: &str, n: usize, deadline: Instant) -> Result<Vec<Vec<u8>>> {
    let first = store.get(&format!("{base}/all"), deadline)?;
    let malformed = || err!(Status::Rendezvous, "exchange: the gathered values under {base:?} are malformed");
    let (Some(parts), Some(mut blob)) = (first.get(..4), first.get(4..).map(<[u8]>::to_vec)) else {
        return Err(malformed());
    };
    let parts = u32::from_le_bytes(parts.try_into().unwrap());
    for i in 1..parts {
        blob.extend_from_slice(&store.get(&format!("{base}/all/{i}"), deadline)?);
    }
    let mut rest = &blob[..];
    let mut take = |len: usize| -> Result<&[u8]> {
        if rest.len() < len {
            return Err(malformed());
        }
        let (a, b) = rest.split_at(len);
        rest = b;
        Ok(a)
    };
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    if u64_at(take(8)?) != n as u64 {
        return Err(malformed());
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = u64_at(take(8)?);
        let len = usize::try_from(len).map_err(|_| malformed())?;
        out.push(take(len)?.to_vec());
    }
    Ok(out)
}

/// Servers hosted by this process, by address, so that several inits share one.
static SERVERS: Lazy<Mutex<HashMap<SocketAddr, Weak<StoreServer>>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// Serves a store on `addr` (port 0: one the kernel picks, held from then on) for this
/// process's inits: a rank 0 whose store address is the server's (`local_addr`) and whose
/// token it accepts uses it instead of binding one. For jobs of thread ranks that must not
/// race other processes for a port between choosing it and binding it.
pub fn serve_store_here(addr: SocketAddr, token: &[u8]) -> Result<Arc<StoreServer>> {
    let l = tcp_store::bind_listener(addr).map_err(|e| Error::system(format!("cannot serve a store on {addr}"), e))?;
    let s = Arc::new(StoreServer::from_listener(l, token.to_vec())?);
    SERVERS.lock().unwrap_or_else(|p| p.into_inner()).insert(s.local_addr(), Arc::downgrade(&s));
    Ok(s)
}

/// Serves the store on `host:port` (exactly that address), or returns the server this process
/// already runs there. `what` words errors ("MASTER_PORT 29500 on 127.0.0.1").
fn host_store(host: &str, port: u16, token: &[u8], env_names: bool) -> Result<Arc<StoreServer>> {
    let place = if env_names {
        format!("MASTER_PORT {port} on {host}")
    } else {
        format!("port {port} on {host}")
    };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| err!(Status::InvalidArgument, "cannot resolve the store host {host:?}: {e}"))?
        .collect();
    let mut servers = SERVERS.lock().unwrap_or_else(|p| p.into_inner());
    servers.retain(|_, w| w.strong_count() > 0);
    for a in &addrs {
        if let Some(s) = servers.get(a).and_then(Weak::upgrade) {
            if !s.accepts_token(token) {
                bail!(Status::InvalidArgument, "this process already serves a store on {a} with another token");
            }
            dc_log!(Level::Info, None, "reusing this process's store server on {a}");
            return Ok(s);
        }
    }
    let mut last: Option<(SocketAddr, io::Error)> = None;
    for a in &addrs {
        match tcp_store::bind_listener(*a) {
            Ok(l) => {
                if a.ip().is_loopback() && !matches!(host, "localhost") && host.parse::<IpAddr>().is_err() {
                    dc_log!(
                        Level::Warn,
                        Some(0),
                        "the store host {host} resolves to the loopback address {} here; ranks on other hosts cannot reach it",
                        a.ip()
                    );
                }
                let s = Arc::new(StoreServer::from_listener(l, token.to_vec())?);
                servers.insert(*a, Arc::downgrade(&s));
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                bail!(Status::System, "{place} is already in use (another job?)");
            }
            Err(e) => last = Some((*a, e)),
        }
    }
    match last {
        Some((a, e)) if e.kind() == io::ErrorKind::AddrNotAvailable => bail!(
            Status::System,
            "cannot serve the store on {a}: {e} (rank 0 must run on the host the store address names: {place})"
        ),
        Some((a, e)) => Err(Error::system(format!("cannot serve the store on {a} ({place})"), e)),
        None => bail!(Status::InvalidArgument, "the store host {host:?} resolves to no address"),
    }
}

/// Calls `FileStore::job_done` when dropped, whatever the outcome of the rendezvous.
struct JobDone {
    store: Arc<FileStore>,
}

impl Drop for JobDone {
    fn drop(&mut self) {
        if let Err(e) = self.store.job_done() {
            dc_log!(Level::Warn, None, "could not mark the rendezvous done in the store file: {e}");
        }
    }
}

/// Forms the group described by `cfg`; see the module docs. Fails with `DC_ERR_TIMEOUT` naming
/// the ranks that did not join within `cfg.timeout`.
pub fn rendezvous(cfg: &JobConfig) -> Result<Rendezvous> {
    let deadline = Instant::now() + cfg.timeout;
    let group = &cfg.group;
    let ws = cfg.world_size;
    if ws < 1 {
        bail!(Status::InvalidArgument, "world size {ws} < 1");
    }

    let mut server = None;
    let mut _done_guard = None;
    let base: Arc<dyn Store>;
    let rank: usize;
    let gen: i64;
    let mut local_ip: Option<IpAddr> = None;

    match &cfg.method {
        Method::Env | Method::Tcp { .. } => {
            let Some((host, port)) = cfg.master.clone() else {
                bail!(Status::InvalidArgument, "no store address (MASTER_ADDR/MASTER_PORT)");
            };
            let Some(r) = cfg.rank else {
                bail!(Status::InvalidArgument, "rank -1 is allowed only with file://");
            };
            rank = r;
            if rank == 0 && !cfg.launcher_store {
                server = Some(host_store(&host, port, &cfg.token, cfg.method == Method::Env)?);
            }
            dc_log!(
                Level::Info,
                Some(rank),
                "rendezvous: group {group:?}, {ws} ranks, store {}{}",
                tcp_store::fmt_host_port(&host, port),
                if server.is_some() { " (served here)" } else if cfg.launcher_store { " (the launcher's)" } else { "" }
            );
            let client = TcpStore::connect(&host, port, &cfg.token, deadline)?;
            local_ip = client.local_addr().ok().map(|a| a.ip());
            let client: Arc<dyn Store> = Arc::new(client);
            gen = client.add(&format!("{group}/gen/{rank}"), 1)? - 1;
            base = client;
        }
        Method::File { path } => {
            let fs = Arc::new(FileStore::open_job(path, &cfg.token, cfg.timeout, group)?);
            _done_guard = Some(JobDone { store: fs.clone() });
            let fsd: Arc<dyn Store> = fs.clone();
            match cfg.rank {
                Some(r) => {
                    rank = r;
                    gen = fsd.add(&format!("{group}/gen/{rank}"), 1)? - 1;
                }
                None => {
                    let n = fsd.add(&format!("{group}/arrivals"), 1)? - 1;
                    rank = (n as usize) % ws;
                    gen = n / ws as i64;
                    dc_log!(Level::Info, Some(rank), "rendezvous: arrival {} in {}: rank {rank}", n + 1, path.display());
                }
            }
            dc_log!(
                Level::Info,
                Some(rank),
                "rendezvous: group {group:?}, {ws} ranks, store file {} (file generation {})",
                path.display(),
                fs.generation()
            );
            base = fsd;
        }
    }

    let store: Arc<dyn Store> = Arc::new(PrefixStore::new(base, format!("{group}/{gen}")));
    dc_log!(Level::Info, Some(rank), "rendezvous: generation {gen} of group {group:?}; waiting for {ws} ranks");

    // Everyone says hello; check that all agree on the world size.
    let me = format!("{ws}\n{}\n{}", crate::log::hostname(), std::process::id());
    let all = exchange(store.as_ref(), "join", rank, ws, me.as_bytes(), deadline).inspect_err(|_| {
        // The other ranks wait on this process's store and time out a little later than we do
        // (they started later). Keep serving them briefly, so they too report which ranks never
        // joined instead of a closed store.
        if let Some(s) = &server {
            s.linger_while_clients(cfg.timeout.min(Duration::from_secs(3)));
        }
    })?;
    for (r, v) in all.iter().enumerate() {
        let text = String::from_utf8_lossy(v);
        let theirs = text.split('\n').next().unwrap_or("");
        if theirs != ws.to_string() {
            bail!(
                Status::InvalidArgument,
                "world size mismatch: rank {rank} has WORLD_SIZE={ws}, rank {r} has {theirs:?}"
            );
        }
    }
    drop(_done_guard);
    dc_log!(Level::Info, Some(rank), "rendezvous: all {ws} ranks joined");

    let bind_ip = choose_bind_ip(cfg, local_ip)?;
    dc_log!(Level::Info, Some(rank), "rendezvous: data listener address {bind_ip}");

    Ok(Rendezvous {
        store,
        rank,
        world_size: ws,
        local_rank: cfg.local_rank,
        token: cfg.token.clone(),
        timeout: cfg.timeout,
        backend: cfg.backend.clone(),
        socket_ifname: cfg.socket_ifname.clone(),
        bind_ip,
        server,
    })
}

/// `DC_SOCKET_IFNAME`'s address; else the address that reaches the store; else (file://) the
/// first non-loopback IPv4, else 127.0.0.1.
fn choose_bind_ip(cfg: &JobConfig, via_store: Option<IpAddr>) -> Result<IpAddr> {
    let master_v6 = via_store.is_some_and(|a| a.is_ipv6());
    if let Some(name) = &cfg.socket_ifname {
        return netif::interface_addr(name, master_v6);
    }
    if let Some(ip) = via_store {
        return Ok(ip);
    }
    if let Some((host, port)) = &cfg.master {
        if let Some(sa) = (host.as_str(), *port).to_socket_addrs().ok().and_then(|mut a| a.next()) {
            if let Ok(ip) = netif::route_to(sa) {
                return Ok(ip);
            }
        }
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    Ok(netif::first_non_loopback_ipv4().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

/// Convenience: resolve from the process environment and rendezvous.
pub fn rendezvous_from_env(opts: &InitOptions) -> Result<Rendezvous> {
    rendezvous(&resolve(opts, &config::process_env)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(st: &Arc<MemStore>, key: &'static str, subsets: Vec<(usize, Vec<usize>)>, part: usize) -> Vec<Vec<Vec<u8>>> {
        let hs: Vec<_> = subsets
            .into_iter()
            .map(|(rank, ranks)| {
                let st = st.clone();
                std::thread::spawn(move || {
                    let v = format!("{key}:{rank}:{}", "x".repeat(rank)).into_bytes();
                    let d = Instant::now() + Duration::from_secs(10);
                    exchange_parts(st.as_ref(), key, rank, &ranks, &v, d, part).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn val(key: &str, r: usize) -> Vec<u8> {
        format!("{key}:{r}:{}", "x".repeat(r)).into_bytes()
    }

    #[test]
    fn exchange_among_subsets_of_one_key_do_not_collide() {
        let st = Arc::new(MemStore::new());
        // Two hosts' ranks exchange under the same key at the same time; one lists its ranks
        // out of order.
        let a = vec![0, 1, 2];
        let b = vec![5, 3, 4];
        let jobs: Vec<_> = a.iter().map(|&r| (r, a.clone())).chain(b.iter().map(|&r| (r, b.clone()))).collect();
        let got = run(&st, "k", jobs, EXCHANGE_PART);
        for g in &got[..3] {
            assert_eq!(*g, a.iter().map(|&r| val("k", r)).collect::<Vec<_>>());
        }
        for g in &got[3..] {
            assert_eq!(*g, b.iter().map(|&r| val("k", r)).collect::<Vec<_>>());
        }
        assert!(st.try_get(&format!("k/{}/all", crate::auth::hex(&subset_tag(&[0, 1, 2])))).unwrap().is_some());
        assert_ne!(subset_tag(&[0, 1, 2]), subset_tag(&[3, 4, 5]));
    }

    #[test]
    fn exchange_among_peers_lists_that_leave_out_self_or_differ() {
        // Init's per-host exchanges: every rank lists its peers, not itself.
        let st = Arc::new(MemStore::new());
        let peers = |r: usize| (0..3).filter(|&q| q != r).collect::<Vec<_>>();
        let got = run(&st, "h", (0..3).map(|r| (r, peers(r))).collect(), EXCHANGE_PART);
        for (r, g) in got.iter().enumerate() {
            assert_eq!(*g, peers(r).iter().map(|&q| val("h", q)).collect::<Vec<_>>());
        }
        assert!(st.try_get(&format!("h/{}/all", crate::auth::hex(&subset_tag(&[0, 1, 2])))).unwrap().is_some());
        // Lists that are not symmetric (rank 1 does not list rank 2): rank 1 reads directly.
        let st = Arc::new(MemStore::new());
        let got = run(&st, "a", vec![(0, vec![1, 2]), (1, vec![0]), (2, vec![0, 1])], EXCHANGE_PART);
        assert_eq!(got[0], vec![val("a", 1), val("a", 2)]);
        assert_eq!(got[1], vec![val("a", 0)]);
        assert_eq!(got[2], vec![val("a", 0), val("a", 1)]);
    }

    #[test]
    fn gathered_values_split_into_parts() {
        let st = Arc::new(MemStore::new());
        let all: Vec<usize> = (0..5).collect();
        let got = run(&st, "p", all.iter().map(|&r| (r, all.clone())).collect(), 7);
        let want: Vec<Vec<u8>> = all.iter().map(|&r| val("p", r)).collect();
        for g in got {
            assert_eq!(g, want);
        }
        assert!(st.try_get(&format!("p/{}/all/3", crate::auth::hex(&subset_tag(&all)))).unwrap().is_some());
    }

    #[test]
    fn a_waiting_rank_names_the_missing_ones_and_a_silent_leader() {
        let st = MemStore::new();
        let soon = || Instant::now() + Duration::from_millis(50);
        let e = exchange(&st, "j", 1, 4, b"x", soon()).unwrap_err();
        assert_eq!(e.status, Status::Timeout);
        assert!(e.msg.contains("ranks 0, 2, 3 never joined"), "{e}");
        // Everyone published but the leader never gathered.
        let mut v = subset_tag(&[0, 1]).to_vec();
        v.push(b'a');
        st.set("q/0", &v).unwrap();
        let e = exchange(&st, "q", 1, 2, b"b", soon()).unwrap_err();
        assert!(e.msg.contains("rank 0, which gathers"), "{e}");
    }
}
