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
