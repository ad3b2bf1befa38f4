//! Taking over a mapping whose owner died (`docs/SHARED.md`, "When the owner dies").
//!
//! The dead owner's private state (its allocator's lists, reclaim lists, wait queues, its
//! writer locks) is gone; what is in the mapping is the folio table, the index nodes, the file
//! records and the client slots. This owner:
//!
//! 1. waits until the previous owner is really gone (pid and start time);
//! 2. decides which files' clean pages it may keep: a file whose change time on storage is
//!    more than [`MARGIN`] before the dead owner's last heartbeat (the owner writes one every
//!    200 ms) changed only while that owner watched it, so its cached pages are what storage
//!    holds; a file changed later (by anyone, while no owner watched) keeps none;
//! 3. writes back every folio the table says is dirty or under writeback, straight to its
//!    file (the record's path, checked against the record's device and inode): a write a
//!    client saw acknowledged survives the owner's death; a file whose write-back failed
//!    keeps no pages;
//! 4. empties every record's index (root 0): clients that look now miss and ask;
//! 5. waits for a grace period over the clients' pins (a client copying from a folio it found
//!    before step 4 finishes before any page is reused; a pin of a dead client is cleared);
//! 6. keeps the staging folios of claimed slots (requests still in a slot may need their
//!    bytes: a write's data is there) and, of the files step 2 chose, every folio whose
//!    descriptor is whole and believable (uptodate, not locked, aligned, inside the arena and
//!    the file, overlapping nothing kept); gives every other page back to the allocator.
//!
//! The owner then opens the chosen files again and puts their kept folios back into new
//! indexes (`Inode::adopt_clean`) before it answers anyone. What is lost: the index nodes
//! (rebuilt), the reclaim lists' order and the shadow entries.
//!
//! A new owner killed in the middle of this leaves the mapping as it found it or further along
//! the same steps, each of which the next owner repeats harmlessly: write-back writes the same
//! bytes again, an empty index stays empty, a kept folio is judged again by its descriptor.

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

/// The index of the live counter that holds an owner's heartbeat (wall-clock nanoseconds).
pub(super) const HEARTBEAT: usize = 6;
/// The index of the live counter that holds the pages the last takeover kept.
pub(super) const KEPT: usize = 7;
/// How long before the dead owner's last heartbeat a file's last change must be for its
/// pages to be kept: well beyond the time an owner takes to see an outside change (an inotify
/// event, milliseconds) and the heartbeat's own period.
pub(super) const MARGIN: Duration = Duration::from_secs(1);

/// The wall clock in nanoseconds (the clock file times are on).
pub(super) fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Clean folios kept for one file: `(record, generation, [(folio, page index, order)])`.
pub(super) type Kept = (usize, u32, Vec<(u32, u64, u8)>);

/// What the new owner's allocator starts from.
pub(super) struct Free {
    kept: Vec<bool>,
    /// Clean folios kept for their files.
    pub(super) adopt: Vec<Kept>,
    /// Thread slots claimed by live clients, with the staging folios kept for them (adopted
    /// by the new memory; their servers start at once).
    pub(super) claimed: Vec<(u32, super::serve::Staging)>,
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
    let heartbeat = live.counters[HEARTBEAT].load(Ordering::Acquire);
    let mut keep = keepable_files(map, heartbeat);
    let (written, failed, failed_records) = write_back_dirty(name, map);
    keep.retain(|record| !failed_records.contains(record));
    crate::inject::kill::point("takeover");
    for rec in map.files() {
        rec.root.store(0, Ordering::Release);
    }
    wait_for_pins(map);
    let table = map.table();
    let mut kept = vec![false; table.len()];
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
        let order = t.staging_order.load(Ordering::Acquire).min(9) as u8;
        let pages = pfn as usize..(pfn as usize).saturating_add(1 << order);
        // Inside the arena, aligned to its order, marked a staging folio, and no page of it
        // kept already: two slots naming one folio (a client's words changed, or the dead
        // owner's bug) must not both write into it.
        let usable = alive
            && pages.end <= table.len()
            && pages.start.is_multiple_of(1 << order)
            && table[pfn as usize].mapping.load(Ordering::Acquire) == STAGING
            && !kept[pages.clone()].contains(&true);
        if usable {
            for k in &mut kept[pages] {
                *k = true;
            }
            claimed.push((i as u32, super::serve::Staging { pfn, order }));
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
    let adopt = keep_clean_folios(map, &keep, &mut kept);
    let kept_pages: u64 = adopt
        .iter()
        .flat_map(|(_, _, folios)| folios.iter().map(|&(_, _, order)| 1u64 << order))
        .sum();
    live.counters[KEPT].store(kept_pages, Ordering::Relaxed);
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
             {failed} failed; {} requests in flight kept; {kept_pages} clean pages of {} \
             files kept",
            ns as f64 / 1e6,
            claimed.len(),
            adopt.len()
        ),
    );
    Ok(Free {
        kept,
        adopt,
        claimed,
    })
}

/// Writes every dirty (or under-writeback) uptodate folio of every live record to its file:
/// pages written, pages that could not be, and the records of those.
fn write_back_dirty(name: &str, map: &SharedMap) -> (u64, u64, Vec<usize>) {
    let table = map.table();
    let mut written = 0;
    let mut failed = 0;
    let mut failed_records = Vec::new();
    for (record, rec) in map.files().iter().enumerate() {
        let failed_before = failed;
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
            failed_records.push(record);
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
            failed_records.push(record);
        } else if failed > failed_before {
            failed_records.push(record);
        }
    }
    (written, failed, failed_records)
}

/// The live records whose files changed on storage (change time) more than [`MARGIN`] before
/// the dead owner's last `heartbeat`, and still are the file the record names: their clean
/// pages are what storage holds (step 2 of the module documentation).
fn keepable_files(map: &SharedMap, heartbeat: u64) -> Vec<usize> {
    if heartbeat == 0 {
        return Vec::new();
    }
    let limit = i128::from(heartbeat) - MARGIN.as_nanos() as i128;
    map.files()
        .iter()
        .enumerate()
        .filter(|(_, rec)| rec.state.load(Ordering::Acquire) == LIVE)
        .filter(|(_, rec)| {
            let Some(path) = rec.path() else {
                return false;
            };
            let Ok(meta) = std::fs::metadata(path) else {
                return false;
            };
            let key = (
                rec.dev.load(Ordering::Acquire),
                rec.ino.load(Ordering::Acquire),
            );
            let changed = i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec());
            (meta.dev(), meta.ino()) == key && changed < limit
        })
        .map(|(record, _)| record)
        .collect()
}

/// Step 6 of the module documentation for the files in `keep`: every folio of theirs whose
/// descriptor is believable, marked in `kept`. Every value comes from shared memory and is
/// checked before it is used.
fn keep_clean_folios(map: &SharedMap, keep: &[usize], kept: &mut [bool]) -> Vec<Kept> {
    let table = map.table();
    let files = map.files();
    let mut ids = std::collections::HashMap::new();
    for &record in keep {
        let rec = &files[record];
        let Some(path) = rec.path() else { continue };
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let pages = meta.len().div_ceil(crate::mem::PAGE_SIZE as u64);
        ids.insert(
            rec.mapping_id.load(Ordering::Acquire),
            (record, rec.generation.load(Ordering::Acquire), pages),
        );
    }
    type Folios = Vec<(u32, u64, u8)>;
    let mut by_record: std::collections::BTreeMap<usize, (u32, Folios)> =
        std::collections::BTreeMap::new();
    for (pfn, desc) in table.iter().enumerate() {
        let id = desc.mapping.load(Ordering::Acquire);
        let Some(&(record, generation, pages)) = ids.get(&id) else {
            continue;
        };
        let flags = desc.flags.load(Ordering::Acquire);
        let order = desc.order.load(Ordering::Acquire);
        let index = desc.index.load(Ordering::Acquire);
        let n = 1usize << order.min(9);
        let believable = flags & flag::UPTODATE != 0
            && flags & flag::LOCKED == 0
            && order <= 9
            && pfn % n == 0
            && pfn + n <= table.len()
            && index % n as u64 == 0
            && index.checked_add(n as u64).is_some_and(|end| end <= pages)
            && kept[pfn..pfn + n].iter().all(|k| !k);
        if !believable {
            continue;
        }
        by_record
            .entry(record)
            .or_insert_with(|| (generation, Vec::new()))
            .1
            .push((pfn as u32, index, order));
    }
    let mut adopt = Vec::new();
    for (record, (generation, mut folios)) in by_record {
        // Two folios claiming the same pages of a file: the owner died between putting one
        // in and taking the other out (a copy on write), and which one storage agrees with
        // cannot be told here: neither is kept.
        folios.sort_by_key(|&(_, index, _)| index);
        let mut whole = Vec::with_capacity(folios.len());
        for (i, &(pfn, index, order)) in folios.iter().enumerate() {
            let end = index + (1u64 << order);
            let overlaps_next = folios.get(i + 1).is_some_and(|&(_, next, _)| next < end);
            let overlaps_prev = i > 0 && {
                let (_, prev, prev_order) = folios[i - 1];
                prev + (1u64 << prev_order) > index
            };
            let pages = pfn as usize..pfn as usize + (1usize << order);
            if !overlaps_next && !overlaps_prev && kept[pages.clone()].iter().all(|k| !k) {
                kept[pages].fill(true);
                whole.push((pfn, index, order));
            }
        }
        if !whole.is_empty() {
            adopt.push((record, generation, whole));
        }
    }
    adopt
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
