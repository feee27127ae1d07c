//! Reading `/proc`: the one parser of `/proc/<pid>/stat` ([`Stat`], used by tree discovery,
//! the reaper and everything else here), and whether a command is blocked waiting for input.
//!
//! A command "waits for input" when a process of its tree that belongs to the foreground process
//! group of its terminal (for pipe sessions: any process of the tree) is asleep in a read-like
//! system call on the command's input: its stdin pipe or its terminal. The input is identified by
//! the target of `/proc/<pid>/fd/0` right after spawning (`pipe:[123]` or `/dev/pts/4`), so a
//! process reading some other pipe (`yes | head`) or sleeping (`sleep 30`) never counts. Reading
//! `/dev/tty` counts when the process's controlling terminal is that terminal: password prompts
//! (`sudo`, `ssh`, `getpass`) read there rather than from stdin.
//!
//! The system call comes from `/proc/<pid>/syscall` (number and first argument, the fd); when that
//! file is unreadable the kernel wait channel in `/proc/<pid>/wchan` is used instead. This module
//! only looks; deciding that "no new output for ~300 ms" makes it a prompt is the caller's job.

use std::path::PathBuf;

/// The fields of `/proc/<pid>/stat` Warren reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    /// One-letter state (`R`, `S`, `D`, `T`, `Z`...).
    pub state: char,
    pub ppid: i32,
    pub pgid: i32,
    /// Session id; 0 when the session leader lives outside this PID namespace.
    pub sid: i32,
    /// The controlling terminal's device number in the kernel's encoding (0 when none).
    pub tty_nr: u32,
    /// Foreground process group of the controlling terminal (-1 when none).
    pub tpgid: i32,
    /// When the process started, in clock ticks after boot: with the pid, it names one process
    /// (a pid reused later has another start time).
    pub start_time: u64,
}

impl Stat {
    /// Exited and not reaped yet (or being reaped): counts as dead.
    pub fn is_zombie(&self) -> bool {
        self.state == 'Z' || self.state == 'X'
    }
}

/// Reads `/proc/<pid>/stat`; `None` when the process is gone (or the text is unreadable).
pub fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses `/proc/<pid>/stat`. The command name is in parentheses and may itself contain spaces
/// and parentheses, so fields are read after the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let pid = text.split_whitespace().next()?.parse().ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    let sid = fields.next()?.parse().ok()?;
    let tty_nr = fields.next()?.parse().ok()?;
    let tpgid = fields.next()?.parse().ok()?;
    // Fields 9 to 21 (flags ... itrealvalue) lie between tpgid and starttime.
    // (0 when the line is cut short, as in hand-written test lines).
    let start_time = fields
        .nth(13)
        .and_then(|field| field.parse().ok())
        .unwrap_or(0);
    Some(Stat {
        pid,
        state,
        ppid,
        pgid,
        sid,
        tty_nr,
        tpgid,
        start_time,
    })
}

/// The target of `pid`'s file descriptor `fd` (`pipe:[123]`, `/dev/pts/4`, ...).
pub fn fd_target(pid: i32, fd: i32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()
}

/// The system call a sleeping process is blocked in, from `/proc/<pid>/syscall`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedSyscall {
    pub number: i64,
    pub first_arg: u64,
}

fn parse_syscall(text: &str) -> Option<BlockedSyscall> {
    let mut fields = text.split_whitespace();
    let number = fields.next()?.parse().ok()?;
    let first_arg = u64::from_str_radix(fields.next()?.trim_start_matches("0x"), 16).ok()?;
    Some(BlockedSyscall { number, first_arg })
}

/// Read-like system calls whose first argument is the fd read from.
#[cfg(target_arch = "x86_64")]
const FD_READS: &[i64] = &[0, 17, 19, 295, 327]; // read, pread64, readv, preadv, preadv2
/// Waits on several fds (select, poll, ppoll, pselect6): the fds are behind pointers.
#[cfg(target_arch = "x86_64")]
const MULTI_WAITS: &[i64] = &[7, 23, 270, 271];
#[cfg(target_arch = "aarch64")]
const FD_READS: &[i64] = &[63, 67, 65, 69, 286];
#[cfg(target_arch = "aarch64")]
const MULTI_WAITS: &[i64] = &[72, 73];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const FD_READS: &[i64] = &[];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const MULTI_WAITS: &[i64] = &[];

/// Kernel wait channels of a process asleep reading a pipe or a terminal.
const READ_WCHANS: &[&str] = &["pipe_read", "anon_pipe_read", "n_tty_read", "wait_woken"];

/// What a descriptor opened through `/dev/tty` points at: password prompts (`sudo`, `ssh`,
/// `getpass`) read the controlling terminal this way rather than through stdin.
const DEV_TTY: &str = "/dev/tty";

/// True when `pid`'s controlling terminal is the device `input` names (`/dev/pts/N`).
fn controlling_tty_is(pid: i32, input: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(tty_nr) = stat(pid).map(|stat| stat.tty_nr) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata(input) else {
        return false;
    };
    let rdev = meta.rdev();
    tty_nr != 0 && decode_tty_nr(tty_nr) == (rustix::fs::major(rdev), rustix::fs::minor(rdev))
}

/// `(major, minor)` of a device number in the kernel's `/proc` encoding: minor bits 0-7 and
/// 20-31, major bits 8-19.
fn decode_tty_nr(tty_nr: u32) -> (u32, u32) {
    (
        (tty_nr >> 8) & 0xfff,
        (tty_nr & 0xff) | ((tty_nr >> 12) & 0xfff00),
    )
}

/// True when `pid` is asleep reading `input` (the target of the command's fd 0, see
/// [`fd_target`]), or reading its controlling terminal through `/dev/tty` when that terminal is
/// `input`.
pub fn is_blocked_reading(pid: i32, input: &std::path::Path) -> bool {
    let Some(state) = stat(pid) else {
        return false;
    };
    if state.state != 'S' {
        return false;
    }
    let stdin_is_input = fd_target(pid, 0).is_some_and(|t| t == input);
    match std::fs::read_to_string(format!("/proc/{pid}/syscall"))
        .ok()
        .and_then(|t| parse_syscall(&t))
    {
        Some(call) if FD_READS.contains(&call.number) => i32::try_from(call.first_arg)
            .ok()
            .and_then(|fd| fd_target(pid, fd))
            .is_some_and(|t| {
                t == input || (t.as_os_str() == DEV_TTY && controlling_tty_is(pid, input))
            }),
        Some(call) if MULTI_WAITS.contains(&call.number) => stdin_is_input,
        Some(_) => false,
        None => {
            let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
            stdin_is_input && READ_WCHANS.contains(&wchan.trim())
        }
    }
}

/// True when one of `members` (a command's live tree) waits for input on `input`. With
/// `foreground_only`, only members in their terminal's foreground process group count (PTY
/// sessions; a background job reading the terminal would be stopped, not prompting).
pub fn tree_awaits_input(members: &[i32], input: &std::path::Path, foreground_only: bool) -> bool {
    members.iter().any(|&pid| {
        if foreground_only {
            match stat(pid) {
                Some(state) if state.tpgid > 0 && state.pgid == state.tpgid => {}
                _ => return false,
            }
        }
        is_blocked_reading(pid, input)
    })
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn parses_stat_fields_after_a_command_name_with_parens_and_spaces() {
        let parsed = parse_stat("42 (my (odd) name) S 7 42 40 34816 45 4194304").expect("parses");
        assert_eq!(
            parsed,
            Stat {
                pid: 42,
                state: 'S',
                ppid: 7,
                pgid: 42,
                sid: 40,
                tty_nr: 34816,
                tpgid: 45,
                start_time: 0,
            }
        );
        assert!(!parsed.is_zombie());
        let full = "7 (sh) S 1 7 7 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 2400000 200";
        assert_eq!(parse_stat(full).map(|stat| stat.start_time), Some(123_456));
        let own = stat(std::process::id() as i32).expect("own stat");
        assert!(own.start_time > 0, "{own:?}");
        let zombie = parse_stat("9 (x) Z 1 9 9 0 -1 0").expect("parses");
        assert!(zombie.is_zombie());
        for bad in ["nonsense", "42 (x) S 7", "42 x S 7 42 40 0 -1"] {
            assert!(parse_stat(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn decodes_the_controlling_terminal() {
        let table = [
            (34816, (136, 0)),       // /dev/pts/0
            (34821, (136, 5)),       // /dev/pts/5
            (1_083_392, (136, 256)), // /dev/pts/256: minor bits above 7 sit at bit 20
            (1025, (4, 1)),          // /dev/tty1
            (0, (0, 0)),
        ];
        for (tty_nr, expected) in table {
            assert_eq!(decode_tty_nr(tty_nr), expected, "{tty_nr}");
        }
    }

    #[test]
    fn parses_syscall_number_and_fd() {
        let table = [
            (
                "0 0x0 0x7fa1654f8000 0x20000 0x0 0x0 0x0 0x7ffc 0x7fa1",
                Some((0, 0)),
            ),
            ("230 0x3 0x0 0x7ffc", Some((230, 3))),
            ("running", None),
            ("-1 0x7ffc 0x7fa1", None),
        ];
        for (text, expected) in table {
            let got = parse_syscall(text).map(|c| (c.number, c.first_arg));
            // "-1" is what the kernel prints for a process blocked outside a syscall; it parses
            // as a number but has no fd argument worth trusting, and must never match a read.
            if text.starts_with("-1") {
                assert!(got.is_none_or(|(n, _)| !FD_READS.contains(&n)), "{text}");
                continue;
            }
            assert_eq!(got, expected, "{text}");
        }
    }

    #[test]
    fn cat_waiting_on_a_pipe_is_blocked_reading_and_sleep_is_not() {
        let (reader, _writer) = std::io::pipe().expect("pipe");
        let mut cat = std::process::Command::new("cat")
            .stdin(reader)
            .spawn()
            .expect("cat");
        let mut sleep = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("sleep");
        let cat_pid = cat.id() as i32;
        let input = fd_target(cat_pid, 0).expect("cat's stdin");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_blocked_reading(cat_pid, &input) {
            assert!(
                Instant::now() < deadline,
                "cat never showed as blocked reading its stdin"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!is_blocked_reading(sleep.id() as i32, &input));
        let _ = cat.kill();
        let _ = sleep.kill();
        let _ = cat.wait();
        let _ = sleep.wait();
    }
}
