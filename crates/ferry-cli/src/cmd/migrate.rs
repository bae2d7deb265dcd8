//! `ferry migrate`.
use ferry_store::redact_url;

use super::{fail, Database, Failure};

pub async fn run(db: &Database) -> Result<u8, Failure> {
    let url = &db.url;
    let applied = ferry_store::migrate_url(url)
        .await
        .map_err(|e| fail(1, format!("{e} ({})", redact_url(url))))?;
    if applied.is_empty() {
        println!("schema up to date ({})", redact_url(url));
    } else {
        println!("applied migrations {applied:?} to {}", redact_url(url));
    }
    Ok(0)
}
