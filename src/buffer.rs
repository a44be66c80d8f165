//! Caller memory that the C surface has validated (non-null where needed, byte length computed
//! without overflow). The engine only ever builds slices from these.

/// Read-only caller memory.
#[derive(Debug, Clone, Copy)]
pub struct ConstBuf {
    ptr: *const u8,
    len: usize,
}

/// Writable caller memory.
#[derive(Debug, Clone, Copy)]
pub struct MutBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the caller promises (API contract) that the memory stays valid and is not touched by
// it until the operation completes; the engine moves these to its worker threads.
unsafe impl Send for ConstBuf {}
unsafe impl Sync for ConstBuf {}
unsafe impl Send for MutBuf {}
unsafe impl Sync for MutBuf {}

impl ConstBuf {
    /// # Safety
    /// `ptr` must be valid for reads of `len` bytes (or `len == 0`) until the op completes.
    pub unsafe fn new(ptr: *const u8, len: usize) -> ConstBuf {
        let ptr = if len == 0 || ptr.is_null() { std::ptr::NonNull::dangling().as_ptr() } else { ptr };
        ConstBuf { ptr, len }
    }

    pub fn from_slice(s: &[u8]) -> ConstBuf {
        ConstBuf { ptr: s.as_ptr(), len: s.len() }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// Its first `n` bytes (all of it if shorter).
    pub fn prefix(&self, n: usize) -> ConstBuf {
        ConstBuf { ptr: self.ptr, len: self.len.min(n) }
    }

    /// # Safety
    /// No live `&mut` to the same memory may exist while the slice is used.
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        std::slice::from_raw_parts(self.ptr, self.len)
    }
}

impl MutBuf {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes (or `len == 0`) until the op completes.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> MutBuf {
        let ptr = if len == 0 || ptr.is_null() { std::ptr::NonNull::dangling().as_ptr() } else { ptr };
        MutBuf { ptr, len }
    }

    pub fn from_slice(s: &mut [u8]) -> MutBuf {
        MutBuf { ptr: s.as_mut_ptr(), len: s.len() }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// # Safety
    /// No other reference to the same memory may be live while the slice is used.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        std::slice::from_raw_parts_mut(self.ptr, self.len)
    }
}

/// Whether two byte ranges overlap.
pub fn overlaps(a: usize, alen: usize, b: usize, blen: usize) -> bool {
    alen > 0 && blen > 0 && a < b.saturating_add(blen) && b < a.saturating_add(alen)
}
