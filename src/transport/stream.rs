//! Large messages between ranks of one host, streamed through the shared-memory ring once their
//! receive is posted. The sender announces the message with an `Rts`; a receiver that has the
//! receive posted answers `Cts` and the sender appends the message in `Chunk` frames of up to
//! `RingSegment::stream_chunk` bytes as the ring has room, which the receiver copies straight into the posted
//! buffer. Two copies, pipelined through a ring that stays in cache: here that beats one
//! `process_vm_readv` copy, in which the kernel pins the sender's pages one 4 KiB page at a
//! time. A receive posted after the `Rts` arrived still reads single-copy from the sender's
//! memory (see `socket`), so nothing has to wait for the sender to be scheduled.
//!
//! This module keeps the two ends' bookkeeping; `socket` moves the frames.

use super::matching::verdict;
use super::ops::{RecvOp, SendOp};
use crate::completion::Done;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

// Bytes of message per `Chunk` frame: the ring's `stream_chunk()`, a little under its
// `inline_max()`, so that four chunk records (frame header and length word included) fill the
// ring, where chunks of `inline_max()` left a quarter of it unused (three fit): 4 MiB
// point-to-point 0.89x the time at 4 ranks, 0.96x at 2 (256 KiB rings).

/// A message we stream to a peer (behind whatever else waits for room in its ring).
pub struct StreamOut {
    pub cookie: u64,
    /// The send; None once it was withdrawn, the rest of the message then being in `rest`.
    pub op: Option<Arc<SendOp>>,
    len: usize,
    /// Bytes appended so far.
    pub off: usize,
    /// Bytes per chunk (the ring's `stream_chunk`).
    chunk: usize,
    /// After a withdrawal: a copy of the message from byte `.0` on (the receiver still gets
    /// all of it; the caller's buffer is free).
    rest: Option<(usize, Vec<u8>)>,
}

impl StreamOut {
    /// Streams `op` in chunks of `chunk` bytes (the ring's `stream_chunk()`).
    pub fn new(cookie: u64, op: Arc<SendOp>, chunk: usize) -> StreamOut {
        StreamOut { cookie, len: op.buf.len(), op: Some(op), off: 0, chunk: chunk.max(1), rest: None }
    }

    pub fn done(&self) -> bool {
        self.off >= self.len
    }

    /// The next chunk to append.
    pub fn next_chunk(&self) -> &[u8] {
        let n = self.chunk.min(self.len - self.off);
        match (&self.rest, &self.op) {
            (Some((base, v)), _) => &v[self.off - base..self.off - base + n],
            // SAFETY: the send's buffer stays valid until the op completes, which happens only
            // when every chunk is appended or after `detach` copied the rest.
            (None, Some(op)) => unsafe { &op.buf.as_slice()[self.off..self.off + n] },
            (None, None) => &[],
        }
    }

    /// Stops using the caller's buffer (the send is withdrawn): copies the rest, returns the op.
    pub fn detach(&mut self) -> Option<Arc<SendOp>> {
        if self.rest.is_none() {
            let rest = self.next_all().to_vec();
            self.rest = Some((self.off, rest));
        }
        self.op.take()
    }

    fn next_all(&self) -> &[u8] {
        match &self.op {
            // SAFETY: as in `next_chunk`; the op is still ours.
            Some(op) => unsafe { &op.buf.as_slice()[self.off..] },
            None => &[],
        }
    }

    /// The send's result once the last chunk is appended.
    pub fn finished(&self) -> Result<Done> {
        Ok(Done { bytes: self.len, source: self.op.as_ref().map_or(0, |o| o.dst), tag: 0 })
    }
}

/// A message a peer streams to us, and the receive it fills.
pub struct StreamIn {
    pub cookie: u64,
    /// None once the receive was withdrawn or failed: the rest of the chunks are dropped.
    pub op: Option<Arc<RecvOp>>,
    len: usize,
    keep: usize,
    off: usize,
    result: Result<Done>,
    /// When the message was announced (the receiver times the ways from there, see
    /// `read_announced`).
    announced: Instant,
}

impl StreamIn {
    /// For `op`, matched to the `Rts` of a `len`-byte message from world rank `src`, announced
    /// at `announced`: the op is being filled from `src` until `finish` (so a canceller knows
    /// where to look).
    pub fn new(cookie: u64, op: Arc<RecvOp>, src: u32, tag: u64, check: u32, len: usize, announced: Instant) -> StreamIn {
        op.filling_from.store(src, Ordering::Release);
        let (keep, result) = verdict(&op, src, tag, check, len);
        StreamIn { cookie, op: Some(op), len, keep, off: 0, result, announced }
    }

    /// Copies one chunk into the receive (what fits; the rest of a too-long message is
    /// dropped); true when the message is complete (the caller then calls `finish`).
    pub fn take(&mut self, chunk: &[u8]) -> bool {
        if let Some(op) = &self.op {
            let n = chunk.len().min(self.keep.saturating_sub(self.off));
            // SAFETY: off + n <= keep <= the buffer's length; the op is ours until completed
            // (a canceller takes it from us under the lock our caller holds).
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), op.buf.as_ptr().add(self.off), n) };
        }
        self.off += chunk.len();
        self.off >= self.len
    }

    /// The message's length, and the time since its announce.
    pub fn timing(&self) -> (usize, Duration) {
        (self.len, self.announced.elapsed())
    }

    /// Completes the receive with the message's verdict (truncation, mismatch) or `err`.
    pub fn finish(&mut self, err: Option<Error>) {
        if let Some(op) = self.op.take() {
            op.filling_from.store(u32::MAX, Ordering::Release);
            let r = match err {
                Some(e) => Err(e),
                None => std::mem::replace(&mut self.result, Ok(Done::default())),
            };
            op.comp.complete(r);
        }
    }
}
