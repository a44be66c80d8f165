//! An in-process store (a map and a condition variable), for ranks that are threads of one
//! process and for tests.

use crate::bail;
use crate::error::{Result, Status};
use crate::rendezvous::Store;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

#[derive(Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock().insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let start = Instant::now();
        let mut m = self.lock();
        loop {
            if let Some(v) = m.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                bail!(
                    Status::Timeout,
                    "store key {key:?} was not set within {:.1} s",
                    (now - start).as_secs_f64()
                );
            }
            m = self.changed.wait_timeout(m, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.lock().get(key).cloned())
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut m = self.lock();
        let cur = match m.get(key) {
            None => 0,
            Some(v) => match std::str::from_utf8(v).ok().and_then(|s| s.trim().parse::<i64>().ok()) {
                Some(n) => n,
                None => bail!(Status::InvalidArgument, "store value at {key:?} is not an integer"),
            },
        };
        let Some(n) = cur.checked_add(delta) else {
            bail!(Status::InvalidArgument, "store counter {key:?} overflows");
        };
        m.insert(key.to_string(), n.to_string().into_bytes());
        self.changed.notify_all();
        Ok(n)
    }
}
