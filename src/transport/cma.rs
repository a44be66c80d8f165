//! Single-copy transfers between processes of one host (cross-memory attach,
//! `process_vm_readv`): the receiver copies a message straight out of the sender's memory.
//! Whether a peer allows it (same kernel, same user, no ptrace restriction) is probed once at
//! init by reading a known pattern from it.

use std::io;

/// A pattern every process exposes for the probe.
static PROBE: [u8; 16] = *b"distcomm-cma-ok!";

/// Messages at least this large go single-copy between ranks of one host (`DC_CMA_MIN` bytes;
/// 0 turns single-copy off).
pub fn threshold() -> usize {
    static T: once_cell::sync::Lazy<usize> =
        once_cell::sync::Lazy::new(|| crate::params::get().cma_min.unwrap_or(256 * 1024));
    *T
}

/// What a rank publishes so peers can probe it: "pid:probe-address".
pub fn advertisement() -> String {
    format!("{}:{:x}", std::process::id(), PROBE.as_ptr() as usize)
}

/// Reads `len` bytes at `remote` in process `pid` into `dst`.
///
/// # Safety
/// `dst` must be valid for `len` writable bytes.
pub unsafe fn read(pid: i32, remote: u64, dst: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let local = libc::iovec { iov_base: dst.add(done) as *mut libc::c_void, iov_len: len - done };
        let far = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        let n = libc::process_vm_readv(pid, &local, 1, &far, 1, 0);
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "process_vm_readv read nothing"));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether the process behind `advertisement` lets us read its memory; its pid if so.
pub fn probe(advertisement: &str) -> Option<i32> {
    if threshold() == 0 {
        return None;
    }
    let (pid, addr) = advertisement.split_once(':')?;
    let pid: i32 = pid.parse().ok()?;
    let addr = u64::from_str_radix(addr, 16).ok()?;
    let mut got = [0u8; 16];
    // SAFETY: reading 16 bytes into a local array.
    unsafe { read(pid, addr, got.as_mut_ptr(), got.len()) }.ok()?;
    (got == PROBE).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_itself_and_refuses_nonsense() {
        assert_eq!(probe(&advertisement()), Some(std::process::id() as i32));
        assert_eq!(probe("1:0"), None);
        assert_eq!(probe("garbage"), None);
    }
}
