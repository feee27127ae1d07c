//! Forking on one thread that lives as long as this process, so a child's parent-death signal
//! means "this process died".
//!
//! Linux sends `PR_SET_PDEATHSIG` when the *thread* that forked the child exits, not the
//! process. Forking on a tokio blocking-pool thread (which exits after a while idle) would get
//! healthy children SIGKILLed at random; forking on the one thread here, which never exits,
//! makes the signal fire only when the daemon itself is gone (a SIGKILL, a crash), so a dead
//! daemon leaves none of its direct children running. Their own descendants are found by
//! marker ([`crate::TreeRegistry`]).
//!
//! The caller's tokio runtime is entered on the spawner thread for the fork, so the child is
//! registered with the same runtime as if the caller had spawned it.

#![allow(unsafe_code)]

use std::io;
use std::sync::Mutex;
use std::sync::mpsc;

type Job = Box<dyn FnOnce() + Send>;

static SPAWNER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);

/// Runs `fork` on the spawner thread inside the caller's tokio runtime and returns its result.
/// Blocks the caller for as long as the fork takes (as forking in place would).
pub(crate) fn on_spawner_thread<T: Send + 'static>(
    fork: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|_| io::Error::other("processes must be spawned inside a tokio runtime"))?;
    let (done_tx, done_rx) = mpsc::sync_channel(1);
    let job: Job = Box::new(move || {
        let _entered = runtime.enter();
        let _ = done_tx.send(fork());
    });
    sender()?
        .send(job)
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    done_rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread dropped a spawn"))?
}

fn sender() -> io::Result<mpsc::Sender<Job>> {
    let mut spawner = SPAWNER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(sender) = spawner.as_ref() {
        return Ok(sender.clone());
    }
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("warren-spawner".into())
        .spawn(move || {
            // A job that panics must not end the thread: its children's parent-death signal
            // would fire.
            for job in rx {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        })?;
    *spawner = Some(tx.clone());
    Ok(tx)
}

/// Gives the command every signal's default disposition. A daemon started in the background of
/// a non-interactive shell (`warren execd &`, `nohup`) inherits SIGINT, SIGQUIT or SIGHUP as
/// ignored, and exec keeps ignored signals ignored: without this, Ctrl-C would never reach a
/// command it runs. (std already resets the signal mask.)
pub(crate) fn default_signal_dispositions(command: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls `signal`, which
    // is async-signal-safe, with constant arguments; it touches no memory shared with the
    // parent. SIGKILL and SIGSTOP cannot be changed and are skipped.
    unsafe {
        command.pre_exec(|| {
            for signal in 1..32 {
                if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                    libc::signal(signal, libc::SIG_DFL);
                }
            }
            Ok(())
        });
    }
}

/// Makes the command's process get SIGKILL when this process dies. Needs the fork to happen on
/// the spawner thread, which every spawn in this crate does.
pub(crate) fn die_with_this_process(command: &mut tokio::process::Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes two system calls
    // (`prctl`, `getppid`), both async-signal-safe, touching no memory shared with the parent.
    // It is the last closure, run after std or `child_setup` switched user and group ids, so
    // the credential change cannot clear the signal.
    unsafe {
        command.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(io::Error::from)?;
            // The parent may have died before the signal was armed; then nobody would send it.
            let parent_now = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get());
            if parent_now as u32 != parent {
                return Err(io::Error::other("the spawning daemon exited"));
            }
            Ok(())
        });
    }
}
