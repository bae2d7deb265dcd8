//! `--sweep-batch` and `--sweep-relays`: the same workload once per value, each point on a
//! fresh database namespace and topic, then a comparison table, the sweep's JSON (`--json`) and
//! its SVG chart ([`chart`], hand-written SVG).
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cli::FlagValue;
use crate::error::{Error, Result};
use crate::report::{self, RunReport};
use crate::run;
use crate::spec::RunSpec;

mod chart;

use self::chart::Chart;

/// What is swept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepKind {
    /// Claim batch size.
    Batch,
    /// Competing relays.
    Relays,
}

impl SweepKind {
    fn name(self) -> &'static str {
        match self {
            Self::Batch => "batch_size",
            Self::Relays => "relays",
        }
    }

    fn file_stem(self) -> &'static str {
        match self {
            Self::Batch => "batch",
            Self::Relays => "relays",
        }
    }

    fn apply(self, spec: &mut RunSpec, v: u32) {
        match self {
            Self::Batch => spec.relays.batch_size = v as usize,
            Self::Relays => spec.relays.relays = v as usize,
        }
        spec.label = format!("{}={v}", self.name());
    }
}

/// A sweep: one report per value.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    /// `batch_size` or `relays`.
    pub sweep: &'static str,
    pub values: Vec<u32>,
    pub ok: bool,
    /// Sums over the points (so scripts can check a sweep like a run).
    pub enqueued: u64,
    pub sent: u64,
    pub consumed: u64,
    pub duplicates: u64,
    pub lost: u64,
    pub ordering_violations: u64,
    pub chart: Option<String>,
    pub points: Vec<RunReport>,
}

/// Runs every point and writes the chart (and the JSON report when `json` is given); a point
/// that fails to run at all stops the sweep. With `interrupt`, the
/// current point ends early and no further points start.
pub async fn run(
    base: &RunSpec,
    kind: SweepKind,
    values: &[u32],
    chart: Option<&Path>,
    json: Option<&Path>,
    interrupt: &CancellationToken,
) -> Result<SweepReport> {
    // one producer-only baseline for the whole sweep: the producers do not change per point
    let baseline = run::baseline(base, interrupt).await?;
    let mut points: Vec<RunReport> = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        if interrupt.is_cancelled() {
            break;
        }
        let mut spec = base.clone();
        kind.apply(&mut spec, *v);
        if spec.progress {
            eprintln!(
                "loadgen: sweep point {}/{}: {}",
                i + 1,
                values.len(),
                spec.label
            );
        }
        let r = run::run(&spec, baseline, interrupt).await?;
        if spec.progress {
            eprintln!("loadgen: {}: {}", spec.label, r.verdict());
        }
        points.push(r);
    }
    let done: Vec<u32> = values[..points.len()].to_vec();
    let chart_path = chart
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(format!("loadgen-sweep-{}.svg", kind.file_stem())));
    write_chart(kind, &done, &points, &chart_path)?;
    let sum = |f: fn(&RunReport) -> u64| points.iter().map(f).sum::<u64>();
    let report = SweepReport {
        sweep: kind.name(),
        values: done,
        ok: points.iter().all(|p| p.ok) && points.len() == values.len(),
        enqueued: sum(|p| p.enqueued),
        sent: sum(|p| p.sent),
        consumed: sum(|p| p.consumed),
        duplicates: sum(|p| p.duplicates),
        lost: sum(|p| p.lost),
        ordering_violations: sum(|p| p.ordering_violations),
        chart: (!points.is_empty()).then(|| chart_path.display().to_string()),
        points,
    };
    if let Some(path) = json {
        report::write_json(path, &report)?;
    }
    Ok(report)
}

/// The p99 plotted per point: commit→ack when the relays' metrics or rows give it, else
/// commit→consumed.
fn p99(r: &RunReport) -> Option<f64> {
    r.latency_ms
        .commit_to_ack
        .or(r.latency_ms.commit_to_consumed)
        .map(|q| q.p99)
}

fn write_chart(kind: SweepKind, xs: &[u32], points: &[RunReport], path: &Path) -> Result<()> {
    let Some(first) = points.first() else {
        return Ok(());
    };
    let c = &first.config;
    let subtitle = format!(
        "{} store, {} sink, {} producers × {} orders/tx, {} B payload, {:.0}s per point",
        c.spec.db.store.as_str(),
        c.spec.relays.sink.as_str(),
        c.producers,
        c.spec.work.orders_per_tx,
        c.spec.work.payload_bytes,
        c.spec.duration.as_secs_f64()
    );
    let (title, x_label) = match kind {
        SweepKind::Batch => (
            "ferry loadgen: claim batch size sweep",
            "claim batch size (events)",
        ),
        SweepKind::Relays => (
            "ferry loadgen: competing relays sweep",
            "relays over the same slots",
        ),
    };
    let throughput: Vec<f64> = points.iter().map(|p| p.sent_per_sec).collect();
    let lat: Vec<Option<f64>> = points.iter().map(p99).collect();
    let acked = points
        .iter()
        .filter(|p| p.latency_ms.commit_to_ack.is_some())
        .count();
    let latency_label = match acked {
        n if n == points.len() => "commit→ack",
        0 => "commit→consumed",
        _ => "commit→ack (commit→consumed where no ack was measured)",
    };
    let svg = Chart {
        title,
        subtitle: &subtitle,
        x_label,
        xs,
        throughput: &throughput,
        p99_ms: &lat,
        latency_label,
    }
    .render();
    std::fs::write(path, svg).map_err(|source| Error::Io {
        what: "write the chart to",
        path: path.to_path_buf(),
        source,
    })
}

impl SweepReport {
    /// The comparison table.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "\nferry loadgen — sweep over {}", self.sweep);
        if let Some(first) = self.points.first() {
            let c = &first.config;
            // the swept setting varies per point; show only the fixed ones
            let relays = if self.sweep == "relays" {
                "K".to_string()
            } else {
                c.spec.relays.relays.to_string()
            };
            let batch = if self.sweep == "batch_size" {
                "swept".to_string()
            } else {
                c.spec.relays.batch_size.to_string()
            };
            let _ = writeln!(
                o,
                "  {} store, {} sink, {relays} relay(s) × {} workers, batch {batch}, {} producers × {} orders/tx, {:.0}s per point",
                c.spec.db.store.as_str(),
                c.spec.relays.sink.as_str(),
                c.spec.relays.workers,
                c.producers,
                c.spec.work.orders_per_tx,
                c.spec.duration.as_secs_f64()
            );
            if let Some(b) = &first.baseline {
                let _ = writeln!(
                    o,
                    "  producer-only baseline: {} ev/s",
                    report::render::rate(b.enqueued_per_sec)
                );
            }
        }
        let _ = writeln!(
            o,
            "\n  {:>10} {:>10} {:>10} {:>10} {:>8} {:>12} {:>12} {:>9} {:>8} {:>8} {:>7} {:>6} {:>6} {:>5}",
            self.sweep,
            "enq/s",
            "sent/s",
            "cons/s",
            "×base",
            "p99 ack ms",
            "p99 cons ms",
            "batch",
            "empty%",
            "skipped",
            "fenced",
            "dups",
            "lost",
            "viol"
        );
        for (v, p) in self.values.iter().zip(&self.points) {
            let ms = |q: Option<crate::report::Quantiles>| {
                q.map_or("-".to_string(), |q| format!("{:.2}", q.p99))
            };
            let _ = writeln!(
                o,
                "  {:>10} {:>10} {:>10} {:>10} {:>8} {:>12} {:>12} {:>9} {:>8} {:>8} {:>7} {:>6} {:>6} {:>5}",
                v,
                report::render::rate(p.enqueued_per_sec),
                report::render::rate(p.sent_per_sec),
                if p.verification.method == "kafka-consumer" { report::render::rate(p.consumed_per_sec) } else { "-".to_string() },
                p.baseline.as_ref().map_or("-".to_string(), |b| format!("{:.2}", b.relay_ratio)),
                ms(p.latency_ms.commit_to_ack),
                ms(p.latency_ms.commit_to_consumed),
                p.batch_size.map_or("-".to_string(), |b| format!("{:.1}", b.mean)),
                p.claims.as_ref().map_or("-".to_string(), |c| format!("{:.2}", c.empty_ratio * 100.0)),
                p.claims.as_ref().and_then(|c| c.rows_skipped_locked).map_or("-".to_string(), |n| n.to_string()),
                p.claims.as_ref().map_or("-".to_string(), |c| c.fenced.to_string()),
                p.duplicates,
                p.lost,
                p.ordering_violations
            );
        }
        if let Some(c) = &self.chart {
            let _ = writeln!(o, "\n  chart: {c}");
        }
        for p in self.points.iter().filter(|p| !p.ok) {
            let _ = writeln!(o, "  {}: {}", p.label, p.verdict());
            for e in &p.errors {
                let _ = writeln!(o, "    ERROR: {e}");
            }
        }
        let verdict = if self.ok {
            format!(
                "PASS: {} points, 0 lost, 0 ordering violations",
                self.points.len()
            )
        } else {
            format!(
                "FAIL: {} lost, {} ordering violations over {} points",
                self.lost,
                self.ordering_violations,
                self.points.len()
            )
        };
        let _ = writeln!(o, "\n  {verdict}");
        o
    }
}
