//! Taking over a mapping whose owner died (`docs/SHARED.md`, "When the owner dies").
//!
//! The dead owner's private state (its allocator's lists, reclaim lists, wait queues, its
//! writer locks) is gone; what is in the mapping is the folio table, the index nodes, the file
//! records and the client slots. This owner:
//!
//! 1. waits until the previous owner is really gone (pid and start time);
//! 2. writes back every folio the table says is dirty or under writeback, straight to its
//!    file (the record's path, checked against the record's device and inode): a write a
//!    client saw acknowledged survives the owner's death;
//! 3. empties every record's index (root 0): clients that look now miss and ask;
//! 4. waits for a grace period over the clients' pins (a client copying from a folio it found
//!    before step 3 finishes before any page is reused; a pin of a dead client is cleared);
//! 5. gives every page back to the allocator except the staging folios of claimed slots
//!    (requests still in a slot may need their bytes: a write's data is there).
//!
//! What this version does not keep: clean pages. They are read again on the next miss. (Keeping
//! them means rebuilding each record's tree from the folio table; see `docs/SHARED.md`.)
//!
//! A new owner killed in the middle of this leaves the mapping as it found it or further along
//! the same steps, each of which the next owner repeats harmlessly: write-back writes the same
//! bytes again, an empty index stays empty.

use super::log;
use crate::error::Error;
use crate::mem::flag;
use crate::mem::records::LIVE;
use crate::mem::shared::{STAGING, SharedMap};
use crate::policy::RefcountPolicy;
use crate::shared::mailbox::CLAIMED;
use crate::shared::runtime::{self, shared_error};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What the new owner's allocator starts from.
pub(super) struct Free {
    kept: Vec<bool>,
    /// Staging folios kept (adopted by the new memory).
    pub(super) staging: Vec<u32>,
    /// Thread slots claimed by live clients (their servers start at once).
    pub(super) claimed: Vec<u32>,
}

impl Free {
    pub(super) fn is_free(&self, pfn: u32) -> bool {
        !self.kept.get(pfn as usize).copied().unwrap_or(true)
    }
}

/// Steps 1 to 5 of the module documentation.
pub(super) fn take_over(
    name: &str,
    map: &SharedMap,
    policy: RefcountPolicy,
) -> Result<Free, Error> {
    let started = Instant::now();
    let live = map.live();
    let old_pid = live.owner_pid.load(Ordering::Acquire);
    let old_start = live.owner_start.load(Ordering::Acquire);
    let deadline = Instant::now() + Duration::from_secs(10);
    while old_pid != std::process::id() && runtime::alive(old_pid, old_start) {
        if Instant::now() > deadline {
            return Err(shared_error(
                name,
                format!("the previous owner (pid {old_pid}) is still alive"),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (written, failed) = write_back_dirty(name, map);
    for rec in map.files() {
        rec.root.store(0, Ordering::Release);
    }
    wait_for_pins(map);
    let table = map.table();
    let mut kept = vec![false; table.len()];
    let mut staging = Vec::new();
    let mut claimed = Vec::new();
    let processes = map.processes();
    for (i, t) in map.threads().iter().enumerate() {
        let claim = t.claim.load(Ordering::Acquire);
        let process = (claim & !CLAIMED) as usize;
        let alive = claim & CLAIMED != 0
            && processes.get(process).is_some_and(|p| {
                runtime::alive(
                    p.pid.load(Ordering::Acquire),
                    p.start.load(Ordering::Acquire),
                )
            });
        let pfn = t.staging.load(Ordering::Acquire);
        let order = t.staging_order.load(Ordering::Acquire).min(9);
        let usable = alive
            && (pfn as usize) < table.len()
            && (pfn as usize) + (1usize << order) <= table.len()
            && table[pfn as usize].mapping.load(Ordering::Acquire) == STAGING;
        if usable {
            for k in &mut kept[pfn as usize..pfn as usize + (1 << order)] {
                *k = true;
            }
            staging.push(pfn);
            claimed.push(i as u32);
        } else {
            t.staging.store(u32::MAX, Ordering::Release);
            t.pin.store(0, Ordering::Release);
            if !alive {
                t.state
                    .store(crate::shared::mailbox::FREE, Ordering::Release);
                t.claim.store(0, Ordering::Release);
            }
        }
    }
    for (pfn, desc) in table.iter().enumerate() {
        if !kept[pfn] {
            // A new life for every descriptor: its sequence moves on, so an optimistic reader's
            // snapshot of the old life never validates against the new one.
            let seq = desc.seq.load(Ordering::Acquire);
            desc.reset(policy);
            desc.seq.store(seq.wrapping_add(1), Ordering::Release);
        }
    }
    // Processes say hello again to this owner; their old slots go.
    for p in processes {
        p.state.store(0, Ordering::Release);
    }
    let ns = started.elapsed().as_nanos() as u64;
    live.counters[5].store(ns, Ordering::Relaxed);
    log(
        name,
        &format!(
            "took over from pid {old_pid} in {:.1} ms: {written} dirty pages written back, \
             {failed} failed; {} requests in flight kept",
            ns as f64 / 1e6,
            claimed.len()
        ),
    );
    Ok(Free {
        kept,
        staging,
        claimed,
    })
}

/// Writes every dirty (or under-writeback) uptodate folio of every live record to its file:
/// pages written, pages that could not be.
fn write_back_dirty(name: &str, map: &SharedMap) -> (u64, u64) {
    let table = map.table();
    let mut written = 0;
    let mut failed = 0;
    for rec in map.files() {
        if rec.state.load(Ordering::Acquire) != LIVE {
            continue;
        }
        let id = rec.mapping_id.load(Ordering::Acquire);
        let size = rec.size.load(Ordering::Acquire);
        let dirty: Vec<(usize, u64, u32)> = table
            .iter()
            .enumerate()
            .filter_map(|(pfn, d)| {
                let flags = d.flags.load(Ordering::Acquire);
                (d.mapping.load(Ordering::Acquire) == id
                    && flags & flag::UPTODATE != 0
                    && flags & (flag::DIRTY | flag::WRITEBACK) != 0)
                    .then(|| {
                        (
                            pfn,
                            d.index.load(Ordering::Acquire),
                            u32::from(d.order.load(Ordering::Acquire)),
                        )
                    })
            })
            .collect();
        if dirty.is_empty() {
            continue;
        }
        let path = rec.path();
        let key = (
            rec.dev.load(Ordering::Acquire),
            rec.ino.load(Ordering::Acquire),
        );
        let file = path.as_ref().and_then(|p| {
            let f = std::fs::OpenOptions::new().write(true).open(p).ok()?;
            let meta = f.metadata().ok()?;
            ((meta.dev(), meta.ino()) == key).then_some(f)
        });
        let Some(file) = file else {
            log(
                name,
                &format!(
                    "cannot write back {} dirty folios of {:?}: the file is gone or replaced",
                    dirty.len(),
                    path
                ),
            );
            failed += dirty.len() as u64;
            continue;
        };
        for (pfn, index, order) in dirty {
            let start = index << crate::mem::PAGE_SHIFT;
            if start >= size {
                continue;
            }
            let len = ((crate::mem::PAGE_SIZE as u64) << order).min(size - start) as usize;
            let mut bytes = vec![0u8; len];
            if !map.copy_out(pfn as u32, order, 0, &mut bytes) {
                failed += 1;
                continue;
            }
            match file.write_all_at(&bytes, start) {
                Ok(()) => written += 1u64 << order,
                Err(e) => {
                    log(name, &format!("writing back {path:?} at {start}: {e}"));
                    failed += 1u64 << order;
                }
            }
        }
        if let Err(e) = file.sync_all() {
            log(name, &format!("fsync of {path:?}: {e}"));
        }
    }
    (written, failed)
}

/// Waits until every client pin taken before now is released (or its process is dead): the
/// clients' epoch mirror moves on first, so a pin taken after this call carries the new value
/// and is not waited for (it was taken after the roots were emptied).
fn wait_for_pins(map: &SharedMap) {
    let mirror = &map.live().epoch;
    let now = mirror.fetch_add(2, Ordering::SeqCst) + 2;
    std::sync::atomic::fence(Ordering::SeqCst);
    let processes = map.processes();
    for t in map.threads() {
        let claim = t.claim.load(Ordering::Acquire);
        let process = processes.get((claim & !CLAIMED) as usize);
        while !crate::mem::epoch::pin_caught_up(t.pin.load(Ordering::SeqCst), now) {
            let alive = claim & CLAIMED != 0
                && process.is_some_and(|p| {
                    runtime::alive(
                        p.pid.load(Ordering::Acquire),
                        p.start.load(Ordering::Acquire),
                    )
                });
            if !alive {
                t.pin.store(0, Ordering::Release);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
