//! `dc_init`: resolve the configuration, rendezvous, connect the data mesh, build the world comm.

use crate::comm::{Comm, TransportPolicy, World};
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::rendezvous::config::{resolve, InitOptions};
use crate::rendezvous::{exchange, exchange_among, rendezvous, Store};
use crate::transport::cma;
use crate::transport::handshake::token_digest;
use crate::transport::ring::{self, RingSegment};
use crate::transport::shm::show_bytes;
use crate::transport::socket::{Listener, MeshConfig, SocketTransport};
use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        return t.as_nanos() as u64 ^ ((std::process::id() as u64) << 32);
    }
    u64::from_le_bytes(b)
}

/// Forms the job described by `opts` and the environment and returns its world communicator.
pub fn init(opts: &InitOptions) -> Result<Arc<Comm>> {
    let cfg = resolve(opts, &|k| std::env::var(k).ok())?;
    let policy = match cfg.backend.as_str() {
        "auto" => TransportPolicy::Auto,
        "socket" => TransportPolicy::Socket,
        "shm" => TransportPolicy::Shm,
        // Device buffers through NCCL; host buffers over the CPU transports (auto policy).
        "nccl" => {
            #[cfg(not(feature = "nccl"))]
            return Err(Error::new(Status::Unavailable, "backend \"nccl\": this build has no NCCL support (built without the cargo feature `nccl`)"));
            // Fail before the rendezvous: a machine without CUDA or NCCL says so at once.
            #[cfg(feature = "nccl")]
            crate::nccl::require()?;
            #[cfg(feature = "nccl")]
            TransportPolicy::Auto
        }
        other => return Err(Error::new(Status::InvalidArgument, format!("unknown backend \"{other}\" (expected auto, shm, socket or nccl)"))),
    };
    #[cfg(feature = "nccl")]
    let gpu_mode = match cfg.backend.as_str() {
        "nccl" => crate::nccl::GpuMode::Required,
        // DC_NCCL=0 keeps "auto" off the GPU (no NCCL communicators, no device memory).
        "auto" if !crate::params::get().nccl_off => crate::nccl::GpuMode::IfAvailable,
        _ => crate::nccl::GpuMode::Off,
    };
    let rdv = rendezvous(&cfg)?;
    let (rank, size) = (rdv.rank, rdv.world_size);
    let deadline = Instant::now() + rdv.timeout;
    let timeout_ms = rdv.timeout.as_millis() as i64;

    // A job id spread by rank 0 keeps data connections of different jobs (same token) apart.
    // Rank 0 publishes the job id and whether connections between hosts are encrypted: every
    // rank must say the same (an encrypted end cannot talk to a clear one).
    let encrypt = cfg.encrypt;
    let job_id = if rank == 0 {
        let id = random_u64();
        let mut v = id.to_le_bytes().to_vec();
        v.push(u8::from(encrypt));
        rdv.store.set("job_id", &v)?;
        id
    } else {
        let v = rdv.store.get("job_id", deadline).map_err(|e| e.context("waiting for rank 0 to publish the job id"))?;
        let (Some(id), Some(&theirs)) = (v.get(..8), v.get(8)) else {
            return Err(Error::new(Status::Rendezvous, "malformed job id in the store"));
        };
        if (theirs != 0) != encrypt {
            let say = |on: bool| if on { "on" } else { "off" };
            return Err(Error::new(
                Status::InvalidUsage,
                format!("encryption (DC_ENCRYPT or opts->encrypt) is {} on rank 0 and {} on rank {rank}: every rank of a job must set it alike", say(theirs != 0), say(encrypt)),
            ));
        }
        u64::from_le_bytes(id.try_into().expect("8 bytes"))
    };

    crate::transport::socket::raise_fd_limit();
    let listener = Listener::bind(rdv.bind_ip, size)?;
    let my_addr = listener.local_addr()?;
    dc_log!(Level::Info, Some(rank), "data listener on {my_addr}");
    // Each rank publishes "address|host|cma-advertisement"; peers on the same host that let us
    // read their memory get single-copy messages.
    let host = crate::log::hostname();
    let mine = format!("{my_addr}|{host}|{}", cma::advertisement());
    let all = exchange(&*rdv.store, "data_addr", rank, size, mine.as_bytes(), deadline)?;
    let mut addrs: Vec<SocketAddr> = Vec::with_capacity(size);
    let mut cma_peers = Vec::with_capacity(size);
    let mut host_pids = Vec::with_capacity(size);
    let mut hosts: Vec<u32> = Vec::with_capacity(size);
    let mut host_names: Vec<&str> = Vec::new();
    for (r, v) in all.iter().enumerate() {
        let text = std::str::from_utf8(v).unwrap_or("");
        let mut parts = text.splitn(3, '|');
        let addr = parts.next().and_then(|a| a.parse().ok());
        let addr = addr.ok_or_else(|| Error::new(Status::Rendezvous, format!("rank {r} published a malformed address")))?;
        addrs.push(addr);
        let their_host = parts.next().unwrap_or("");
        let same_host = their_host == host.as_str();
        // Hosts numbered in order of first appearance: the same numbers on every rank.
        let h = host_names.iter().position(|n| *n == their_host).unwrap_or_else(|| {
            host_names.push(their_host);
            host_names.len() - 1
        });
        hosts.push(h as u32);
        let adv = parts.next();
        host_pids.push(if same_host { adv.and_then(|a| a.split(':').next()?.parse().ok()) } else { None });
        let allowed = same_host && r != rank && policy != TransportPolicy::Socket;
        cma_peers.push(if allowed { adv.and_then(cma::probe) } else { None });
    }
    let mesh = MeshConfig { rank: rank as u32, size: size as u32, token_digest: token_digest(&rdv.token), job_id, deadline, cma_peers, host_pids, peer_timeout: crate::params::get().peer_timeout(), encrypt };
    let transport = SocketTransport::start(listener, &addrs, &mesh, rdv.timeout)?;
    let local: Vec<usize> = (0..size).filter(|&r| mesh.cma_peers[r].is_some()).collect();
    if !local.is_empty() {
        setup_rings(&transport, &*rdv.store, rank, &local, deadline)?;
    }
    for (r, a) in addrs.iter().enumerate() {
        if r != rank {
            let how = if mesh.cma_peers[r].is_some() { "socket, single-copy above the threshold" } else { "socket" };
            dc_log!(Level::Info, Some(rank), "rank {r} at {a}: transport {how}");
        }
    }
    let keepalive: Vec<Box<dyn std::any::Any + Send>> = match rdv.server {
        Some(s) => vec![Box::new(s)],
        None => Vec::new(),
    };
    let shutdown_wait = Duration::from_millis(timeout_ms.clamp(0, 30_000) as u64);
    let world = Arc::new(World {
        transport,
        store: rdv.store.clone(),
        addrs,
        hosts,
        keepalive: Mutex::new(keepalive),
        shutdown_wait,
        policy,
        arena_pool: Default::default(),
        #[cfg(feature = "nccl")]
        gpu: crate::nccl::GpuPlan { mode: gpu_mode, local_rank: rdv.local_rank },
    });
    let comm = Comm::new_world(world, job_id, timeout_ms)?;
    dc_log!(Level::Info, Some(rank), "collectives use {}", comm.backend().to_string_lossy());
    Ok(comm)
}

/// Shared-memory rings for point-to-point messages with the ranks of our host (`local`: the
/// world ranks whose memory we may read): we create our segment of incoming rings and publish
/// it, map each peer's and send to it through our ring there from now on, and unlink ours once
/// every peer has had its chance to map it. A peer whose segment we cannot map (another mount
/// namespace, no /dev/shm) keeps the socket; so does one that cannot map ours, towards us.
///
/// The rings' size comes from the number of ranks on the host (`ring::ring_bytes_for`: every
/// rank of the host computes the same), so that all segments together stay under
/// `ring::RING_CAP`; with more ranks than that allows, no rings at all (every rank of the host
/// decides so alike, and nobody waits for announcements). Our segment is reserved before we
/// announce it: a /dev/shm without room for it is a WARN line and sockets for our peers'
/// messages to us.
fn setup_rings(transport: &SocketTransport, store: &dyn Store, rank: usize, local: &[usize], deadline: Instant) -> Result<()> {
    let on_host = local.len() + 1;
    let Some(ring_bytes) = ring::ring_bytes_for(on_host) else {
        dc_log!(
            Level::Info,
            Some(rank),
            "no point-to-point rings: {on_host} ranks on this host would need more than {} of /dev/shm even with {} rings; same-host messages go over sockets (single-copy from {} bytes)",
            show_bytes(ring::RING_CAP as u64),
            ring::MIN_RING_BYTES,
            cma::threshold()
        );
        return Ok(());
    };
    let nonce = random_u64();
    let path = ring::segment_path(std::process::id(), nonce);
    let mine = match RingSegment::create(&path, local.len(), ring_bytes, nonce) {
        Ok(seg) => {
            dc_log!(Level::Info, Some(rank), "point-to-point rings: {} of {ring_bytes} bytes, {} for the {on_host} ranks of this host", local.len(), show_bytes(ring::host_bytes(on_host, ring_bytes) as u64));
            let mut index = vec![None; transport.size() as usize];
            for (i, &r) in local.iter().enumerate() {
                index[r] = Some(i);
            }
            transport.attach_incoming_rings(seg, index);
            let ranks: Vec<String> = local.iter().map(|r| r.to_string()).collect();
            format!("{}:{nonce:x}:{ring_bytes}:{}", std::process::id(), ranks.join(","))
        }
        Err(e) => {
            dc_log!(Level::Warn, Some(rank), "no point-to-point rings for this rank: its same-host peers and it talk over sockets: {}", e.msg);
            "none".to_string()
        }
    };
    let announced = exchange_among(store, "p2p_rings", rank, local, mine.as_bytes(), deadline)?;
    let mut mapped = Vec::new();
    for (i, v) in announced.iter().enumerate() {
        match map_peer_ring(&String::from_utf8_lossy(v), rank) {
            Ok((seg, index)) => mapped.push((i, seg, index)),
            Err(why) => dc_log!(Level::Info, Some(rank), "messages to rank {} go over the socket: {why}", local[i]),
        }
    }
    // Everyone has mapped what it could (and says which): ours may go. A pair uses rings both
    // ways or not at all: the stream protocol expects a ring from the sender to the receiver
    // wherever there is one the other way (a peer whose segment could not be reserved, or
    // that could not map ours, keeps the socket in both directions).
    let list: Vec<String> = mapped.iter().map(|(i, ..)| local[*i].to_string()).collect();
    let list = if list.is_empty() { "none".to_string() } else { list.join(",") };
    let theirs = exchange_among(store, "p2p_mapped", rank, local, list.as_bytes(), deadline)?;
    let _ = std::fs::remove_file(&path);
    let me = rank.to_string();
    for (i, seg, index) in mapped {
        let r = local[i];
        if String::from_utf8_lossy(&theirs[i]).split(',').any(|x| x == me) {
            transport.attach_outgoing_ring(r as u32, seg, index);
        } else {
            dc_log!(Level::Info, Some(rank), "messages to rank {r} go over the socket: it has no ring from us (a pair uses rings both ways or neither)");
        }
    }
    Ok(())
}

/// Maps the segment a peer announced ("pid:nonce:ring_bytes:rank,rank,..."); our ring's index
/// in it. The file must have exactly the announced size before it is mapped (see
/// `shm::open_segment_file`), and its creator reserved all of it, so no access faults.
fn map_peer_ring(announced: &str, rank: usize) -> std::result::Result<(RingSegment, usize), String> {
    let mut parts = announced.splitn(4, ':');
    let (Some(pid), Some(nonce), Some(ring_bytes), Some(ranks)) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(format!("it has no ring segment ({announced})"));
    };
    let pid: u32 = pid.parse().map_err(|_| "malformed announcement")?;
    let nonce = u64::from_str_radix(nonce, 16).map_err(|_| "malformed announcement")?;
    let ring_bytes: usize = ring_bytes.parse().map_err(|_| "malformed announcement")?;
    let ranks: Vec<&str> = ranks.split(',').collect();
    let me = rank.to_string();
    let index = ranks.iter().position(|r| *r == me).ok_or("its segment has no ring for us")?;
    let seg = RingSegment::open(&ring::segment_path(pid, nonce), ranks.len(), ring_bytes, nonce).map_err(|e| e.msg)?;
    Ok((seg, index))
}
