//! The pool's order channel over the daemon link [`DaemonGate`] keeps: orders polled, results
//! reported (and folded into the paused set the gate re-registers).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{DaemonGate, PoolChannel};
use crate::api;

#[async_trait]
impl PoolChannel for Arc<DaemonGate> {
    async fn pool_orders(&self, wait: Duration) -> Vec<api::PoolOrder> {
        let req = api::PoolOrdersRequest {
            shim_pid: std::process::id(),
            wait_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX),
            ..Default::default()
        };
        let got = match self.client().await {
            Ok(c) => {
                let deadline = i64::try_from(wait.as_nanos())
                    .unwrap_or(i64::MAX)
                    .saturating_add(5_000_000_000);
                c.pool_orders(ttrpc::context::with_timeout(deadline), &req)
                    .await
                    .map_err(super::daemon::LinkError::call("pool orders"))
            }
            Err(e) => Err(e),
        };
        match got {
            Ok(r) => r.orders,
            Err(e) => {
                tracing::debug!("{e}");
                self.forget().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                Vec::new()
            }
        }
    }

    async fn pool_report(&self, results: Vec<api::PoolResult>) {
        self.pool_done(&results);
        let Ok(c) = self.client().await else {
            tracing::info!(
                results = results.len(),
                "pool report dropped: mqfqd unreachable"
            );
            return;
        };
        let req = api::PoolReportRequest {
            shim_pid: std::process::id(),
            results,
            ..Default::default()
        };
        if let Err(e) = c
            .pool_report(ttrpc::context::with_timeout(5_000_000_000), &req)
            .await
        {
            tracing::info!("pool report: {e}");
        }
    }
}
