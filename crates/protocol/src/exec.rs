//! Wire types for the exec API (see ../shared/spec).
