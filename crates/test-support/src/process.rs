//! Whether a process still runs, read from /proc. A zombie (killed, not yet reaped by its
//! parent) counts as dead: it runs nothing and holds nothing but its pid.

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: impl Into<i64>) -> bool {
    let pid = pid.into();
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold ") " itself.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z" | "X"))
}

/// Waits until `pid` is gone or a zombie; panics after [`crate::WAIT`] naming `what`.
pub async fn wait_until_dead(pid: impl Into<i64>, what: &str) {
    let pid = pid.into();
    let what = format!("{what} (pid {pid} gone or a zombie)");
    crate::eventually(&what, || !alive(pid)).await;
}
