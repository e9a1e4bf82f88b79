//! The InstanceSet decisions the emulation takes, as pure functions: the rolling-update order and the next pod to
//! update, the replicas a scale-in removes, and how a role probe's output becomes a role label.
//!
//! Emulated:
//! - rolling update (`pkg/controller/instanceset/reconciler_update.go`, `update_plan.go`, `instance_util.go`):
//!   pods sorted by role `updatePriority` ascending (no role = 0, first), ties by name descending then ordinal
//!   descending, recomputed from the live labels at every step; the `Serial` plan walks that order: a terminating pod,
//!   or an updated pod that is not ready or has no role, means wait; the first pod not on the update revision is the
//!   one; the update loop then requires every pod up to it to be ready, available (`minReadySeconds`) and
//!   role-labelled, and no more unavailable pods than `maxUnavailable` (1); the chosen pod gets switchover (failure
//!   ignored, no wait) and is deleted, to be recreated from the new revision;
//! - scale-in: the highest ordinals go (no `offlineInstances`);
//! - role probe output: 1.0 trims and lower-cases stdout; 1.1 splits it into whitespace tokens: one is the role
//!   (lower-cased), two are `<role> <uint64>`, anything else is rejected (the label stays); a role not among
//!   `spec.roles` removes the label, as does empty output; a failed probe changes nothing.
//!
//! Does NOT model: `BestEffortParallel` and `Parallel` strategies (refused), in-place updates (every update
//! recreates the pod), pending pods, instance templates, `OnDelete`, `maxUnavailable` other than 1, role-snapshot
//! versions (every accepted probe result is newer than the last).

use super::Line;

/// What the update decision needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Name, `<comp>-<ordinal>`.
    pub name: String,
    /// Its `kubeblocks.io/role` label.
    pub role: Option<String>,
    /// Ready condition.
    pub ready: bool,
    /// Ready for at least `minReadySeconds`.
    pub available: bool,
    /// On the update revision.
    pub updated: bool,
    /// Being deleted.
    pub terminating: bool,
}

/// The next step of a rolling update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateStep {
    /// Every pod is updated.
    Done,
    /// Nothing may be updated now: why.
    Wait(String),
    /// Switch over and recreate this pod.
    Update(String),
}

fn parent_and_ordinal(name: &str) -> (&str, i64) {
    match name.rsplit_once('-') {
        Some((parent, ord)) => match ord.parse() {
            Ok(o) => (parent, o),
            Err(_) => (name, -1),
        },
        None => (name, -1),
    }
}

/// `updatePriority` of a pod's role (`ComposeRolePriorityMap`: no role = 0, an unknown role = 0).
fn priority(roles: &[(String, i32)], role: Option<&str>) -> i32 {
    let role = role.unwrap_or_default().to_lowercase();
    roles.iter().find(|(name, _)| name.to_lowercase() == role).map_or(0, |(_, p)| *p)
}

/// The pods in update order (`sortObjects(pods, priorities, false)`).
pub fn update_order(pods: &[PodView], roles: &[(String, i32)]) -> Vec<String> {
    let mut sorted: Vec<&PodView> = pods.iter().collect();
    sorted.sort_by(|a, b| {
        let (pa, pb) = (priority(roles, a.role.as_deref()), priority(roles, b.role.as_deref()));
        let (na, oa) = parent_and_ordinal(&a.name);
        let (nb, ob) = parent_and_ordinal(&b.name);
        pa.cmp(&pb).then(nb.cmp(na)).then(ob.cmp(&oa))
    });
    sorted.into_iter().map(|p| p.name.clone()).collect()
}

/// The next pod a `Serial` rolling update recreates, if any may be recreated now.
pub fn next_update(pods: &[PodView], roles: &[(String, i32)]) -> UpdateStep {
    let order = update_order(pods, roles);
    let by_name = |n: &str| pods.iter().find(|p| p.name == n).expect("pod of the order");
    let has_role = |p: &PodView| roles.is_empty() || p.role.is_some();
    // The Serial plan (memberUpdateQuota): at most one pod, found by walking the order.
    let mut planned = None;
    for name in &order {
        let p = by_name(name);
        if p.terminating {
            return UpdateStep::Wait(format!("{} is terminating", p.name));
        }
        if p.updated {
            if !p.ready || !has_role(p) {
                return UpdateStep::Wait(format!("updated pod {} is not ready with a role yet", p.name));
            }
            continue;
        }
        planned = Some(p.name.clone());
        break;
    }
    let Some(planned) = planned else { return UpdateStep::Done };
    let unavailable = pods.iter().filter(|p| !p.available).count();
    if unavailable >= 1 {
        return UpdateStep::Wait(format!("{unavailable} pod(s) unavailable (maxUnavailable 1)"));
    }
    // The update loop: every pod up to the planned one must be updatable; updated ones are left as they are.
    for name in &order {
        let p = by_name(name);
        if !p.ready {
            return UpdateStep::Wait(format!("{} is not ready", p.name));
        }
        if !p.available {
            return UpdateStep::Wait(format!("{} is not available", p.name));
        }
        if !has_role(p) {
            return UpdateStep::Wait(format!("{} has no role", p.name));
        }
        if !p.updated {
            debug_assert_eq!(*name, planned);
            return UpdateStep::Update(p.name.clone());
        }
    }
    UpdateStep::Done
}

/// The pods a scale-in from `current` to `desired` replicas removes: the highest ordinals.
pub fn scale_in_victims(comp_full: &str, current: u32, desired: u32) -> Vec<String> {
    (desired..current).rev().map(|i| format!("{comp_full}-{i}")).collect()
}

/// What a probe result does to the role label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeEffect {
    /// Set the label to this role.
    Set(String),
    /// Remove the label.
    Remove,
    /// Leave the label as it is (failed probe, or output the line rejects): why.
    Keep(String),
}

/// How `line` turns a probe's exit code and stdout into a label change, for a definition with `roles`.
pub fn probe_effect(line: Line, exit_ok: bool, stdout: &str, roles: &[(String, i32)]) -> ProbeEffect {
    if !exit_ok {
        return ProbeEffect::Keep("the probe failed".into());
    }
    let role = match line {
        Line::V1_0 => stdout.trim().to_lowercase(),
        Line::V1_1 => {
            let tokens: Vec<&str> = stdout.split_whitespace().collect();
            match tokens.as_slice() {
                [] => String::new(),
                [role] => role.to_lowercase(),
                [role, version] => {
                    if version.parse::<u64>().is_err() {
                        return ProbeEffect::Keep(format!("invalid role version {version:?}"));
                    }
                    role.to_lowercase()
                }
                more => {
                    return ProbeEffect::Keep(format!(
                        "invalid role probe output: expected one or two tokens, got {}",
                        more.len()
                    ))
                }
            }
        }
    };
    if roles.iter().any(|(name, _)| name.to_lowercase() == role) {
        ProbeEffect::Set(role)
    } else {
        ProbeEffect::Remove
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles() -> Vec<(String, i32)> {
        vec![("master".into(), 2), ("slave".into(), 1)]
    }

    fn pod(name: &str, role: Option<&str>, updated: bool) -> PodView {
        PodView {
            name: name.into(),
            role: role.map(str::to_owned),
            ready: true,
            available: true,
            updated,
            terminating: false,
        }
    }

    #[test]
    fn slaves_by_descending_ordinal_then_the_master_and_unlabelled_pods_first() {
        let pods = vec![
            pod("c1-pika-abc-0", Some("master"), false),
            pod("c1-pika-abc-1", Some("slave"), false),
            pod("c1-pika-abc-2", Some("slave"), false),
            pod("c1-pika-abc-10", Some("slave"), false),
            pod("c1-pika-abc-3", None, false),
        ];
        assert_eq!(
            update_order(&pods, &roles()),
            vec!["c1-pika-abc-3", "c1-pika-abc-10", "c1-pika-abc-2", "c1-pika-abc-1", "c1-pika-abc-0"]
        );
    }

    #[test]
    fn a_rolling_restart_of_three_recreates_slaves_then_the_master_one_at_a_time() {
        let mut pods = vec![
            pod("c1-pika-abc-0", Some("master"), false),
            pod("c1-pika-abc-1", Some("slave"), false),
            pod("c1-pika-abc-2", Some("slave"), false),
        ];
        let mut order = Vec::new();
        loop {
            match next_update(&pods, &roles()) {
                UpdateStep::Done => break,
                UpdateStep::Wait(why) => panic!("unexpected wait: {why}"),
                UpdateStep::Update(name) => {
                    // Recreated: first not ready and without a role, which blocks the next step.
                    let p = pods.iter_mut().find(|p| p.name == name).unwrap();
                    p.updated = true;
                    p.ready = false;
                    p.available = false;
                    let role = p.role.take();
                    assert!(matches!(next_update(&pods, &roles()), UpdateStep::Wait(_)));
                    let p = pods.iter_mut().find(|p| p.name == name).unwrap();
                    p.ready = true;
                    assert!(matches!(next_update(&pods, &roles()), UpdateStep::Wait(_)), "no role yet");
                    let p = pods.iter_mut().find(|p| p.name == name).unwrap();
                    p.role = role;
                    // Not available yet: nothing else may be recreated (the last one leaves nothing to do).
                    assert!(!matches!(next_update(&pods, &roles()), UpdateStep::Update(_)), "not available yet");
                    pods.iter_mut().find(|p| p.name == name).unwrap().available = true;
                    order.push(name);
                }
            }
        }
        assert_eq!(order, vec!["c1-pika-abc-2", "c1-pika-abc-1", "c1-pika-abc-0"]);
    }

    #[test]
    fn the_order_follows_live_labels_after_a_switchover_moved_the_master() {
        // -2 was updated and became master after the old master's switchover; -0 is a slave now.
        let pods = vec![
            pod("c1-pika-abc-0", Some("slave"), false),
            pod("c1-pika-abc-1", Some("slave"), true),
            pod("c1-pika-abc-2", Some("master"), true),
        ];
        assert_eq!(next_update(&pods, &roles()), UpdateStep::Update("c1-pika-abc-0".into()));
    }

    #[test]
    fn a_terminating_or_roleless_updated_pod_blocks_the_update() {
        let mut pods = vec![pod("c1-p-0", Some("master"), false), pod("c1-p-1", None, true)];
        assert!(matches!(next_update(&pods, &roles()), UpdateStep::Wait(w) if w.contains("c1-p-1")));
        pods[1].role = Some("slave".into());
        pods[1].terminating = true;
        assert!(matches!(next_update(&pods, &roles()), UpdateStep::Wait(w) if w.contains("terminating")));
    }

    #[test]
    fn scale_in_removes_the_highest_ordinals() {
        assert_eq!(scale_in_victims("c1-pika-abc", 4, 2), vec!["c1-pika-abc-3", "c1-pika-abc-2"]);
        assert!(scale_in_victims("c1-pika-abc", 2, 2).is_empty());
    }

    #[test]
    fn probe_output_per_line() {
        let r = roles();
        assert_eq!(probe_effect(Line::V1_0, true, " Master\n", &r), ProbeEffect::Set("master".into()));
        assert_eq!(probe_effect(Line::V1_1, true, "slave\n", &r), ProbeEffect::Set("slave".into()));
        assert_eq!(probe_effect(Line::V1_1, true, "master 42", &r), ProbeEffect::Set("master".into()));
        // 1.0 takes the whole trimmed output: two tokens are no role of the definition.
        assert_eq!(probe_effect(Line::V1_0, true, "master 42", &r), ProbeEffect::Remove);
        assert!(matches!(probe_effect(Line::V1_1, true, "master x", &r), ProbeEffect::Keep(_)));
        assert!(matches!(probe_effect(Line::V1_1, true, "a b c", &r), ProbeEffect::Keep(_)));
        assert_eq!(probe_effect(Line::V1_0, true, "", &r), ProbeEffect::Remove);
        assert_eq!(probe_effect(Line::V1_1, true, "leader", &r), ProbeEffect::Remove);
        assert!(matches!(probe_effect(Line::V1_0, false, "master", &r), ProbeEffect::Keep(_)));
    }
}
