//! `ferry`: migrate, relay, status, quarantine and enqueue for the ferry outbox relay.
//!
//! Settings come from built-in defaults, then a TOML file (`--config`), then `FERRY_*`
//! environment variables, then flags (each later source wins). Exit codes: 0 success, 1 runtime
//! error, 2 bad usage or configuration; `status` exits 4 at a warning and 5 at a critical alert;
//! `reconcile` exits 4 with unknown or quarantined intents and 5 with business rows that have no
//! intent; `lab` exits 1 if an expectation did not hold; `relay` exits 130 when its shutdown
//! did not finish within its bound or a second signal cut it short.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod cmd;
mod config;
mod help;
mod lab;

use cmd::{fail, Database, Failure};
use config::{FileConfig, LogFormat};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "ferry",
    version,
    about = "Transactional-outbox relay: claim, send, confirm — fenced and in order.",
    after_help = "Exit codes: 0 success; 1 runtime error; 2 bad usage or configuration; \
                  4 status WARNING, or reconcile found unknown or quarantined intents; \
                  5 status CRITICAL, or reconcile found business rows without an intent; \
                  130 relay shutdown cut short (past --shutdown-timeout + 10 s, or a second signal)."
)]
struct Cli {
    /// TOML configuration file (see docs/operations.md for every key).
    #[arg(long, global = true, env = "FERRY_CONFIG")]
    config: Option<PathBuf>,
    /// Database URL: postgres://…, mysql://… (MariaDB) or sqlite://path.db. Never printed
    /// with its password.
    #[arg(
        long,
        global = true,
        env = "FERRY_DATABASE_URL",
        hide_env_values = true
    )]
    database_url: Option<String>,
    /// Log filter (tracing EnvFilter syntax), e.g. info, ferry_relay=debug. PostgreSQL notices
    /// (sqlx::postgres::notice) are logged from warn unless the filter mentions sqlx.
    #[arg(long, global = true, env = "FERRY_LOG", default_value = config::DEFAULT_LOG)]
    log: String,
    /// Log format: text (colours only when stderr is a terminal) or json (one object per line,
    /// for log shippers).
    #[arg(long, global = true, env = "FERRY_LOG_FORMAT", value_enum, default_value_t = config::DEFAULT_LOG_FORMAT)]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

// parsed once per process: the size of the relay's arguments does not matter
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Apply the embedded schema migrations (waits for a concurrent migrate; never double-applies).
    Migrate,
    /// Run the relay until SIGINT/SIGTERM, then drain gracefully and exit 0 (130 when the drain
    /// outlasts --shutdown-timeout + 10 s, or at a second signal).
    Relay(cmd::relay::RelayArgs),
    /// Show backlog, oldest intent age, unknown exposure, quarantine, pauses, the outbox's size,
    /// slot owners and each relay's sink. Exits 4 at a warning (past the warning age, blocked
    /// aggregates, a relay's stalled sink, a harmful server setting, a paused topic), 5 at a
    /// critical alert (past the critical age); 2 is bad usage, 1 an error.
    Status(cmd::status::StatusArgs),
    /// Inspect and resolve quarantined events.
    Quarantine {
        #[command(subcommand)]
        cmd: cmd::quarantine::QuarantineCmd,
    },
    /// Stop delivering the intents of chosen topics (--topic, repeatable) or of every topic
    /// (--all), with a --reason; recorded in the database, obeyed by every relay within one idle
    /// poll, kept across restarts. Later versions of their aggregates wait too.
    Pause(cmd::pause::PauseArgs),
    /// Lift pauses (--topic, repeatable, or --all): the held intents go out, each aggregate in
    /// order. Exits 2, changing nothing, when a named topic is not paused.
    Resume(cmd::pause::ResumeArgs),
    /// Enqueue events from JSON (an object, an array, or JSON lines) for demos and scripts.
    Enqueue(cmd::enqueue::EnqueueArgs),
    /// Delete SENT rows older than the retention window, in bounded batches. Never touches
    /// PENDING, CLAIMED, QUARANTINED or SKIPPED rows.
    Purge(cmd::purge::PurgeArgs),
    /// Classify every intent under a fixed watermark into mutually exclusive classes. Exits 4
    /// with unknown or quarantined intents, 5 with business rows that have no intent.
    Reconcile(cmd::reconcile::ReconcileArgs),
    /// Re-publish retained SENT events of a topic, aggregate and created_at range through the
    /// Kafka sink (to their topic or --to-topic), each aggregate in version order, marked with
    /// the ferry-replay header. Refuses a range retention cut; --dry-run only counts.
    Replay(cmd::replay::ReplayArgs),
    /// The reliability lab: run the outbox's failure cases (rollback, crash windows, stale claims,
    /// partial batches) on a fresh database (a temporary SQLite file by default or with a
    /// sqlite:// URL; with a PostgreSQL or MariaDB --database-url, a new schema/database there,
    /// dropped afterwards) with a real Kafka receiver (the embedded mock cluster)
    /// and a consumer Inbox; print the durable facts; exit 1 if an expectation did not hold.
    Lab(cmd::lab::LabArgs),
}

/// The command line, its help text's `[default: …]` filled in from the defaults the code uses.
fn command() -> clap::Command {
    help::document_defaults(Cli::command())
}

fn main() -> ExitCode {
    // what `Cli::parse()` does, with the help text filled in
    let mut matches = command().get_matches();
    let cli =
        Cli::from_arg_matches_mut(&mut matches).unwrap_or_else(|e| e.format(&mut command()).exit());
    if !matches!(cli.cmd, Cmd::Relay(_)) {
        end_quietly_on_a_closed_pipe();
    }
    // Migrations log PostgreSQL NOTICEs ("trigger … does not exist, skipping") at info: quiet
    // them unless the filter asks for them.
    let directives = if cli.log.contains("sqlx") {
        cli.log.clone()
    } else {
        format!("{},sqlx::postgres::notice=warn", cli.log)
    };
    let filter = match tracing_subscriber::EnvFilter::try_new(&directives) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "error: invalid --log (FERRY_LOG) {:?}: {e}; use a tracing filter such as info or ferry_relay=debug",
                cli.log
            );
            return ExitCode::from(2);
        }
    };
    {
        use std::io::IsTerminal;
        let fmt = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        match cli.log_format {
            LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).init(),
            LogFormat::Json => fmt.json().with_ansi(false).init(),
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// A command whose output is piped into a reader that stops early (`ferry status | head -3`)
/// ends the way Unix tools do, by SIGPIPE, instead of panicking on the failed write (Rust
/// ignores SIGPIPE, so `println!` meets EPIPE). Not for `ferry relay`: its stdout sink treats a
/// closed pipe as a failed send and retries, and a signal would stop it mid-batch. Sockets are
/// unaffected either way (their writes pass `MSG_NOSIGNAL`).
fn end_quietly_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: called at the start of main before any thread is spawned; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    let file = match &cli.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let url = config::database_url(&cli.database_url, &file);
    if let Cmd::Lab(a) = &cli.cmd {
        return cmd::lab::run(a, url).await;
    }
    let url = url.ok_or_else(|| {
        fail(2, "no database URL: pass --database-url, set FERRY_DATABASE_URL, or database_url in the config file")
    })?;
    let backend = ferry_store::Backend::from_url(&url)?;
    let db = Database {
        url,
        backend,
        limits: config::limits(&file),
    };
    match cli.cmd {
        Cmd::Migrate => cmd::migrate::run(&db).await,
        Cmd::Relay(args) => cmd::relay::run(&args, &file, &db).await,
        Cmd::Status(args) => cmd::status::run(args, &file, db.open(false, false).await?).await,
        Cmd::Quarantine { cmd } => cmd::quarantine::run(cmd, db.open(false, false).await?).await,
        Cmd::Pause(args) => cmd::pause::pause(args, db.open(false, false).await?).await,
        Cmd::Resume(args) => cmd::pause::resume(args, db.open(false, false).await?).await,
        Cmd::Enqueue(args) => cmd::enqueue::run(args, db.open(true, false).await?).await,
        Cmd::Purge(args) => cmd::purge::run(args, db.open(false, false).await?).await,
        Cmd::Reconcile(args) => cmd::reconcile::run(args, db.open(false, false).await?).await,
        Cmd::Replay(args) => cmd::replay::run(args, &file, db.open(false, false).await?).await,
        Cmd::Lab(_) => unreachable!("handled before the database URL is required"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `ferry …` command lines of README.md and docs/*.md use `ferry`'s own flags.
    #[test]
    fn documented_command_lines_use_real_flags() {
        ferry_testkit::assert_documented_command_lines!(Cli::command(), "ferry");
    }

    /// Every `{placeholder}` in the help is filled, and every default is shown somewhere.
    #[test]
    fn the_help_shows_every_default_and_no_placeholder() {
        fn walk(c: &clap::Command, out: &mut Vec<String>) {
            for a in c.get_arguments() {
                out.extend(a.get_help().map(|h| h.to_string()));
                out.extend(a.get_long_help().map(|h| h.to_string()));
            }
            for s in c.get_subcommands() {
                walk(s, out);
            }
        }
        let (mut raw, mut filled) = (Vec::new(), Vec::new());
        walk(&Cli::command(), &mut raw);
        walk(&command(), &mut filled);
        for key in help::help_defaults().iter().map(|(k, _)| k) {
            let p = format!("{{{key}}}");
            assert!(raw.iter().any(|h| h.contains(&p)), "no flag shows {key}");
        }
        // a placeholder: `{` then lowercase letters, `_` and `.`, then `}`
        let placeholder = |h: &str| {
            h.split('{').skip(1).any(|rest| {
                rest.split_once('}').is_some_and(|(name, _)| {
                    !name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
                })
            })
        };
        assert!(placeholder("x [default: {relay.slot_ttl}]"));
        for h in &filled {
            assert!(!placeholder(h), "unfilled placeholder in {h:?}");
        }
        let relay = command()
            .find_subcommand_mut("relay")
            .unwrap()
            .render_help()
            .to_string();
        for shown in [
            "[default: 1 in cursor dispatch; in row dispatch 4, and 1 on SQLite,",
            "Claim lease, e.g. 60s [default: 60s] (relay.claim_lease)",
            "[default: 5m] (alerts.oldest_warning)",
            "[default: 127.0.0.1:9464] (metrics.listen)",
            "[default: kafka] (sink.kind)",
            "[default: cursor] (relay.dispatch)",
        ] {
            assert!(relay.contains(shown), "{shown:?} not in:\n{relay}");
        }
    }
}
