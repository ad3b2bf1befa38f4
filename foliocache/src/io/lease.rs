//! File leases for a shared cache's owner: the kernel's exact signal that another process is
//! opening a file for writing (`docs/SHARED.md`, "Writers outside the cache").
//!
//! A read lease (`fcntl(F_SETLEASE, F_RDLCK)`) is granted only while nobody has the file open
//! for writing, the owner included. Once granted, an `open` for writing or a `truncate` by
//! path anywhere *breaks* it: the kernel signals the holder and holds the opener until the
//! holder gives the lease up (or `/proc/sys/fs/lease-break-time`, 45 s by default, passes).
//!
//! The owner blocks the break signals in every thread ([`block_signals`], called before it
//! starts any) and one thread waits for them ([`wait`]): a break is then never a handler
//! running in some thread, and its `si_fd` names the lease. The signal is a real-time one so
//! that breaks queue and carry their descriptor; when the kernel cannot queue one more
//! (`RLIMIT_SIGPENDING`) it sends `SIGIO` instead, without a descriptor ([`Woken::Lost`]),
//! and the owner then asks every lease it holds ([`is_broken`]).
//!
//! `unsafe` here is the raw `fcntl`, `pthread_sigmask` and `sigwaitinfo` calls, each on a
//! descriptor or a signal set this module owns for the call.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// `fcntl` commands the libc crate does not name for this target (`<asm-generic/fcntl.h>`).
const F_SETSIG: libc::c_int = 10;
const F_SETLEASE: libc::c_int = 1024;
const F_GETLEASE: libc::c_int = 1025;

/// The signal a lease break comes as: the fourth real-time signal (glibc keeps the first two
/// for itself; the owner is our own program, so nothing else claims it).
pub(crate) fn signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

/// The set of the break signals: [`signal`] and `SIGIO`.
fn signal_set() -> libc::sigset_t {
    // SAFETY: `sigemptyset` initialises the set it is given; `sigaddset` adds valid signal
    // numbers to an initialised set.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal());
        libc::sigaddset(&mut set, libc::SIGIO);
        set
    }
}

/// Blocks the break signals in the calling thread (and so in every thread it starts later).
pub(crate) fn block_signals() -> io::Result<()> {
    let set = signal_set();
    // SAFETY: a valid, initialised set; the old mask is not asked for.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Takes a read lease on `fd` (a descriptor open for reading only), its breaks to come as
/// [`signal`]. `EAGAIN`: the file is open for writing somewhere (this process included);
/// `EACCES`: the caller neither owns the file nor has `CAP_LEASE`.
pub(crate) fn take_read(fd: BorrowedFd<'_>) -> io::Result<()> {
    fcntl(fd, F_SETSIG, signal())?;
    fcntl(fd, F_SETLEASE, libc::F_RDLCK)?;
    // `F_SETLEASE` makes the calling *thread's* pid the descriptor's owner, and the kernel
    // finds the process to signal through it: once that thread exits (a connection's thread,
    // when its client leaves) a break signals nobody, and the breaker waits out the whole
    // `lease-break-time`. The process's own pid (its main thread's) lasts as long as it.
    // A break between the two calls is aimed at the calling thread, alive now.
    fcntl(fd, libc::F_SETOWN, std::process::id() as libc::c_int)?;
    Ok(())
}

/// Gives the lease on `fd` up: an opener the kernel holds for it goes on.
pub(crate) fn release(fd: BorrowedFd<'_>) -> io::Result<()> {
    fcntl(fd, F_SETLEASE, libc::F_UNLCK).map(drop)
}

/// Whether the lease on `fd` is being broken (or is gone): `F_GETLEASE` then reads as the type
/// the breaker wants, not the read lease taken.
pub(crate) fn is_broken(fd: BorrowedFd<'_>) -> bool {
    !matches!(fcntl(fd, F_GETLEASE, 0), Ok(t) if t == libc::F_RDLCK)
}

fn fcntl(fd: BorrowedFd<'_>, cmd: libc::c_int, arg: libc::c_int) -> io::Result<libc::c_int> {
    // SAFETY: a lease or signal command on a descriptor the caller borrows for the call; the
    // argument is an integer, not a pointer.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, arg) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// What woke [`wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The lease on this descriptor is being broken.
    Broken(RawFd),
    /// A break whose descriptor the kernel could not say (`SIGIO`): ask every lease.
    Lost,
}

/// Waits for the next break signal. The caller's thread must have them blocked
/// ([`block_signals`]).
pub(crate) fn wait() -> io::Result<Woken> {
    let set = signal_set();
    loop {
        // SAFETY: `info` is written by the kernel on success; the set is initialised.
        let (rc, info) = unsafe {
            let mut info = std::mem::zeroed::<libc::siginfo_t>();
            (libc::sigwaitinfo(&set, &mut info), info)
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if rc == signal() {
            // SIGPOLL-style information: `si_fd` follows `si_band` in the union
            // (`struct { long si_band; int si_fd; }` after the three leading ints).
            // SAFETY: reading plain integers from the siginfo the kernel filled for a
            // signal sent by `F_SETSIG`, at the offsets of its `_sigpoll` member.
            let fd = unsafe { sigpoll_fd(&info) };
            return Ok(Woken::Broken(fd));
        }
        return Ok(Woken::Lost);
    }
}

/// The `si_fd` of a `SIGPOLL`-style siginfo (Linux, 64-bit: the union starts at byte 16;
/// `si_band` is a `long` there, `si_fd` the `int` after it).
///
/// # Safety
/// `info` must have been filled by the kernel for a signal sent through `F_SETSIG`.
unsafe fn sigpoll_fd(info: &libc::siginfo_t) -> RawFd {
    const UNION: usize = 16;
    let base = (info as *const libc::siginfo_t).cast::<u8>();
    // SAFETY: `siginfo_t` is 128 bytes; byte 24..28 lies inside it. The read is unaligned-safe.
    unsafe { std::ptr::read_unaligned(base.add(UNION + 8).cast::<libc::c_int>()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// The layout `sigpoll_fd` reads: `si_fd` at byte 24 of a 128-byte siginfo.
    #[test]
    fn siginfo_is_the_size_read() {
        assert_eq!(std::mem::size_of::<libc::siginfo_t>(), 128);
    }

    /// A read lease is refused while this process has the file open for writing, granted
    /// once it has not, and reads as broken once given up.
    #[test]
    fn a_read_lease_needs_no_writer() {
        let dir = std::env::temp_dir().join(format!("fc-lease-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let writer = std::fs::File::create(&path).unwrap();
        let reader = std::fs::File::open(&path).unwrap();
        let refused = take_read(reader.as_fd()).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EAGAIN));
        drop(writer);
        take_read(reader.as_fd()).unwrap();
        assert!(!is_broken(reader.as_fd()));
        release(reader.as_fd()).unwrap();
        assert!(is_broken(reader.as_fd()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
