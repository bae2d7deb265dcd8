//! `ferry lab`: the reliability lab's command line; the cases are in [`crate::lab`].
use clap::Args;
use ferry_store::redact_url;

use super::{fail, Failure};
use crate::{config, lab};

#[derive(Args, Debug)]
pub struct LabArgs {
    /// all, rollback, committed, send-before-mark, mark-before-send, stale-claim, stale-cursor,
    /// batch, two-sessions (two sessions claiming at once with a lease expiry and a stale CAS) or
    /// kafka-duplicate (the same event id sent twice, one Inbox effect).
    #[arg(long, default_value = config::DEFAULT_LAB_CASE)]
    pub case: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(a: &LabArgs, url: Option<String>) -> Result<u8, Failure> {
    if a.case != "all" && !lab::CASES.contains(&a.case.as_str()) {
        return Err(fail(
            2,
            format!(
                "invalid --case {:?}: use all or one of {}",
                a.case,
                lab::CASES.join(", ")
            ),
        ));
    }
    let results = lab::run(&a.case, url.as_deref()).await.map_err(|e| {
        let e = match &url {
            Some(u) => e.replace(u.as_str(), &redact_url(u)),
            None => e,
        };
        fail(1, e)
    })?;
    let all_held = results.iter().all(|r| r.held);
    if a.json {
        let v = serde_json::json!({ "all_held": all_held, "cases": results });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        for r in &results {
            println!(
                "[{}] {} ({}): {}",
                if r.held { "held" } else { "FAILED" },
                r.case,
                r.backend,
                r.expectation
            );
            println!("    {}", r.facts);
        }
        println!(
            "{}",
            if all_held {
                "all expectations held"
            } else {
                "SOME EXPECTATIONS DID NOT HOLD"
            }
        );
    }
    Ok(if all_held { 0 } else { 1 })
}
