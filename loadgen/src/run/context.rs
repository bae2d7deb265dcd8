//! What the phases of one run share ([`Run`]), and its notes and errors.
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use ferry_testkit::verify::Verifier;
use ferry_testkit::workload::{Counters, Ids};
use tokio_util::sync::CancellationToken;

use crate::clock::CommitClock;
use crate::db::Database;
use crate::inbox::InboxConsumer;
use crate::progress::Live;
use crate::relays::Relays;
use crate::spec::RunSpec;

/// One run in progress: what its phases share, and the notes and errors they report.
pub(super) struct Run<'a> {
    pub(super) spec: &'a RunSpec,
    pub(super) run: &'a str,
    pub(super) db: &'a Arc<Database>,
    pub(super) ids: Ids,
    pub(super) topic: String,
    pub(super) counters: Arc<Counters>,
    /// When each event's COMMIT returned, for the COMMIT → broker-ack latency.
    pub(super) clock: Arc<CommitClock>,
    /// Rows `--retention` purged so far.
    pub(super) purged: Arc<AtomicU64>,
    pub(super) interrupt: &'a CancellationToken,
    pub(super) notes: Mutex<Vec<String>>,
    pub(super) errors: Mutex<Vec<String>>,
}

impl<'a> Run<'a> {
    pub(super) fn new(
        spec: &'a RunSpec,
        run: &'a str,
        db: &'a Arc<Database>,
        interrupt: &'a CancellationToken,
    ) -> Self {
        Self {
            spec,
            run,
            db,
            ids: Ids {
                run: run.to_string(),
            },
            topic: spec
                .kafka
                .topic
                .clone()
                .unwrap_or_else(|| format!("loadgen-{run}")),
            counters: Arc::new(Counters::default()),
            clock: Arc::default(),
            purged: Arc::default(),
            interrupt,
            notes: Mutex::default(),
            errors: Mutex::default(),
        }
    }

    pub(super) fn note(&self, n: String) {
        self.notes.lock().expect("notes lock").push(n);
    }

    pub(super) fn error(&self, e: String) {
        self.errors.lock().expect("errors lock").push(e);
    }

    pub(super) fn has_errors(&self) -> bool {
        !self.errors.lock().expect("errors lock").is_empty()
    }

    pub(super) fn live<'b>(
        &'b self,
        relays: Option<&'b Relays>,
        verifier: Option<&'b Verifier>,
        inbox: Option<&'b InboxConsumer>,
    ) -> Live<'b> {
        Live {
            db: self.db,
            counters: &self.counters,
            relays,
            verifier,
            inbox,
            purged: self
                .spec
                .retention
                .filter(|r| !r.in_relays)
                .map(|_| &*self.purged),
        }
    }
}
