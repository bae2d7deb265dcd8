//! MariaDB's fenced outcomes: one compare-and-set per batch of tokens (MariaDB has no
//! `UPDATE … RETURNING`: a short count is redone row-locked to say which items were fenced).
use std::collections::HashMap;

use ferry_core::{CasReport, StoreError};
use sqlx::Row;

use super::rows::txt;
use super::sql::{
    fetch_rows, lock_tokens, outcome_one, outcome_seqs, outcome_set, outcome_tokens, CHUNK,
};
use super::MyStore;
use crate::error::{db_err, Ctx};
use crate::outcome::{Outcome, Transition};

impl MyStore {
    /// A fenced outcome on `ferry_outbox` ([`Self::cas_on`]).
    pub(super) async fn cas(&self, o: Outcome<'_>) -> Result<CasReport, StoreError> {
        self.cas_on("ferry_outbox", &o).await
    }

    /// One CAS per batch on `table` (`ferry_outbox` or `ferry_outbox_exception`, fixed
    /// constants), in a transaction of its own. A transition with per-item values (retry,
    /// quarantine: the rare paths) runs one statement per item inside that transaction.
    pub(crate) async fn cas_on(
        &self,
        table: &str,
        o: &Outcome<'_>,
    ) -> Result<CasReport, StoreError> {
        let (tokens, set) = (&o.tokens[..], outcome_set(o.to));
        let per_item = match o.to {
            Transition::Retry | Transition::Quarantine => Some(&o.items[..]),
            Transition::Ack | Transition::Release | Transition::Extend { .. } => None,
        };
        if tokens.is_empty() {
            return Ok(CasReport::default());
        }
        let mut tx = self.pool.begin().await.ctx("outcome: begin")?;
        let report = if let Some(values) = per_item {
            let mut applied = HashMap::new();
            for (t, (delay, text)) in tokens.iter().zip(values) {
                let n = sqlx::query(&outcome_one(table, &set))
                    .bind(*delay)
                    .bind(*text)
                    .bind(t.seq)
                    .bind(t.claim_version)
                    .bind(&t.claim_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("outcome update", e))?
                    .rows_affected();
                if n == 1 {
                    applied.insert(t.seq, (t.claim_version, t.claim_id.clone()));
                }
            }
            CasReport::from_applied(tokens, &applied)
        } else {
            let mut total = 0usize;
            for chunk in tokens.chunks(CHUNK) {
                total += outcome_tokens(table, &set, chunk)
                    .build()
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| db_err("outcome update", e))?
                    .rows_affected() as usize;
            }
            if total == tokens.len() {
                CasReport::all_applied(tokens)
            } else {
                // Short count: some tokens are stale. Redo the batch row-locked so the report can
                // name exactly which items applied and which were fenced.
                tx.rollback()
                    .await
                    .map_err(|e| db_err("outcome: rollback", e))?;
                tx = self
                    .pool
                    .begin()
                    .await
                    .map_err(|e| db_err("outcome: begin", e))?;
                let mut applied = HashMap::new();
                for chunk in tokens.chunks(CHUNK) {
                    let matching: Vec<(i64, i64, String)> =
                        fetch_rows(&mut lock_tokens(table, chunk), &mut *tx, "outcome lock")
                            .await?
                            .iter()
                            .map(|r| (r.get(0), r.get(1), txt(r, 2)))
                            .collect();
                    if matching.is_empty() {
                        continue;
                    }
                    let seqs: Vec<i64> = matching.iter().map(|m| m.0).collect();
                    outcome_seqs(table, &set, &seqs)
                        .build()
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_err("outcome update", e))?;
                    applied.extend(matching.into_iter().map(|(seq, cv, cid)| (seq, (cv, cid))));
                }
                CasReport::from_applied(tokens, &applied)
            }
        };
        tx.commit().await.ctx("outcome: commit")?;
        Ok(report)
    }
}
