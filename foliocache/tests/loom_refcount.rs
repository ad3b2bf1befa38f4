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

/// How a model's free path behaves: ours, or with one of the two flaws raised against the
/// upstream frozen-bit series (see the refcount module's documentation, "Two objections").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FreePath {
    /// foliocache's: the count stays FROZEN from the last put until the next life's `init`,
    /// and the free reads what it destroys from the descriptor (`Memory::free_frozen`).
    Ours,
    /// The free path leaves the count at 0 instead of frozen (Linus Torvalds' objection).
    ClearsCount,
    /// The last putter runs the destructor of the folio it held a reference to, not of the
    /// folio the descriptor now describes (the ABA of the v4 review).
    CallersDestructor,
}

/// A descriptor in the models below: the count, what the current life is (its number and
/// its kind, the "folio type" whose destructor must run), and what happened to each life.
struct Folio {
    count: RefCount,
    life: AtomicUsize,
    kind: AtomicUsize,
    in_index: AtomicBool,
    frees: [AtomicUsize; 3],
    violations: Violations,
}

/// What a model found wrong, over all its executions. A model records instead of panicking, so
/// that a flawed protocol's violation, found in a spawned thread, is reported by the test
/// rather than aborting it (a panic in a loom thread tears the whole run down).
type Violations = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

fn check(violations: &Violations, ok: bool, what: impl FnOnce() -> String) {
    if !ok {
        violations.lock().unwrap().push(what());
    }
}

/// Runs `model` under loom and returns what it found wrong in any execution.
fn violations_of(model: impl Fn(Violations) + Send + Sync + 'static) -> Vec<String> {
    let violations = Violations::default();
    let found = violations.clone();
    loom::model(move || model(found.clone()));
    let list = violations.lock().unwrap().clone();
    list
}

impl Folio {
    fn new(kind: usize, violations: Violations) -> Self {
        let folio = Folio {
            count: RefCount::new_free(RefcountPolicy::FrozenBit),
            life: AtomicUsize::new(1),
            kind: AtomicUsize::new(kind),
            in_index: AtomicBool::new(true),
            frees: [
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
            ],
            violations,
        };
        folio.count.init();
        folio
    }

    /// Frees the current life after a last put (or a won compare-exchange). `known_kind` is
    /// the kind the caller believed the folio to be when it took its reference.
    fn free(&self, known_kind: usize, path: FreePath) {
        let life = self.life.load(Ordering::SeqCst);
        let kind = self.kind.load(Ordering::SeqCst);
        let destructor = match path {
            FreePath::CallersDestructor => known_kind,
            FreePath::Ours | FreePath::ClearsCount => kind,
        };
        check(&self.violations, destructor == kind, || {
            format!(
                "{path:?}: the destructor of kind {destructor} ran on life {life}, of kind {kind}"
            )
        });
        let before = self.frees[life].fetch_add(1, Ordering::SeqCst);
        check(&self.violations, before == 0, || {
            format!("{path:?}: double free of life {life}")
        });
        if path == FreePath::ClearsCount {
            self.count.store_raw(0);
        }
    }

    /// The allocator hands the (freed) folio out again, as `kind`: the next life.
    fn reallocate(&self, kind: usize) {
        self.life.fetch_add(1, Ordering::SeqCst);
        self.kind.store(kind, Ordering::SeqCst);
        self.in_index.store(true, Ordering::SeqCst);
        self.count.init();
    }
}

/// Linus Torvalds' objection to the frozen-bit series: the frozen bit must stay set on a freed
/// folio. A remover takes the folio out of the index and drops the cache's last reference,
/// freeing it; a speculative reader found it in the index just before and now takes a
/// reference, checks the index again, finds the folio gone and drops its reference. If the
/// free had left the count at 0, the reader's `fetch_add` would make it 1 (a "success" on a
/// free folio), its `put` would bring it to 0 and win the 0 → FROZEN exchange, and it would
/// free the folio a second time.
fn frozen_bit_stays_on_a_freed_folio(path: FreePath) -> Vec<String> {
    let policy = RefcountPolicy::FrozenBit;
    violations_of(move |violations| {
        let folio = Arc::new(Folio::new(1, violations.clone()));
        let reader = {
            let folio = folio.clone();
            thread::spawn(move || {
                // Speculative lookup: found in the index, then the reference, then the re-check.
                if !folio.in_index.load(Ordering::SeqCst) || !folio.count.try_get(policy) {
                    return;
                }
                if folio.in_index.load(Ordering::SeqCst) {
                    let freed = folio.frees[1].load(Ordering::SeqCst);
                    check(&folio.violations, freed == 0, || "use after free".into());
                }
                if folio.count.put(policy) {
                    folio.free(1, path);
                }
            })
        };
        folio.in_index.store(false, Ordering::SeqCst);
        if folio.count.put(policy) {
            folio.free(1, path);
        }
        reader.join().unwrap();
        let frees = folio.frees[1].load(Ordering::SeqCst);
        check(&violations, frees >= 1, || "life 1 leaked".into());
    })
}

#[test]
fn linus_frozen_bit_stays_on_a_freed_folio() {
    let found = frozen_bit_stays_on_a_freed_folio(FreePath::Ours);
    assert!(found.is_empty(), "{found:?}");
}

/// The same model on a free path that clears the count: it must find the double free.
#[test]
fn linus_objection_model_finds_a_free_path_that_clears_the_count() {
    let found = frozen_bit_stays_on_a_freed_folio(FreePath::ClearsCount);
    assert!(
        found.iter().any(|v| v.contains("double free of life 1")),
        "the model missed the flaw: {found:?}"
    );
}

/// The ABA race of the v4 review (June 2026). T1 drops the last reference of life 1 (1 → 0)
/// and is delayed before its 0 → FROZEN compare-exchange. T2 takes a speculative reference
/// (0 → 1), drops it, wins its own exchange and frees life 1; the allocator hands the folio
/// out again as another kind (life 2), and its owner drops that reference too (1 → 0). Now
/// T1 resumes and its exchange 0 → FROZEN succeeds: T1, not life 2's owner, frees life 2. A
/// free path that runs the destructor its caller knew (life 1's kind) runs the wrong one;
/// ours reads the kind from the descriptor, so whoever wins frees what is there, once.
fn aba_on_the_last_put(path: FreePath, policy: RefcountPolicy) -> Vec<String> {
    violations_of(move |violations| {
        let folio = Arc::new(Folio::new(1, violations.clone()));
        let t2 = {
            let folio = folio.clone();
            thread::spawn(move || {
                if folio.count.try_get(policy) && folio.count.put(policy) {
                    folio.free(1, path);
                    folio.reallocate(2);
                    if folio.count.put(policy) {
                        folio.free(2, path);
                    }
                }
            })
        };
        // T1 holds life 1's only reference, a folio of kind 1.
        if folio.count.put(policy) {
            folio.free(1, path);
        }
        t2.join().unwrap();
        let lives = folio.life.load(Ordering::SeqCst);
        for life in 1..=lives {
            let frees = folio.frees[life].load(Ordering::SeqCst);
            check(&violations, frees >= 1, || format!("life {life} leaked"));
        }
        check(&violations, folio.count.is_frozen(policy), || {
            "the count is not frozen at the end".into()
        });
    })
}

#[test]
fn aba_review_each_life_is_freed_once_by_its_own_destructor() {
    for policy in BOTH {
        let found = aba_on_the_last_put(FreePath::Ours, policy);
        assert!(found.is_empty(), "{policy:?}: {found:?}");
    }
}

/// The same model on a free path that runs the caller's destructor: it must find the ABA.
#[test]
fn aba_model_finds_a_free_path_that_runs_the_callers_destructor() {
    let found = aba_on_the_last_put(FreePath::CallersDestructor, RefcountPolicy::FrozenBit);
    assert!(
        found
            .iter()
            .any(|v| v.contains("the destructor of kind 1 ran on life 2, of kind 2")),
        "the model missed the flaw: {found:?}"
    );
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
