//! Rendezvous: init-method parsing, launcher environment detection, key-value stores, job token.

use crate::error::Result;
use std::time::Instant;

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
