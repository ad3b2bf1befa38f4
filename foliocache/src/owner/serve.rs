//! A claimed thread slot's server: an owner thread that runs the slot's requests
//! (`shared::mailbox` has the protocol). Each request is checked before use: the record and
//! its generation name a file this owner serves, lengths are bounded by the staging folio, the
//! readahead state is clamped; a bad request gets an error answer, never a wild access.

use super::Owner;
use crate::error::Error;
use crate::file::{File, SyncRange};
use crate::mem::shared::MAIL_WORDS;
use crate::shared::mailbox::{self, DONE, RUNNING, SUBMITTED, at, error_kind, op};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The staging folio the owner gave a thread slot: its id and order. The owner's own copy: the
/// slot's words in the mapping say the same for the client to read, but a client can write
/// them, and a value read back from there names whatever the client put in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Staging {
    pub(super) pfn: u32,
    pub(super) order: u8,
}

/// A running server thread.
pub(super) struct Server {
    stop: Arc<AtomicBool>,
    slot: u32,
    /// The slot's staging folio: the server reads into it and writes from it, and whoever
    /// stops the server frees it (`Owner::stop_server`).
    pub(super) staging: Staging,
    owner: std::sync::Weak<Owner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub(super) fn start(owner: Arc<Owner>, slot: u32, staging: Staging) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let weak = Arc::downgrade(&owner);
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("fc-serve-{slot}"))
            .spawn(move || serve(&owner, slot, staging, &flag))
            .map_err(|e| {
                super::log(
                    &weak.upgrade().map(|o| o.name.clone()).unwrap_or_default(),
                    &format!("cannot start a server thread: {e}"),
                );
            })
            .ok();
        Self {
            stop,
            slot,
            staging,
            owner: weak,
            thread,
        }
    }

    /// Stops the thread after the request it runs, and waits for it. Its staging folio is the
    /// caller's to free.
    pub(super) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(owner) = self.owner.upgrade() {
            mailbox::wake(&owner.map.threads()[self.slot as usize].state);
        }
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

fn serve(owner: &Owner, slot: u32, staging: Staging, stop: &AtomicBool) {
    let t = &owner.map.threads()[slot as usize];
    // Whether the slot's last request was a write that came soon after the answer before it
    // (within three `SPIN`s: a server that slept sees it a wake-up later): a client in a
    // burst of writes (a loop, a checkpoint). Only then does the server poll for the next one
    // before sleeping, so a client that asks now and then, or reads, costs no polling.
    let mut burst = false;
    let mut answered: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let state = t.state.load(Ordering::Acquire);
        match state {
            SUBMITTED => {
                if let Some(then) = answered.take() {
                    burst = then.elapsed() < 3 * mailbox::SPIN
                        && t.request[at::OP].load(Ordering::Relaxed) == op::WRITE;
                }
                if t.state
                    .compare_exchange(SUBMITTED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
            }
            // Left RUNNING by a previous owner that died: run it again (requests are
            // idempotent).
            RUNNING => {}
            _ => {
                if !(burst && mailbox::spin_while(&t.state, state, mailbox::SPIN)) {
                    mailbox::wait(&t.state, state, Duration::from_millis(500));
                }
                continue;
            }
        }
        let request = mailbox::read_request(t);
        let reply = run(owner, staging, &request);
        mailbox::write_reply(t, &reply);
        t.state.store(DONE, Ordering::Release);
        mailbox::wake(&t.state);
        answered = Some(Instant::now());
    }
}

/// An error answer.
fn failed(error: &Error, kind: Option<u64>) -> [u64; MAIL_WORDS] {
    let (errno, k) = mailbox::encode_error(error);
    let mut reply = [0u64; MAIL_WORDS];
    reply[at::RESULT] = (-i64::from(errno.max(1))) as u64;
    reply[at::ERROR_KIND] = kind.unwrap_or(k);
    reply
}

fn bad_request() -> [u64; MAIL_WORDS] {
    failed(
        &Error::SharedMapping("a malformed request".to_owned()),
        Some(error_kind::BAD_REQUEST),
    )
}

/// Runs one request and makes its answer.
fn run(owner: &Owner, staging: Staging, request: &[u64; MAIL_WORDS]) -> [u64; MAIL_WORDS] {
    let record = request[at::RECORD] as usize;
    let generation = request[at::GENERATION] as u32;
    let changes = matches!(
        request[at::OP],
        op::WRITE | op::SET_LEN | op::FALLOCATE | op::PUNCH_HOLE
    );
    let found = if changes {
        owner.file_to_change(record, generation)
    } else {
        owner.file(record, generation)
    };
    let file = match found {
        Ok(file) => file,
        Err(e @ Error::SharedMapping(_)) => return failed(&e, Some(error_kind::STALE_FILE)),
        Err(e) => return failed(&e, None),
    };
    // A change runs under the gate, and not while the file passes through: the client makes
    // it on storage (`held.rs`: an outside opener waits on the gate for the changes in flight).
    let _gate = changes.then(|| {
        owner
            .change_gate
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    });
    if changes && owner.map.files()[record].serving.load(Ordering::Acquire) & 1 == 1 {
        return failed(&Error::ReadOnly, Some(error_kind::PASSING_THROUGH));
    }
    let result = match request[at::OP] {
        op::READ | op::WRITE => transfer(owner, staging, &file, request),
        op::SET_LEN => file.set_len(request[at::A]).map(|()| [0; MAIL_WORDS]),
        op::FALLOCATE => file
            .fallocate(request[at::A], request[at::B])
            .map(|()| [0; MAIL_WORDS]),
        op::PUNCH_HOLE => file
            .punch_hole(request[at::A], request[at::B])
            .map(|()| [0; MAIL_WORDS]),
        op::SYNC => return sync(&file, request),
        op::READAHEAD => {
            let mut handle = file.handle();
            handle.set_ra_state(mailbox::get_ra(request, max_ra_pages()));
            handle.readahead(request[at::A], request[at::B]).map(|()| {
                let mut reply = [0; MAIL_WORDS];
                mailbox::put_ra(&mut reply, &handle.ra_state());
                reply
            })
        }
        _ => return bad_request(),
    };
    result.unwrap_or_else(|e| {
        if std::env::var_os("FOLIOCACHE_OWNER_DEBUG").is_some() {
            eprintln!(
                "foliocache-owner: request {} failed: {e:?}",
                request[at::OP]
            );
        }
        failed(&e, None)
    })
}

fn max_ra_pages() -> u64 {
    crate::readahead::MAX_READAHEAD_BYTES >> crate::mem::PAGE_SHIFT
}

/// A read into, or a write from, the slot's staging folio (the one the owner gave the slot,
/// not whatever the slot's words in the mapping say now).
fn transfer(
    owner: &Owner,
    Staging { pfn, order }: Staging,
    file: &File,
    request: &[u64; MAIL_WORDS],
) -> Result<[u64; MAIL_WORDS], Error> {
    let order = u32::from(order);
    let pos = request[at::A];
    let room = crate::mem::PAGE_SIZE << order.min(9);
    let len = usize::try_from(request[at::B]).unwrap_or(usize::MAX);
    if len > room || pos.checked_add(len as u64).is_none() {
        return Ok(bad_request());
    }
    let mut handle = file.handle();
    let mut reply = [0u64; MAIL_WORDS];
    let done = if request[at::OP] == op::READ {
        handle.set_ra_state(mailbox::get_ra(request, max_ra_pages()));
        let done = owner.map.with_folio_bytes(pfn, order, len, |bytes| {
            let mut done = 0;
            while done < bytes.len() {
                match handle.read_at(&mut bytes[done..], pos + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(_) if done > 0 => break,
                    Err(e) => return Err(e),
                }
            }
            Ok(done)
        });
        mailbox::put_ra(&mut reply, &handle.ra_state());
        done
    } else {
        // `[pos, len, to_kernel]`: with `to_kernel`, the bytes are in the kernel's page cache
        // too when the answer goes (a write-through client's one request per write).
        let to_kernel = request[at::C] & 1 != 0;
        owner.map.with_folio_bytes(pfn, order, len, |bytes| {
            let n = handle.write_at(bytes, pos)?;
            if to_kernel && n > 0 {
                handle.sync_range(pos, n as u64, SyncRange::ALL | SyncRange::KERNEL)?;
            }
            Ok(n)
        })
    };
    match done {
        None => Ok(bad_request()),
        Some(Ok(n)) => {
            reply[at::RESULT] = n as u64;
            Ok(reply)
        }
        Some(Err(e)) => Err(e),
    }
}

/// A sync from the handle's errseq cursor (`[mode, offset, len, cursor]`): the answer carries
/// the cursor on, error or not.
fn sync(file: &File, request: &[u64; MAIL_WORDS]) -> [u64; MAIL_WORDS] {
    let mut handle = file.handle();
    handle.set_errseq_cursor(request[at::C + 1] as u32);
    let result = match request[at::A] {
        0 => handle.sync_all(),
        1 => handle.sync_data(),
        mode => handle.sync_range(
            request[at::B],
            request[at::C],
            SyncRange::from_bits((mode - 2) as u8),
        ),
    };
    let mut reply = match result {
        Ok(()) => [0; MAIL_WORDS],
        Err(e) => {
            if std::env::var_os("FOLIOCACHE_OWNER_DEBUG").is_some() {
                eprintln!("foliocache-owner: sync failed: {e} ({e:?})");
            }
            failed(&e, None)
        }
    };
    reply[at::VALUE] = u64::from(handle.errseq_cursor());
    reply
}
