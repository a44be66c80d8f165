//! Per-thread eventfds that a completion writes to, so a thread sleeping in `poll` on sockets
//! also wakes when its operation is finished by someone else (the progress thread, an abort).
//! The descriptors are pooled and never closed: a completion that raced with the waiter leaving
//! can at worst cause one spurious wake-up of the fd's next user, never a write into a reused
//! descriptor number.

use std::os::fd::RawFd;
use std::sync::Mutex;

static POOL: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());

struct ThreadWaker(RawFd);

impl ThreadWaker {
    fn take() -> ThreadWaker {
        let pooled = POOL.lock().unwrap_or_else(|p| p.into_inner()).pop();
        // SAFETY: eventfd returns a new descriptor or -1.
        ThreadWaker(pooled.unwrap_or_else(|| unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) }))
    }
}

impl Drop for ThreadWaker {
    fn drop(&mut self) {
        if self.0 >= 0 {
            POOL.lock().unwrap_or_else(|p| p.into_inner()).push(self.0);
        }
    }
}

thread_local! {
    static MINE: ThreadWaker = ThreadWaker::take();
}

/// This thread's wake-up descriptor (-1 if none could be made).
pub fn thread_fd() -> RawFd {
    MINE.try_with(|w| w.0).unwrap_or(-1)
}

/// Wakes whoever polls `fd`.
pub fn wake(fd: RawFd) {
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a u64 to a pooled eventfd that is never closed.
        unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
    }
}

/// Consumes pending wake-ups of `fd`.
pub fn drain(fd: RawFd) {
    if fd >= 0 {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a u64 from a non-blocking eventfd.
        unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
}
