//! `loadgen`: ferry's load generator and delivery verifier.
//!
//! Producers commit orders and their outbox intents in one local transaction; relays claim,
//! send and mark them SENT; a Kafka consumer reads the topic back while the run goes on. The
//! report states throughput, latency distributions, claim statistics and database costs, and
//! the run fails (exit code 1) if any committed intent was lost or any aggregate's versions
//! were first delivered out of order. With `--inbox`, a consumer also applies every message
//! through ferry's consumer Inbox, and the run fails unless every committed event's effect was
//! applied exactly once.
//!
//! Exit codes: 0 pass, 1 verification failed, 2 bad flags, 3 the run could not be carried out,
//! 130 interrupted twice.
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

mod chaos;
mod cli;
mod clock;
mod db;
mod error;
mod inbox;
mod intervals;
mod kafka;
mod progress;
mod relays;
mod report;
mod retention;
mod run;
mod spec;
mod sweep;

use cli::Args;
use error::Result;
use sweep::SweepKind;

// Allocation-heavy paths (event strings, JSON, librdkafka callbacks) run on every core.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Args::parse_checked();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // relay info logs (slot ownership, ...) would drown the progress line
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen: error: cannot start the async runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(app(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            let mut msg = format!("loadgen: error: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                let s_text = s.to_string();
                if !msg.contains(&s_text) {
                    msg.push_str(&format!(": {s_text}"));
                }
                src = s.source();
            }
            eprintln!("{msg}");
            ExitCode::from(3)
        }
    }
}

/// Runs what the flags ask for; `Ok(passed)`.
async fn app(args: Args) -> Result<bool> {
    let interrupt = CancellationToken::new();
    {
        // First Ctrl-C: end the load phase, drain, verify and report. Second: give up.
        let interrupt = interrupt.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\nloadgen: interrupted: draining and reporting (Ctrl-C again to abort)");
                interrupt.cancel();
                if tokio::signal::ctrl_c().await.is_ok() {
                    eprintln!("loadgen: aborted");
                    std::process::exit(130);
                }
            }
        });
    }
    let spec = spec::RunSpec::from_args(&args);
    let sweep = match (&args.sweep.sweep_batch, &args.sweep.sweep_relays) {
        (Some(v), _) => Some((SweepKind::Batch, v.0.clone())),
        (None, Some(v)) => Some((SweepKind::Relays, v.0.clone())),
        (None, None) => None,
    };
    if let Some((kind, values)) = sweep {
        let report = sweep::run(
            &spec,
            kind,
            &values,
            args.sweep.chart.as_deref(),
            args.run.json.as_deref(),
            &interrupt,
        )
        .await?;
        for p in &report.points {
            print!("{}", p.render());
        }
        print!("{}", report.render());
        return Ok(report.ok);
    }
    if matches!(args.command, Some(cli::Command::Baseline)) {
        return save_baseline(&spec, args.run.json.as_deref(), &interrupt).await;
    }
    let baseline = match &args.run.compare {
        Some(path) => Some(report::SavedBaseline::read(path)?.measured()),
        None => run::baseline(&spec, &interrupt).await?,
    };
    let report = run::run(&spec, baseline, &interrupt).await?;
    print!("{}", report.render());
    if let Some(path) = &args.run.json {
        report::write_json(path, &report)?;
    }
    Ok(report.ok)
}

/// `loadgen baseline`: the producer-only phase alone, printed and saved to `json` if given.
async fn save_baseline(
    spec: &spec::RunSpec,
    json: Option<&std::path::Path>,
    interrupt: &CancellationToken,
) -> Result<bool> {
    let Some(measured) = run::baseline(spec, interrupt).await? else {
        return Ok(false);
    };
    let saved = report::SavedBaseline::new(spec, measured);
    println!(
        "ferry loadgen — baseline: {} producers, no relay: {} intents in {:.1}s = {} ev/s ({})",
        saved.producers,
        saved.enqueued,
        saved.duration_secs,
        report::render::rate(saved.enqueued_per_sec),
        saved.store
    );
    if let Some(path) = json {
        report::write_json(path, &saved)?;
    }
    Ok(true)
}
