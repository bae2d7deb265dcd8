//! Relay processes beside the embedded mock cluster (loadgen's `--chaos` restarts them while
//! `--broker-stall` takes the brokers down and brings them back), and their end when whoever
//! started them is gone.
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ferry_testkit::{EmbeddedKafka, RelayProcess, Stdout, TempDir};

/// Brokers going down and up while child processes start must not abort the process: a child
/// between `fork` and `exec` holds a copy of a broker's listening socket, librdkafka cannot
/// re-bind the port and asserts (SIGABRT, the whole test binary). Without the lock
/// `RelayProcess::spawn` and the broker commands share, this aborted in the first cycle.
#[test]
fn brokers_go_down_and_up_while_processes_start() {
    let kafka = EmbeddedKafka::start(3).expect("mock cluster");
    let dir = TempDir::new("ferry-spawn-race").expect("temporary directory");
    let log = dir.path().join("child.log");
    let (stop, started) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let spawner = {
        let (stop, started) = (stop.clone(), started.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // `true` ignores the `--metrics-listen` the spawn adds, and exits
                let child = RelayProcess::spawn(Command::new("true"), &log, Stdout::Log);
                drop(child.expect("start a child"));
                started.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    for _ in 0..100 {
        for b in 1..=3 {
            kafka.broker_down(b).expect("broker down");
        }
        for b in 1..=3 {
            kafka.broker_up(b).expect("broker up");
        }
    }
    stop.store(true, Ordering::Relaxed);
    spawner.join().expect("the spawning thread");
    assert!(started.load(Ordering::Relaxed) > 0, "children were started");
}

/// A relay process gets SIGTERM when the thread that started it exits, so a loadgen or a test
/// killed outright leaves no relay running against its database. Without `PR_SET_PDEATHSIG`
/// the child below sleeps on for 30 s and `wait_exit` panics after 5.
#[cfg(target_os = "linux")]
#[test]
fn a_relay_process_ends_with_the_thread_that_started_it() {
    let dir = TempDir::new("ferry-parent-death").expect("temporary directory");
    let log = dir.path().join("child.log");
    let mut child = std::thread::spawn(move || {
        // `sh -c` takes the `--metrics-listen` the spawn adds as its `$0` and `$1`
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exec sleep 30"]);
        RelayProcess::spawn(cmd, &log, Stdout::Log).expect("start a child")
    })
    .join()
    .expect("the starting thread");
    assert_eq!(
        child.wait_exit(std::time::Duration::from_secs(5)),
        None,
        "ended by a signal"
    );
}
