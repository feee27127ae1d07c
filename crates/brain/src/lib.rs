//! Brains: agent processes spoken to over the Agent Client Protocol.

pub mod shell_agent;
