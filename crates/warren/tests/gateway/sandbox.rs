//! What a command in a session's hands can and cannot see, through the gateway's HTTP API and
//! the built-in shell agent, with the real bwrap sandbox (hands.md's table), and the faults one
//! session's hands must survive alone.
