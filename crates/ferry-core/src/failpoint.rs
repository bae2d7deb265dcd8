//! Deterministic failpoints for crash tests. Never active by default.
//!
//! Set `FERRY_FAILPOINT=<name>` in a process's environment; when execution reaches
//! [`hit`]`(name)`, the process writes `FERRY_FAILPOINT <name> reached` to stderr and stops there
//! forever, so a test can SIGKILL it at exactly that point of the protocol. Names:
//!
//! | name | where | crash window |
//! | --- | --- | --- |
//! | `enqueue-before-commit` | store enqueue, rows inserted, before COMMIT | before the business commit |
//! | `enqueue-after-commit` | `ferry enqueue`, after COMMIT | after commit, before a relay claims |
//! | `relay-after-claim` | relay, claim committed (cursor dispatch: batch read), before the send | after claim, before the broker ack |
//! | `relay-after-ack` | relay, broker acked, before the SENT CAS (cursor dispatch: before the advance) | after the ack, before SENT commits |
use std::io::Write;
use std::sync::OnceLock;

fn active() -> Option<&'static str> {
    static ACTIVE: OnceLock<Option<String>> = OnceLock::new();
    ACTIVE
        .get_or_init(|| {
            std::env::var("FERRY_FAILPOINT")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .as_deref()
}

/// Stops the process here (forever) if `FERRY_FAILPOINT` names this point.
pub fn hit(name: &str) {
    if active() == Some(name) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "FERRY_FAILPOINT {name} reached");
        let _ = err.flush();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}
