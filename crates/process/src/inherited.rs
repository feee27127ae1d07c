//! Descriptors a parent passed at fixed numbers ([`crate::CommandSpec::fd`]): the child takes
//! ownership of one once, at start, so it is closed when done with (a secrets pipe is read to its
//! end and gone, never left for the commands the child runs).

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// Takes ownership of the inherited descriptor `fd` (3 or above, open in this process), marks it
/// close-on-exec and returns it. Call once per descriptor, before anything else could use it.
pub fn take_inherited_fd(fd: i32) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is stdio, not an inherited one"),
        ));
    }
    if std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_err() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("descriptor {fd} is not open"),
        ));
    }
    // SAFETY: the descriptor is open (checked above) and was passed by the parent for this
    // process to own; the caller takes it once, at start, before any other code could have
    // wrapped or closed it, so no other owner exists.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdio_and_closed_descriptors_are_refused() {
        assert_eq!(
            take_inherited_fd(1).expect_err("stdio").kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            take_inherited_fd(987_654).expect_err("not open").kind(),
            io::ErrorKind::NotFound
        );
    }
}
