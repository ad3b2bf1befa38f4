//! The settings a shared cache is created with, as the words of its header: the first client's
//! `CacheBuilder` settings, which the owner it starts builds the cache from (later clients get
//! the cache as it is). Each word's meaning is fixed by its position; `CacheBuilder` encodes
//! and checks them (`cache.rs`).

/// The memory budget in bytes.
pub(crate) const CAPACITY: usize = 0;
pub(crate) const MAX_ORDER: usize = 1;
pub(crate) const HUGE_PAGES: usize = 2;
pub(crate) const REFCOUNT: usize = 3;
pub(crate) const READ: usize = 4;
pub(crate) const SMALL_READ: usize = 5;
pub(crate) const INSERT: usize = 6;
pub(crate) const EXEC_ORDER: usize = 7;
pub(crate) const RECLAIM: usize = 8;
pub(crate) const WRITEBACK_ERROR: usize = 9;
pub(crate) const ENGINE: usize = 10;
pub(crate) const RA_BYTES: usize = 11;
pub(crate) const IO_BYTES: usize = 12;
pub(crate) const REQUEST_BYTES: usize = 13;
/// `f64::to_bits` of the ratio.
pub(crate) const DIRTY_BACKGROUND: usize = 14;
/// `f64::to_bits` of the ratio.
pub(crate) const DIRTY_RATIO: usize = 15;
pub(crate) const DIRTY_EXPIRE_MS: usize = 16;
pub(crate) const WRITEBACK_INTERVAL_MS: usize = 17;
pub(crate) const WRITE_BEHIND: usize = 18;
/// Seconds the owner waits for a client once the last one left.
pub(crate) const IDLE_SECS: usize = 19;

/// The policies the settings words name; a word out of range is an error (a corrupted or
/// foreign header).
pub(crate) fn policy(
    words: &[u64; crate::mem::shared::SETTINGS_WORDS],
) -> Result<crate::policy::Policy, crate::error::Error> {
    use crate::policy::{InsertPolicy, ReadPolicy, ReclaimPolicy, SmallReadPolicy};
    use crate::policy::{RefcountPolicy, WritebackErrorPolicy};
    let pick = |i: usize, n: u64, what: &str| {
        if words[i] < n {
            Ok(words[i] as usize)
        } else {
            Err(crate::error::Error::SharedMapping(format!(
                "settings word {what} is out of range"
            )))
        }
    };
    Ok(crate::policy::Policy {
        refcount: [RefcountPolicy::FrozenBit, RefcountPolicy::Cas][pick(REFCOUNT, 2, "refcount")?],
        read: [ReadPolicy::Batched, ReadPolicy::PerFolio][pick(READ, 2, "read")?],
        small_read: [SmallReadPolicy::Optimistic, SmallReadPolicy::Refcounted]
            [pick(SMALL_READ, 2, "small_read")?],
        insert: [InsertPolicy::Batched, InsertPolicy::Single][pick(INSERT, 2, "insert")?],
        exec_order: pick(
            EXEC_ORDER,
            u64::from(crate::mem::MAX_ORDER) + 1,
            "exec_order",
        )? as u8,
        reclaim: [
            ReclaimPolicy::Workingset,
            ReclaimPolicy::TwoLists,
            ReclaimPolicy::Clock,
        ][pick(RECLAIM, 3, "reclaim")?],
        writeback_error: [
            WritebackErrorPolicy::KeepDirty,
            WritebackErrorPolicy::Discard,
        ][pick(WRITEBACK_ERROR, 2, "writeback_error")?],
    })
}
