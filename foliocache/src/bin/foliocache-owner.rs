//! `foliocache-owner NAME`: the owner process of the shared cache NAME (`docs/SHARED.md`).
//! Programs that attach to a shared cache start it themselves.

#[cfg(not(loom))]
fn main() {
    std::process::exit(foliocache::owner_main());
}

/// Under loom (the models' build) there is no shared cache, so no owner.
#[cfg(loom)]
fn main() {}
