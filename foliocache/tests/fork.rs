//! `foliocache::fork`: a child process forgets the epoch pins and the deferred frees of the
//! threads that did not come along (one binary, one test: the child shares no harness thread's
//! work). A pin left behind would hold every grace period back in the child, so freed folios
//! would never return to its cache's allocator.
#![cfg(not(loom))]

use foliocache::raw::epoch;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;

fn collect_a_few_times() {
    for _ in 0..4 {
        epoch::collect();
    }
}

#[test]
fn a_child_forgets_pins_and_deferred_frees_of_threads_that_did_not_come_along() {
    let (pinned_tx, pinned_rx) = channel();
    let (go_tx, go_rx) = channel::<()>();
    let reader = std::thread::spawn(move || {
        let guard = epoch::pin();
        pinned_tx.send(()).unwrap();
        let _ = go_rx.recv();
        drop(guard);
    });
    pinned_rx.recv().unwrap();
    let parents = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&parents);
    epoch::defer(move || flag.store(true, Ordering::SeqCst));
    collect_a_few_times();
    assert!(
        !parents.load(Ordering::SeqCst),
        "ran while a pin held it back"
    );

    let prepared = foliocache::fork::prepare();
    // SAFETY: fork in a test binary with this one test; the child only uses the epoch (and the
    // allocator, which glibc makes fork-safe) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        prepared.child();
        let childs = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&childs);
        epoch::defer(move || flag.store(true, Ordering::SeqCst));
        collect_a_few_times();
        // Exit code bits: 1, the child's function did not run or something is still pending
        // (the reader's pin holds the child back); 2, the parent's function ran in the child.
        let code = i32::from(!childs.load(Ordering::SeqCst))
            | (i32::from(parents.load(Ordering::SeqCst)) << 1)
            | i32::from(epoch::pending() != 0);
        // SAFETY: leaving the child without running the harness's exit code.
        unsafe { libc::_exit(code) };
    }
    prepared.parent();
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid status pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child exit code (see above)");

    // In the parent nothing changed: the pin still holds the function back, until it goes.
    collect_a_few_times();
    assert!(!parents.load(Ordering::SeqCst));
    go_tx.send(()).unwrap();
    reader.join().unwrap();
    collect_a_few_times();
    assert!(
        parents.load(Ordering::SeqCst),
        "never ran after the pin was gone"
    );
}
