//! SQLite's in-process write gate: one FIFO mutex per database file, taken before `BEGIN
//! IMMEDIATE`, so writers queue in order instead of sleeping in SQLite's busy handler.
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};
use tokio::sync::OwnedMutexGuard;

/// The in-process write gate of the database file `pool` opens: one FIFO mutex per file,
/// shared by every pool of this process on that file.
pub fn write_gate(pool: &SqlitePool) -> Arc<tokio::sync::Mutex<()>> {
    static GATES: OnceLock<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let file = pool.connect_options().get_filename().to_path_buf();
    let key = std::fs::canonicalize(&file).unwrap_or(file);
    GATES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_default()
        .clone()
}

/// A write transaction (`BEGIN IMMEDIATE`) that holds this process's write gate of its
/// database file until it commits or is dropped (rolled back). Dereferences to the
/// transaction's connection, so `&mut *tx` runs statements in it.
pub struct WriteTx {
    // field order: the transaction is dropped (its rollback queued) before the gate opens
    tx: Transaction<'static, Sqlite>,
    _gate: Option<OwnedMutexGuard<()>>,
}

impl WriteTx {
    /// Commits, then opens the gate.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

impl Deref for WriteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

/// Begins a write transaction on `pool` behind the file's in-process write gate: application
/// transactions that enqueue intents should use it, so they queue with the relay's claims and
/// acks in FIFO order instead of sleeping in SQLite's busy handler.
pub async fn begin_write(pool: &SqlitePool) -> Result<WriteTx, sqlx::Error> {
    begin_gated(pool, write_gate(pool)).await
}

/// A purge's write transactions ([`crate::operator::BeginWrite`]) queue on the gate too.
impl crate::operator::BeginWrite for SqlitePool {
    type Tx = WriteTx;
    async fn begin_write_tx(&self) -> Result<Self::Tx, sqlx::Error> {
        begin_write(self).await
    }
}

/// `FERRY_SQLITE_WRITE_GATE=off` leaves write transactions to SQLite's busy handler, as before
/// the gate existed: a diagnostic switch for measuring what the gate buys, not a tuning knob.
pub(crate) fn gate_disabled() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| {
        std::env::var("FERRY_SQLITE_WRITE_GATE").is_ok_and(|v| v.eq_ignore_ascii_case("off"))
    })
}

pub(crate) async fn begin_gated(
    pool: &SqlitePool,
    gate: Arc<tokio::sync::Mutex<()>>,
) -> Result<WriteTx, sqlx::Error> {
    // gate first, connection second: nothing holds a connection while it waits for the gate
    let guard = if gate_disabled() {
        None
    } else {
        Some(gate.lock_owned().await)
    };
    let tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    Ok(WriteTx { tx, _gate: guard })
}
