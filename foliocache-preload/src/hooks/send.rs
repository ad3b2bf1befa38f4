//! Descriptors sent to another process (`SCM_RIGHTS`): a writable description of a served file
//! that goes over a Unix socket lets the receiver write the file unheard, as a forked child
//! could, so the file passes through from then on (see the adapter).

use crate::guard;
use crate::table;
use crate::{real, runtime};
use libc::{c_int, c_uint, ssize_t};

/// The served writable descriptions among the descriptors `msg` carries.
///
/// # Safety
/// `msg` is null or points to a readable msghdr whose control buffer is readable.
unsafe fn sending(msg: *const libc::msghdr) {
    if msg.is_null() || runtime().is_none() {
        return;
    }
    let Some(_outer) = guard::enter() else {
        return;
    };
    // SAFETY: the caller's promise: a readable msghdr and control buffer; the CMSG macros
    // walk the buffer within msg_controllen.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<c_int>();
                let bytes = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for k in 0..bytes / std::mem::size_of::<c_int>() {
                    let fd = data.add(k).read_unaligned();
                    if let Some(d) = table::get(fd)
                        && d.writable
                    {
                        d.inode.shared_with_another_process();
                    }
                }
            }
            header = libc::CMSG_NXTHDR(msg, header);
        }
    }
}

/// # Safety
/// sendmsg(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: sendmsg's contract: `msg` is a readable msghdr.
    unsafe { sending(msg) };
    // SAFETY: passed on unchanged.
    unsafe { real::sendmsg(socket, msg, flags) }
}

/// # Safety
/// sendmmsg(2)'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(
    socket: c_int,
    msgs: *mut libc::mmsghdr,
    count: c_uint,
    flags: c_int,
) -> c_int {
    if !msgs.is_null() {
        for k in 0..count as usize {
            // SAFETY: sendmmsg's contract: `count` readable mmsghdrs.
            unsafe { sending(std::ptr::addr_of!((*msgs.add(k)).msg_hdr)) };
        }
    }
    // SAFETY: passed on unchanged.
    unsafe { real::sendmmsg(socket, msgs, count, flags) }
}
