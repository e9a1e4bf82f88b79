//! Deciding that a master is gone, from probes alone: pure bookkeeping over the times probes were sent and what
//! they returned, so that it can be tested against any schedule of answers without a server or a clock.
//!
//! The rule: a server is **dead** once every probe sent to it for [`Detector::detection`] has failed — no answer
//! within the probe deadline, a refused connection, a reset — counted from the first probe of the current run of
//! failures. A probe waits up to [`Detector::deadline`], half the detection time, so that a probe hung on a
//! connection the server dropped without a reset fails in time for another, on a new connection, to answer before
//! the server would be judged dead. A server that answers every probe within the deadline is never dead; one that
//! stops answering is dead `detection` after the first probe it left unanswered, plus at most one probe interval for
//! that probe to be sent.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Probe bookkeeping of one server.
#[derive(Debug, Clone, Default)]
struct Track {
    /// When the probe in flight was sent.
    in_flight: Option<Instant>,
    /// When the last probe was sent.
    last_sent: Option<Instant>,
    /// When the first probe of the current run of failures was sent.
    failing_since: Option<Instant>,
    /// The last failure, for the verdict.
    last_error: Option<String>,
}

/// A server found dead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The server.
    pub server: String,
    /// When the first unanswered probe of the run was sent.
    pub since: Instant,
    /// The last failure.
    pub error: String,
}

/// The probe schedule and failure runs of the servers being watched.
#[derive(Debug, Clone)]
pub struct Detector {
    detection: Duration,
    interval: Duration,
    tracks: BTreeMap<String, Track>,
}

impl Detector {
    /// Probes every `interval`; a server failing every probe for `detection` is dead.
    #[must_use]
    pub fn new(detection: Duration, interval: Duration) -> Self {
        Self { detection, interval, tracks: BTreeMap::new() }
    }

    /// The detection time.
    #[must_use]
    pub fn detection(&self) -> Duration {
        self.detection
    }

    /// How long one probe may wait, connecting included: half the detection time, so that a server is never judged
    /// dead on one probe alone (the next is sent on a new connection, at most one interval later).
    #[must_use]
    pub fn deadline(&self) -> Duration {
        self.detection / 2
    }

    /// Starts `server`'s record afresh, as when it has just become a master: its failures so far, and the outcome of
    /// the probe in flight (sent before), no longer count.
    pub fn restart(&mut self, server: &str) {
        if let Some(t) = self.tracks.get_mut(&server.to_ascii_lowercase()) {
            *t = Track { last_sent: t.last_sent, ..Track::default() };
        }
    }

    /// Watches exactly `servers` from now on: new ones start with a clean record, the others are forgotten.
    pub fn watch(&mut self, servers: impl IntoIterator<Item = String>) {
        let wanted: BTreeMap<String, ()> = servers.into_iter().map(|s| (s.to_ascii_lowercase(), ())).collect();
        self.tracks.retain(|s, _| wanted.contains_key(s));
        for server in wanted.into_keys() {
            self.tracks.entry(server).or_default();
        }
    }

    /// The servers watched.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.tracks.keys().map(String::as_str)
    }

    /// The servers to probe now: none in flight and the last probe at least one interval ago. They are marked in
    /// flight as of `now`.
    pub fn due(&mut self, now: Instant) -> Vec<String> {
        let interval = self.interval;
        let mut out = Vec::new();
        for (server, t) in &mut self.tracks {
            let idle = t.in_flight.is_none();
            let rested = t.last_sent.is_none_or(|s| now.saturating_duration_since(s) >= interval);
            if idle && rested {
                t.in_flight = Some(now);
                t.last_sent = Some(now);
                out.push(server.clone());
            }
        }
        out
    }

    /// Records the outcome of the probe of `server` sent at `sent`, known at `now`. An outcome for a server no longer
    /// watched, or for a probe other than the one in flight, is ignored.
    pub fn report(&mut self, server: &str, sent: Instant, outcome: Result<(), String>, now: Instant) {
        let deadline = self.deadline();
        let Some(t) = self.tracks.get_mut(&server.to_ascii_lowercase()) else { return };
        if t.in_flight != Some(sent) {
            return;
        }
        t.in_flight = None;
        match outcome {
            // An answer within the deadline (the probe's timeout) proves the server alive.
            Ok(()) if now.saturating_duration_since(sent) <= deadline => {
                t.failing_since = None;
                t.last_error = None;
            }
            Ok(()) => {
                t.failing_since.get_or_insert(sent);
                t.last_error = Some(format!("answered only after {:?}", now.saturating_duration_since(sent)));
            }
            Err(e) => {
                t.failing_since.get_or_insert(sent);
                t.last_error = Some(e);
            }
        }
    }

    /// Whether `server` is failing now (at least one failed probe since its last success).
    #[must_use]
    pub fn is_failing(&self, server: &str) -> bool {
        self.tracks.get(&server.to_ascii_lowercase()).is_some_and(|t| t.failing_since.is_some())
    }

    /// The servers dead at `now`. A probe still in flight past its deadline counts as failed from when it was sent
    /// (its own timeout reports it a moment later).
    #[must_use]
    pub fn dead(&self, now: Instant) -> Vec<Verdict> {
        self.tracks
            .iter()
            .filter_map(|(server, t)| {
                let overdue = t.in_flight.filter(|sent| now.saturating_duration_since(*sent) >= self.deadline());
                let since = match (t.failing_since, overdue) {
                    (Some(f), _) => f,
                    (None, Some(sent)) => sent,
                    (None, None) => return None,
                };
                (now.saturating_duration_since(since) >= self.detection).then(|| Verdict {
                    server: server.clone(),
                    since,
                    error: t.last_error.clone().unwrap_or_else(|| "no answer".to_owned()),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: &str = "c1-pika-a-0.c1-pika-a-headless.ns.svc.cluster.local:9221";

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Drives a detector over one server with a 10 ms tick: `answer(sent)` says how long the probe sent then takes
    /// and whether it succeeds (`None`: never answers, so it times out at the detection time). Returns when the
    /// server was first found dead, if before `horizon`.
    fn run(
        detection: Duration,
        interval: Duration,
        horizon: Duration,
        answer: impl Fn(Duration) -> Option<(Duration, bool)>,
    ) -> Option<Duration> {
        let start = Instant::now();
        let mut d = Detector::new(detection, interval);
        d.watch([S.to_owned()]);
        let mut pending: Vec<(Instant, Instant, bool)> = Vec::new();
        let mut t = Duration::ZERO;
        while t <= horizon {
            let now = start + t;
            pending.sort_by_key(|p| p.1);
            while let Some(&(sent, at, ok)) = pending.first() {
                if at > now {
                    break;
                }
                pending.remove(0);
                d.report(S, sent, if ok { Ok(()) } else { Err("refused".into()) }, at);
            }
            if !d.dead(now).is_empty() {
                return Some(t);
            }
            for _ in d.due(now) {
                let deadline = d.deadline();
                let (took, ok) = answer(t).unwrap_or((deadline, false));
                // A probe never waits longer than its deadline.
                let took = took.min(deadline);
                pending.push((now, now + took, ok && took < deadline));
            }
            t += ms(10);
        }
        None
    }

    #[test]
    fn a_refused_connection_is_dead_after_the_detection_time_and_not_before() {
        let died = ms(1000);
        let dead = run(ms(2000), ms(500), ms(10_000), |t| Some((ms(1), t < died))).expect("found dead");
        // The first probe after the death is sent within one interval; detection counts from there.
        assert!(dead >= died + ms(2000) - ms(10) && dead <= died + ms(500) + ms(2000) + ms(20), "{dead:?}");
    }

    #[test]
    fn a_server_that_never_answers_is_dead_once_its_probe_times_out() {
        let died = ms(700);
        let dead = run(ms(2000), ms(500), ms(10_000), |t| if t < died { Some((ms(1), true)) } else { None }).unwrap();
        assert!(dead >= died + ms(2000) - ms(10) && dead <= died + ms(500) + ms(2000) + ms(20), "{dead:?}");
    }

    #[test]
    fn a_slow_server_within_the_deadline_is_never_dead_and_one_beyond_it_is() {
        assert_eq!(run(ms(2000), ms(500), ms(20_000), |_| Some((ms(900), true))), None);
        assert!(run(ms(2000), ms(500), ms(20_000), |_| Some((ms(1100), true))).is_some());
    }

    #[test]
    fn a_probe_hung_on_a_dropped_connection_between_answers_is_not_a_death() {
        // The probe sent at 1 s never answers (the server dropped its connection without a reset); the next one,
        // on a new connection, answers at once. A probe waiting the whole detection time would make this a death.
        let hung = |t: Duration| (ms(1000)..ms(1010)).contains(&t);
        assert_eq!(run(ms(2000), ms(500), ms(20_000), |t| if hung(t) { None } else { Some((ms(1), true)) }), None);
    }

    #[test]
    fn a_restarted_record_ignores_the_failures_and_the_probe_in_flight_from_before() {
        let now = Instant::now();
        let mut d = Detector::new(ms(100), ms(10));
        d.watch([S.to_owned()]);
        let first = d.due(now);
        assert_eq!(first, [S.to_owned()]);
        d.report(S, now, Err("refused".into()), now + ms(1));
        let stale = now + ms(10);
        assert_eq!(d.due(stale), [S.to_owned()]);
        d.restart(S);
        assert!(!d.is_failing(S) && d.dead(now + ms(200)).is_empty(), "failures from before the restart counted");
        d.report(S, stale, Err("no answer".into()), now + ms(60));
        assert!(!d.is_failing(S), "the probe sent before the restart counted");
        assert_eq!(d.due(now + ms(20)), [S.to_owned()], "not probed again after the restart");
    }

    #[test]
    fn one_failed_probe_between_answers_is_not_a_death() {
        // Every fourth probe is refused: runs of failures never last the detection time.
        assert_eq!(run(ms(2000), ms(500), ms(20_000), |t| Some((ms(1), (t.as_millis() / 500) % 4 != 1))), None);
    }

    #[test]
    fn forgotten_servers_and_stale_reports_change_nothing() {
        let now = Instant::now();
        let mut d = Detector::new(ms(100), ms(10));
        d.watch([S.to_owned()]);
        let sent = d.due(now);
        assert_eq!(sent, [S.to_owned()]);
        d.report(S, now - ms(5), Err("stale".into()), now);
        assert!(!d.is_failing(S), "a report for a probe not in flight is ignored");
        d.report(S, now, Ok(()), now + ms(1));
        assert!(!d.is_failing(S) && d.due(now + ms(20)) == [S.to_owned()], "answered: probed again on schedule");
        d.watch(Vec::<String>::new());
        assert_eq!(d.servers().count(), 0);
        d.report(S, now, Err("gone".into()), now);
        assert!(d.dead(now + ms(1000)).is_empty());
    }

    proptest! {
        /// Whatever the latencies, a server whose every answer comes within the probe deadline is never dead.
        #[test]
        fn answers_within_the_deadline_are_never_a_death(
            detection in 200u64..3000,
            interval_share in 1u64..90,
            latencies in proptest::collection::vec(0u64..1000, 1..50),
        ) {
            let detection = ms(detection);
            let interval = detection * u32::try_from(interval_share).unwrap() / 100;
            let found = run(detection, interval.max(ms(10)), ms(15_000), |t| {
                let i = usize::try_from(t.as_millis()).unwrap() % latencies.len();
                // Scaled into [0, deadline).
                Some((detection / 2 * u32::try_from(latencies[i]).unwrap() / 1001, true))
            });
            prop_assert_eq!(found, None);
        }

        /// A server that stops answering at any moment is found dead no sooner than the detection time after, and
        /// no later than one interval plus the detection time after.
        #[test]
        fn a_death_is_found_within_detection_plus_one_interval(
            detection in 200u64..3000,
            interval_share in 1u64..90,
            died in 0u64..5000,
            refused in any::<bool>(),
        ) {
            let detection = ms(detection);
            let interval = (detection * u32::try_from(interval_share).unwrap() / 100).max(ms(10));
            let died = ms(died);
            let found = run(detection, interval, died + detection * 3, |t| {
                if t < died { Some((ms(1), true)) } else if refused { Some((ms(1), false)) } else { None }
            });
            let found = found.expect("found dead");
            prop_assert!(found + ms(10) >= died + detection, "found {:?}, died {:?}", found, died);
            prop_assert!(found <= died + interval + detection + ms(30), "found {:?}, died {:?}", found, died);
        }
    }
}
