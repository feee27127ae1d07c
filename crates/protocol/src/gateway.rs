//! Wire types for the gateway API (see ../shared/spec).
