//! warren-gateway.
