//! A client thread's mailbox: how a request reaches the owner and its answer comes back, through
//! the thread's slot in the mapping and shared futexes (`docs/SHARED.md`, "Requests").
//!
//! ```text
//! state:  FREE ──client──▶ SUBMITTED ──owner──▶ RUNNING ──owner──▶ DONE ──client──▶ FREE
//! ```
//!
//! * The client writes the request words, then stores SUBMITTED (release) and wakes the state
//!   word (`FUTEX_WAKE`, shared: the owner's server thread sleeps on it in another process).
//! * The owner's server thread for the slot sleeps on the state word while it is FREE or DONE;
//!   seeing SUBMITTED (acquire) it stores RUNNING, runs the request, writes the answer words,
//!   stores DONE (release) and wakes the word.
//! * The client sleeps on the state word while it is SUBMITTED or RUNNING, with a timeout after
//!   which it checks that the owner is alive (its control connection). Seeing DONE (acquire) it
//!   reads the answer and stores FREE.
//!
//! What a death leaves: a client that dies after SUBMITTED leaves a request the owner runs to
//! the end (its answer is never read); the owner clears the slot when it learns of the death.
//! An owner that dies after RUNNING leaves the request marked RUNNING in shared memory: the
//! next owner runs it again. Every request is idempotent (writes name their offset), so
//! running one twice is harmless. The request words are checked by the owner before use, the
//! answer words by the client.

use crate::error::Error;
use crate::mem::shared::{MAIL_WORDS, ThreadSlot};
use crate::readahead::RaState;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub(crate) const FREE: u32 = 0;
pub(crate) const SUBMITTED: u32 = 1;
pub(crate) const RUNNING: u32 = 2;
pub(crate) const DONE: u32 = 3;

/// A claimed slot's claim word: this bit, and the process slot in the low bits.
pub(crate) const CLAIMED: u32 = 1 << 31;

/// Requests (word 0 of the request).
pub(crate) mod op {
    /// `[record, gen, pos, len, ra...]`: read `len` bytes at `pos` into the staging folio,
    /// with the handle's readahead state; answer: bytes, then the new readahead state.
    pub(crate) const READ: u64 = 1;
    /// `[record, gen, pos, len]`: write `len` bytes from the staging folio at `pos`; answer:
    /// bytes written.
    pub(crate) const WRITE: u64 = 2;
    /// `[record, gen, len]`.
    pub(crate) const SET_LEN: u64 = 3;
    /// `[record, gen, offset, len]`.
    pub(crate) const FALLOCATE: u64 = 4;
    /// `[record, gen, offset, len]`.
    pub(crate) const PUNCH_HOLE: u64 = 5;
    /// `[record, gen, mode, offset, len, errseq cursor]`: mode 0 all, 1 data, 2.. a range's
    /// flags + 2; answer: `[0, errseq cursor]` or an error.
    pub(crate) const SYNC: u64 = 6;
    /// `[record, gen, offset, len, ra...]`: forced readahead (`WillNeed`), no data.
    pub(crate) const READAHEAD: u64 = 7;
}

/// Request and answer word positions.
pub(crate) mod at {
    pub(crate) const OP: usize = 0;
    pub(crate) const RECORD: usize = 1;
    pub(crate) const GENERATION: usize = 2;
    /// First argument.
    pub(crate) const A: usize = 3;
    pub(crate) const B: usize = 4;
    pub(crate) const C: usize = 5;
    /// The readahead state (8 words), in requests and answers.
    pub(crate) const RA: usize = 8;
    /// Answer: the result (bytes, or 0) as a signed number; negative: an error.
    pub(crate) const RESULT: usize = 0;
    /// Answer: the error's kind (`ErrorKind`), when the result is negative.
    pub(crate) const ERROR_KIND: usize = 1;
    /// Answer: a value (an errseq cursor, say).
    pub(crate) const VALUE: usize = 2;
}

const _: () = assert!(at::RA + 8 <= MAIL_WORDS);

/// Writes a readahead state into words `RA..RA + 8`.
pub(crate) fn put_ra(words: &mut [u64; MAIL_WORDS], ra: &RaState) {
    words[at::RA] = ra.start;
    words[at::RA + 1] = ra.size;
    words[at::RA + 2] = ra.async_size;
    words[at::RA + 3] = u64::from(ra.order);
    words[at::RA + 4] = ra.ra_pages;
    words[at::RA + 5] = ra.default_ra_pages;
    words[at::RA + 6] = ra.prev_pos as u64;
    words[at::RA + 7] = u64::from(ra.random);
}

/// Reads a readahead state from words `RA..RA + 8`, bounded to sane values (a corrupted
/// mailbox cannot make readahead ask for more than its maximum).
pub(crate) fn get_ra(words: &[u64; MAIL_WORDS], max_pages: u64) -> RaState {
    let clamp = |v: u64| v.min(max_pages.max(1) * 4);
    RaState {
        start: words[at::RA],
        size: clamp(words[at::RA + 1]),
        async_size: clamp(words[at::RA + 2]),
        order: words[at::RA + 3].min(u64::from(crate::mem::MAX_ORDER)) as u8,
        ra_pages: words[at::RA + 4].min(max_pages),
        default_ra_pages: words[at::RA + 5].min(max_pages),
        prev_pos: words[at::RA + 6] as i64,
        random: words[at::RA + 7] != 0,
    }
}

/// The kinds of error a mailbox carries back (the error's details stay in the owner's log).
pub(crate) mod error_kind {
    pub(crate) const IO: u64 = 1;
    pub(crate) const WRITEBACK: u64 = 2;
    pub(crate) const READ_ONLY: u64 = 3;
    pub(crate) const NO_MEMORY: u64 = 4;
    pub(crate) const BAD_REQUEST: u64 = 5;
    pub(crate) const STALE_FILE: u64 = 6;
    pub(crate) const TOO_LARGE: u64 = 7;
    pub(crate) const OTHER: u64 = 8;
    /// A change refused: the file passes through (the client makes it on storage itself).
    pub(crate) const PASSING_THROUGH: u64 = 9;
}

/// An error's (errno, kind) for the answer.
pub(crate) fn encode_error(error: &Error) -> (i32, u64) {
    use error_kind as k;
    match error {
        Error::Io { source, .. } => (source.raw_os_error().unwrap_or(libc::EIO), k::IO),
        Error::Writeback { source } => (source.raw_os_error().unwrap_or(libc::EIO), k::WRITEBACK),
        Error::ReadOnly => (libc::EBADF, k::READ_ONLY),
        Error::NoMemory { .. } | Error::IndexNoMemory => (libc::ENOMEM, k::NO_MEMORY),
        Error::FileTooLarge { .. } => (libc::EFBIG, k::TOO_LARGE),
        Error::Detached => (libc::EBADF, k::OTHER),
        _ => (libc::EIO, k::OTHER),
    }
}

/// The error an answer carries, as the client's call returns it.
pub(crate) fn decode_error(errno: i32, kind: u64, offset: u64, len: u64) -> Error {
    use error_kind as k;
    let source = std::io::Error::from_raw_os_error(errno.clamp(1, 4095));
    match kind {
        k::IO => Error::Io {
            offset,
            len,
            source,
        },
        k::WRITEBACK => Error::Writeback { source },
        k::READ_ONLY => Error::ReadOnly,
        k::NO_MEMORY => Error::NoMemory { order: 0 },
        k::TOO_LARGE => Error::FileTooLarge { offset },
        k::STALE_FILE => Error::SharedMapping(
            "the file's record was given to another file (the owner dropped it)".to_owned(),
        ),
        k::BAD_REQUEST => Error::SharedMapping("the owner refused a malformed request".to_owned()),
        _ => Error::Io {
            offset,
            len,
            source,
        },
    }
}

/// Sleeps while `word` holds `value`, for at most `timeout` (a shared futex: the waker may be
/// in another process). Spurious and early returns are fine: callers re-check.
pub(crate) fn wait(word: &AtomicU32, value: u32, timeout: Duration) {
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let _ = rustix::thread::futex::wait(
        word,
        rustix::thread::futex::Flags::empty(),
        value,
        Some(&ts),
    );
}

/// How long a waiter polls a mailbox word before it sleeps: a write's answer and a client's
/// next request in a burst usually come sooner, and a sleep costs more than this on a virtual
/// machine whose idle CPUs halt at once (a wake-up is then an interprocessor interrupt to a
/// halted CPU: a client's 8 KiB write through the shared cache took 75–104 µs with both sides
/// sleeping, 10.5–14.7 µs with polling, 9–10 µs with the watcher's pause as well;
/// docs/SHARED.md).
pub(crate) const SPIN: Duration = Duration::from_micros(30);

/// How long a client polls for the server to take its request (SUBMITTED → RUNNING) before it
/// sleeps: long enough for a server that is polling (in a burst) to see it, short enough not to
/// hold a CPU that a server woken from sleep may be waiting for.
pub(crate) const PICKUP: Duration = Duration::from_micros(3);

/// A client waiting for a write's answer in `word`, last seen holding `state`: polls while a
/// server holds the request on a CPU (RUNNING, up to [`SPIN`]), and only briefly
/// ([`PICKUP`]) while no server has taken it yet. Whether the word left SUBMITTED and
/// RUNNING; `false` means sleep. Polling while no server has the request took the CPU from
/// the servers where CPUs were scarce: with PostgreSQL's four backends on two CPUs, 9% of all
/// CPU time went into this poll.
pub(crate) fn spin_for_answer(word: &AtomicU32, state: u32) -> bool {
    let mut state = state;
    if state == SUBMITTED {
        if !spin_while(word, SUBMITTED, PICKUP) {
            return false;
        }
        state = word.load(Ordering::Acquire);
    }
    if state != RUNNING {
        return true;
    }
    spin_while(word, RUNNING, SPIN)
}

/// Polls `word` while it holds `value`, for at most `limit`: whether it changed. Never sleeps.
pub(crate) fn spin_while(word: &AtomicU32, value: u32, limit: Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        for _ in 0..64 {
            if word.load(Ordering::Acquire) != value {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= limit {
            return word.load(Ordering::Acquire) != value;
        }
    }
}

/// Wakes every sleeper on `word`, in any process.
pub(crate) fn wake(word: &AtomicU32) {
    let _ =
        rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
}

/// Copies the request words out of a slot (the owner: a snapshot it then checks).
pub(crate) fn read_request(slot: &ThreadSlot) -> [u64; MAIL_WORDS] {
    std::array::from_fn(|i| slot.request[i].load(Ordering::Relaxed))
}

/// Copies the answer words out of a slot (the client).
pub(crate) fn read_reply(slot: &ThreadSlot) -> [u64; MAIL_WORDS] {
    std::array::from_fn(|i| slot.reply[i].load(Ordering::Relaxed))
}

pub(crate) fn write_request(slot: &ThreadSlot, words: &[u64; MAIL_WORDS]) {
    for (w, &v) in slot.request.iter().zip(words) {
        w.store(v, Ordering::Relaxed);
    }
}

pub(crate) fn write_reply(slot: &ThreadSlot, words: &[u64; MAIL_WORDS]) {
    for (w, &v) in slot.reply.iter().zip(words) {
        w.store(v, Ordering::Relaxed);
    }
}
