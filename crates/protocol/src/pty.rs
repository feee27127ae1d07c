//! Wire types for the pty API (see ../shared/spec).
