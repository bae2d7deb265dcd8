//! `ferry relay`: run the relay until SIGINT/SIGTERM, then drain. Its flags are in [`args`],
//! how they merge with the file and the defaults in [`settings`].
use std::sync::Arc;
use std::time::Duration;

use ferry_relay::{KafkaSink, NullSink, Relay, Sink, StdoutSink};
use tokio_util::sync::CancellationToken;

use self::settings::{relay_settings, RelaySettings, SinkSpec};
use super::{fail, Database, Failure};
use crate::config::FileConfig;

mod args;
pub(crate) mod settings;

pub use self::args::RelayArgs;

pub async fn run(args: &RelayArgs, file: &FileConfig, db: &Database) -> Result<u8, Failure> {
    // Validate the settings before touching the database (the librdkafka properties are checked
    // when the producer is created, after the store opened: the sink depends on its mode).
    let settings = relay_settings(args, file, db.backend)?;
    // a database that is down, restarting or full when the relay starts is waited for
    let Some(store) = db
        .open_retrying(!args.no_migrate, args.measure_contention)
        .await?
    else {
        tracing::info!("stopped before the database answered");
        return Ok(0);
    };
    run_relay(settings, store).await
}

async fn run_relay(
    settings: RelaySettings,
    store: Arc<dyn ferry_core::OutboxStore>,
) -> Result<u8, Failure> {
    let RelaySettings {
        mut config,
        retention,
        sink: spec,
        alerts,
        listen,
        unsafe_allowed,
    } = settings;
    for (key, value, why) in &unsafe_allowed {
        tracing::warn!(
            property = %key,
            value = %value,
            "running with a Kafka property that weakens delivery (allowed by --allow-unsafe-kafka-property): {why}"
        );
    }
    let mode = config.dispatch.unwrap_or(if store.cursor().is_some() {
        ferry_core::DispatchMode::Cursor
    } else {
        ferry_core::DispatchMode::Row
    });
    config.dispatch = Some(mode);
    let mut kafka = None;
    let sink: Arc<dyn Sink> = match spec {
        SinkSpec::Null => Arc::new(NullSink),
        SinkSpec::Stdout => Arc::new(StdoutSink),
        SinkSpec::Kafka(mut kc) => {
            // several versions of one key in flight: the producer must not leave gaps
            kc.ordered = mode == ferry_core::DispatchMode::Cursor;
            let s = Arc::new(KafkaSink::new(kc).map_err(|e| fail(2, e.to_string()))?);
            kafka = Some(s.clone());
            s
        }
    };
    let owner = config.owner.clone();
    let shutdown_timeout = config.shutdown_timeout;
    let (workers, batch_size, in_flight) =
        (config.workers, config.batch_size, config.max_in_flight);
    let mut relay = Relay::new(store, sink, config).map_err(|e| fail(2, e.to_string()))?;
    if let Some(r) = retention {
        relay = relay
            .with_retention(r)
            .map_err(|e| fail(2, e.to_string()))?;
    }
    *relay.metrics().alerts.lock().expect("alerts lock") = alerts;
    let cancel = CancellationToken::new();
    if let Some(addr) = listen {
        let (m, c) = (relay.metrics(), cancel.clone());
        // bound here, so an address in use fails the start with a clear sentence
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            let hint = "set --metrics-listen or \"off\"";
            fail(
                1,
                format!("cannot listen on metrics address {addr}: {e} ({hint})"),
            )
        })?;
        let config = ferry_relay::metrics::ServeConfig::default();
        tokio::spawn(async move {
            if let Err(e) = ferry_relay::metrics::serve(listener, m, config, c).await {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
    }
    {
        let cancel = cancel.clone();
        let bound = shutdown_timeout + SHUTDOWN_GRACE;
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!(
                within_secs = bound.as_secs_f64(),
                "shutdown requested: draining in-flight batches (a second SIGTERM or SIGINT exits at once)"
            );
            cancel.cancel();
            shutdown_watchdog(bound);
            wait_for_signal().await;
            tracing::warn!(
                "second signal: exiting at once; intents not confirmed stay unsent and are sent again by the next owner"
            );
            std::process::exit(EXIT_FORCED.into());
        });
    }
    tracing::info!(%owner, workers, batch_size, in_flight, dispatch = %mode, "relay started");
    if let Some(r) = retention {
        tracing::info!(
            older_than = %crate::help::format_duration(r.purge.older_than),
            every = %crate::help::format_duration(r.every),
            batch = r.purge.batch,
            vacuum = r.purge.vacuum,
            "retention on: the relay that owns slot 0 deletes SENT rows older than the window"
        );
    }
    relay.run(cancel).await?;
    if let Some(k) = kafka {
        k.flush(Duration::from_secs(5));
    }
    tracing::info!("relay stopped");
    Ok(0)
}

/// How long a shutdown may take beyond `relay.shutdown_timeout`: releasing what is left in
/// flight, giving up the slots, and the Kafka flush (5 s) after the workers stopped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The exit code of a shutdown that did not finish in time, or that a second signal cut
/// short (as a shell reports a process ended by SIGINT).
pub const EXIT_FORCED: u8 = 130;

/// Ends the process `bound` after a shutdown began if it is still running then. A thread of
/// its own, not a task: a runtime whose threads are blocked (a Kafka flush or a producer
/// teardown waiting on a broker that does not answer) cannot hold it back. Exiting there loses
/// nothing: an event is only marked sent after its broker ack, so whatever was in flight is
/// read or claimed again by the next owner once the slot leases expire.
fn shutdown_watchdog(bound: Duration) {
    let _ = std::thread::Builder::new()
        .name("shutdown-watchdog".into())
        .spawn(move || {
            std::thread::sleep(bound);
            tracing::error!(
                after_secs = bound.as_secs_f64(),
                "shutdown did not finish in time: exiting; intents not confirmed stay unsent and are sent again by the next owner"
            );
            std::process::exit(EXIT_FORCED.into());
        });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
