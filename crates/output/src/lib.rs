//! warren-output.
