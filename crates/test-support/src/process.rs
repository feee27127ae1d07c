//! Processes as /proc shows them: whether one still runs, and which mention a path. A zombie
//! (killed, not yet reaped by its parent) counts as dead: it runs nothing and holds nothing but
//! its pid. And the first line a child prints.

/// Whether `pid` exists and is not a zombie. Takes a pid as the tests hold it (`i32`, `u32`,
/// `u64`); one no process can have is not alive.
pub fn alive(pid: impl TryInto<i32>) -> bool {
    let Ok(pid) = pid.try_into() else {
        return false;
    };
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
pub async fn wait_until_dead(pid: impl TryInto<i32> + Copy + std::fmt::Display, what: &str) {
    let what = format!("{what} (pid {pid} gone or a zombie)");
    crate::eventually(&what, || !alive(pid)).await;
}

/// Pids of the processes other than this one whose command line mentions `needle` (a unique
/// temporary path of the test, so only processes the test started match).
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

/// Starts `command` as a child this process owns in the reaper's sense
/// (`warren_process::reaper`): a test binary that is also a subreaper (execd in process) leaves
/// its exit status to the caller's wait. Release it with [`wait_owned`].
pub fn spawn_owned(command: &mut std::process::Command) -> std::io::Result<std::process::Child> {
    warren_process::reaper::spawn_owned(|| {
        let child = command.spawn()?;
        let pid = child.id();
        Ok((child, Some(pid)))
    })
}

/// Runs `command` to its end as an owned child (see [`spawn_owned`]) and returns its status.
pub fn status_owned(
    command: &mut std::process::Command,
) -> std::io::Result<std::process::ExitStatus> {
    let mut child = spawn_owned(command)?;
    let status = child.wait();
    warren_process::reaper::release(child.id());
    status
}

/// Takes `child`'s piped stdout and returns its first line, read within [`crate::WAIT`] (`what`
/// names it); the rest is read and dropped in the background, so the child never blocks on a
/// full pipe.
pub async fn first_line(child: &mut tokio::process::Child, what: &str) -> String {
    use tokio::io::AsyncBufReadExt as _;
    let stdout = child.stdout.take().expect("the child's stdout is piped");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = crate::within(what, lines.next_line())
        .await
        .unwrap_or_else(|e| panic!("reads {what}: {e}"))
        .unwrap_or_else(|| panic!("the child exited before {what}"));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    line
}
