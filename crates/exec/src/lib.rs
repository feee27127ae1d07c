//! warren-exec.
