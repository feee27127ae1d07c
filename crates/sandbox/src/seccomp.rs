//! The hands' seccomp filter: every system call is allowed except the few a sandboxed command
//! never needs ([`DENIED`]), which fail with `EPERM`. Most of them need a capability the
//! sandbox has dropped anyway; the filter is the second wall, for the day a kernel bug or a
//! namespace quirk makes the first one thin.
//!
//! [`filter_bpf`] compiles the table with seccompiler for the host's architecture (x86_64 or
//! aarch64) into the raw `sock_filter` array bwrap's `--seccomp FD` reads. A call from another
//! ABI (32-bit x86 on x86_64) kills the process, since its numbers differ; x32 numbers (the
//! `0x4000_0000` bit) are denied alongside the 64-bit ones. This module only builds bytes;
//! bwrap installs them.

use std::collections::BTreeMap;

/// The system calls the hands refuse, each with the reason a sandboxed command never needs it.
pub const DENIED: &[(&str, &str)] = &[
    (
        "mount",
        "the sandbox's file system is fixed by the launcher; a command never mounts",
    ),
    (
        "umount2",
        "unmounting could uncover what the sandbox's mounts hide",
    ),
    ("pivot_root", "the root is the launcher's to choose"),
    ("move_mount", "new mount API: same as mount"),
    (
        "open_tree",
        "new mount API: clones mounts, same as a bind mount",
    ),
    ("fsopen", "new mount API: same as mount"),
    ("fsmount", "new mount API: same as mount"),
    ("fsconfig", "new mount API: same as mount"),
    (
        "mount_setattr",
        "new mount API: could make a read-only mount writable",
    ),
    (
        "ptrace",
        "the pid namespace already hides outside processes; blocking it also stops a command from tampering with execd inside",
    ),
    (
        "process_vm_readv",
        "reads another process's memory, as ptrace does",
    ),
    (
        "process_vm_writev",
        "writes another process's memory, as ptrace does",
    ),
    (
        "pidfd_getfd",
        "steals another process's descriptors, as ptrace does",
    ),
    ("kexec_load", "loads a new kernel"),
    ("kexec_file_load", "loads a new kernel"),
    ("init_module", "loads kernel code"),
    ("finit_module", "loads kernel code"),
    ("delete_module", "unloads kernel code"),
    (
        "add_key",
        "the kernel keyring is not namespaced: keys could leak between sessions",
    ),
    ("request_key", "the kernel keyring is not namespaced"),
    ("keyctl", "the kernel keyring is not namespaced"),
    (
        "bpf",
        "loads programs into the kernel; a large attack surface",
    ),
    (
        "perf_event_open",
        "observes other processes and the kernel; a large attack surface",
    ),
    (
        "userfaultfd",
        "a favourite tool for widening kernel race windows",
    ),
    ("swapon", "changes the host's swap"),
    ("swapoff", "changes the host's swap"),
    ("reboot", "reboots the host (or the pid namespace)"),
    ("setns", "joins other namespaces; the sandbox's are fixed"),
    (
        "unshare",
        "new namespaces would give a command capabilities inside them",
    ),
    (
        "open_by_handle_at",
        "opens files by handle, bypassing the mount tree (the shocker escape)",
    ),
    (
        "name_to_handle_at",
        "makes the handles open_by_handle_at takes",
    ),
    ("acct", "process accounting is the host's"),
    ("quotactl", "disk quotas are the host's"),
    ("quotactl_fd", "disk quotas are the host's"),
    ("syslog", "the kernel log shows the host's messages"),
    ("settimeofday", "the clock is the host's"),
    ("clock_settime", "the clock is the host's"),
    ("adjtimex", "the clock is the host's"),
    ("fanotify_init", "watches file access across the host"),
    (
        "lookup_dcookie",
        "a profiling interface that reveals host paths",
    ),
    ("iopl", "x86 port I/O: direct hardware access"),
    ("ioperm", "x86 port I/O: direct hardware access"),
    ("uselib", "an obsolete loader interface nothing uses"),
];

/// Compiling the filter failed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("no seccomp filter for architecture {0}")]
    UnsupportedArch(&'static str),
    #[error("compiling the seccomp filter: {0}")]
    Compile(#[from] seccompiler::BackendError),
}

/// The x32 ABI's syscall bit on x86_64.
#[cfg(target_arch = "x86_64")]
const X32_BIT: i64 = 0x4000_0000;

/// x32 numbers of denied calls that x32 routes to their own entries (512 and up) instead of
/// the 64-bit number with the x32 bit.
#[cfg(target_arch = "x86_64")]
const X32_OWN_NUMBERS: &[(&str, i64)] = &[
    ("ptrace", 521),
    ("kexec_load", 528),
    ("process_vm_readv", 539),
    ("process_vm_writev", 540),
];

/// The host's number for a denied call; `None` where the architecture has no such call.
fn number(name: &str) -> Option<i64> {
    let nr = match name {
        "mount" => libc::SYS_mount,
        "umount2" => libc::SYS_umount2,
        "pivot_root" => libc::SYS_pivot_root,
        "move_mount" => libc::SYS_move_mount,
        "open_tree" => libc::SYS_open_tree,
        "fsopen" => libc::SYS_fsopen,
        "fsmount" => libc::SYS_fsmount,
        "fsconfig" => libc::SYS_fsconfig,
        "mount_setattr" => libc::SYS_mount_setattr,
        "ptrace" => libc::SYS_ptrace,
        "process_vm_readv" => libc::SYS_process_vm_readv,
        "process_vm_writev" => libc::SYS_process_vm_writev,
        "pidfd_getfd" => libc::SYS_pidfd_getfd,
        "kexec_load" => libc::SYS_kexec_load,
        "kexec_file_load" => libc::SYS_kexec_file_load,
        "init_module" => libc::SYS_init_module,
        "finit_module" => libc::SYS_finit_module,
        "delete_module" => libc::SYS_delete_module,
        "add_key" => libc::SYS_add_key,
        "request_key" => libc::SYS_request_key,
        "keyctl" => libc::SYS_keyctl,
        "bpf" => libc::SYS_bpf,
        "perf_event_open" => libc::SYS_perf_event_open,
        "userfaultfd" => libc::SYS_userfaultfd,
        "swapon" => libc::SYS_swapon,
        "swapoff" => libc::SYS_swapoff,
        "reboot" => libc::SYS_reboot,
        "setns" => libc::SYS_setns,
        "unshare" => libc::SYS_unshare,
        "open_by_handle_at" => libc::SYS_open_by_handle_at,
        "name_to_handle_at" => libc::SYS_name_to_handle_at,
        "acct" => libc::SYS_acct,
        "quotactl" => libc::SYS_quotactl,
        "quotactl_fd" => libc::SYS_quotactl_fd,
        "syslog" => libc::SYS_syslog,
        "settimeofday" => libc::SYS_settimeofday,
        "clock_settime" => libc::SYS_clock_settime,
        "adjtimex" => libc::SYS_adjtimex,
        "fanotify_init" => libc::SYS_fanotify_init,
        "lookup_dcookie" => libc::SYS_lookup_dcookie,
        #[cfg(target_arch = "x86_64")]
        "iopl" => libc::SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        "ioperm" => libc::SYS_ioperm,
        #[cfg(target_arch = "x86_64")]
        "uselib" => libc::SYS_uselib,
        _ => return None,
    };
    Some(nr)
}

/// Every number the filter denies on this architecture.
fn denied_numbers() -> Vec<i64> {
    let mut numbers: Vec<i64> = DENIED.iter().filter_map(|(name, _)| number(name)).collect();
    #[cfg(target_arch = "x86_64")]
    {
        let x32: Vec<i64> = numbers.iter().map(|nr| nr | X32_BIT).collect();
        numbers.extend(x32);
        numbers.extend(X32_OWN_NUMBERS.iter().map(|(_, nr)| nr | X32_BIT));
    }
    numbers
}

fn target_arch() -> Result<seccompiler::TargetArch, SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(seccompiler::TargetArch::x86_64),
        "aarch64" => Ok(seccompiler::TargetArch::aarch64),
        other => Err(SeccompError::UnsupportedArch(other)),
    }
}

/// The filter as the raw `sock_filter` array (8 bytes per instruction, native endian) that
/// bwrap's `--seccomp FD` reads: default allow, [`DENIED`] answers `EPERM`.
pub fn filter_bpf() -> Result<Vec<u8>, SeccompError> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = denied_numbers()
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    let filter = seccompiler::SeccompFilter::new(
        rules,
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(libc::EPERM as u32),
        target_arch()?,
    )?;
    let program: seccompiler::BpfProgram = filter.try_into()?;
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for instruction in program {
        bytes.extend_from_slice(&instruction.code.to_ne_bytes());
        bytes.push(instruction.jt);
        bytes.push(instruction.jf);
        bytes.extend_from_slice(&instruction.k.to_ne_bytes());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_denied_call_has_a_number_and_a_reason_on_this_architecture() {
        let x86_only = ["iopl", "ioperm", "uselib"];
        for (name, why) in DENIED {
            assert!(!why.is_empty(), "{name} has no reason");
            if cfg!(target_arch = "x86_64") || !x86_only.contains(name) {
                assert!(number(name).is_some(), "{name} has no number here");
            }
        }
        let mut names: Vec<&str> = DENIED.iter().map(|(name, _)| *name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), DENIED.len(), "a call is listed twice");
    }

    #[test]
    fn the_filter_checks_the_architecture_then_denies_each_call_with_eperm() {
        let bytes = filter_bpf().expect("compiles");
        assert_eq!(bytes.len() % 8, 0);
        let instructions: Vec<(u16, u32)> = bytes
            .chunks_exact(8)
            .map(|i| {
                (
                    u16::from_ne_bytes([i[0], i[1]]),
                    u32::from_ne_bytes([i[4], i[5], i[6], i[7]]),
                )
            })
            .collect();
        const BPF_RET_K: u16 = 0x06;
        const BPF_JEQ_K: u16 = 0x15;
        // Loads the arch, compares, kills on a mismatch.
        assert_eq!(instructions[2], (BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS));
        let compared: Vec<i64> = instructions
            .iter()
            .filter(|(code, _)| *code == BPF_JEQ_K)
            .map(|(_, k)| i64::from(*k))
            .collect();
        for nr in denied_numbers() {
            assert!(compared.contains(&nr), "syscall {nr} is not in the filter");
        }
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        assert!(instructions.contains(&(BPF_RET_K, eperm)));
        assert_eq!(
            instructions.last(),
            Some(&(BPF_RET_K, libc::SECCOMP_RET_ALLOW))
        );
    }
}
