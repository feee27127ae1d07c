//! The hands' sandbox against the real bwrap and the host's cgroups: one module per concern,
//! each test a row of what a command in the hands can and cannot see, or one cgroup promise.
//! Every sandbox a test starts joins a cgroup the test created, and is killed through it when
//! the test ends, passed or not.

mod cgroups;
mod isolation;
mod staging;
mod support;
