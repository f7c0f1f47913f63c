//! A drained flow lingers for its sticky TTL (its container and memory stay resident), but a
//! short flow holds back the short-slot reserve and the memory room beside long flows only while
//! its next call is due: [`CLAIM_IATS`] inter-arrival times after its last arrival, at most its
//! TTL. Past that the reserve's slot and the room go to waiting work (the README demo's long calls
//! waited ~1.7 s with a slot free behind a short function that had stopped arriving: 10.5 s of
//! wall time against FCFS's 8.5). The queue's clock lives here too: [`MqfqQueue::tick`] ends the
//! claims and TTLs that are due.

use std::collections::BTreeSet;

use super::{FlowEvent, FlowId, MqfqQueue, Phase};
use crate::Time;

/// How many of its inter-arrival times after its last arrival a lingering short flow keeps its
/// claim (Poisson arrivals come within three mean gaps 95 % of the time; the random sweep is
/// neutral to 2, 3 or 4 as a whole, the README demo the same for each).
pub const CLAIM_IATS: f64 = 3.0;

impl<T> MqfqQueue<T> {
    /// Flow `id` drained: Lingering until `until`, claiming the reserve until its next call is
    /// due. `now` is `None` when nothing was served (a withdrawn wait): no claim then.
    pub(super) fn linger(&mut self, id: FlowId, until: Time, now: Option<Time>) {
        self.drop_claim(id);
        let reserve_on = self.cfg.short_charge_s > 0.0;
        let f = &mut self.flows[id.ix()];
        f.phase = Phase::Lingering { until };
        self.expiries.insert((until, id));
        let claim = now.map(|now| {
            let due = match (f.last_arrival, f.iat.get()) {
                (Some(last), Some(iat)) => last.plus_secs(CLAIM_IATS * iat).max(now),
                _ => until,
            };
            due.min(until)
        });
        f.claim_until = claim.filter(|&c| reserve_on && now.is_some_and(|now| c > now));
        if let Some(c) = f.claim_until {
            self.claims.insert((c, id));
        }
    }

    /// Flow `id` leaves Lingering: its claim, if any, is over.
    pub(super) fn drop_claim(&mut self, id: FlowId) {
        if let Some(c) = self.flows[id.ix()].claim_until.take() {
            self.claims.remove(&(c, id));
        }
    }

    /// Ends the claims due by `now`.
    pub(super) fn end_claims(&mut self, now: Time) {
        while let Some(&(t, id)) = self.claims.first() {
            if t > now {
                break;
            }
            self.claims.pop_first();
            let was_short = self.counts_short(id);
            self.flows[id.ix()].claim_until = None;
            self.recount(id, was_short);
        }
    }

    /// Expires sticky TTLs up to `now` (Active → Inactive). Call it before dispatching and on a
    /// timer; cost is O(log n) per expiry.
    pub fn tick(&mut self, now: Time) {
        self.end_claims(now);
        while let Some(&(until, id)) = self.expiries.first() {
            if until > now {
                break;
            }
            self.expiries.pop_first();
            let was_short = self.counts_short(id);
            let f = &mut self.flows[id.ix()];
            debug_assert_eq!(
                f.phase,
                Phase::Lingering { until },
                "expiries hold no stale entry"
            );
            if f.phase == (Phase::Lingering { until }) {
                f.phase = Phase::Inactive;
                if let Some(c) = f.claim_until.take() {
                    self.claims.remove(&(c, id));
                }
                if self.sticky == Some(id) {
                    self.sticky = None;
                }
                self.events.push(FlowEvent::Deactivated(id));
            }
            self.recount(id, was_short);
        }
    }

    /// The next time [`tick`](Self::tick) has work, if any.
    #[must_use]
    pub fn next_expiry(&self) -> Option<Time> {
        let first = |set: &BTreeSet<(Time, FlowId)>| set.first().map(|&(t, _)| t);
        match (first(&self.expiries), first(&self.claims)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
