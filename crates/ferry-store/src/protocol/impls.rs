//! The macros that give a backend store its trait `impl`s: [`handles!`] (its pool, limits and
//! write transactions) and [`store_traits!`] (ferry-core's store traits, each method handing
//! over to its step). A backend invokes them by this module's path.

/// [`Handles`] of each store: its connection and transaction types, its [`Pools`] and
/// [`Conn`] variant, and the method (on the store) that begins its write transaction.
macro_rules! handles {
    ($($store:ty: $conn:ty, $tx:ty, $variant:ident, $($begin:ident).+;)*) => {$(
        impl $crate::protocol::Handles for $store {
            type Conn = $conn;
            type Tx = $tx;

            fn pools(&self) -> $crate::operator::Pools<'_> {
                $crate::operator::Pools::$variant(&self.pool)
            }

            fn limits(&self) -> &ferry_core::Limits {
                &self.limits
            }

            fn begin(&self) -> impl std::future::Future<Output = Result<$tx, sqlx::Error>> + Send {
                self.$($begin).+()
            }

            fn commit(tx: $tx) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send {
                tx.commit()
            }

            fn bulk_conn(c: &mut $conn) -> $crate::operator::bulk::Conn<'_> {
                $crate::operator::bulk::Conn::$variant(c)
            }
        }
    )*};
}
pub(crate) use handles;

/// Methods of a store trait that hand their arguments (after `&self`) over to a step: each
/// `fn name(args) -> T = step;` becomes `fn name<'a>(&'a self, args) -> BoxFuture<'a, T>`.
macro_rules! forward {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) -> $out:ty = $step:expr;)*) => {$(
        fn $name<'a>(&'a self, $($arg: $ty),*) -> BoxFuture<'a, $out> {
            Box::pin(($step)(self, $($arg),*))
        }
    )*};
}
pub(crate) use forward;

/// `impl`s of ferry-core's store traits (`RowDispatch`, `SlotOwnership`, `OperatorActions`,
/// `OutboxStore`, `CursorStore`, `PauseControl`) for `$store`, which implements [`Ops`],
/// [`Switch`] and [`Cursor`]: every method hands over to its step in [`crate::protocol`] (or to the
/// backend's statement); and its [`Statements`] from its module `$sql`. A macro, not blanket impls: the traits belong to ferry-core, and the
/// orphan rule forbids `impl<S: Ops> RowDispatch for S` here.
macro_rules! store_traits {
    ($store:ty, $sql:ident) => {
        const _: () = {
            use ferry_core::replay::{ReplayFilter, ReplayPage, ReplayPageRequest, TopicScan};
            use ferry_core::*;
            use $crate::protocol::cursor::{self as pc, Cursor};
            use $crate::protocol::impls::forward;
            use $crate::protocol::switch as ps;
            use $crate::protocol::{self as p, Ops};
            type R<T> = Result<T, StoreError>;

            impl p::Statements for $store {
                const MEMBER_HEARTBEAT: &'static str = $sql::MEMBER_HEARTBEAT;
                const SLOT_LEASES: &'static str = $sql::SLOT_LEASES;
                const QUARANTINED_ROWS: &'static str = $sql::QUARANTINED_ROWS;
                const QUARANTINED_CURSOR: &'static str = $sql::QUARANTINED_CURSOR;
                const OUTBOX_SIZE: &'static str = $sql::OUTBOX_SIZE;
                const OUTBOX_SIZE_SOURCE: &'static str = $sql::OUTBOX_SIZE_SOURCE;
            }

            impl RowDispatch for $store {
                forward! {
                    fn claim(req: &'a ClaimRequest) -> R<Vec<ClaimedEvent>> = p::claim;
                    fn lookup_claim(id: &'a str) -> R<Vec<ClaimedEvent>> = <$store as Ops>::lookup_claim;
                }

                fn rows_skipped_locked(&self) -> Option<u64> {
                    <Self as Ops>::rows_skipped_locked(self)
                }

                $crate::outcome::row_outcomes!();
            }

            impl SlotOwnership for $store {
                forward! {
                    fn acquire_slots(req: &'a SlotRequest<'a>) -> R<Vec<SlotLease>> = p::acquire_slots;
                    fn release_slots(req: &'a SlotRelease<'a>) -> R<()> = p::release_slots;
                    fn heartbeat_member(req: &'a MemberHeartbeat<'a>) -> R<Vec<String>> = p::heartbeat_member;
                    fn members() -> R<Vec<MemberInfo>> = p::members;
                    fn leave_member(owner: &'a str) -> R<()> = p::leave_member;
                    fn slot_leases() -> R<Vec<SlotLease>> = p::slot_leases;
                }
            }

            impl OperatorActions for $store {
                forward! {
                    fn enqueue(events: &'a [NewEvent]) -> Result<Vec<String>, EnqueueError> = p::enqueue;
                    fn requeue(req: &'a OperatorAction<'a>) -> R<()> = p::requeue;
                    fn skip(req: &'a OperatorAction<'a>) -> R<()> = p::skip;
                    fn list_quarantined(limit: usize) -> R<Vec<QuarantinedEvent>> = p::list_quarantined;
                    fn status() -> R<OutboxStatus> = p::status;
                    fn record(event_id: &'a str) -> R<Option<EventRecord>> = p::record;
                }
            }

            impl OutboxStore for $store {
                forward! {
                    fn shared_status(max_age: std::time::Duration) -> R<OutboxStatus> = <$store as Ops>::shared_status;
                    fn listen_commits(wake: std::sync::Arc<dyn Fn() + Send + Sync>) -> R<bool> = <$store as Ops>::listen_commits;
                    fn server_warnings() -> R<Vec<SettingWarning>> = <$store as Ops>::server_warnings;
                    fn outbox_size() -> R<Option<OutboxSize>> = p::outbox_size;
                    fn purge_sent(req: &'a PurgeRequest<'a>) -> R<u64> = p::purge_sent;
                    fn reconcile(req: &'a ReconcileRequest) -> R<ReconcileReport> = p::reconcile;
                    fn replay_scan(filter: &'a ReplayFilter) -> R<Vec<TopicScan>> = p::replay_scan;
                    fn replay_page(req: &'a ReplayPageRequest<'a>) -> R<ReplayPage> = p::replay_page;
                    fn bulk_quarantine(req: &'a BulkRequest<'a>) -> R<BulkOutcome> = p::bulk_quarantine;
                    fn operator_actions(limit: usize) -> R<Vec<OperatorRecord>> = p::operator_actions;
                }

                fn backend(&self) -> &'static str {
                    p::Handles::pools(self).dialect().name()
                }

                fn cursor(&self) -> Option<&dyn CursorStore> {
                    Some(self)
                }

                fn pause_control(&self) -> Option<&dyn PauseControl> {
                    Some(self)
                }
            }

            impl CursorStore for $store {
                forward! {
                    fn dispatch_mode() -> R<DispatchMode> = p::stored_mode;
                    fn set_dispatch_mode(mode: DispatchMode, owner: &'a str) -> R<bool> = ps::set_dispatch_mode;
                    fn load_cursors(owner: &'a str, slots: &'a [SlotId]) -> R<Vec<SlotCursor>> = <$store as Cursor>::load_cursors;
                    fn read_batch(req: &'a CursorRead) -> R<CursorBatch> = <$store as Cursor>::read_batch;
                    fn advance(req: &'a CursorAdvance) -> R<AdvanceResult> = pc::advance;
                    fn lookup_advance(id: &'a str) -> R<bool> = <$store as Cursor>::lookup_advance;
                    fn claim_exceptions(req: &'a ClaimRequest) -> R<Vec<ClaimedEvent>> = pc::claim_exceptions;
                    fn settle_exceptions(out: &'a ExceptionOutcomes) -> R<CasReport> = <$store as Cursor>::settle_exceptions;
                    fn horizon() -> R<HorizonInfo> = <$store as Cursor>::horizon;
                }
            }

            impl PauseControl for $store {
                forward! {
                    fn pause(req: &'a PauseRequest<'a>) -> R<Vec<String>> = p::pause;
                    fn resume(topics: &'a [String]) -> R<Vec<PausedTopic>> = p::resume;
                    fn paused() -> R<Vec<PausedTopic>> = p::paused;
                }
            }
        };
    };
}
pub(crate) use store_traits;
