//! Collective algorithms, written against the small `Link` trait so they never see a transport.
//!
//! A `Link` is one collective call's view of its communicator: the caller's rank, the group size,
//! and tagged point-to-point operations private to this call. Messages between one pair of ranks
//! within one collective are matched in the order they were posted (FIFO per pair).

use crate::error::Result;

/// One collective call's private point-to-point channel to the other members.
pub trait Link {
    /// This rank, in `[0, size)`.
    fn rank(&self) -> usize;
    /// Number of members.
    fn size(&self) -> usize;
    /// Starts sending `buf` to `peer`. The buffer stays borrowed until the op is waited or dropped.
    fn send<'a>(&'a self, peer: usize, buf: &'a [u8]) -> Result<Pending<'a>>;
    /// Starts receiving into `buf` from `peer`. A message longer than `buf` fails the op
    /// (truncation) without writing past `buf`; `wait` returns the number of bytes received.
    fn recv<'a>(&'a self, peer: usize, buf: &'a mut [u8]) -> Result<Pending<'a>>;
}

/// Something a `Link` implementation returns for a started operation.
pub trait PendingOp {
    /// Blocks until the op completes (honouring the call's deadline and abort); returns bytes moved.
    fn wait(&mut self) -> Result<usize>;
}

/// A started send or receive. Dropping it without waiting cancels it (and blocks until the
/// transport no longer touches the buffer), so an early `?` return is always memory-safe.
pub struct Pending<'a>(pub Box<dyn PendingOp + 'a>);

impl<'a> Pending<'a> {
    pub fn new(op: impl PendingOp + 'a) -> Pending<'a> {
        Pending(Box::new(op))
    }

    /// Waits and returns the number of bytes moved.
    pub fn wait(mut self) -> Result<usize> {
        self.0.wait()
    }
}
