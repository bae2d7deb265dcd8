//! `ferry relay` child processes: the CLI's process tests and loadgen's `--relay-mode process`
//! start them the same way (a free metrics port, output to a log file) and stop, signal and
//! inspect them through [`RelayProcess`].
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Where a relay process's standard output goes (its standard error always goes to the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdout {
    /// Appended to the log as well.
    Log,
    /// A pipe the caller reads ([`RelayProcess::take_stdout`]), e.g. the stdout sink's lines.
    Piped,
}

/// A free TCP port on 127.0.0.1 (another process may take it before it is bound).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Waits (at most 1 s) until the child `pid` runs `program`. `spawn` can return before the
/// child has closed the close-on-exec descriptors it was forked with (the parent resumes at the
/// child's `execve`, which closes them later); Linux names the process after the new program
/// (`/proc/<pid>/comm`, the file name's first 15 bytes) only once they are closed. Returns at
/// once where there is no `/proc`.
fn wait_for_exec(pid: u32, program: &std::ffi::OsStr) {
    use std::os::unix::ffi::OsStrExt;
    let Some(name) = Path::new(program).file_name() else {
        return;
    };
    let name = name.as_bytes();
    let name = &name[..name.len().min(15)];
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        match std::fs::read(format!("/proc/{pid}/comm")) {
            Ok(comm) if comm.strip_suffix(b"\n").unwrap_or(&comm) == name => return,
            Ok(_) => std::thread::sleep(Duration::from_micros(100)),
            Err(_) => return,
        }
    }
}

/// The last `n` lines of a file (best effort: empty if it cannot be read).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A running relay process. Dropping it SIGKILLs and reaps it; when the thread is panicking
/// (a failing test) it prints the last 60 lines of the log first; the log is removed unless
/// [`RelayProcess::keep_log`] was called or `KEEP_RELAY_LOGS` is set.
pub struct RelayProcess {
    child: Child,
    metrics_port: u16,
    log: PathBuf,
    keep_log: bool,
}

/// Why a relay process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// No free port for its metrics endpoint.
    #[error("cannot find a free port for relay metrics: {0}")]
    Port(#[source] std::io::Error),
    /// Its log file could not be opened.
    #[error("cannot open the relay log: {0}")]
    Log(#[source] std::io::Error),
    /// The process could not be started.
    #[error("cannot start the relay: {0}")]
    Start(#[source] std::io::Error),
}

impl RelayProcess {
    /// Starts `cmd` (a `ferry relay …` command line, its arguments and environment set by the
    /// caller) with `--metrics-listen 127.0.0.1:<a free port>`, stdin closed and stderr (and
    /// with [`Stdout::Log`] stdout) appended to `log`. On Linux the child gets SIGTERM when the
    /// thread that called this exits (`PR_SET_PDEATHSIG`): call it from a thread that outlives
    /// the relay (a runtime's worker, a test's own thread), not from a short-lived one.
    pub fn spawn(
        mut cmd: Command,
        log: impl Into<PathBuf>,
        stdout: Stdout,
    ) -> Result<Self, SpawnError> {
        let log = log.into();
        let metrics_port = free_port().map_err(SpawnError::Port)?;
        let open = || {
            File::options()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(SpawnError::Log)
        };
        cmd.arg("--metrics-listen")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .stdin(Stdio::null())
            .stderr(open()?);
        match stdout {
            Stdout::Log => cmd.stdout(open()?),
            Stdout::Piped => cmd.stdout(Stdio::piped()),
        };
        // a relay dies with the thread that started it: a loadgen or test that is killed outright
        // (SIGKILL, an abort) leaves no relay behind that keeps working on its database
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the child between fork and exec and only calls
            // prctl(2), which is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // not while a mock broker of this process goes down or comes back, and not until the
        // child has closed its copies of this process's sockets (see the lock)
        let child = {
            let _spawning = crate::embedded::BROKER_COMMANDS_AND_SPAWNS
                .read()
                .unwrap_or_else(|e| e.into_inner());
            let child = cmd.spawn().map_err(SpawnError::Start)?;
            wait_for_exec(child.id(), cmd.get_program());
            child
        };
        Ok(Self {
            child,
            metrics_port,
            log,
            keep_log: false,
        })
    }

    /// The port its `/metrics` endpoint listens on (127.0.0.1).
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Keeps the log file when this is dropped.
    pub fn keep_log(mut self) -> Self {
        self.keep_log = true;
        self
    }

    /// The last `n` lines of its log.
    pub fn tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }

    /// Its standard output, with [`Stdout::Piped`] (once).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Sends signal `sig` (`libc::SIGTERM`, `SIGKILL`, `SIGSTOP`, `SIGCONT`, …).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with the pid of a child we spawned and have not reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    /// Its exit status if it has exited.
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for it to exit; its exit code (`None`: killed by a signal). Panics,
    /// with the log, if it does not exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("wait for the relay") {
                return s.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "relay did not exit; log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `timeout` without blocking the runtime; whether it exited.
    pub async fn exited_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.try_exited().is_none() {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            // a failing test: show what the relay said (its last lines) before the log goes
            eprintln!(
                "--- {} (last 60 lines):\n{}",
                self.log.display(),
                self.tail(60)
            );
        }
        if !self.keep_log && std::env::var_os("KEEP_RELAY_LOGS").is_none() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
