//! A producer session: its own connection on a task of its own, running one step at a time.
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use sqlx::{Connection, Executor, MySqlConnection, PgConnection, SqliteConnection};
use tokio::sync::{mpsc, OwnedMutexGuard};

use super::check::payload;
use super::model::Outcome;
use super::op::{letter, Op};

/// How long a session's step may take to finish or to be seen waiting (a lock wait is seen in
/// milliseconds; this only bounds a hung server).
pub(super) const STEP_DEADLINE: Duration = Duration::from_secs(15);

pub(super) const TOPIC: &str = "interleave";

/// SQLite: who holds the write gate and who is queued for it (set by the sessions).
pub(super) struct GateFlags {
    pub(super) holder: AtomicUsize,
    pub(super) queued: Vec<AtomicBool>,
}

pub(super) const NOBODY: usize = usize::MAX;

pub(super) enum Conn {
    Pg(PgConnection),
    My(MySqlConnection),
    Lite {
        conn: SqliteConnection,
        gate: Arc<tokio::sync::Mutex<()>>,
        guard: Option<OwnedMutexGuard<()>>,
        flags: Arc<GateFlags>,
    },
}

/// Runs `$body` with `$c` bound to the connection and `$pg` telling whether it is PostgreSQL
/// (for [`placeholder`](crate::placeholder)).
macro_rules! on {
    ($conn:expr, $c:ident, $pg:ident => $body:expr) => {
        match $conn {
            Conn::Pg($c) => {
                let $pg = true;
                $body
            }
            Conn::My($c) => {
                let $pg = false;
                $body
            }
            Conn::Lite { conn: $c, .. } => {
                let $pg = false;
                $body
            }
        }
    };
}

/// One producer session: a connection and what the application remembers in its transaction.
pub(super) struct Session {
    s: usize,
    conn: Conn,
    open: bool,
    seen: BTreeMap<String, i64>,
    last: BTreeMap<String, i64>,
    mark: Option<(BTreeMap<String, i64>, BTreeMap<String, i64>)>,
}

/// A step sent to a session.
pub(super) struct Cmd {
    pub(super) op: Op,
    /// The business row / aggregate id, prefixed for this run.
    pub(super) agg: String,
    /// The intent's tag (its payload), when the step writes one.
    pub(super) tag: String,
}

/// A session's answer: the step's outcome or the database's error.
pub(super) struct Reply {
    pub(super) s: usize,
    pub(super) result: Result<Outcome, String>,
}

pub(super) fn db_msg(what: &str, e: sqlx::Error) -> String {
    format!("{what}: {e}")
}

pub(super) fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}

impl Session {
    pub(super) async fn exec(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        on!(&mut self.conn, c, _pg => c.execute(sql).await.map(drop))
    }

    async fn begin(&mut self) -> Result<(), sqlx::Error> {
        match &mut self.conn {
            Conn::Pg(c) => c
                .execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                .await
                .map(drop),
            Conn::My(c) => c.execute("START TRANSACTION").await.map(drop),
            Conn::Lite {
                conn,
                gate,
                guard,
                flags,
            } => {
                // as ferry_store::sqlite::begin_write: the gate first, then the write lock.
                // Shown as queued only once this session is in the gate's FIFO queue (its
                // first poll enqueues it): the harness sends the next session's step when it
                // sees this one queued, and the model's order of waiters is the gate's.
                let mut lock = std::pin::pin!(gate.clone().lock_owned());
                let first = std::future::poll_fn(|cx| Poll::Ready(lock.as_mut().poll(cx))).await;
                let g = match first {
                    Poll::Ready(g) => g,
                    Poll::Pending => {
                        flags.queued[self.s].store(true, Ordering::SeqCst);
                        lock.await
                    }
                };
                flags.holder.store(self.s, Ordering::SeqCst);
                flags.queued[self.s].store(false, Ordering::SeqCst);
                *guard = Some(g);
                conn.execute("BEGIN IMMEDIATE").await.map(drop)
            }
        }
    }

    /// `COMMIT` or `ROLLBACK`; on SQLite the gate is released after it (the holder flag first).
    async fn end(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        let r = self.exec(sql).await;
        if let Conn::Lite { guard, flags, .. } = &mut self.conn {
            flags.holder.store(NOBODY, Ordering::SeqCst);
            *guard = None;
        }
        self.open = false;
        self.seen.clear();
        self.last.clear();
        self.mark = None;
        r
    }

    async fn bump(&mut self, agg: &str) -> Result<i64, sqlx::Error> {
        match &mut self.conn {
            Conn::My(c) => {
                sqlx::query("UPDATE ferry_it_biz SET ver = ver + 1 WHERE id = ?")
                    .bind(agg)
                    .execute(&mut *c)
                    .await?;
                sqlx::query_scalar("SELECT ver FROM ferry_it_biz WHERE id = ?")
                    .bind(agg)
                    .fetch_one(&mut *c)
                    .await
            }
            conn => on!(conn, c, pg => sqlx::query_scalar(&crate::sql::placeholder(
                "UPDATE ferry_it_biz SET ver = ver + 1 WHERE id = ? RETURNING ver",
                pg,
            ))
            .bind(agg)
            .fetch_one(&mut *c)
            .await),
        }
    }

    async fn lock_read(&mut self, agg: &str) -> Result<i64, sqlx::Error> {
        // SQLite has no FOR UPDATE: the transaction holds the one write lock already
        let sql = match self.conn {
            Conn::Lite { .. } => "SELECT ver FROM ferry_it_biz WHERE id = ?",
            _ => "SELECT ver FROM ferry_it_biz WHERE id = ? FOR UPDATE",
        };
        on!(&mut self.conn, c, pg => sqlx::query_scalar(&crate::sql::placeholder(sql, pg))
            .bind(agg)
            .fetch_one(&mut *c)
            .await)
    }

    async fn write(&mut self, agg: &str, v: i64) -> Result<(), sqlx::Error> {
        let sql = "UPDATE ferry_it_biz SET ver = ? WHERE id = ?";
        on!(&mut self.conn, c, pg => sqlx::query(&crate::sql::placeholder(sql, pg))
            .bind(v)
            .bind(agg)
            .execute(&mut *c)
            .await
            .map(drop))
    }

    /// The producer's one plain INSERT (docs/schema.md §2.1); SQLite's goes through the view
    /// `ferry_outbox_insert`.
    async fn insert(&mut self, agg: &str, v: i64, tag: &str) -> Result<(), sqlx::Error> {
        let table = match self.conn {
            Conn::Lite { .. } => "ferry_outbox_insert",
            _ => "ferry_outbox",
        };
        let sql = format!(
            "INSERT INTO {table} (aggregate_id, aggregate_version, topic, event_type, payload) \
             VALUES (?, ?, ?, 'Changed', ?)"
        );
        let body = payload(tag);
        on!(&mut self.conn, c, pg => sqlx::query(&crate::sql::placeholder(&sql, pg))
            .bind(agg)
            .bind(v)
            .bind(TOPIC)
            .bind(&body)
            .execute(&mut *c)
            .await
            .map(drop))
    }

    async fn max_version(&mut self, agg: &str) -> Result<i64, sqlx::Error> {
        let sql =
            "SELECT COALESCE(MAX(aggregate_version), 0) FROM ferry_outbox WHERE aggregate_id = ?";
        on!(&mut self.conn, c, pg => sqlx::query_scalar(&crate::sql::placeholder(sql, pg))
            .bind(agg)
            .fetch_one(&mut *c)
            .await)
    }

    /// A blind writer: max + 1 in a savepoint of its own, again after each unique violation.
    async fn optimistic(&mut self, agg: &str, tag: &str) -> Result<Outcome, sqlx::Error> {
        let mut conflicts = 0;
        loop {
            self.exec("SAVEPOINT ferry_it_opt").await?;
            let v = self.max_version(agg).await? + 1;
            match self.insert(agg, v, tag).await {
                Ok(()) => {
                    self.exec("RELEASE SAVEPOINT ferry_it_opt").await?;
                    return Ok(Outcome {
                        version: Some(v),
                        conflicts,
                    });
                }
                Err(e) if is_unique_violation(&e) && conflicts < 10 => {
                    self.exec("ROLLBACK TO SAVEPOINT ferry_it_opt").await?;
                    conflicts += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn step(&mut self, cmd: &Cmd) -> Result<Outcome, String> {
        let what = format!("{} {} ({})", letter(self.s), cmd.op.describe(), cmd.agg);
        let err = |e: sqlx::Error| db_msg(&what, e);
        if !self.open {
            self.begin().await.map_err(err)?;
            self.open = true;
        }
        let agg = cmd.agg.as_str();
        Ok(match cmd.op {
            Op::Bump(_) => {
                let v = self.bump(agg).await.map_err(err)?;
                self.last.insert(agg.into(), v);
                Outcome::version(v)
            }
            Op::LockRead(_) => {
                let v = self.lock_read(agg).await.map_err(err)?;
                self.seen.insert(agg.into(), v);
                Outcome::version(v)
            }
            Op::WriteNext(_) => {
                let v = self.seen.get(agg).copied().ok_or("write before read")? + 1;
                self.write(agg, v).await.map_err(err)?;
                self.last.insert(agg.into(), v);
                Outcome::version(v)
            }
            Op::Insert(_) => {
                let v = self.last.get(agg).copied().ok_or("insert before write")?;
                self.insert(agg, v, &cmd.tag).await.map_err(err)?;
                Outcome::version(v)
            }
            Op::Optimistic(_) => self.optimistic(agg, &cmd.tag).await.map_err(err)?,
            Op::Savepoint => {
                self.exec("SAVEPOINT ferry_it_sp").await.map_err(err)?;
                self.mark = Some((self.seen.clone(), self.last.clone()));
                Outcome::default()
            }
            Op::RollbackToSavepoint => {
                self.exec("ROLLBACK TO SAVEPOINT ferry_it_sp")
                    .await
                    .map_err(err)?;
                if let Some((seen, last)) = self.mark.clone() {
                    self.seen = seen;
                    self.last = last;
                }
                Outcome::default()
            }
            Op::Commit => {
                self.end("COMMIT").await.map_err(err)?;
                Outcome::default()
            }
            Op::Rollback => {
                self.end("ROLLBACK").await.map_err(err)?;
                Outcome::default()
            }
        })
    }
}

pub(super) async fn session_task(
    mut session: Session,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    tx: mpsc::UnboundedSender<Reply>,
) {
    while let Some(cmd) = rx.recv().await {
        let result = session.step(&cmd).await;
        if tx
            .send(Reply {
                s: session.s,
                result,
            })
            .is_err()
        {
            break;
        }
    }
    if session.open {
        let _ = session.end("ROLLBACK").await;
    }
    on!(session.conn, c, _pg => { let _ = c.close().await; });
}

pub(super) fn spawn(
    s: usize,
    conn: Conn,
    replies: &mpsc::UnboundedSender<Reply>,
) -> mpsc::UnboundedSender<Cmd> {
    let (tx, rx) = mpsc::unbounded_channel();
    let session = Session {
        s,
        conn,
        open: false,
        seen: BTreeMap::new(),
        last: BTreeMap::new(),
        mark: None,
    };
    tokio::spawn(session_task(session, rx, replies.clone()));
    tx
}
