//! The process's one runtime for object requests: a small tokio runtime of its own, so the
//! blocking API works from any thread (with or without a runtime of the caller's) and the
//! async API's requests do not depend on the caller's executor or its timer.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::runtime::{Builder, Handle, Runtime};

/// Worker threads: the requests are I/O bound; two keep a completion from waiting behind a
/// copy into folio memory.
const WORKERS: usize = 2;

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("foliocache-object")
            .enable_all()
            .build()
            .unwrap_or_else(|error| {
                // Without threads there is nothing this crate can do; say why plainly.
                panic!("foliocache-object: cannot start its runtime threads: {error}")
            })
    })
}

/// The runtime's handle, to spawn requests on.
pub(crate) fn handle() -> &'static Handle {
    runtime().handle()
}

/// Runs `future` on the runtime and waits for it in the calling thread, which may be any
/// thread, a caller's runtime worker included (it blocks that worker, as any blocking call
/// does; the async API never comes here on its read path).
pub(crate) fn wait<T: Send + 'static>(future: impl Future<Output = T> + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    handle().spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv()
        .unwrap_or_else(|_| panic!("foliocache-object: a request task ended without an answer"))
}

/// Resolves after `after`, in any executor (the timer is this runtime's).
pub(crate) async fn sleep(after: Duration) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    handle().spawn(async move {
        tokio::time::sleep(after).await;
        let _ = tx.send(());
    });
    let _ = rx.await;
}

/// Runs blocking `work` on the runtime's blocking threads and awaits it from any executor.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match handle().spawn_blocking(work).await {
        Ok(out) => out,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}
