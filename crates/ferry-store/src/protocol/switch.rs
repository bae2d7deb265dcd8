//! The dispatch-mode switch (docs/schema.md, "Switching modes"), written once: the backend's
//! checks ([`Switch`]), the switch's transaction, and what follows its commit.
use std::future::Future;

use ferry_core::{DispatchMode, StoreError};

use crate::error::{mode_in_use, Ctx};
use crate::operator::bulk::{now, Val};
use crate::protocol::Ops;

/// The dispatch-mode switch's steps (docs/schema.md, "Switching modes"), in the switch's
/// transaction where they take a connection.
pub(crate) trait Switch: Ops {
    /// The statements that convert the outbox to cursor dispatch, in order (each binds the
    /// clock where the backend binds it), for the default [`Switch::convert`].
    const TO_CURSOR: &'static [&'static str] = &[];
    /// The same for row dispatch.
    const TO_ROW: &'static [&'static str] = &[];

    /// Checks before the switch's transaction (PostgreSQL: the outbox sequence's cache).
    fn before_switch(
        &self,
        mode: DispatchMode,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = mode;
        std::future::ready(Ok(()))
    }
    /// The first statements of the switch's transaction (PostgreSQL: its lock timeout).
    fn begin_switch(c: &mut Self::Conn) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = c;
        async { Ok(()) }
    }
    /// Whether a switch to the mode in force must re-base the cursors (PostgreSQL, restored).
    fn must_rebase(
        c: &mut Self::Conn,
        mode: DispatchMode,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = (c, mode);
        async { Ok(false) }
    }
    /// The error of a switch refused because `others` relays are live.
    fn switch_refused(current: &str, others: i64, mode: DispatchMode, rebase: bool) -> StoreError {
        let _ = rebase;
        mode_in_use(current, others, mode)
    }
    /// Converts the outbox's rows to `mode` (or re-bases the cursors); by default the
    /// statements [`Switch::TO_CURSOR`] or [`Switch::TO_ROW`].
    fn convert(
        c: &mut Self::Conn,
        mode: DispatchMode,
        rebase: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = rebase;
        convert_by::<Self>(c, mode)
    }
    /// After the switch's commit, whether it `changed` the mode or not (MariaDB: its
    /// row-dispatch indexes).
    fn after_switch(
        &self,
        mode: DispatchMode,
        changed: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (mode, changed);
        async { Ok(()) }
    }
}

/// [`Switch::convert`] by the backend's statements.
async fn convert_by<S: Switch>(c: &mut S::Conn, mode: DispatchMode) -> Result<(), StoreError> {
    let stmts = match mode {
        DispatchMode::Cursor => S::TO_CURSOR,
        DispatchMode::Row => S::TO_ROW,
    };
    let mut conn = S::bulk_conn(c);
    let mut clock = Vec::new();
    now(conn.dialect(), &mut clock);
    for s in stmts {
        conn.exec(s, &clock, "dispatch mode: convert").await?;
    }
    Ok(())
}

/// [`ferry_core::CursorStore::set_dispatch_mode`]: the backend's checks, the switch's
/// transaction, and what follows its commit.
pub(crate) async fn set_dispatch_mode<S: Switch>(
    s: &S,
    mode: DispatchMode,
    owner: &str,
) -> Result<bool, StoreError> {
    s.before_switch(mode).await?;
    let changed = switch_mode(s, mode, owner).await?;
    s.after_switch(mode, changed).await?;
    Ok(changed)
}

/// The switch's transaction: `false` when the outbox is in `mode` already (and needs no
/// re-base); refused while other relays are live.
async fn switch_mode<S: Switch>(
    s: &S,
    mode: DispatchMode,
    owner: &str,
) -> Result<bool, StoreError> {
    let d = s.pools().dialect();
    let mut tx = s.begin().await.ctx("dispatch mode: begin")?;
    S::begin_switch(&mut tx).await?;
    // Serialises switches: a second one waits here, then finds the mode set.
    let current = S::bulk_conn(&mut tx)
        .first_text(
            &format!(
                "SELECT mode FROM ferry_dispatch WHERE id = 1{}",
                d.for_update()
            ),
            &[],
            "dispatch mode",
        )
        .await?
        .unwrap_or_default();
    let same = current == mode.as_str();
    let rebase = same && S::must_rebase(&mut tx, mode).await?;
    if same && !rebase {
        return Ok(false);
    }
    let mut vals = vec![Val::Str(Some(owner.to_string()))];
    let live = format!(
        "SELECT count(*) FROM ferry_relay_member WHERE owner <> ? AND lease_until > {}",
        now(d, &mut vals)
    );
    let others = S::bulk_conn(&mut tx)
        .first_text(&live, &vals, "dispatch mode: members")
        .await?
        .and_then(|n| n.parse::<i64>().ok())
        .unwrap_or(0);
    if others > 0 {
        return Err(S::switch_refused(&current, others, mode, rebase));
    }
    S::convert(&mut tx, mode, rebase).await?;
    let mut vals = vec![Val::Str(Some(mode.as_str().to_string()))];
    let set = format!(
        "UPDATE ferry_dispatch SET mode = ?, changed_at = {} WHERE id = 1",
        now(d, &mut vals)
    );
    S::bulk_conn(&mut tx)
        .exec(&set, &vals, "dispatch mode: set")
        .await?;
    S::commit(tx).await.ctx("dispatch mode: commit")?;
    Ok(true)
}
