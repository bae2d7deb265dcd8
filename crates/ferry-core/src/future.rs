//! The boxed future the store traits return.
use std::future::Future;
use std::pin::Pin;

/// A boxed, `Send` future (keeps [`OutboxStore`](crate::store::OutboxStore) object safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
