//! The harness's own connection (setup, the final table check) and the monitor that sees
//! whether a session waits.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sqlx::{Executor, MySqlConnection, PgConnection, Row};

use super::check::tag_of;
use super::op::letter;
use super::session::{db_msg, GateFlags, NOBODY};

/// A connection of the harness itself: setup, the final table check, and the wait monitor.
pub(super) enum Server {
    Pg(PgConnection),
    My(MySqlConnection),
    Lite(sqlx::SqlitePool),
}

/// A session as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seen {
    Running,
    Waiting(String),
}

impl Server {
    pub(super) async fn exec(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Server::Pg(c) => c.execute(sql).await.map(drop),
            Server::My(c) => c.execute(sql).await.map(drop),
            Server::Lite(p) => p.execute(sql).await.map(drop),
        }
        .map_err(|e| db_msg(sql, e))
    }

    /// The tags of every intent in the outbox table.
    pub(super) async fn outbox_tags(&mut self) -> Result<BTreeSet<String>, String> {
        let sql = "SELECT payload FROM ferry_outbox";
        let payloads: Vec<String> = match self {
            Server::Pg(c) => sqlx::query_scalar(sql).fetch_all(c).await,
            // a BLOB on MariaDB
            Server::My(c) => sqlx::query_scalar::<_, Vec<u8>>(sql)
                .fetch_all(c)
                .await
                .map(|v| {
                    v.into_iter()
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                        .collect()
                }),
            Server::Lite(p) => sqlx::query_scalar(sql).fetch_all(&*p).await,
        }
        .map_err(|e| db_msg(sql, e))?;
        Ok(payloads.iter().map(|p| tag_of(p)).collect())
    }
}

/// How the harness learns whether a session waits (see the module doc).
pub(super) enum Monitor {
    /// Backend pids of the sessions.
    Pg(Vec<i32>),
    /// Connection ids of the sessions.
    My(Vec<u64>),
    Lite(Arc<GateFlags>),
}

/// `SHOW ENGINE INNODB STATUS`'s transaction list: connection id → waiting for a lock.
pub(super) fn innodb_lock_waits(status: &str) -> BTreeMap<u64, bool> {
    let mut out = BTreeMap::new();
    for block in status.split("---TRANSACTION ").skip(1) {
        // the last transaction's block runs into the next section
        let block = block.split("\n--------\n").next().unwrap_or(block);
        let Some(i) = block.find("thread id ") else {
            continue;
        };
        let digits: String = block[i + "thread id ".len()..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if let Ok(id) = digits.parse() {
            let waiting = block.lines().any(|l| l.starts_with("LOCK WAIT"));
            out.insert(id, waiting);
        }
    }
    out
}

impl Monitor {
    pub(super) async fn poll(&self, server: &mut Server) -> Result<Vec<Seen>, String> {
        match (self, server) {
            (Monitor::Pg(pids), Server::Pg(c)) => {
                let rows = sqlx::query(
                    "SELECT pid, coalesce(wait_event_type, ''), coalesce(wait_event, ''), \
                     pg_blocking_pids(pid) FROM pg_stat_activity WHERE pid = ANY($1)",
                )
                .bind(&pids[..])
                .fetch_all(&mut *c)
                .await
                .map_err(|e| db_msg("pg_stat_activity", e))?;
                let mut seen = vec![Seen::Running; pids.len()];
                for r in rows {
                    let pid: i32 = r.get(0);
                    let (kind, event): (String, String) = (r.get(1), r.get(2));
                    let blockers: Vec<i32> = r.get(3);
                    let Some(s) = pids.iter().position(|p| *p == pid) else {
                        continue;
                    };
                    if kind == "Lock" && !blockers.is_empty() {
                        let names: Vec<String> = blockers
                            .iter()
                            .map(|b| match pids.iter().position(|p| p == b) {
                                Some(i) => letter(i).to_string(),
                                None => format!("pid {b}, not a session of this case"),
                            })
                            .collect();
                        seen[s] = Seen::Waiting(format!(
                            "pg_stat_activity: Lock/{event}, blocked by {}",
                            names.join(", ")
                        ));
                    }
                }
                Ok(seen)
            }
            (Monitor::My(ids), Server::My(c)) => {
                // a text-protocol query: SHOW ENGINE is not a statement to prepare
                let row = c
                    .fetch_one("SHOW ENGINE INNODB STATUS")
                    .await
                    .map_err(|e| db_msg("SHOW ENGINE INNODB STATUS", e))?;
                let status: String = row
                    .try_get::<String, _>(2)
                    .or_else(|_| {
                        row.try_get::<Vec<u8>, _>(2)
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                    })
                    .map_err(|e| db_msg("InnoDB status text", e))?;
                let waits = innodb_lock_waits(&status);
                Ok(ids
                    .iter()
                    .map(|id| match waits.get(id) {
                        Some(true) => Seen::Waiting("InnoDB: LOCK WAIT".into()),
                        _ => Seen::Running,
                    })
                    .collect())
            }
            (Monitor::Lite(flags), _) => {
                let holder = flags.holder.load(Ordering::SeqCst);
                Ok(flags
                    .queued
                    .iter()
                    .enumerate()
                    .map(|(s, q)| {
                        if q.load(Ordering::SeqCst) && holder != NOBODY && holder != s {
                            Seen::Waiting(format!(
                                "queued for the write gate {} holds",
                                letter(holder)
                            ))
                        } else {
                            Seen::Running
                        }
                    })
                    .collect())
            }
            _ => Err("monitor and server of different backends".into()),
        }
    }
}
