//! `foliocache-owner NAME`: the owner process of the shared cache NAME (`docs/SHARED.md`).
//! Programs that attach to a shared cache start it themselves.

fn main() {
    std::process::exit(foliocache::owner_main());
}
