//! Runs one schedule step by step: sends each step to its session and checks the server
//! against the model after every step.
use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::DispatchMode;
use ferry_store::Backend;
use sqlx::{Connection, Executor, MySqlConnection, PgConnection};
use tokio::sync::mpsc;

use super::check::Intent;
use super::model::{Issuer, Locking, Model, Outcome};
use super::op::{letter, Op};
use super::reader::Reader;
use super::server::{Monitor, Seen, Server};
use super::session::{spawn, Cmd, Conn, GateFlags, Reply, NOBODY, STEP_DEADLINE};
use crate::db::TestDb;

/// What a run of one schedule left behind.
#[derive(Debug, Default)]
pub(super) struct Book {
    pub(super) committed: Vec<Intent>,
    pub(super) discarded: Vec<Intent>,
    /// Per session: intents of the open transaction, and how many there were at the savepoint.
    open: Vec<(Vec<Intent>, Option<usize>)>,
    /// Waits the server showed, as the model predicted.
    pub(super) waits: usize,
    pub(super) steps: usize,
}

pub(super) struct Harness {
    pub(super) locking: Locking,
    sessions: Vec<mpsc::UnboundedSender<Cmd>>,
    replies: mpsc::UnboundedReceiver<Reply>,
    pub(super) server: Server,
    monitor: Monitor,
    pub(super) book: Book,
}

impl Harness {
    pub(super) async fn open(db: &TestDb, n: usize) -> Harness {
        let (reply_tx, replies) = mpsc::unbounded_channel();
        let mut sessions = Vec::new();
        let flags = Arc::new(GateFlags {
            holder: AtomicUsize::new(NOBODY),
            queued: (0..n).map(|_| AtomicBool::new(false)).collect(),
        });
        let (server, monitor) = match db.backend {
            Backend::Postgres => {
                let mut pids = Vec::new();
                for s in 0..n {
                    let mut c = PgConnection::connect(&db.url).await.expect("session");
                    c.execute("SET lock_timeout = '30s'").await.expect("set");
                    pids.push(
                        sqlx::query_scalar("SELECT pg_backend_pid()")
                            .fetch_one(&mut c)
                            .await
                            .expect("pid"),
                    );
                    sessions.push(spawn(s, Conn::Pg(c), &reply_tx));
                }
                let server = PgConnection::connect(&db.url).await.expect("server");
                (Server::Pg(server), Monitor::Pg(pids))
            }
            Backend::Mysql => {
                let mut ids = Vec::new();
                for s in 0..n {
                    let mut c = MySqlConnection::connect(&db.url).await.expect("session");
                    c.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await
                        .expect("set");
                    c.execute("SET SESSION innodb_lock_wait_timeout = 30")
                        .await
                        .expect("set");
                    ids.push(
                        sqlx::query_scalar("SELECT CONNECTION_ID()")
                            .fetch_one(&mut c)
                            .await
                            .expect("connection id"),
                    );
                    sessions.push(spawn(s, Conn::My(c), &reply_tx));
                }
                let server = MySqlConnection::connect(&db.url).await.expect("server");
                (Server::My(server), Monitor::My(ids))
            }
            Backend::Sqlite => {
                let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&db.url)
                    .expect("SQLite URL")
                    .busy_timeout(Duration::from_secs(10));
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(n as u32 + 1)
                    .connect_with(opts)
                    .await
                    .expect("SQLite pool");
                let gate = ferry_store::sqlite::write_gate(&pool);
                for s in 0..n {
                    let conn = pool.acquire().await.expect("session").detach();
                    let conn = Conn::Lite {
                        conn,
                        gate: gate.clone(),
                        guard: None,
                        flags: flags.clone(),
                    };
                    sessions.push(spawn(s, conn, &reply_tx));
                }
                (Server::Lite(pool), Monitor::Lite(flags))
            }
        };
        Harness {
            locking: Locking::of(db.backend),
            sessions,
            replies,
            server,
            monitor,
            book: Book {
                open: vec![(Vec::new(), None); n],
                ..Book::default()
            },
        }
    }

    /// Runs one schedule on the rows of `prefix`: the steps in `order`, except that a step of
    /// a session that waits is deferred until the session runs (the server may grant a row to
    /// another waiter than the model's first one, see [`Model::prefer`]). `reader`, when given,
    /// reads after every step. The returned log lists the steps as they ran (with the versions
    /// they got and the waits the server showed).
    pub(super) async fn run(
        &mut self,
        prefix: &str,
        order: &[(usize, Op)],
        mut reader: Option<&mut Reader>,
        db: &TestDb,
    ) -> Result<Vec<String>, String> {
        let n = self.sessions.len();
        let mut model = Model::new(self.locking, n);
        let mut log = Vec::new();
        let mut flight: Vec<Option<InFlight>> = (0..n).map(|_| None).collect();
        let mut issuer = Issuer::new(order, n);
        while let Some((k, s, op)) = issuer.next(&model) {
            let step = InFlight {
                what: format!("{} {}", letter(s), op.describe()),
                op,
                agg: op.agg().map(|a| format!("{prefix}{a}")).unwrap_or_default(),
                tag: format!("{prefix}{}{k}", letter(s)),
                waited: false,
            };
            self.step(&mut model, s, step, &mut flight, &mut log)
                .await
                .map_err(|e| format!("{e}\nsteps so far:\n  {}", log.join("\n  ")))?;
            if let Some(r) = reader.as_deref_mut() {
                // a row claim writes: on SQLite it would wait for an open producer
                if r.mode == DispatchMode::Cursor || !model.holds_writer() {
                    r.read(db).await?;
                }
            }
        }
        if let Some(s) = (0..n).find(|&s| flight[s].is_some() || issuer.deferred(s) > 0) {
            return Err(format!("{} did not finish its steps", letter(s)));
        }
        Ok(log)
    }

    /// Sends one step and waits until the steps the model says finished have finished (with
    /// the model's outcomes) and the sessions it says wait are seen waiting by the server.
    async fn step(
        &mut self,
        model: &mut Model,
        s: usize,
        step: InFlight,
        flight: &mut [Option<InFlight>],
        log: &mut Vec<String>,
    ) -> Result<(), String> {
        let op = step.op;
        self.sessions[s]
            .send(Cmd {
                op,
                agg: step.agg.clone(),
                tag: step.tag.clone(),
            })
            .map_err(|_| "a session ended".to_string())?;
        self.book.steps += 1;
        let before = model.clone();
        let done = model
            .issue(s, op)
            .map_err(|e| format!("{}: {e}", step.what))?;
        let waits = model.waiting(s);
        if waits {
            log.push(format!("{} … waits", step.what));
        }
        flight[s] = Some(InFlight {
            waited: waits,
            ..step
        });
        let deadline = Instant::now() + STEP_DEADLINE;
        let what = |flight: &[Option<InFlight>], s: usize| {
            flight[s]
                .as_ref()
                .map_or_else(|| letter(s).to_string(), |f| f.what.clone())
        };
        let mut expect: BTreeMap<usize, Outcome> = done.iter().copied().collect();
        let mut done_order: Vec<usize> = done.iter().map(|(d, _)| *d).collect();
        let mut got: Vec<(usize, Outcome)> = Vec::new();
        // log lines of the steps that finished, in the order the replies came
        let mut lines: Vec<(usize, String)> = Vec::new();
        let mut diagnose_at = Instant::now() + Duration::from_secs(2);
        while !expect.is_empty() {
            match tokio::time::timeout(Duration::from_millis(100), self.replies.recv()).await {
                Ok(Some(reply)) => {
                    let r = reply.s;
                    if !expect.contains_key(&r) {
                        // the server granted a released row to another of its waiters
                        if let Some((alt, alt_done)) = before.prefer(r, (s, op), &got) {
                            *model = alt;
                            done_order = alt_done.iter().map(|(d, _)| *d).collect();
                            expect = alt_done.into_iter().filter(|g| !got.contains(g)).collect();
                        }
                    }
                    let want = expect.remove(&r);
                    if let (Some(w), Ok(o)) = (want, &reply.result) {
                        if *o == w {
                            got.push((r, w));
                        }
                    }
                    lines.push((r, self.accept(reply, want, flight)?));
                }
                Ok(None) => return Err("every session ended".into()),
                Err(_) => {
                    let now = Instant::now();
                    if now > diagnose_at {
                        diagnose_at = now + Duration::from_secs(1);
                        let seen = self.monitor.poll(&mut self.server).await?;
                        for &e in expect.keys() {
                            if let Seen::Waiting(how) = &seen[e] {
                                return Err(format!(
                                    "{} waits ({how}), the model expected it to run",
                                    what(flight, e)
                                ));
                            }
                        }
                    }
                    if now > deadline {
                        let late: Vec<String> = expect.keys().map(|&e| what(flight, e)).collect();
                        return Err(format!("{late:?} did not finish within {STEP_DEADLINE:?}"));
                    }
                }
            }
        }
        // the log in the model's order: the step sent first, then the waiters it released
        lines.sort_by_key(|(r, _)| (*r != s, done_order.iter().position(|o| o == r)));
        log.extend(lines.into_iter().map(|(_, l)| l));
        let waiting = model.queue.clone();
        if waiting.is_empty() {
            return Ok(());
        }
        loop {
            if let Ok(reply) = self.replies.try_recv() {
                self.accept(reply, None, flight)?;
            }
            let seen = self.monitor.poll(&mut self.server).await?;
            if waiting.iter().all(|&w| matches!(seen[w], Seen::Waiting(_))) {
                for &w in &waiting {
                    let (Seen::Waiting(how), Some(f)) = (&seen[w], flight[w].as_ref()) else {
                        continue;
                    };
                    let line = format!("{} … waits", f.what);
                    if let Some(l) = log.iter_mut().rev().find(|l| **l == line) {
                        *l = format!("{line} ({how})");
                        self.book.waits += 1;
                    }
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let running: Vec<String> = waiting
                    .iter()
                    .filter(|&&w| seen[w] == Seen::Running)
                    .map(|&w| what(flight, w))
                    .collect();
                return Err(format!(
                    "the model expects {running:?} to wait, but the server shows no wait \
                     after {STEP_DEADLINE:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Books a finished step: compares it with the model's outcome (`None`: the model expected
    /// the session to wait) and records the intents it wrote or dropped. Returns its log line.
    fn accept(
        &mut self,
        reply: Reply,
        want: Option<Outcome>,
        flight: &mut [Option<InFlight>],
    ) -> Result<String, String> {
        let s = reply.s;
        let f = flight[s]
            .take()
            .ok_or_else(|| format!("{} answered with no step in flight", letter(s)))?;
        let got = reply.result?;
        let Some(want) = want else {
            return Err(format!(
                "{} finished ({got:?}) while the model expected it to wait",
                f.what
            ));
        };
        if got != want {
            return Err(format!(
                "{}: the database returned {got:?}, the model {want:?}",
                f.what
            ));
        }
        let mut line = match (got.version, f.op) {
            (Some(v), Op::LockRead(_)) => format!("{} → sees v{v}", f.what),
            (Some(v), _) => format!("{} → v{v}", f.what),
            (None, _) => f.what.clone(),
        };
        if got.conflicts > 0 {
            line.push_str(&format!(" (after {} unique violations)", got.conflicts));
        }
        let line = if f.waited {
            format!("  ↳ {line}")
        } else {
            line
        };
        let (open, mark) = &mut self.book.open[s];
        match f.op {
            Op::Insert(_) | Op::Optimistic(_) => open.push(Intent {
                tag: f.tag,
                agg: f.agg,
                version: got.version.unwrap_or_default(),
            }),
            Op::Savepoint => *mark = Some(open.len()),
            Op::RollbackToSavepoint => {
                let keep = mark.unwrap_or(0);
                self.book.discarded.extend(open.drain(keep..));
            }
            Op::Commit => {
                self.book.committed.append(open);
                *mark = None;
            }
            Op::Rollback => {
                self.book.discarded.append(open);
                *mark = None;
            }
            _ => {}
        }
        Ok(line)
    }
}

/// A step sent to a session and not answered yet.
pub(super) struct InFlight {
    /// `B bump X`, for the log.
    what: String,
    op: Op,
    agg: String,
    tag: String,
    /// The model said it waits.
    waited: bool,
}
