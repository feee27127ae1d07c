//! Wire types for the opensandbox API (see ../shared/spec).
