//! Point-to-point on device memory: ncclSend/ncclRecv plus a 16-byte envelope (tag, bytes) that
//! the sender posts over the comm's CPU transport. NCCL has no tags and needs equal counts on
//! both sides; the envelope lets the receiver report the sender's tag and size
//! (`dc_recv_info`) and turn a receive that would not match (other tag, other size) into a
//! clear error instead of a hang or corrupted data.
//!
//! Device messages between two ranks are matched in the order they were posted (NCCL's rule):
//! a receive with a specific tag that meets a message with another tag fails with
//! DC_ERR_UNAVAILABLE (tags cannot reorder device messages), a size mismatch with
//! DC_ERR_INVALID_ARGUMENT; both abort the comm's NCCL communicator, whose state no longer
//! agrees between the two ranks. DC_ANY_SOURCE is DC_ERR_UNAVAILABLE on device memory.

use super::device::{DevOp, DeviceComm, P2pSlot};
use crate::comm::{Comm, P2pOp};
use crate::completion::Done;
use crate::error::{Error, Result, Status};
use std::sync::Mutex;
use std::time::Instant;

/// Size of the envelope: tag (u32), reserved (u32), bytes (u64), little endian.
pub const ENVELOPE: usize = 16;

/// One device send or receive and its envelope.
pub struct DeviceP2p {
    /// Filled when the comm launches its posted sends and receives (`DeviceComm::flush`).
    slot: P2pSlot,
    env: Option<P2pOp>,
    env_buf: Option<Box<[u8; ENVELOPE]>>,
    /// Comm rank of the peer.
    peer: usize,
    /// Receives: the tag asked for (None: any) and the bytes posted.
    want: Option<(Option<u32>, usize)>,
    /// Sends: what the envelope says.
    sent: (u32, usize),
    result: Mutex<Option<Result<Done>>>,
}

fn envelope(tag: u32, bytes: usize) -> Box<[u8; ENVELOPE]> {
    let mut b = Box::new([0u8; ENVELOPE]);
    b[0..4].copy_from_slice(&tag.to_le_bytes());
    b[8..16].copy_from_slice(&(bytes as u64).to_le_bytes());
    b
}

fn read_envelope(b: &[u8; ENVELOPE]) -> (u32, usize) {
    (u32::from_le_bytes(b[0..4].try_into().unwrap()), u64::from_le_bytes(b[8..16].try_into().unwrap()) as usize)
}

impl DeviceP2p {
    /// Queues the device send, then posts its envelope.
    pub fn send(comm: &Comm, buf: crate::buffer::ConstBuf, dst: usize, tag: u32) -> Result<DeviceP2p> {
        let dev = comm.device().expect("device comm");
        let slot = dev.send(buf, dst)?;
        let env_buf = envelope(tag, buf.len());
        let env = match comm.post_envelope_send(dst, crate::buffer::ConstBuf::from_slice(&env_buf[..])) {
            Ok(e) => e,
            Err(e) => {
                // The NCCL send is queued but the peer will never learn of it.
                dev.abort(&e.msg);
                return Err(e);
            }
        };
        Ok(DeviceP2p { slot, env: Some(env), env_buf: Some(env_buf), peer: dst, want: None, sent: (tag, buf.len()), result: Mutex::new(None) })
    }

    /// Posts the envelope receive, then queues the device receive of exactly `buf.len()` bytes.
    pub fn recv(comm: &Comm, buf: crate::buffer::MutBuf, src: usize, tag: Option<u32>) -> Result<DeviceP2p> {
        let dev = comm.device().expect("device comm");
        let mut env_buf = Box::new([0u8; ENVELOPE]);
        let slot = dev.recv(buf, src)?;
        let env = match comm.post_envelope_recv(src, crate::buffer::MutBuf::from_slice(&mut env_buf[..])) {
            Ok(e) => e,
            Err(e) => {
                dev.abort(&e.msg);
                return Err(e);
            }
        };
        Ok(DeviceP2p { slot, env: Some(env), env_buf: Some(env_buf), peer: src, want: Some((tag, buf.len())), sent: (0, 0), result: Mutex::new(None) })
    }

    /// Whether this is a receive (for `dc_request_recv_info`).
    pub fn is_recv(&self) -> bool {
        self.want.is_some()
    }

    /// The launched operation (launching what the comm has posted if need be).
    fn op(&self, dev: &DeviceComm) -> Result<&DevOp> {
        if self.slot.get().is_none() {
            dev.flush();
        }
        match self.slot.get() {
            Some(Ok(op)) => Ok(op),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::new(Status::Internal, "a device send or receive was never launched")),
        }
    }

    fn stored(&self) -> Option<Result<Done>> {
        self.result.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn store(&self, r: Result<Done>) -> Result<Done> {
        self.result.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(r).clone()
    }

    /// Checks an arrived envelope against the receive; a mismatch aborts the NCCL communicator.
    fn check_envelope(&self, comm: &Comm) -> Result<Done> {
        let (tag, bytes) = read_envelope(self.env_buf.as_ref().expect("envelope buffer"));
        let Some((want_tag, posted)) = self.want else {
            return Ok(Done { bytes: self.sent.1, source: 0, tag: self.sent.0 as u64 });
        };
        let peer = self.peer;
        let err = if want_tag.is_some_and(|t| t != tag) {
            Some(Error::new(
                Status::Unavailable,
                format!(
                    "receive from rank {peer} with tag {} met a message with tag {tag}: on CUDA device memory messages between two ranks are received in the order sent, tags cannot reorder them",
                    want_tag.unwrap()
                ),
            ))
        } else if bytes != posted {
            Some(Error::new(
                Status::InvalidArgument,
                format!("rank {peer} sent {bytes} bytes but the receive is for {posted}: on CUDA device memory (NCCL) the receive count must equal the send count"),
            ))
        } else {
            None
        };
        if let Some(e) = err {
            if let Some(d) = comm.device() {
                d.abort(&e.msg);
            }
            return Err(e);
        }
        Ok(Done { bytes, source: comm.members()[peer], tag: tag as u64 })
    }

    /// Waits for the envelope and the device operation.
    pub fn wait(&self, comm: &Comm, deadline: Instant, what: &dyn Fn() -> String) -> Result<Done> {
        if let Some(r) = self.stored() {
            return r;
        }
        let env = self.env.as_ref().expect("envelope op");
        let dev = comm.device().expect("device comm");
        let r = (|| {
            let op = self.op(dev)?;
            if self.want.is_some() {
                // The envelope comes first: a mismatch fails at once instead of at the timeout.
                comm.wait_p2p(env, deadline, what)?;
            }
            let done = self.check_envelope_after_arrival(comm)?;
            dev.wait(op, deadline, comm.timeout_ms(), &|| comm.check_usable().err()).map_err(|e| e.context(what()))?;
            if self.want.is_none() {
                comm.wait_p2p(env, deadline, what)?;
            }
            Ok(done)
        })();
        self.store(r)
    }

    fn check_envelope_after_arrival(&self, comm: &Comm) -> Result<Done> {
        if self.want.is_some() {
            self.check_envelope(comm)
        } else {
            Ok(Done { bytes: self.sent.1, source: 0, tag: self.sent.0 as u64 })
        }
    }

    /// Never blocks: the envelope has arrived (receives) and the device operation is complete.
    pub fn is_done(&self, comm: &Comm) -> bool {
        if self.stored().is_some() {
            return true;
        }
        let env = self.env.as_ref().expect("envelope op");
        let dev = comm.device().expect("device comm");
        let op = match self.op(dev) {
            Ok(op) => op,
            Err(e) => {
                let _ = self.store(Err(e));
                return true;
            }
        };
        if !Comm::p2p_done(env) {
            return false;
        }
        if self.want.is_some() {
            if let Err(e) = self.check_envelope(comm) {
                let _ = self.store(Err(e));
                return true;
            }
        }
        match dev.result(op) {
            None => false,
            Some(Err(e)) => {
                let _ = self.store(Err(e));
                true
            }
            Some(Ok(())) => {
                let d = self.check_envelope_after_arrival(comm);
                let _ = self.store(d);
                true
            }
        }
    }

    /// The result once finished.
    pub fn result(&self, comm: &Comm) -> Option<Result<Done>> {
        if self.is_done(comm) {
            self.stored()
        } else {
            None
        }
    }

    /// Withdraws the envelope operation if it is still pending.
    pub fn cancel(&self, comm: &Comm, e: Error) {
        if let Some(env) = &self.env {
            comm.cancel_p2p(env, || e);
        }
    }
}

impl Drop for DeviceP2p {
    fn drop(&mut self) {
        // The transport may still read or write the envelope of an unfinished operation: keep
        // its 16 bytes alive rather than free memory in use.
        if let Some(env) = &self.env {
            if !Comm::p2p_done(env) {
                std::mem::forget(self.env_buf.take());
            }
        }
    }
}
