//! What one `dc_init` creates: the transport, store and address book that the world comm and
//! its subgroups share, and the policy for which transports collectives may use.

use crate::transport::socket::SocketTransport;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one `dc_init` created: the transport shared by the world comm and its subgroups.
pub struct World {
    pub transport: Arc<SocketTransport>,
    /// The job's rendezvous store (already prefixed for this job and group), for later
    /// out-of-band exchanges such as NCCL unique ids.
    pub store: Arc<dyn crate::rendezvous::Store>,
    /// Every rank's data address, by world rank.
    pub addrs: Vec<std::net::SocketAddr>,
    /// By world rank: the index of its host (ranks with the same hostname share one), the
    /// same on every rank, for hierarchical collectives.
    pub hosts: Vec<u32>,
    /// Kept alive for the job's lifetime (e.g. the store server rank 0 hosts).
    pub keepalive: Mutex<Vec<Box<dyn std::any::Any + Send>>>,
    pub shutdown_wait: Duration,
    /// Which transports collectives may use.
    pub policy: TransportPolicy,
    /// Arenas of destroyed comms, for new comms of the same members.
    pub(crate) arena_pool: super::arena_pool::ArenaPool,
    /// Whether comms get an NCCL communicator for device buffers, and on which device.
    #[cfg(feature = "nccl")]
    pub gpu: crate::nccl::GpuPlan,
}

/// `auto`: shared memory where every member of a comm can map the same segment, else sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportPolicy {
    Auto,
    Socket,
    Shm,
}

impl World {
    /// Ends this process's part in the job now: goodbye to the peers, the progress thread
    /// stopped, what is kept alive for the job (the store served here) released. Dropping the
    /// last comm does it otherwise; a second call does nothing.
    pub fn close(&self) {
        self.transport.shutdown(Instant::now() + self.shutdown_wait);
        super::lock(&self.keepalive).clear();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.close();
    }
}
