//! A table of objects behind integer handles (BASE + slot), for windows, files and sessions: a
//! freed or never-made handle is found missing, never dereferenced.

use std::sync::{Arc, Mutex};

pub struct Slots<T> {
    base: usize,
    v: Mutex<Vec<Option<Arc<T>>>>,
}

impl<T> Slots<T> {
    pub const fn new(base: usize) -> Slots<T> {
        Slots { base, v: Mutex::new(Vec::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<Arc<T>>>> {
        self.v.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handle for the object that `make` builds from its handle.
    pub fn add(&self, make: impl FnOnce(usize) -> T) -> (usize, Arc<T>) {
        let mut v = self.lock();
        let slot = v.iter().position(|s| s.is_none()).unwrap_or_else(|| {
            v.push(None);
            v.len() - 1
        });
        let h = self.base + slot;
        let o = Arc::new(make(h));
        v[slot] = Some(o.clone());
        (h, o)
    }

    pub fn get(&self, h: usize) -> Option<Arc<T>> {
        let i = h.checked_sub(self.base)?;
        self.lock().get(i).cloned().flatten()
    }

    pub fn remove(&self, h: usize) -> Option<Arc<T>> {
        let i = h.checked_sub(self.base)?;
        self.lock().get_mut(i).and_then(|s| s.take())
    }

    /// Whether `h` is in this table's handle range (live or not).
    pub fn owns(&self, h: usize) -> bool {
        h >= self.base && h - self.base < 0x0100_0000
    }
}
