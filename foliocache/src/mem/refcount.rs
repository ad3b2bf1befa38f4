//! The folio reference count: one protocol, two variants (seed 002).
//!
//! A folio's count says how many owners it has. The page cache holds one reference while the
//! folio is in an index, every lookup that returns a folio holds one, and whoever allocated it
//! holds one until it lets go. Readers take their reference *speculatively*: they find a folio in
//! the index without any lock, so by the time they touch its count the folio may have been
//! removed, freed, and even handed out again for another file. Descriptors are never freed
//! (`FolioTable` is type-stable), so touching the count of a stale descriptor is always memory
//! safe; the protocol's job is to make that touch harmless:
//!
//! * [`RefCount::try_get`] refuses to take a reference on a folio that is free or *frozen*, so a
//!   freed folio is never resurrected;
//! * [`RefCount::freeze`] turns "exactly `expected` references" into frozen in one atomic step,
//!   so a remover either sees every reader (and gives up) or no reader can get in after it;
//! * [`RefCount::put`] tells exactly one caller that it dropped the last reference; that caller
//!   frees the folio, reading what to free from the descriptor itself, never from its own idea
//!   of what the folio was.
//!
//! # The two variants ([`RefcountPolicy`])
//!
//! **`Cas`**, the classic kernel encoding before seed 002: zero means dead. `try_get` is "add one
//! unless zero", a load + compare-exchange loop. Under contention every failed CAS reloads and
//! retries, so N readers of one folio serialise on retries.
//!
//! **`FrozenBit`** (seed 002, the default): bit 31 marks frozen/dead and the low 31 bits count.
//! `try_get` is a single `fetch_add`; success iff the *result* has bit 31 clear. A failed
//! increment is left in place: it only dirties the garbage low bits of a frozen value, which the
//! next `init`/`unfreeze` overwrites. So that garbage can never carry into bit 31's neighbour and
//! wrap, a `try_get` that sees the value at or above `0xC000_0000` (frozen plus 2^30 of garbage)
//! resets it to plain `FROZEN` with a compare-exchange: the overflow guard, off the hot path.
//! `put` is decrement-and-test; when it reaches zero it must still win a compare-exchange
//! `0 → FROZEN`, because a speculative getter may have incremented `0 → 1` in between and now
//! owns the folio. Zero is never a resting state: it exists only between a putter's decrement and
//! its compare-exchange.
//!
//! # Memory orderings
//!
//! Every read-modify-write that decides ownership (`try_get`'s add, `put`'s decrement, `freeze`)
//! is `SeqCst`, as the kernel's fully ordered atomics; the follow-up `0 → FROZEN` compare-exchange
//! is `Acquire` on success so that the freeing thread sees every earlier owner's writes to the
//! folio before the memory is reused (the acquire fence of `Arc::drop`, for the same reason).
//! The overflow reset is `Relaxed`: it acts on one location whose RMW order is total and
//! publishes nothing. `init` and `unfreeze` are `Release` stores: a getter whose increment lands
//! after them synchronises with everything the allocating or unfreezing thread did before, in
//! particular with the removal of the folio's previous identity from its index, which is what
//! makes the reader's re-check of the index slot (`reload`) meaningful. The loom models in
//! `tests/loom_refcount.rs` and `tests/loom_lookup.rs` check these claims.
//!
//! # Two objections to the upstream series, and why ours holds
//!
//! Two flaws were found in versions of the kernel's frozen-bit series. Each has a loom model in
//! `tests/loom_refcount.rs` that runs on this protocol and on one with the flaw, and must
//! fail on the flawed one (a `should_panic` test), so the model is known to catch it.
//!
//! * **The frozen bit must stay set on a freed folio** (Linus Torvalds). A free path that
//!   left the count at 0 would let a speculative getter's `fetch_add` turn 0 into 1, a
//!   success on a free folio; its validation would fail, its `put` would win `0 → FROZEN`,
//!   and it would free the folio a second time. Here the count is FROZEN from the winning
//!   `put` (or a `freeze`) until the allocator's [`init`](RefCount::init) of the next life:
//!   `Memory::free_frozen` and the buddy allocator never write the count, and the only other
//!   writers are `init` (a new life, after the block left the free lists, or a
//!   staging folio or a clean folio a new owner keeps from a dead owner, whose references
//!   all died with it), `unfreeze` (by a freezer that holds the folio) and `reset_free` (a new shared mapping's table, before any
//!   other process sees it, or a takeover, after the dead owner, the only process that took
//!   references, has fully exited). Model: `linus_frozen_bit_stays_on_a_freed_folio`.
//! * **ABA on the last put** (an automated review of v4, June 2026). A putter delayed between
//!   its decrement to 0 and its `0 → FROZEN` exchange can find 0 again on a *later* life of the
//!   folio (a getter revived the old life, freed it, the folio was handed out again and its new
//!   owner dropped its last reference) and win the exchange there. Ours lets it win too: a
//!   count at 0 is a life whose last reference is gone, whichever life that is, and exactly one
//!   exchange succeeds, so each life is freed once. What must not happen is the kernel's
//!   worry, that the winner then runs the destructor of the folio *it* knew. Ours has no
//!   per-caller destructor: `put` returns only "you freed it", and `Memory::free_frozen` reads
//!   what to free (the order, the flags, whether it was ever published) from the descriptor
//!   itself, the same action for every owner. Model:
//!   `aba_review_each_life_is_freed_once_by_its_own_destructor`.
//!
//! In a shared cache only the owner process takes references (clients read optimistically,
//! `docs/SHARED.md`), so a count never holds a reference of a process that died while another
//! process can still change it: when the owner dies, a new one resets every count it keeps.
//!
//! # What each variant guarantees
//!
//! Both: `try_get` never succeeds on a free or frozen count; `freeze(n)` succeeds only when the
//! count is exactly `n` and no reference can be taken until `unfreeze` or a new `init`; exactly
//! one `put` of a count's last reference reports `true`. `FrozenBit` additionally makes a
//! successful `try_get` wait-free (one instruction) and a failed one cheap.

use crate::sync::{AtomicU32, Ordering};

/// Which reference-count protocol a cache uses (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RefcountPolicy {
    /// Seed 002: bit 31 marks frozen; `try_get` is one `fetch_add`. The default.
    #[default]
    FrozenBit,
    /// The classic protocol: zero means dead; `try_get` is an add-unless-zero CAS loop.
    Cas,
}

/// Bit 31: the count is frozen (FrozenBit variant).
pub const FROZEN: u32 = 1 << 31;
/// At or above this value a frozen count's garbage is reset to [`FROZEN`].
pub const FROZEN_LIMIT: u32 = 0xC000_0000;

/// A folio reference count. The policy is passed to every call rather than stored, because it
/// is a property of the whole cache and the descriptor must stay small.
#[derive(Debug)]
#[repr(transparent)]
pub struct RefCount(AtomicU32);

impl RefCount {
    /// A count in the free state of `policy` (what a descriptor holds before its first use).
    pub fn new_free(policy: RefcountPolicy) -> Self {
        Self(AtomicU32::new(free_value(policy)))
    }

    /// A count holding `value` as is: for tests and model checking (e.g. a frozen value with
    /// runaway garbage, to exercise the overflow guard).
    pub fn with_raw(value: u32) -> Self {
        Self(AtomicU32::new(value))
    }

    /// Stores `value` as is, whatever the count holds: only for model checking a flawed
    /// protocol (`tests/loom_refcount.rs` builds a free path that clears the count this way,
    /// to show its model catches the double free that follows). The cache never calls it.
    #[doc(hidden)]
    pub fn store_raw(&self, value: u32) {
        self.0.store(value, Ordering::Release);
    }

    /// Puts the count in the free state of `policy` (a new shared mapping's table).
    #[cfg(not(loom))]
    pub(crate) fn reset_free(&self, policy: RefcountPolicy) {
        self.0.store(free_value(policy), Ordering::Relaxed);
    }

    /// Gives a freshly allocated folio its first reference. Only the allocator calls this, on a
    /// count that is free (frozen); it overwrites any garbage left by failed speculative getters.
    pub fn init(&self) {
        self.0.store(1, Ordering::Release);
    }

    /// Takes a reference unless the folio is free or frozen. See the module documentation.
    #[inline]
    pub fn try_get(&self, policy: RefcountPolicy) -> bool {
        match policy {
            RefcountPolicy::FrozenBit => {
                let now = self.0.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
                if now & FROZEN == 0 {
                    check_overflow(now);
                    return true;
                }
                self.reset_garbage(now);
                false
            }
            RefcountPolicy::Cas => {
                let mut current = self.0.load(Ordering::Relaxed);
                loop {
                    if current == 0 {
                        return false;
                    }
                    check_overflow(current.wrapping_add(1));
                    match self.0.compare_exchange_weak(
                        current,
                        current + 1,
                        Ordering::SeqCst,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return true,
                        Err(seen) => current = seen,
                    }
                }
            }
        }
    }

    /// The overflow guard of the FrozenBit variant: runs only after a failed `try_get`.
    #[cold]
    fn reset_garbage(&self, mut seen: u32) {
        while seen >= FROZEN_LIMIT {
            match self
                .0
                .compare_exchange(seen, FROZEN, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
    }

    /// Takes another reference; the caller must already hold one (the count is live).
    #[inline]
    pub fn get(&self) {
        let before = self.0.fetch_add(1, Ordering::Relaxed);
        debug_assert!(before != 0 && before & FROZEN == 0, "get on a dead folio");
        check_overflow(before.wrapping_add(1));
    }

    /// Drops a reference. Returns `true` for exactly one caller: the one that dropped the last
    /// reference and must now free the folio (the count is then frozen / zero).
    #[inline]
    pub fn put(&self, policy: RefcountPolicy) -> bool {
        let before = self.0.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before != 0 && before & FROZEN == 0, "put on a dead folio");
        if before != 1 {
            return false;
        }
        match policy {
            RefcountPolicy::Cas => true,
            // Zero is only "staged for freeing": a speculative getter may have made it 1 again,
            // in which case it owns the folio now and will run this same sequence itself.
            RefcountPolicy::FrozenBit => self
                .0
                .compare_exchange(0, FROZEN, Ordering::Acquire, Ordering::Relaxed)
                .is_ok(),
        }
    }

    /// Freezes the count if it is exactly `expected` (the caller's references included).
    /// On success no reference can be taken until [`unfreeze`](Self::unfreeze) or a new
    /// [`init`](Self::init); on failure nothing changed.
    #[inline]
    pub fn freeze(&self, expected: u32, policy: RefcountPolicy) -> bool {
        debug_assert!(expected != 0 && expected & FROZEN == 0);
        self.0
            .compare_exchange(
                expected,
                free_value(policy),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Makes a frozen count live again with `count` references (overwriting FrozenBit garbage).
    #[inline]
    pub fn unfreeze(&self, count: u32) {
        debug_assert!(count != 0 && count & FROZEN == 0);
        self.0.store(count, Ordering::Release);
    }

    /// The number of references; 0 for a free or frozen count.
    pub fn count(&self, policy: RefcountPolicy) -> u32 {
        let value = self.0.load(Ordering::Acquire);
        match policy {
            RefcountPolicy::FrozenBit if value & FROZEN != 0 => 0,
            _ => value,
        }
    }

    /// Whether the count is free or frozen.
    pub fn is_frozen(&self, policy: RefcountPolicy) -> bool {
        let value = self.0.load(Ordering::Acquire);
        match policy {
            RefcountPolicy::FrozenBit => value & FROZEN != 0,
            RefcountPolicy::Cas => value == 0,
        }
    }

    /// The raw value, for tests and debugging.
    pub fn raw(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }
}

/// The most references a folio may have. Like `std::sync::Arc`, taking a reference beyond it
/// aborts the process: only leaked references (forgotten guards) can get there, and going on
/// would set the frozen bit (lookups of the folio would then spin forever) or, past 2^32,
/// wrap the count to a live-looking small value (a use after free). The limit is far below
/// either, and checking it costs one compare on a value already in a register.
pub const MAX_REFS: u32 = 1 << 30;

/// Aborts if a count just taken is above [`MAX_REFS`] (see there).
#[inline]
fn check_overflow(count: u32) {
    if count > MAX_REFS {
        overflow_abort();
    }
}

#[cold]
#[inline(never)]
fn overflow_abort() -> ! {
    eprintln!(
        "foliocache: a folio reference count passed {MAX_REFS} (leaked references); aborting"
    );
    std::process::abort();
}

/// The value of a free or frozen count under `policy`.
pub const fn free_value(policy: RefcountPolicy) -> u32 {
    match policy {
        RefcountPolicy::FrozenBit => FROZEN,
        RefcountPolicy::Cas => 0,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const BOTH: [RefcountPolicy; 2] = [RefcountPolicy::FrozenBit, RefcountPolicy::Cas];

    #[test]
    fn free_count_refuses_try_get() {
        for policy in BOTH {
            let count = RefCount::new_free(policy);
            assert!(!count.try_get(policy));
            assert!(count.is_frozen(policy));
            assert_eq!(count.count(policy), 0);
        }
    }

    #[test]
    fn last_put_is_reported_once() {
        for policy in BOTH {
            let count = RefCount::new_free(policy);
            count.init();
            assert!(count.try_get(policy));
            assert_eq!(count.count(policy), 2);
            assert!(!count.put(policy));
            assert!(count.put(policy));
            assert!(count.is_frozen(policy));
            assert!(
                !count.try_get(policy),
                "a freed count must not be resurrected"
            );
        }
    }

    #[test]
    fn freeze_needs_the_exact_count() {
        for policy in BOTH {
            let count = RefCount::new_free(policy);
            count.init();
            count.get();
            assert!(!count.freeze(1, policy));
            assert_eq!(count.count(policy), 2);
            assert!(count.freeze(2, policy));
            assert!(!count.try_get(policy));
            count.unfreeze(3);
            assert_eq!(count.count(policy), 3);
        }
    }

    #[test]
    fn failed_try_get_leaves_garbage_that_unfreeze_overwrites() {
        let policy = RefcountPolicy::FrozenBit;
        let count = RefCount::new_free(policy);
        for _ in 0..10 {
            assert!(!count.try_get(policy));
        }
        assert_eq!(count.raw(), FROZEN + 10);
        assert_eq!(count.count(policy), 0);
        count.init();
        assert_eq!(count.raw(), 1);
    }

    #[test]
    fn overflow_guard_resets_runaway_garbage() {
        let policy = RefcountPolicy::FrozenBit;
        let count = RefCount(AtomicU32::new(FROZEN_LIMIT - 1));
        // This failed increment reaches the limit: the guard resets the value to FROZEN.
        assert!(!count.try_get(policy));
        assert_eq!(count.raw(), FROZEN);
        // Right at the wrap point the guard also holds: 0xFFFF_FFFF + 1 would wrap to 0, a live
        // looking value, which is exactly what the guard exists to prevent long before.
        let count = RefCount(AtomicU32::new(u32::MAX - 1));
        assert!(!count.try_get(policy));
        assert_eq!(count.raw(), FROZEN);
    }
}
