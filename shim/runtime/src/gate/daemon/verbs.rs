//! [`Gate`] through mqfqd: the verbs the task service calls (advise, place, admit, cancel,
//! end a burst, release), each keeping the book of what this shim's containers hold.

use super::*;

#[async_trait]
impl Gate for Arc<DaemonGate> {
    async fn advise(&self, ns: &str, id: &str, work: &GpuWork) -> Option<super::super::Advice> {
        let ask = async {
            let c = self.client().await.ok()?;
            let req = admit_request(ns, id, work, Kind::Start, true);
            let ms = i64::try_from(ADVISE_DEADLINE.as_nanos()).unwrap_or(i64::MAX);
            c.advise(ttrpc::context::with_timeout(ms), &req).await.ok()
        };
        let r = tokio::time::timeout(ADVISE_DEADLINE, ask).await.ok()??;
        Some(super::super::Advice {
            native_alloc: r.native_alloc,
            warm: r.warm,
            warm_allowed: r.warm_allowed,
        })
    }

    async fn place(&self, ns: &str, id: &str, work: &GpuWork) -> Option<String> {
        let ask = async {
            let c = self.client().await.ok()?;
            let req = admit_request(ns, id, work, Kind::Start, false);
            let ms = i64::try_from(ADVISE_DEADLINE.as_nanos()).unwrap_or(i64::MAX);
            c.place(ttrpc::context::with_timeout(ms), &req).await.ok()
        };
        let r = tokio::time::timeout(ADVISE_DEADLINE, ask).await.ok()??;
        (!r.device.is_empty()).then_some(r.device)
    }

    async fn exported(&self, ns: &str, id: &str, work: &GpuWork) -> bool {
        let tell = async {
            let c = self.client().await?;
            let req = admit_request(ns, id, work, Kind::Start, true);
            let ms = i64::try_from(ADVISE_DEADLINE.as_nanos()).unwrap_or(i64::MAX);
            c.exported(ttrpc::context::with_timeout(ms), &req)
                .await
                .map_err(LinkError::call("exported"))
        };
        match tokio::time::timeout(ADVISE_DEADLINE, tell).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::warn!(container = %id, "report a refused export ({e})");
                false
            }
            Err(_) => {
                tracing::warn!(container = %id, "report a refused export: no answer");
                false
            }
        }
    }

    async fn admit(
        &self,
        ns: &str,
        id: &str,
        work: &GpuWork,
        kind: Kind,
        pooled: bool,
    ) -> Result<()> {
        let k = ContainerKey::new(ns, id).map_err(|e| Error::invalid("container key", e))?;
        let req = admit_request(ns, id, work, kind, pooled);
        self.admitting().insert(k.clone());
        let waited = match self.cfg.admit_timeout {
            Some(limit) => tokio::time::timeout(limit, self.admit_waiting(&req))
                .await
                .ok(),
            None => Some(self.admit_waiting(&req).await),
        };
        let timed_out = waited.is_none();
        let outcome = match waited {
            Some(Ok(granted)) => Ok(granted),
            Some(Err(AdmitFailure::Refused(e))) => Err(e),
            Some(Err(AdmitFailure::Lost(why))) => self
                .fail(&req, &k, &format!("unreachable ({why})"), false)
                .map(|lease| (lease, Vec::new())),
            None => {
                // Withdrawn at the daemon; a grant that raced the deadline is a lease nobody
                // holds, released when this shim's next registrations do not list it.
                self.cancel(ns, id).await;
                let limit = self.cfg.admit_timeout.unwrap_or_default();
                let why = format!("no GPU slot within {}s", limit.as_secs());
                // A start past its deadline starts whatever the fail mode: the queue never
                // makes a pod fail to start (the kubelet would retry it into a crash loop).
                if self.cfg.fail_open || kind == Kind::Start {
                    self.fail(&req, &k, &why, true)
                        .map(|lease| (lease, Vec::new()))
                } else {
                    self.admitting().remove(&k);
                    return Err(Error::DeadlineExceeded(format!(
                        "GPU admission for {id}: {why} (MQFQ_ADMIT_TIMEOUT_MS) and MQFQ_FAIL=closed"
                    )));
                }
            }
        };
        let result = outcome.map(|(lease, onto)| {
            let was_evicted = self.idle().remove(&k).is_some_and(|i| i.evicted);
            self.held().insert(
                k.clone(),
                Held {
                    key: k.clone(),
                    work: work.clone(),
                    lease,
                    since: Instant::now(),
                    pooled,
                    kind,
                    burst: None,
                    pids: Vec::new(),
                    onto,
                    was_evicted,
                },
            );
            self.start_heartbeat();
        });
        // After `held`: a registration never sees the container in neither set.
        self.admitting().remove(&k);
        if timed_out && result.is_ok() {
            // The daemon is there (only the queue was slow): report the fail-open start now,
            // not at a heartbeat this short-lived shim may never reach.
            let cached = self.conn.lock().await.client.clone();
            if let Some(c) = cached
                && let Err(e) = self.register(&c).await
            {
                tracing::debug!("report fail-open start: {e}");
            }
        }
        result
    }

    async fn cancel(&self, ns: &str, id: &str) {
        // Kill or Delete: a paused container is not idle in the pool any more.
        if let Some(k) = key(ns, id) {
            self.idle().remove(&k);
        }
        let Some(c) = self.conn.lock().await.client.clone() else {
            return;
        };
        let req = api::CancelRequest {
            namespace: ns.to_owned(),
            container_id: id.to_owned(),
            ..Default::default()
        };
        if let Err(e) = c
            .cancel(ttrpc::context::with_timeout(5_000_000_000), &req)
            .await
        {
            tracing::warn!(container = %id, "cancel admission: {e}");
        }
    }

    async fn end_burst(&self, ns: &str, id: &str, report: BurstReport, held: Usage) {
        if let Some(k) = key(ns, id)
            && let Some(h) = self.held().get_mut(&k)
        {
            h.burst = Some(report);
        }
        self.release(ns, id, "idle", held).await;
    }

    fn restore_onto(&self, ns: &str, id: &str) -> Vec<(String, String)> {
        key(ns, id)
            .and_then(|k| self.held().get(&k).map(|h| h.onto.clone()))
            .unwrap_or_default()
    }

    async fn pause_release(&self, ns: &str, id: &str, held: Usage, pids: Vec<u32>) {
        if let Some(k) = key(ns, id)
            && let Some(h) = self.held().get_mut(&k)
        {
            h.pids = pids;
        }
        self.release(ns, id, "pause", held).await;
    }

    async fn release(&self, ns: &str, id: &str, reason: &str, held: Usage) {
        let _sync = self.sync.lock().await;
        let removed = key(ns, id).and_then(|k| self.held().remove(&k));
        let Some(h) = removed else {
            return;
        };
        if h.pooled && mqfq_proto::stays_idle(reason) {
            self.idle().insert(
                h.key.clone(),
                Idle {
                    key: h.key.clone(),
                    work: h.work.clone(),
                    held,
                    // A lease that went back unused restored nothing.
                    evicted: h.was_evicted && reason == mqfq_proto::UNUSED,
                },
            );
        }
        if h.lease == 0 {
            return;
        }
        let service = if reason == mqfq_proto::UNUSED {
            Duration::ZERO
        } else {
            h.burst
                .as_ref()
                .map_or_else(|| h.since.elapsed(), |b| b.service)
        };
        let burst = h.burst.unwrap_or_default();
        let req = api::ReleaseRequest {
            lease_id: h.lease,
            // A grant nobody used reports no service (0: unknown to mqfqd), not a nanosecond.
            service_ns: u64::try_from(service.as_nanos()).unwrap_or(u64::MAX),
            reason: reason.to_owned(),
            managed_bytes: held.managed,
            native: Some(crate::memory::to_proto(&held.native)).into(),
            transfer_bytes: burst.transfer_bytes,
            pids: if burst.pids.is_empty() {
                h.pids
            } else {
                burst.pids
            },
            ..Default::default()
        };
        let Some(c) = self.conn.lock().await.client.clone() else {
            self.keep_release(req);
            self.start_heartbeat();
            return;
        };
        match c
            .release(ttrpc::context::with_timeout(5_000_000_000), &req)
            .await
        {
            Ok(_) => {}
            // A daemon that restarted never saw this lease.
            Err(ttrpc::Error::RpcStatus(s)) => {
                tracing::info!(container = %id, lease = h.lease, "release: {}", s.message);
            }
            Err(e) => {
                tracing::info!(container = %id, lease = h.lease, "release not delivered ({e}): kept, retried");
                self.forget().await;
                self.keep_release(req);
                self.start_heartbeat();
            }
        }
    }
}
