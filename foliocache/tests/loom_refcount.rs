//! loom models of the folio reference count, both variants.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom_refcount`
//!
//! Each model explores every interleaving (within the preemption bound) of two threads using
//! the very `RefCount` the cache uses (its atomics come from loom under `--cfg loom`).
#![cfg(loom)]

use foliocache::RefcountPolicy;
use foliocache::raw::refcount::{FROZEN, FROZEN_LIMIT, RefCount};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

const BOTH: [RefcountPolicy; 2] = [RefcountPolicy::FrozenBit, RefcountPolicy::Cas];

/// try_get vs freeze: a reader's speculative reference and a remover's freeze at the expected
/// count exclude each other. Either the reader got in first (the freeze fails and the folio
/// stays) or the freeze did (the reader fails): a frozen folio is never referenced.
#[test]
fn try_get_vs_freeze() {
    for policy in BOTH {
        loom::model(move || {
            let count = Arc::new(RefCount::new_free(policy));
            count.init(); // the page cache's reference
            let frozen = Arc::new(AtomicBool::new(false));
            let reader = {
                let (count, frozen) = (count.clone(), frozen.clone());
                thread::spawn(move || {
                    if count.try_get(policy) {
                        // We hold a reference: nobody may have frozen the folio.
                        assert!(
                            !frozen.load(Ordering::SeqCst),
                            "{policy:?}: got a frozen folio"
                        );
                        assert!(!count.put(policy), "the cache still holds its reference");
                        true
                    } else {
                        false
                    }
                })
            };
            let froze = count.freeze(1, policy);
            frozen.store(froze, Ordering::SeqCst);
            let got = reader.join().unwrap();
            if froze {
                assert!(count.is_frozen(policy));
                assert!(
                    !count.try_get(policy),
                    "{policy:?}: frozen count resurrected"
                );
            } else {
                assert!(
                    got,
                    "the freeze can only fail because the reader held a reference"
                );
                assert_eq!(count.count(policy), 1);
            }
        });
    }
}

/// put vs try_get: the owner drops the last reference while a speculative reader tries to take
/// one. Exactly one of them frees the folio, and never while the other holds a reference.
/// (With FrozenBit this is the "staged, abortable zero": the reader may turn 0 into 1, and then
/// the owner's 0 → FROZEN compare-exchange fails and the reader becomes the one who frees.)
#[test]
fn put_vs_try_get_frees_exactly_once() {
    for policy in BOTH {
        loom::model(move || {
            let count = Arc::new(RefCount::new_free(policy));
            count.init(); // the owner's reference
            let frees = Arc::new(AtomicUsize::new(0));
            let reader = {
                let (count, frees) = (count.clone(), frees.clone());
                thread::spawn(move || {
                    if count.try_get(policy) {
                        assert_eq!(
                            frees.load(Ordering::SeqCst),
                            0,
                            "{policy:?}: use after free"
                        );
                        if count.put(policy) {
                            frees.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            };
            if count.put(policy) {
                frees.fetch_add(1, Ordering::SeqCst);
            }
            reader.join().unwrap();
            assert_eq!(
                frees.load(Ordering::SeqCst),
                1,
                "{policy:?}: freed {} times",
                frees.load(Ordering::SeqCst)
            );
            assert!(count.is_frozen(policy));
            assert!(
                !count.try_get(policy),
                "{policy:?}: freed count resurrected"
            );
        });
    }
}

/// The ABA interleaving from seed 002's review, in this design.
///
/// T1 drops the last reference (1 → 0) and is delayed before its 0 → FROZEN compare-exchange.
/// T2 takes a speculative reference (0 → 1), drops it, wins its own compare-exchange and frees
/// the folio; the folio is allocated again (`init`, count 1: a new life), and its new owner
/// drops that reference too (1 → 0). Now T1 resumes: its compare-exchange 0 → FROZEN can
/// succeed, so T1, not the new owner, frees the folio's *second* life.
///
/// In the kernel the worry is that T1 would then run the *first* owner's destructor on a page
/// that changed identity. Here that cannot go wrong: the free path (`Memory::free_frozen`)
/// takes nothing from the caller; it reads the folio's order from the descriptor and returns
/// that block to the allocator, the same action for every kind of owner. What this model
/// checks is what matters for that: every life is freed exactly once (no double free, no
/// leak), and a free never happens while any reference of that life is held.
#[test]
fn aba_from_the_review_frees_each_life_once() {
    let policy = RefcountPolicy::FrozenBit;
    loom::model(move || {
        let count = Arc::new(RefCount::new_free(policy));
        count.init(); // life 1, owned by T1
        let lives = Arc::new(AtomicUsize::new(1));
        let frees = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicUsize::new(1)); // references believed held, all lives
        let free = {
            let (frees, held) = (frees.clone(), held.clone());
            move || {
                assert_eq!(held.load(Ordering::SeqCst), 0, "freed while referenced");
                frees.fetch_add(1, Ordering::SeqCst);
            }
        };
        let t2 = {
            let (count, lives, held, free) =
                (count.clone(), lives.clone(), held.clone(), free.clone());
            thread::spawn(move || {
                if count.try_get(policy) {
                    held.fetch_add(1, Ordering::SeqCst);
                    held.fetch_sub(1, Ordering::SeqCst);
                    if count.put(policy) {
                        free();
                        // The allocator hands the folio out again: life 2.
                        held.fetch_add(1, Ordering::SeqCst);
                        lives.fetch_add(1, Ordering::SeqCst);
                        count.init();
                        held.fetch_sub(1, Ordering::SeqCst);
                        if count.put(policy) {
                            free();
                        }
                    }
                }
            })
        };
        held.fetch_sub(1, Ordering::SeqCst);
        if count.put(policy) {
            free();
        }
        t2.join().unwrap();
        assert_eq!(frees.load(Ordering::SeqCst), lives.load(Ordering::SeqCst));
        assert!(count.is_frozen(policy));
    });
}

/// The overflow guard: failed speculative increments pile garbage onto a frozen count; once the
/// value reaches `0xC000_0000` a failing `try_get` resets it to plain FROZEN. Two racing
/// getters both fail, the value stays frozen and ends below the limit, and a later `init`
/// starts a clean life.
#[test]
fn overflow_guard_keeps_the_count_frozen() {
    let policy = RefcountPolicy::FrozenBit;
    loom::model(move || {
        let count = Arc::new(RefCount::with_raw(FROZEN_LIMIT - 1));
        let other = {
            let count = count.clone();
            thread::spawn(move || assert!(!count.try_get(policy)))
        };
        assert!(!count.try_get(policy));
        other.join().unwrap();
        let raw = count.raw();
        assert!(raw & FROZEN != 0 && raw < FROZEN_LIMIT, "raw {raw:#x}");
        count.init();
        assert!(count.try_get(policy));
        assert_eq!(count.count(policy), 2);
    });
}
