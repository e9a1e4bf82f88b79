//! When KubeBlocks runs a reconcile again, and the emulation's clock.
//!
//! Emulated (both lines unless marked):
//! - controller-runtime's workqueue: a reconcile that returns an error is re-added rate-limited, after
//!   `5 ms × 2^failures` capped at 1000 s (`ItemExponentialFailureRateLimiter`), the failure count growing until a
//!   reconcile succeeds or asks for a fixed requeue (`RequeueAfter`, which forgets the count); a change to a watched
//!   object re-adds the key at once, whatever delay is pending, without resetting the count;
//! - fixed requeues: component postProvision 5 s after a failure and 10 s after an unmet preCondition, memberJoin and
//!   memberLeave 1 s, a component entering deletion 1 s, sub-resource deletion 1 s, the first sharding postProvision
//!   3 s (1.1);
//! - errors that go through the rate limiter: component preTerminate, var resolution, and (1.1) the sharding actions
//!   run by the cluster controller.
//!
//! Does NOT model: the overall 10 qps / burst 100 bucket limiter controller-runtime combines with the per-item one
//! (never reached here), `MaxConcurrentReconciles` (every key has its own worker, so keys never queue behind each
//! other), informer resync periods.
//!
//! The clock: every controller delay (requeues, backoff, probe periods, `minReadySeconds`) is emulated time, run
//! [`TIME_SCALE`] times faster than real time so that the suite stays fast; actions run at real speed (the binary's
//! budget and kbagent's timeouts are real seconds, since the binary's own clock cannot be scaled). A figure printed
//! in emulated seconds is therefore real seconds × scale for controller waits only; [`Clock::emulated`] converts.

use std::time::{Duration, Instant};

/// How many emulated seconds pass per real second (controller waits only). `KBEMU_TIME_SCALE` overrides it.
pub const TIME_SCALE: u32 = 10;

/// The shortest real interval between two role probes of one pod. Each probe is a run of the (debug) binary costing
/// tens of milliseconds of CPU; probing every `periodSeconds / TIME_SCALE` would make probes the suite's bottleneck,
/// so in emulated time a pod is probed every `max(periodSeconds, PROBE_FLOOR × TIME_SCALE)` (5 s instead of the
/// chart's 2 s at the default scale).
pub const PROBE_FLOOR: Duration = Duration::from_millis(500);

/// The first rate-limited retry.
pub const BACKOFF_BASE: Duration = Duration::from_millis(5);
/// The longest rate-limited retry.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1000);
/// Component postProvision: after a failed call.
pub const POST_PROVISION_FAILED: Duration = Duration::from_secs(5);
/// Component postProvision: after an unmet preCondition.
pub const POST_PROVISION_PRECONDITION: Duration = Duration::from_secs(10);
/// memberJoin / memberLeave: after a failed call.
pub const MEMBER_ACTION_FAILED: Duration = Duration::from_secs(1);
/// A component entering deletion, and each sub-resource deletion round.
pub const DELETION_STEP: Duration = Duration::from_secs(1);
/// 1.1: after the sharding postProvision is first scheduled.
pub const SHARDING_POST_PROVISION_INIT: Duration = Duration::from_secs(3);

/// The per-key failure rate limiter of controller-runtime's default workqueue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The delay before the next retry of a key that failed again (`When`), counting this failure.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self.failures.min(40);
        self.failures = self.failures.saturating_add(1);
        BACKOFF_BASE.checked_mul(1u32 << exp.min(31)).filter(|d| *d <= BACKOFF_MAX).unwrap_or(BACKOFF_MAX)
    }

    /// A success or a fixed requeue (`Forget`).
    pub fn forget(&mut self) {
        self.failures = 0;
    }

    /// Failures counted since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// How [`one_call_each`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Every call exited 0.
    Done,
    /// The last call exited neither 0 nor 75.
    Failed,
    /// Calls still exited 75 after the last reconcile.
    OutOfPasses,
}

/// What [`one_call_each`] saw: every call's output in the order made, and the reconcile it ended in.
#[derive(Debug)]
pub struct Reconciled {
    /// Every call's output, in order.
    pub outputs: Vec<std::process::Output>,
    /// The reconcile it ended in (1-based).
    pub passes: usize,
    /// How.
    pub ended: Ended,
}

/// What reconciles do with one change's calls (a 1.1 change's shardAdds), without the rest of the emulation: each
/// call once, in order; those that exit 75 again in the next reconcile, after the rate limiter's delay ([`Backoff`],
/// capped at `cap` where a test cannot sit through 1000 s); at most `passes` reconciles. Stops at the first call that
/// exits neither 0 nor 75.
pub fn one_call_each<C>(
    calls: &[C],
    passes: usize,
    cap: Duration,
    mut call: impl FnMut(&C) -> std::process::Output,
) -> Reconciled {
    let mut pending: Vec<&C> = calls.iter().collect();
    let mut backoff = Backoff::default();
    let mut outputs = Vec::new();
    for pass in 1..=passes {
        let mut again = Vec::new();
        for c in pending {
            let out = call(c);
            let code = out.status.code();
            outputs.push(out);
            match code {
                Some(0) => {}
                Some(75) => again.push(c),
                _ => return Reconciled { outputs, passes: pass, ended: Ended::Failed },
            }
        }
        if again.is_empty() {
            return Reconciled { outputs, passes: pass, ended: Ended::Done };
        }
        pending = again;
        std::thread::sleep(backoff.next_delay().min(cap));
    }
    Reconciled { outputs, passes, ended: Ended::OutOfPasses }
}

/// What a reconcile asks for next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Done: run again on the next watched change.
    Idle,
    /// `RequeueAfter(d)`: forgets the failures.
    After(Duration),
    /// An error: rate-limited retry; the message is what KubeBlocks logs and puts in a Warning event.
    Error(String),
    /// A failure answered by a fixed requeue (`RequeueError`): forgets the failures, keeps the message.
    Retry(Duration, String),
}

/// The emulation's clock: emulated time since the emulation started. Its scale may change while it runs (a
/// measurement switches to real time); emulated time stays monotonic across the change.
#[derive(Debug)]
pub struct Clock {
    state: std::sync::Mutex<(Instant, Duration, u32)>,
}

impl Clock {
    /// A clock running `scale` times faster than real time.
    pub fn new(scale: u32) -> Clock {
        Clock { state: std::sync::Mutex::new((Instant::now(), Duration::ZERO, scale.max(1))) }
    }

    fn get(&self) -> (Instant, Duration, u32) {
        *self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The scale.
    pub fn scale(&self) -> u32 {
        self.get().2
    }

    /// From now on, `scale` emulated seconds per real second.
    pub fn set_scale(&self, scale: u32) {
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = st.1 + st.0.elapsed() * st.2;
        *st = (Instant::now(), now, scale.max(1));
    }

    /// Emulated time since start.
    pub fn now(&self) -> Duration {
        let (since, base, scale) = self.get();
        base + since.elapsed() * scale
    }

    /// Real time → emulated time.
    pub fn emulated(&self, real: Duration) -> Duration {
        real * self.scale()
    }

    /// Emulated time → real time.
    pub fn real(&self, emulated: Duration) -> Duration {
        emulated / self.scale()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32) -> std::process::Output {
        use std::os::unix::process::ExitStatusExt;
        std::process::Output { status: std::process::ExitStatus::from_raw(code << 8), stdout: vec![], stderr: vec![] }
    }

    #[test]
    fn one_call_each_calls_again_in_order_only_what_exited_75_and_stops_at_a_failure() {
        let mut left = std::collections::BTreeMap::from([('a', 0), ('b', 2), ('c', 1)]);
        let mut made = Vec::new();
        let r = one_call_each(&['a', 'b', 'c'], 10, Duration::from_millis(1), |&c| {
            made.push(c);
            let n = left.get_mut(&c).expect("a call");
            if *n == 0 {
                exit(0)
            } else {
                *n -= 1;
                exit(75)
            }
        });
        assert_eq!(made, ['a', 'b', 'c', 'b', 'c', 'b']);
        assert_eq!((r.outputs.len(), r.passes, r.ended), (6, 3, Ended::Done));

        let r = one_call_each(&[1, 2], 10, Duration::from_millis(1), |&c| exit(if c == 1 { 1 } else { 0 }));
        assert_eq!((r.outputs.len(), r.passes, r.ended), (1, 1, Ended::Failed));
        let r = one_call_each(&[1], 3, Duration::from_millis(1), |_| exit(75));
        assert_eq!((r.outputs.len(), r.passes, r.ended), (3, 3, Ended::OutOfPasses));
    }

    #[test]
    fn the_backoff_doubles_from_5_ms_to_1000_s_and_is_forgotten_on_success() {
        let mut b = Backoff::default();
        let seq: Vec<Duration> = (0..22).map(|_| b.next_delay()).collect();
        let ms = |n: u64| Duration::from_millis(n);
        assert_eq!(
            seq,
            vec![
                ms(5),
                ms(10),
                ms(20),
                ms(40),
                ms(80),
                ms(160),
                ms(320),
                ms(640),
                ms(1280),
                ms(2560),
                ms(5120),
                ms(10_240),
                ms(20_480),
                ms(40_960),
                ms(81_920),
                ms(163_840),
                ms(327_680),
                ms(655_360),
                BACKOFF_MAX,
                BACKOFF_MAX,
                BACKOFF_MAX,
                BACKOFF_MAX,
            ]
        );
        // After 13 failures in a row the next retry is more than 40 s away (the figure the brief quotes).
        let mut b = Backoff::default();
        let total: Duration = (0..13).map(|_| b.next_delay()).sum();
        assert_eq!(total, ms(40_955));
        assert_eq!(b.next_delay(), ms(40_960));
        b.forget();
        assert_eq!(b.next_delay(), ms(5));
        assert_eq!(b.failures(), 1);
    }

    #[test]
    fn the_clock_scales_controller_time_and_stays_monotonic_when_rescaled() {
        let c = Clock::new(10);
        assert_eq!(c.real(Duration::from_secs(5)), Duration::from_millis(500));
        assert_eq!(c.emulated(Duration::from_millis(300)), Duration::from_secs(3));
        let before = c.now();
        c.set_scale(1);
        assert!(c.now() >= before);
        assert_eq!(c.real(Duration::from_secs(5)), Duration::from_secs(5));
    }
}
