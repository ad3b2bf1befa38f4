//! New programs: the kernel's offsets of served fds (and, in write-back mode, the files' data)
//! are brought up to date before a program can inherit them or read the files. fork does it in
//! its atfork handler; these cover the ways around it.

use super::set_errno;
use crate::real;
use libc::{c_char, c_int};

/// vfork cannot be wrapped (the child would return through this frame on the parent's
/// stack): a plain fork, which runs the atfork handlers, takes its place.
///
/// # Safety
/// vfork(2)'s contract (which fork's satisfies: the child may do more than vfork allows).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: fork has no arguments; callers of vfork only exec or _exit in the child.
    unsafe { libc::fork() }
}

/// # Safety
/// execve(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::execve(path, argv, envp) };
    crate::after_failed_exec(undo);
    rc
}

/// # Safety
/// execv(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::execv(path, argv) };
    crate::after_failed_exec(undo);
    rc
}

/// # Safety
/// execvp(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::execvp(file, argv) };
    crate::after_failed_exec(undo);
    rc
}

/// # Safety
/// execvpe(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::execvpe(file, argv, envp) };
    crate::after_failed_exec(undo);
    rc
}

/// # Safety
/// fexecve(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let undo = crate::before_exec();
    // SAFETY: passed on unchanged.
    let rc = unsafe { real::fexecve(fd, argv, envp) };
    crate::after_failed_exec(undo);
    rc
}

/// The argument list of `execl`, `execle` and `execlp`: variadic in C, received here as
/// [`LIST_ARGS`] fixed pointer arguments (on x86_64 and aarch64 Linux a variadic pointer
/// travels where a fixed one would, see the module doc). The list ends at the first null;
/// for `execle` the environment follows it.
const LIST_ARGS: usize = 32;

/// The arguments up to the null, and what follows it; `None` if there is no null among them.
fn arg_list(args: [*const c_char; LIST_ARGS]) -> Option<(Vec<*const c_char>, *const c_char)> {
    let end = args.iter().position(|arg| arg.is_null())?;
    let mut list = args[..=end].to_vec();
    list[end] = std::ptr::null();
    Some((list, args.get(end + 1).copied().unwrap_or(std::ptr::null())))
}

macro_rules! list_exec {
    ($(#[$doc:meta])* $name:ident, |$path:ident, $list:ident, $after:ident| $call:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The C contract of the function: a NULL-terminated list of C strings.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            $path: *const c_char,
            a0: *const c_char, a1: *const c_char, a2: *const c_char, a3: *const c_char,
            a4: *const c_char, a5: *const c_char, a6: *const c_char, a7: *const c_char,
            a8: *const c_char, a9: *const c_char, a10: *const c_char, a11: *const c_char,
            a12: *const c_char, a13: *const c_char, a14: *const c_char, a15: *const c_char,
            a16: *const c_char, a17: *const c_char, a18: *const c_char, a19: *const c_char,
            a20: *const c_char, a21: *const c_char, a22: *const c_char, a23: *const c_char,
            a24: *const c_char, a25: *const c_char, a26: *const c_char, a27: *const c_char,
            a28: *const c_char, a29: *const c_char, a30: *const c_char,
        ) -> c_int {
            let all = [
                a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,
                a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, std::ptr::null(),
            ];
            let Some(($list, $after)) = arg_list(all) else {
                // More arguments than the library takes through this call: execv takes them.
                set_errno(libc::E2BIG);
                return -1;
            };
            let _ = $after;
            // SAFETY: the list is the caller's NULL-terminated argument list, passed on.
            unsafe { $call }
        }
    };
}

list_exec!(
    /// `execl`: as `execv` (hooked above) with the list.
    execl,
    |path, list, after| execv(path, list.as_ptr())
);
list_exec!(
    /// `execlp`: as `execvp` with the list.
    execlp,
    |path, list, after| execvp(path, list.as_ptr())
);
list_exec!(
    /// `execle`: as `execve` with the list and the environment after it.
    execle,
    |path, list, after| execve(path, list.as_ptr(), after.cast())
);

/// # Safety
/// posix_spawn(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    crate::before_spawn(!actions.is_null());
    // SAFETY: passed on unchanged.
    unsafe { real::posix_spawn(pid, path, actions, attr, argv, envp) }
}

/// # Safety
/// posix_spawnp(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    crate::before_spawn(!actions.is_null());
    // SAFETY: passed on unchanged.
    unsafe { real::posix_spawnp(pid, file, actions, attr, argv, envp) }
}

/// # Safety
/// system(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    crate::before_spawn(false);
    // SAFETY: passed on unchanged.
    unsafe { real::system(command) }
}

/// # Safety
/// popen(3)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    crate::before_spawn(false);
    // SAFETY: passed on unchanged.
    unsafe { real::popen(command, mode) }
}
