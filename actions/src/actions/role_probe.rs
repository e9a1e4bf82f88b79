//! `role-probe`: prints `master` or `slave` for the local pika, every few seconds in every pod.
//!
//! It is the hot path of the addon, so it stays small: no async runtime, no dashboard, no Tera (its built-in template
//! is evaluated directly), one connection and one `INFO replication`. A chained node (`role:master&&slave`) is a
//! slave for KubeBlocks. An unreachable pika is exit 1 with nothing on stdout, which KubeBlocks ignores (the role
//! label stays as it was).

use std::time::Duration;

use crate::clients::pika;
use crate::error::Result;
use crate::input::address::HostPort;
use crate::input::context::Context;

/// Longest a probe waits for pika; KubeBlocks probes every few seconds, so a slow answer is as good as none.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs the action.
pub fn run(ctx: &Context, event: &crate::input::event::RoleProbe) -> Result<String> {
    let crate::input::event::RoleProbe { host, pika: target, .. } = event;
    let timeout = ctx.budget.cap(PROBE_TIMEOUT);
    let role =
        pika::probe_role(&HostPort::new(host.clone(), target.port), ctx.secrets.pika_password.as_deref(), timeout)?;
    Ok(role.probe_name().to_owned())
}
