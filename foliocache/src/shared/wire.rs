//! The control socket between a shared cache's clients and its owner: one `SOCK_SEQPACKET`
//! connection per attached process (a message is delivered whole or not at all, with the
//! descriptors it carries), which also tells each side of the other's death: the kernel closes
//! it when either process dies.
//!
//! A message is a kind, some words and a text; it may carry one descriptor (`SCM_RIGHTS`):
//! the memfd at attach, a file's descriptor at open. Every field read from a message is
//! checked by its reader (the other process is not trusted to be correct).

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

/// The largest message (a status report is the largest).
pub(crate) const MAX_MESSAGE: usize = 256 << 10;

/// The protocol's version (a client and an owner of different versions refuse each other).
pub(crate) const PROTOCOL: u64 = 2;

/// Message kinds.
pub(crate) mod kind {
    /// Client → owner: `[protocol, pid, start time, memfd number in the client or u64::MAX]`.
    pub(crate) const HELLO: u32 = 1;
    /// Owner → client: `[process slot, owner generation, owner pid]` + the memfd.
    pub(crate) const WELCOME: u32 = 2;
    /// Owner → client: the request failed; the text says why, word 0 is an errno or 0.
    pub(crate) const ERROR: u32 = 3;
    /// Client → owner: `[write, max order + 1 or 0, insert policy + 1 or 0]` + the file's
    /// descriptor, opened by the client.
    pub(crate) const OPEN: u32 = 4;
    /// Owner → client: `[record, generation, max order]`.
    pub(crate) const OPENED: u32 = 5;
    /// Client → owner: `[thread slot]`: serve this slot's mailbox.
    pub(crate) const CLAIM: u32 = 6;
    /// Client → owner: `[thread slot]`: the thread is gone.
    pub(crate) const RELEASE: u32 = 7;
    /// Owner → client: done (words depend on the request).
    pub(crate) const OK: u32 = 8;
    /// Client → owner: `[record, generation]`: the client closed its last handle of the file.
    pub(crate) const CLOSE: u32 = 9;
    /// Client → owner: `[record, generation, op, a, b]`: a rare file operation whose answer
    /// is bulky or needs no speed (see `shared::client`, `FileOp`).
    pub(crate) const FILE_OP: u32 = 10;
    /// Client → owner: the cache's statistics; answer words (see `shared::owner`).
    pub(crate) const STATS: u32 = 11;
    /// Anyone → owner: a status report (text, JSON).
    pub(crate) const STATUS: u32 = 12;
    /// Anyone → owner: drop clean pages.
    pub(crate) const DROP: u32 = 13;
    /// Anyone → owner: write everything back.
    pub(crate) const SYNC: u32 = 14;
    /// Anyone → owner: write everything back, then end.
    pub(crate) const DESTROY: u32 = 15;
    /// Client → owner: `[pages]`: evict clean folios.
    pub(crate) const EVICT: u32 = 16;
    /// Client → owner, right after the welcome: `[fd]`, the descriptor number at which this
    /// process holds the mapping (listed in `NAME.clients`, so that a new owner started by a
    /// process that holds none can find the mapping through this one).
    pub(crate) const MEMFD: u32 = 17;
}

/// The file operations of `kind::FILE_OP` (word 2).
pub(crate) mod file_op {
    pub(crate) const RA_STATS: u64 = 1;
    pub(crate) const IO_STATS: u64 = 2;
    pub(crate) const WAIT_IO: u64 = 3;
    pub(crate) const CACHED_RANGES: u64 = 4;
    /// `[offset, len]`.
    pub(crate) const DROP_CACHED: u64 = 5;
    pub(crate) const REVALIDATE: u64 = 6;
    pub(crate) const MAPPING_STATS: u64 = 7;
    /// `[offset, len]`.
    pub(crate) const WRITTEN_OUTSIDE: u64 = 8;
    pub(crate) const CHANGED_OUTSIDE: u64 = 9;
    /// `[errno]`.
    pub(crate) const DISCARD_DIRTY: u64 = 10;
}

/// One message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Msg {
    pub(crate) kind: u32,
    pub(crate) words: Vec<u64>,
    pub(crate) text: String,
}

impl Msg {
    pub(crate) fn new(kind: u32, words: &[u64]) -> Self {
        Self {
            kind,
            words: words.to_vec(),
            text: String::new(),
        }
    }

    pub(crate) fn with_text(kind: u32, words: &[u64], text: impl Into<String>) -> Self {
        Self {
            kind,
            words: words.to_vec(),
            text: text.into(),
        }
    }

    /// Word `i`, or an error naming the message if it is missing.
    pub(crate) fn word(&self, i: usize) -> io::Result<u64> {
        self.words.get(i).copied().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("message {} has no word {i}", self.kind),
            )
        })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 8 * self.words.len() + self.text.len());
        out.extend_from_slice(&self.kind.to_le_bytes());
        out.extend_from_slice(&(self.words.len() as u32).to_le_bytes());
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        let room = MAX_MESSAGE.saturating_sub(out.len());
        let mut text = self.text.as_bytes();
        if text.len() > room {
            // Cut at a character boundary.
            let mut cut = room;
            while cut > 0 && !self.text.is_char_boundary(cut) {
                cut -= 1;
            }
            text = &text[..cut];
        }
        out.extend_from_slice(text);
        out
    }

    fn decode(bytes: &[u8]) -> io::Result<Self> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
        if bytes.len() < 8 {
            return Err(bad("a message shorter than its header"));
        }
        let kind = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        let n = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
        let words_end = n
            .checked_mul(8)
            .and_then(|b| b.checked_add(8))
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| bad("a message with more words than bytes"))?;
        let words = bytes[8..words_end]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let text = String::from_utf8_lossy(&bytes[words_end..]).into_owned();
        Ok(Self { kind, words, text })
    }
}

/// One end of a control connection.
#[derive(Debug)]
pub(crate) struct Conn {
    fd: OwnedFd,
}

impl Conn {
    /// Connects to the owner listening at `path`.
    pub(crate) fn connect(path: &Path) -> io::Result<Self> {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        let addr = SocketAddrUnix::new(path)?;
        rustix::net::connect(&fd, &addr)?;
        Ok(Self { fd })
    }

    /// A connected pair (an owner being started, and the client that started it).
    pub(crate) fn pair() -> io::Result<(Self, Self)> {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        Ok((Self { fd: a }, Self { fd: b }))
    }

    /// A connection from a descriptor (the owner's standard input, a socket its starter made).
    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }

    pub(crate) fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Sends `msg`, with `fd` if given.
    pub(crate) fn send(&self, msg: &Msg, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let bytes = msg.encode();
        let fds;
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if let Some(fd) = fd {
            fds = [fd];
            control.push(SendAncillaryMessage::ScmRights(&fds));
        }
        let sent = rustix::net::sendmsg(
            &self.fd,
            &[IoSlice::new(&bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        if sent != bytes.len() {
            return Err(io::Error::other("a control message was cut short"));
        }
        Ok(())
    }

    /// Receives one message (and the descriptor it carries, if any); `None` when the other
    /// side has closed the connection (it exited, or died).
    pub(crate) fn recv(&self) -> io::Result<Option<(Msg, Option<OwnedFd>)>> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = loop {
            match rustix::net::recvmsg(
                &self.fd,
                &mut [IoSliceMut::new(&mut buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other?,
            }
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if got.bytes == 0 {
            return Ok(None);
        }
        let msg = Msg::decode(&buf[..got.bytes.min(buf.len())])?;
        // One descriptor at most is meant: extra ones are closed here (dropped).
        Ok(Some((msg, fds.into_iter().next())))
    }

    /// A request and its answer (an `ERROR` answer becomes an error with its text).
    pub(crate) fn call(
        &self,
        msg: &Msg,
        fd: Option<BorrowedFd<'_>>,
    ) -> io::Result<(Msg, Option<OwnedFd>)> {
        self.send(msg, fd)?;
        match self.recv()? {
            None => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the owner closed the connection (it ended or died)",
            )),
            Some((answer, _)) if answer.kind == kind::ERROR => {
                let errno = answer.words.first().copied().unwrap_or(0) as i32;
                let text = if answer.text.is_empty() {
                    "the owner refused the request".to_owned()
                } else {
                    answer.text
                };
                Err(if errno > 0 {
                    io::Error::new(io::Error::from_raw_os_error(errno).kind(), text)
                } else {
                    io::Error::other(text)
                })
            }
            Some(answer) => Ok(answer),
        }
    }

    /// Whether the other side has closed the connection (checked without blocking).
    pub(crate) fn closed(&self) -> bool {
        use rustix::event::{PollFd, PollFlags};
        let mut fds = [PollFd::new(&self.fd, PollFlags::RDHUP | PollFlags::HUP)];
        match rustix::event::poll(&mut fds, Some(&rustix::time::Timespec::default())) {
            Ok(0) => false,
            Ok(_) => fds[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR),
            Err(_) => true,
        }
    }

    /// The other side's user and process (`SO_PEERCRED`).
    pub(crate) fn peer(&self) -> io::Result<(u32, u32)> {
        let cred = rustix::net::sockopt::socket_peercred(&self.fd)?;
        Ok((cred.uid.as_raw(), cred.pid.as_raw_nonzero().get() as u32))
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The owner's listening socket.
#[derive(Debug)]
pub(crate) struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Listens at `path` (a stale socket file left by a dead owner is replaced: the caller
    /// holds the owner lock, so no live owner is listening there).
    pub(crate) fn bind(path: &Path) -> io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::net::bind(&fd, &SocketAddrUnix::new(path)?)?;
        rustix::net::listen(&fd, 64)?;
        Ok(Self { fd })
    }

    /// The next connection.
    pub(crate) fn accept(&self) -> io::Result<Conn> {
        loop {
            match rustix::net::accept_with(&self.fd, SocketFlags::CLOEXEC) {
                Err(rustix::io::Errno::INTR) => continue,
                other => return Ok(Conn { fd: other? }),
            }
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
