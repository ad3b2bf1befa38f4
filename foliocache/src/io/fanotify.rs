//! fanotify permission events, the exact signal for opens from outside a shared cache while
//! its clients hold a file writable (`owner/held.rs` has the protocol; `docs/SHARED.md`,
//! "Writers outside the cache").
//!
//! A group of class `FAN_CLASS_CONTENT` (which needs `CAP_SYS_ADMIN`) marks a file's inode
//! for `FAN_OPEN_PERM` and the two close events. Every open of a marked file then waits in
//! the kernel until the group answers; the group learns the opener's pid, and the last close
//! of each open file description arrives as an event too. When the group's descriptor is
//! closed (its process died) the kernel allows every open still waiting, so a dead owner
//! blocks nobody.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// What an event tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An open waiting for the answer ([`Group::answer`]).
    Open,
    /// The last close of an open file description.
    Close,
    /// The queue overflowed: close events may have been lost.
    Overflow,
}

/// One event: its kind, the pid of the process that caused it, and a descriptor of the file
/// (read-only, opened by the kernel for the group; `None` for an overflow).
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) kind: Kind,
    pub(crate) pid: i32,
    pub(crate) file: Option<OwnedFd>,
}

/// A fanotify group for permission events.
#[derive(Debug)]
pub(crate) struct Group {
    fd: OwnedFd,
}

impl Group {
    /// A new group, or the error (`EPERM` without `CAP_SYS_ADMIN`).
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain system call with flag arguments; the result is checked.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC | libc::FAN_UNLIMITED_QUEUE,
                (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by fanotify_init and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    fn mark_with(&self, file: BorrowedFd<'_>, flags: libc::c_uint) -> io::Result<()> {
        let mask = libc::FAN_OPEN_PERM | libc::FAN_CLOSE_WRITE | libc::FAN_CLOSE_NOWRITE;
        // SAFETY: a null path marks the object `file` refers to; both descriptors are open.
        let rc = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                flags,
                mask,
                file.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Marks the inode `file` refers to: its opens wait for the group from now on.
    pub(crate) fn mark(&self, file: BorrowedFd<'_>) -> io::Result<()> {
        self.mark_with(file, libc::FAN_MARK_ADD)
    }

    /// Removes the mark of the inode `file` refers to.
    pub(crate) fn unmark(&self, file: BorrowedFd<'_>) -> io::Result<()> {
        self.mark_with(file, libc::FAN_MARK_REMOVE)
    }

    /// Waits for events and returns those one read gave.
    pub(crate) fn read(&self) -> io::Result<Vec<Event>> {
        let mut buf = vec![0u8; 16 << 10];
        let n = loop {
            match rustix::io::read(&self.fd, &mut buf) {
                Ok(n) => break n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        };
        let header = std::mem::size_of::<libc::fanotify_event_metadata>();
        let mut events = Vec::new();
        let mut at = 0;
        while at + header <= n {
            // SAFETY: `header` bytes at `at` are inside what the kernel wrote; the struct is
            // plain integers, read unaligned.
            let meta: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
            let len = meta.event_len as usize;
            if meta.vers != libc::FANOTIFY_METADATA_VERSION || len < header || at + len > n {
                // Not a record this program reads: the events before it are still answered
                // (an error here would leave their openers waiting).
                break;
            }
            let file = (meta.fd >= 0).then(|| {
                // SAFETY: the kernel opened this descriptor for the group's reader; it is
                // ours to close.
                unsafe { OwnedFd::from_raw_fd(meta.fd) }
            });
            let kind = if meta.mask & libc::FAN_Q_OVERFLOW != 0 {
                Kind::Overflow
            } else if meta.mask & libc::FAN_OPEN_PERM != 0 {
                Kind::Open
            } else {
                Kind::Close
            };
            events.push(Event {
                kind,
                pid: meta.pid,
                file,
            });
            at += len;
        }
        Ok(events)
    }

    /// Lets the open of `event` go on (a permission event must be answered once; the kernel
    /// holds the opener until then).
    pub(crate) fn answer(&self, event: &Event) -> io::Result<()> {
        let Some(file) = &event.file else {
            return Ok(());
        };
        let response = libc::fanotify_response {
            fd: file.as_raw_fd(),
            response: libc::FAN_ALLOW,
        };
        // SAFETY: `response` is a plain struct, written whole from a live local.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw const response).cast::<u8>(),
                std::mem::size_of::<libc::fanotify_response>(),
            )
        };
        rustix::io::write(&self.fd, bytes)?;
        Ok(())
    }
}

impl AsFd for Group {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
