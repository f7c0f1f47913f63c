//! One scheduling cycle — dispatch, complete, enqueue — at 10, 1 000 and 100 000 backlogged
//! flows. The goal is O(log n): ≤ 1 µs per cycle at 100 000 flows.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use scheduler_core::{MqfqQueue, Profile, Time};

fn cycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("enqueue_dispatch_complete");
    g.noise_threshold(0.05);
    for n in [10usize, 1_000, 100_000] {
        let mut q: MqfqQueue<u32> = MqfqQueue::new(Profile::Balanced.queue()).expect("valid");
        let ids: Vec<_> = (0..n).map(|i| q.flow(&format!("fn-{i}"))).collect();
        let mut now = Time::ZERO;
        for (i, id) in ids.iter().enumerate() {
            q.set_residency(*id, i % 3 == 0, 0.2).expect("flow exists");
            q.enqueue(*id, 0, now).expect("flow exists");
        }
        let mut k: u64 = 0;
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                k += 1;
                now = Time::from_nanos(k * 1_000);
                let d = q.dispatch(now).expect("always backlogged");
                let flow = d.ticket.flow;
                // Service varies a little so tags move and the indexes are exercised.
                #[expect(clippy::cast_precision_loss, reason = "k % 7: below 7")]
                let service = 0.05 + (k % 7) as f64 * 0.01;
                q.complete(&d.ticket, Some(service), now)
                    .expect("outstanding");
                q.enqueue(flow, black_box(d.item), now)
                    .expect("flow exists");
                q.tick(now);
            });
        });
    }
    g.finish();
}

criterion_group!(benches, cycle);
criterion_main!(benches);
