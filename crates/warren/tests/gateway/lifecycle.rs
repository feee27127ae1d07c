//! The hands lifecycle through the gateway's HTTP API and the built-in shell agent: idle pause
//! and resume, archive and restore, lost hands rebuilt, adoption after a gateway restart.
