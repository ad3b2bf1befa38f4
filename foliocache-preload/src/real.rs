//! The real functions: the next definition of each interposed symbol (libc's), found with
//! `dlsym(RTLD_NEXT)` on first use and kept in an atomic.
//!
//! Each wrapper has the C signature of its symbol. A symbol libc does not have (an old glibc
//! without `preadv2`, say) makes its wrapper fail with `ENOSYS`, as a missing system call
//! would. `dlsym` may allocate; it takes none of the locks this library takes, so calling it
//! from a hook is fine (and hooks entered from inside `dlsym` pass straight through, see
//! `guard`).

use libc::{c_char, c_int, c_uint, c_void, iovec, mode_t, off64_t, size_t, ssize_t};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Resolves `name` (NUL-terminated) to the next definition after this library, or 0.
fn resolve(name: &'static str) -> usize {
    debug_assert!(name.ends_with('\0'));
    // SAFETY: `name` is a NUL-terminated static string; RTLD_NEXT is a valid pseudo-handle
    // for a call made from a shared object.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) as usize }
}

/// Sets errno to ENOSYS (for a symbol libc lacks).
fn no_such_symbol() {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
}

macro_rules! real_functions {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(, ...$var:ident: $vty:ty)?) -> $ret:ty = $fail:expr; )*) => {
        $(
            /// The real (libc's) function of this name.
            ///
            /// # Safety
            /// As the C function: the caller passes what its C signature asks for.
            #[allow(clippy::unused_unit)] // `-> ()` for the C functions that return nothing
            pub(crate) unsafe fn $name($($arg: $ty),* $(, $var: $vty)?) -> $ret {
                static ADDRESS: AtomicUsize = AtomicUsize::new(0);
                let mut address = ADDRESS.load(Ordering::Relaxed);
                if address == 0 {
                    address = resolve(concat!(stringify!($name), "\0"));
                    if address == 0 {
                        no_such_symbol();
                        return $fail;
                    }
                    ADDRESS.store(address, Ordering::Relaxed);
                }
                real_functions!(@call address, $ret, ($($arg: $ty),*) $(, $var: $vty)?)
            }
        )*
    };
    (@call $address:ident, $ret:ty, ($($arg:ident: $ty:ty),*)) => {{
        type Function = unsafe extern "C" fn($($ty),*) -> $ret;
        // SAFETY: `address` is the non-null address dlsym gave for this symbol, whose C
        // signature is the one written above (the C library's prototype).
        let function = unsafe { std::mem::transmute::<usize, Function>($address) };
        // SAFETY: the caller's promise covers the arguments.
        unsafe { function($($arg),*) }
    }};
    (@call $address:ident, $ret:ty, ($($arg:ident: $ty:ty),*), $var:ident: $vty:ty) => {{
        type Function = unsafe extern "C" fn($($ty),*, ...) -> $ret;
        // SAFETY: as above; the symbol is variadic in C, and is called as such.
        let function = unsafe { std::mem::transmute::<usize, Function>($address) };
        // SAFETY: the caller's promise covers the arguments.
        unsafe { function($($arg),*, $var) }
    }};
}

real_functions! {
    fn open(path: *const c_char, flags: c_int, ...mode: c_uint) -> c_int = -1;
    fn open64(path: *const c_char, flags: c_int, ...mode: c_uint) -> c_int = -1;
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, ...mode: c_uint) -> c_int = -1;
    fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, ...mode: c_uint) -> c_int = -1;
    fn creat(path: *const c_char, mode: mode_t) -> c_int = -1;
    fn creat64(path: *const c_char, mode: mode_t) -> c_int = -1;
    fn close(fd: c_int) -> c_int = -1;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int = -1;
    fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t = -1;
    fn pread64(fd: c_int, buf: *mut c_void, count: size_t, offset: off64_t) -> ssize_t = -1;
    fn readv(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t = -1;
    fn preadv64(fd: c_int, iov: *const iovec, count: c_int, offset: off64_t) -> ssize_t = -1;
    fn preadv64v2(fd: c_int, iov: *const iovec, count: c_int, offset: off64_t, flags: c_int) -> ssize_t = -1;
    fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t = -1;
    fn pwrite64(fd: c_int, buf: *const c_void, count: size_t, offset: off64_t) -> ssize_t = -1;
    fn writev(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t = -1;
    fn pwritev64(fd: c_int, iov: *const iovec, count: c_int, offset: off64_t) -> ssize_t = -1;
    fn pwritev64v2(fd: c_int, iov: *const iovec, count: c_int, offset: off64_t, flags: c_int) -> ssize_t = -1;
    fn lseek64(fd: c_int, offset: off64_t, whence: c_int) -> off64_t = -1;
    fn ftruncate64(fd: c_int, len: off64_t) -> c_int = -1;
    fn truncate64(path: *const c_char, len: off64_t) -> c_int = -1;
    fn fallocate64(fd: c_int, mode: c_int, offset: off64_t, len: off64_t) -> c_int = -1;
    fn posix_fallocate64(fd: c_int, offset: off64_t, len: off64_t) -> c_int = libc::ENOSYS;
    fn posix_fadvise64(fd: c_int, offset: off64_t, len: off64_t, advice: c_int) -> c_int = libc::ENOSYS;
    fn readahead(fd: c_int, offset: off64_t, count: size_t) -> ssize_t = -1;
    fn dup(fd: c_int) -> c_int = -1;
    fn dup2(fd: c_int, new: c_int) -> c_int = -1;
    fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int = -1;
    fn fcntl(fd: c_int, cmd: c_int, ...arg: usize) -> c_int = -1;
    fn fcntl64(fd: c_int, cmd: c_int, ...arg: usize) -> c_int = -1;
    fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off64_t) -> *mut c_void = libc::MAP_FAILED;
    fn copy_file_range(fd_in: c_int, off_in: *mut off64_t, fd_out: c_int, off_out: *mut off64_t, len: size_t, flags: c_uint) -> ssize_t = -1;
    fn sendfile64(out_fd: c_int, in_fd: c_int, offset: *mut off64_t, count: size_t) -> ssize_t = -1;
    fn splice(fd_in: c_int, off_in: *mut off64_t, fd_out: c_int, off_out: *mut off64_t, len: size_t, flags: c_uint) -> ssize_t = -1;
    fn fsync(fd: c_int) -> c_int = -1;
    fn syncfs(fd: c_int) -> c_int = -1;
    fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int = -1;
    fn stat64(path: *const c_char, buf: *mut libc::stat64) -> c_int = -1;
    fn lstat64(path: *const c_char, buf: *mut libc::stat64) -> c_int = -1;
    fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int = -1;
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int = -1;
    fn __fxstat64(version: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int = -1;
    fn __xstat64(version: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int = -1;
    fn __lxstat64(version: c_int, path: *const c_char, buf: *mut libc::stat64) -> c_int = -1;
    fn __fxstatat64(version: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat64, flags: c_int) -> c_int = -1;
    fn fdatasync(fd: c_int) -> c_int = -1;
    fn sync_file_range(fd: c_int, offset: off64_t, nbytes: off64_t, flags: c_uint) -> c_int = -1;
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int = -1;
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int = -1;
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int = -1;
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int = -1;
    fn posix_spawn(pid: *mut libc::pid_t, path: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int = libc::ENOSYS;
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int = libc::ENOSYS;
    fn system(command: *const c_char) -> c_int = -1;
    fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
    fn __read_chk(fd: c_int, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t = -1;
    fn __pread64_chk(fd: c_int, buf: *mut c_void, count: size_t, offset: off64_t, buflen: size_t) -> ssize_t = -1;
    fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
    fn fclose(stream: *mut libc::FILE) -> c_int = libc::EOF;
    fn fileno(stream: *mut libc::FILE) -> c_int = -1;
    fn fileno_unlocked(stream: *mut libc::FILE) -> c_int = -1;
    fn fflush(stream: *mut libc::FILE) -> c_int = libc::EOF;
    fn freopen(path: *const c_char, mode: *const c_char, stream: *mut libc::FILE) -> *mut libc::FILE = std::ptr::null_mut();
    fn freopen64(path: *const c_char, mode: *const c_char, stream: *mut libc::FILE) -> *mut libc::FILE = std::ptr::null_mut();
    fn ioctl(fd: c_int, request: libc::c_ulong, ...arg: usize) -> c_int = -1;
    fn sigaction(signum: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int = -1;
    fn signal(signum: c_int, handler: libc::sighandler_t) -> libc::sighandler_t = libc::SIG_ERR;
    fn sigset(signum: c_int, handler: libc::sighandler_t) -> libc::sighandler_t = libc::SIG_ERR;
    fn bsd_signal(signum: c_int, handler: libc::sighandler_t) -> libc::sighandler_t = libc::SIG_ERR;
    fn sysv_signal(signum: c_int, handler: libc::sighandler_t) -> libc::sighandler_t = libc::SIG_ERR;
    fn closefrom(lowfd: c_int) -> () = ();
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int = -1;
    fn sendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t = -1;
    fn sendmmsg(socket: c_int, msgs: *mut libc::mmsghdr, count: c_uint, flags: c_int) -> c_int = -1;
}

/// The real `sync` (it returns nothing, so it is written out here rather than in the list).
pub(crate) fn sync() {
    static ADDRESS: AtomicUsize = AtomicUsize::new(0);
    let mut address = ADDRESS.load(Ordering::Relaxed);
    if address == 0 {
        address = resolve("sync\0");
        if address == 0 {
            return;
        }
        ADDRESS.store(address, Ordering::Relaxed);
    }
    // SAFETY: the non-null address dlsym gave for `sync`, whose C signature is
    // `void sync(void)`.
    let function = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn()>(address) };
    // SAFETY: no arguments.
    unsafe { function() }
}
