//! `ferry relay`'s settings: its flags, the file and the defaults merged by the rules of
//! [`crate::config`] ([`relay_settings`]), every value checked.
use std::net::SocketAddr;

use clap::ValueEnum;
use ferry_core::{Backoff, DispatchMode};
use ferry_relay::metrics::AlertThresholds;
use ferry_relay::{KafkaConfig, RelayConfig, RetentionConfig, WorkerDefaults};
use ferry_store::Backend;

use crate::cmd::relay::args::RelayArgs;
use crate::config::{
    alerts, default_dispatch, duration, listen_addr, pick, ConfigError, FileConfig, RelaySection,
    SinkKind, DEFAULT_METRICS_LISTEN, DEFAULT_SINK,
};

/// The sink to build.
pub enum SinkSpec {
    Kafka(KafkaConfig),
    Stdout,
    Null,
}

/// Everything `ferry relay` runs with.
pub struct RelaySettings {
    pub config: RelayConfig,
    pub sink: SinkSpec,
    pub alerts: AlertThresholds,
    pub retention: Option<RetentionConfig>,
    /// `None`: the metrics endpoint is off.
    pub listen: Option<SocketAddr>,
    /// Kafka properties that weaken delivery or order, allowed by name: (key, value, why),
    /// logged at WARN on every start.
    pub unsafe_allowed: Vec<(String, String, String)>,
}
/// Resolves and checks every `ferry relay` setting for a relay on `backend`.
pub fn relay_settings(
    a: &RelayArgs,
    f: &FileConfig,
    backend: Backend,
) -> Result<RelaySettings, ConfigError> {
    let (mut config, sink) = relay_and_sink(a, f)?;
    // Worker settings left unset take the defaults of the dispatch mode the relay will run in
    // (the store's preferred one unless --dispatch says otherwise).
    let d = worker_defaults(config.dispatch, backend);
    if pick(&a.workers, &f.relay.workers).is_none() {
        config.workers = d.workers;
    }
    if pick(&a.batch_size, &f.relay.batch_size).is_none() {
        config.batch_size = d.batch_size;
    }
    if pick(&a.in_flight, &f.relay.in_flight).is_none() {
        config.max_in_flight = d.max_in_flight;
    }
    config.read_interval = duration(
        "relay.read_interval (--read-interval)",
        &a.read_interval,
        &f.relay.read_interval,
        d.read_interval,
    )?;
    let mut alerts = alerts(
        &a.slo_target,
        &a.slo_ratio,
        &a.oldest_warning,
        &a.oldest_critical,
        f,
    )?;
    alerts.sink_stall = duration(
        "alerts.sink_stall (--sink-stall)",
        &a.sink_stall,
        &f.alerts.sink_stall,
        alerts.sink_stall,
    )?;
    if alerts.sink_stall.is_zero() {
        return Err(ConfigError(
            "invalid alerts.sink_stall (--sink-stall): must be longer than 0, e.g. 30s".into(),
        ));
    }
    let mut unsafe_allowed = Vec::new();
    if let SinkSpec::Kafka(kc) = &sink {
        let allowed: std::collections::BTreeSet<&str> = a
            .allow_unsafe_kafka_property
            .iter()
            .chain(&f.sink.allow_unsafe_properties)
            .map(|k| k.trim())
            .collect();
        for k in &allowed {
            if !kc.extra.contains_key(*k) {
                return Err(ConfigError(format!(
                    "invalid --allow-unsafe-kafka-property {k:?} (sink.allow_unsafe_properties): no such Kafka property is set"
                )));
            }
        }
        for (k, why) in
            ferry_relay::sink::kafka::weakening_properties(&kc.extra, config.claim_lease)
        {
            let v = kc.extra.get(&k).cloned().unwrap_or_default();
            if allowed.contains(k.as_str()) {
                unsafe_allowed.push((k, v, why));
            } else {
                return Err(ConfigError(format!(
                    "refusing Kafka property {k}={v}: {why}; to run with it anyway, pass --allow-unsafe-kafka-property {k} (sink.allow_unsafe_properties)"
                )));
            }
        }
    }
    let listen = metrics_listen(a, f)?;
    let retention = retention(a, &f.relay)?;
    if let Some(r) = &retention {
        r.validate().map_err(|e| ConfigError(e.to_string()))?;
    }
    Ok(RelaySettings {
        config,
        retention,
        sink,
        alerts,
        listen,
        unsafe_allowed,
    })
}
/// The worker settings of `dispatch` (else the default mode) on `backend`.
fn worker_defaults(dispatch: Option<DispatchMode>, backend: Backend) -> WorkerDefaults {
    let mode = dispatch.unwrap_or(default_dispatch(backend));
    WorkerDefaults::for_mode(mode, backend)
}
fn relay_and_sink(a: &RelayArgs, f: &FileConfig) -> Result<(RelayConfig, SinkSpec), ConfigError> {
    let r = &f.relay;
    let d = RelayConfig::default();
    let config = RelayConfig {
        owner: pick(&a.owner, &r.owner).unwrap_or(d.owner),
        workers: pick(&a.workers, &r.workers).unwrap_or(d.workers),
        batch_size: pick(&a.batch_size, &r.batch_size).unwrap_or(d.batch_size),
        max_in_flight: pick(&a.in_flight, &r.in_flight).unwrap_or(d.max_in_flight),
        claim_lease: duration(
            "relay.claim_lease (--claim-lease)",
            &a.claim_lease,
            &r.claim_lease,
            d.claim_lease,
        )?,
        slot_ttl: duration(
            "relay.slot_ttl (--slot-ttl)",
            &a.slot_ttl,
            &r.slot_ttl,
            d.slot_ttl,
        )?,
        heartbeat: duration(
            "relay.heartbeat (--heartbeat)",
            &a.heartbeat,
            &r.heartbeat,
            d.heartbeat,
        )?,
        poll_min: duration(
            "relay.poll_min (--poll-min)",
            &a.poll_min,
            &r.poll_min,
            d.poll_min,
        )?,
        poll_idle: duration(
            "relay.poll_idle (--poll-idle)",
            &a.poll_idle,
            &r.poll_idle,
            d.poll_idle,
        )?,
        read_linger: duration(
            "relay.read_linger (--read-linger)",
            &a.read_linger,
            &r.read_linger,
            d.read_linger,
        )?,
        backoff: Backoff {
            base: duration(
                "relay.backoff_base (--backoff-base)",
                &a.backoff_base,
                &r.backoff_base,
                d.backoff.base,
            )?,
            max: duration(
                "relay.backoff_max (--backoff-max)",
                &a.backoff_max,
                &r.backoff_max,
                d.backoff.max,
            )?,
        },
        max_attempts: pick(&a.max_attempts, &r.max_attempts).unwrap_or(d.max_attempts),
        shutdown_timeout: duration(
            "relay.shutdown_timeout (--shutdown-timeout)",
            &a.shutdown_timeout,
            &r.shutdown_timeout,
            d.shutdown_timeout,
        )?,
        dispatch: pick(&a.dispatch, &r.dispatch)
            .map(|m| {
                m.parse::<DispatchMode>()
                    .map_err(|e| ConfigError(format!("invalid relay.dispatch (--dispatch): {e}")))
            })
            .transpose()?,
        ..d
    };
    config.validate().map_err(|e| ConfigError(e.to_string()))?;
    let kind = match pick(&a.sink, &f.sink.kind) {
        None => DEFAULT_SINK,
        Some(kind) => SinkKind::from_str(&kind, true).map_err(|_| {
            ConfigError(format!(
                "invalid sink.kind (--sink) {kind:?}: use kafka, stdout or null"
            ))
        })?,
    };
    let sink = match kind {
        SinkKind::Stdout => SinkSpec::Stdout,
        SinkKind::Null => SinkSpec::Null,
        SinkKind::Kafka => SinkSpec::Kafka(kafka_config(
            &KafkaFlags {
                brokers: &a.kafka_brokers,
                properties: &a.kafka_property,
                message_timeout: &a.kafka_message_timeout,
                linger: &a.kafka_linger,
            },
            f,
            config.claim_lease,
        )?),
    };
    Ok((config, sink))
}
/// `relay.retention` and its two companions; these alone are refused (they would do nothing).
fn retention(a: &RelayArgs, r: &RelaySection) -> Result<Option<RetentionConfig>, ConfigError> {
    let batch = pick(&a.retention_batch, &r.retention_batch);
    let vacuum = a.retention_vacuum || r.retention_vacuum.unwrap_or(false);
    let Some(age) = pick(&a.retention, &r.retention) else {
        if batch.is_some() || vacuum {
            return Err(ConfigError(
                "relay.retention_batch (--retention-batch) and relay.retention_vacuum (--retention-vacuum) need relay.retention (--retention), e.g. 7d".into(),
            ));
        }
        return Ok(None);
    };
    let age = ferry_core::parse_duration(&age)
        .map_err(|e| ConfigError(format!("invalid relay.retention (--retention): {e}")))?;
    let mut retention = RetentionConfig::new(age);
    retention.purge.batch = batch.unwrap_or(retention.purge.batch);
    retention.purge.vacuum = vacuum;
    Ok(Some(retention))
}

/// The Kafka flags of a command that sends through the relay's sink (`ferry relay`,
/// `ferry replay`).
pub(crate) struct KafkaFlags<'a> {
    pub brokers: &'a Option<String>,
    pub properties: &'a [String],
    pub message_timeout: &'a Option<String>,
    pub linger: &'a Option<String>,
}

/// The Kafka producer settings from `flags` over the file's `[sink]`, checked (brokers, the
/// message timeout against `claim_lease`, the linger range); `ordered` is left false.
pub(crate) fn kafka_config(
    flags: &KafkaFlags<'_>,
    f: &FileConfig,
    claim_lease: std::time::Duration,
) -> Result<KafkaConfig, ConfigError> {
    let dk = KafkaConfig::default();
    let mut extra = f.sink.kafka_properties.clone();
    for p in flags.properties {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| ConfigError(format!("invalid --kafka-property {p:?}: use KEY=VALUE")))?;
        extra.insert(k.trim().to_string(), v.trim().to_string());
    }
    let kc = KafkaConfig {
        brokers: pick(flags.brokers, &f.sink.brokers).unwrap_or(dk.brokers),
        message_timeout: duration(
            "sink.message_timeout (--kafka-message-timeout)",
            flags.message_timeout,
            &f.sink.message_timeout,
            dk.message_timeout,
        )?,
        linger: duration(
            "sink.linger (--kafka-linger)",
            flags.linger,
            &f.sink.linger,
            dk.linger,
        )?,
        extra,
        // set by the relay command once the dispatch mode is known
        ordered: false,
    };
    if kc.brokers.trim().is_empty() {
        return Err(ConfigError(
            "invalid sink.brokers (--kafka-brokers): must not be empty".into(),
        ));
    }
    // checked in both dispatch modes (cursor dispatch sends without a message timeout,
    // but the same configuration must stay valid in row dispatch)
    if kc.message_timeout >= claim_lease {
        return Err(ConfigError(
            "invalid sink.message_timeout: must be shorter than relay.claim_lease, so an unanswered send resolves before another relay may take the event over".into(),
        ));
    }
    // librdkafka's own range for linger.ms, named here rather than in its words
    if kc.linger > ferry_relay::MAX_KAFKA_LINGER {
        return Err(ConfigError(
            "invalid sink.linger (--kafka-linger): must be at most 15m (librdkafka's linger.ms range)".into(),
        ));
    }
    Ok(kc)
}

fn metrics_listen(a: &RelayArgs, f: &FileConfig) -> Result<Option<SocketAddr>, ConfigError> {
    let s =
        pick(&a.metrics_listen, &f.metrics.listen).unwrap_or_else(|| DEFAULT_METRICS_LISTEN.into());
    if s == "off" {
        return Ok(None);
    }
    Ok(Some(listen_addr(&s)?))
}
