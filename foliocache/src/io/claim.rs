//! Byte-range open-file-description locks (`F_OFD_SETLK`), for the machine-wide claims a
//! shared cache's owner makes on the files it serves (`owner::claims`).
//!
//! An OFD lock belongs to the open file description, not to the process: the owner's one
//! descriptor of the claims file holds all its claims, and the kernel drops them all when the
//! owner dies, whatever it was doing. Two descriptions' locks on the same byte conflict, so
//! one byte is one claim.
//!
//! `unsafe` here is the raw `fcntl` with a `struct flock` this module owns for the call.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Takes the write lock on byte `offset` of the file of `fd` without waiting: `Ok(true)`
/// taken (or held already through this description), `Ok(false)` another description holds
/// it.
pub(crate) fn try_lock_byte(fd: BorrowedFd<'_>, offset: u64) -> io::Result<bool> {
    match set(fd, offset, libc::F_WRLCK as libc::c_short) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the lock on byte `offset` up.
pub(crate) fn unlock_byte(fd: BorrowedFd<'_>, offset: u64) -> io::Result<()> {
    set(fd, offset, libc::F_UNLCK as libc::c_short)
}

fn set(fd: BorrowedFd<'_>, offset: u64, kind: libc::c_short) -> io::Result<()> {
    let start = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "lock offset too large"))?;
    // SAFETY: all-zero is a valid `struct flock` (l_pid must be 0 for OFD locks).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = start;
    lock.l_len = 1;
    // SAFETY: F_OFD_SETLK with a pointer to the local, initialised `struct flock`, on a
    // descriptor the caller borrows for the call.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut lock) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Two descriptions of one file: a byte one holds, the other cannot take until given up;
    /// the holder takes it again freely.
    #[test]
    fn one_byte_one_claim() {
        let path = std::env::temp_dir().join(format!("fc-claim-{}", std::process::id()));
        let a = std::fs::File::create(&path).unwrap();
        let b = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert!(try_lock_byte(a.as_fd(), 1 << 33).unwrap());
        assert!(try_lock_byte(a.as_fd(), 1 << 33).unwrap());
        assert!(!try_lock_byte(b.as_fd(), 1 << 33).unwrap());
        assert!(try_lock_byte(b.as_fd(), 7).unwrap());
        unlock_byte(a.as_fd(), 1 << 33).unwrap();
        assert!(try_lock_byte(b.as_fd(), 1 << 33).unwrap());
        let _ = std::fs::remove_file(&path);
    }
}
