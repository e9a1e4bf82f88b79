//! How long the slot planner takes at Codis' two usual table sizes (1024 and 16384 slots) with 2 to 256 groups.
//!
//! Two scenarios, both starting from the contiguous layout Codis gives a fresh cluster: `add` balances `g - 1`
//! groups over `g` (what `shard-add` plans), `drain` empties one of `g` groups into the others (`shard-remove`).
//! Before timing, each case prints what the plan contains — moves, `create-range` calls, critical path and its lower
//! bound — so the numbers show next to the timings.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use pika_action::plan::{drain, rebalance, Plan, PlanError, SlotState};

const SLOTS: [usize; 2] = [1024, 16384];
const GROUPS: [u32; 5] = [2, 4, 16, 64, 256];

/// Slots spread over `holders` in contiguous blocks, the larger blocks first, as Codis assigns a fresh cluster.
fn balanced(n: usize, holders: &[u32]) -> Vec<SlotState> {
    let (q, r) = (n / holders.len(), n % holders.len());
    holders
        .iter()
        .enumerate()
        .flat_map(|(i, &gid)| std::iter::repeat_n(SlotState::owned(gid), q + usize::from(i < r)))
        .collect()
}

fn report(scenario: &str, n: usize, groups: u32, plan: &Result<Plan, PlanError>) {
    match plan {
        Ok(p) => println!(
            "plan {scenario}/{n}/{groups}: moves={} ranges={} critical_path={} lower_bound={} rounds={}",
            p.moves.len(),
            p.ranges().len(),
            p.critical_path,
            p.lower_bound,
            p.rounds.len()
        ),
        Err(e) => println!("plan {scenario}/{n}/{groups}: refused: {e}"),
    }
}

fn bench_rebalance(c: &mut Criterion) {
    let mut group = c.benchmark_group("rebalance");
    for n in SLOTS {
        for g in GROUPS {
            let all: Vec<u32> = (1..=g).collect();

            // add: groups 1..g-1 hold everything, group g is new.
            let before = balanced(n, &all[..all.len() - 1]);
            report("add", n, g, &rebalance(&before, &all));
            group.bench_with_input(BenchmarkId::new(format!("add/{n}"), g), &before, |b, slots| {
                b.iter(|| rebalance(black_box(slots), black_box(&all)));
            });

            // drain: group 1 leaves the other g-1.
            let before = balanced(n, &all);
            let remaining = &all[1..];
            report("drain", n, g, &drain(&before, 1, remaining));
            group.bench_with_input(BenchmarkId::new(format!("drain/{n}"), g), &before, |b, slots| {
                b.iter(|| drain(black_box(slots), 1, black_box(remaining)));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_rebalance);
criterion_main!(benches);
