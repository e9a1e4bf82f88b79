//! `topology`, for people: each Codis group's servers in Codis's order, with what Codis says about each (index 0 is
//! the master; the Pika fork also reports a role and a health state) next to what the pika itself says (`INFO
//! replication`: role, whom it follows, link), and, when etcd is given, the group's transfer fence and its last
//! failover (when, from, to, why, by whom: the watcher or a restarting master's `rejoin`). Read-only: it changes
//! nothing anywhere.
//!
//! A group is flagged `DISAGREE` when Codis's `servers[0]` is not a pika master, another member is one, a member
//! does not follow `servers[0]`, a promote is left in progress, the fork reports a role the pika does not have, or a
//! pika cannot be asked (then nothing can be confirmed). The table goes to stdout either way; the exit status is 0
//! when every group is consistent and 1 when any is flagged (with a one-line summary on stderr).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;

use crate::clients::codis::Group;
use crate::clients::pika::{Replication, Role};
use crate::error::Result;
use crate::input::address::HostPort;
use crate::input::context::Context;
use crate::steps::cluster::{self, Session};
use crate::steps::failover::{self, FailoverRecord};
use crate::steps::transfer;

/// Runs the subcommand: prints the table, and fails (exit 1) when a group is flagged.
pub async fn run(ctx: &Context, event: &crate::input::event::Topology) -> Result<String> {
    let crate::input::event::Topology { common, shards } = event;
    let s = Session::open_without_etcd_if_down(ctx, common).await?;
    let stats = s.stats().await?;
    let mut names = cluster::shards_by_group(&stats);
    let failovers = match &s.etcd {
        Some(etcd) => failover::last_failovers(etcd, &s.prefix()).await.unwrap_or_default(),
        None => Default::default(),
    };
    let mut report = String::new();
    let mut flagged = Vec::new();
    for group in &stats.group.models {
        let servers: Vec<String> = group.servers.iter().map(|gs| gs.server.clone()).collect();
        let infos = transfer::survey(&s, &servers).await;
        let fence = match &s.etcd {
            Some(etcd) => etcd.get(&transfer::fence_key(&s.prefix(), group.id)).await.ok().flatten().map(|e| e.value),
            None => None,
        };
        let view = GroupView {
            group,
            shard: names.remove(&group.id),
            slots: stats.slots_of(group.id).len(),
            infos: &infos,
            fence: fence.as_deref(),
            last_failover: failovers.get(&group.id),
        };
        let problems = view.render(&mut report, |server| s.dial(server).ok());
        if problems > 0 {
            flagged.push(group.id);
        }
    }
    for shard in shards {
        if cluster::group_of_shard(&stats, &shard.name).is_none() {
            let _ = writeln!(report, "shard {}: not registered in codis", shard.name);
        }
    }
    if stats.group.models.is_empty() {
        report.push_str("codis has no groups\n");
    }
    if flagged.is_empty() {
        return Ok(report.trim_end().to_owned());
    }
    // The table is the result in both cases; only the exit status and stderr tell the two apart.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(report.as_bytes()).and_then(|()| out.flush());
    Err(Disagreement { gids: flagged }.into())
}

/// Codis and the pikas disagree; the report on stdout says how.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("codis and the pikas disagree in group(s) {gids:?}")]
pub struct Disagreement {
    /// The groups flagged.
    pub gids: Vec<u32>,
}

/// One group, with what its pikas answered.
pub struct GroupView<'a> {
    /// The group as Codis has it.
    pub group: &'a Group,
    /// The shard it serves, when known.
    pub shard: Option<String>,
    /// The slots it owns.
    pub slots: usize,
    /// `INFO replication` per server, or why it could not be read.
    pub infos: &'a BTreeMap<String, Result<Replication, String>>,
    /// The transfer fence in etcd, if any.
    pub fence: Option<&'a str>,
    /// The group's last failover, if any.
    pub last_failover: Option<&'a FailoverRecord>,
}

impl GroupView<'_> {
    /// Appends the group's table to `out` and returns how many problems it flagged. `dial` maps a registered server
    /// to the host and port its replicas name as their master (overrides applied).
    pub fn render(&self, out: &mut String, dial: impl Fn(&str) -> Option<HostPort>) -> usize {
        let g = self.group;
        let mut problems = Vec::new();
        let _ = write!(out, "group {}  shard {}  slots {}", g.id, self.shard.as_deref().unwrap_or("?"), self.slots);
        if g.is_promoting() {
            let _ = write!(
                out,
                "  promoting index {} ({})",
                g.promoting.index.unwrap_or(0),
                g.promoting.state.as_deref().unwrap_or("")
            );
            problems.push("a promote is left in progress".to_owned());
        }
        if let Some(fence) = self.fence {
            let _ = write!(out, "  fence -> {fence}");
        }
        out.push('\n');
        let master = g.master().unwrap_or_default();
        let master_at = dial(master);
        // Which server a replica's `master_host:master_port` names, for the table.
        let name_of = |host: &str, port: u16| -> String {
            g.servers
                .iter()
                .position(|gs| {
                    dial(&gs.server).is_some_and(|at| at.port() == port && at.host().eq_ignore_ascii_case(host))
                })
                .map_or_else(|| format!("{host}:{port}"), |i| format!("[{i}]"))
        };
        for (i, gs) in g.servers.iter().enumerate() {
            let mut codis = if i == 0 { "master".to_owned() } else { "slave".to_owned() };
            if let Some(role) = gs.role.as_deref().filter(|r| !r.is_empty()) {
                let _ = write!(codis, " (fork: {role}, state {})", gs.state.unwrap_or(0));
            }
            let pika = match self.infos.get(&gs.server) {
                None => {
                    problems.push(format!("[{i}] was not asked"));
                    "not asked".to_owned()
                }
                Some(Err(e)) => {
                    problems.push(format!("[{i}] cannot be asked"));
                    format!("unreachable ({e})")
                }
                Some(Ok(info)) => {
                    let text = describe(info, &name_of);
                    if i == 0 && info.role.is_slave() {
                        problems.push(format!("[0] is codis's master but a pika {text}"));
                    }
                    if i > 0 && info.role == Role::Master {
                        problems.push(format!("[{i}] is a second pika master"));
                    } else if i > 0 {
                        let follows = master_at.as_ref().is_some_and(|at| info.follows(at));
                        if !follows {
                            problems.push(format!("[{i}] does not follow [0]"));
                        }
                    }
                    if let Some(role) = gs.role.as_deref().filter(|r| !r.is_empty()) {
                        let pika_role = info.role.probe_name();
                        if gs.state.unwrap_or(0) == 0 && !role.eq_ignore_ascii_case(pika_role) {
                            problems
                                .push(format!("[{i}] is a {role} for codis's health check, a {pika_role} for pika"));
                        }
                    }
                    text
                }
            };
            let _ = writeln!(out, "  [{i}] {}  codis {codis}  pika {pika}", gs.server);
        }
        if let Some(record) = self.last_failover {
            let _ = writeln!(
                out,
                "  last failover {}: {} -> {} ({}; by {}, {} ms)",
                record.at, record.from, record.to, record.why, record.by, record.took_ms
            );
        }
        if problems.is_empty() {
            out.push_str("  ok\n");
        } else {
            let _ = writeln!(out, "  DISAGREE: {}", problems.join("; "));
        }
        problems.len()
    }
}

fn describe(info: &Replication, name_of: &impl Fn(&str, u16) -> String) -> String {
    match info.role {
        Role::Master => format!("master ({} replica(s))", info.connected_slaves),
        Role::Slave | Role::MasterAndSlave => {
            let of = match (&info.master_host, info.master_port) {
                (Some(h), Some(p)) => name_of(h, p),
                _ => "?".to_owned(),
            };
            let chained = if info.role == Role::MasterAndSlave {
                format!(", {} replica(s) of its own", info.connected_slaves)
            } else {
                String::new()
            };
            format!("slave of {of} link {}{chained}", if info.link_up { "up" } else { "down" })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::codis::GroupServer;
    use crate::clients::pika::parse_replication;

    fn server(o: u32) -> String {
        format!("c1-pika-x7k-{o}.c1-pika-x7k-headless.prod.svc.cluster.local:9221")
    }

    fn group() -> Group {
        Group {
            id: 4,
            servers: (0..3).map(|o| GroupServer { server: server(o), ..GroupServer::default() }).collect(),
            ..Group::default()
        }
    }

    fn dial(server: &str) -> Option<HostPort> {
        Some(HostPort::new(
            "127.0.0.1".to_owned(),
            7000 + crate::clients::server::ServerAddr::of(server).ordinal()? as u16,
        ))
    }

    fn slave_of(port: u16) -> Result<Replication, String> {
        Ok(parse_replication(&format!(
            "role:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:{port}\r\nmaster_link_status:up\r\n"
        )))
    }

    fn render(infos: &BTreeMap<String, Result<Replication, String>>) -> (String, usize) {
        let g = group();
        let view = GroupView {
            group: &g,
            shard: Some("c1-pika-x7k".into()),
            slots: 1024,
            infos,
            fence: None,
            last_failover: None,
        };
        let mut out = String::new();
        let n = view.render(&mut out, dial);
        (out, n)
    }

    #[test]
    fn a_consistent_group_is_ok_and_names_masters_by_index() {
        let infos = BTreeMap::from([
            (server(0), Ok(parse_replication("role:master\r\nconnected_slaves:2\r\n"))),
            (server(1), slave_of(7000)),
            (server(2), slave_of(7000)),
        ]);
        let (out, n) = render(&infos);
        assert_eq!(n, 0, "{out}");
        assert!(out.contains("pika slave of [0] link up") && out.ends_with("  ok\n"), "{out}");
    }

    #[test]
    fn a_second_master_and_a_stray_replica_are_flagged() {
        let infos = BTreeMap::from([
            (server(0), Ok(parse_replication("role:master\r\nconnected_slaves:0\r\n"))),
            (server(1), Ok(parse_replication("role:master\r\nconnected_slaves:1\r\n"))),
            (server(2), slave_of(7001)),
        ]);
        let (out, n) = render(&infos);
        assert_eq!(n, 2, "{out}");
        assert!(out.contains("[1] is a second pika master") && out.contains("[2] does not follow [0]"), "{out}");
        assert!(out.contains("slave of [1]"), "{out}");
    }

    #[test]
    fn an_unreachable_pika_and_a_slave_at_index_0_are_flagged() {
        let infos = BTreeMap::from([
            (server(0), slave_of(7001)),
            (server(1), Ok(parse_replication("role:master\r\nconnected_slaves:1\r\n"))),
            (server(2), Err("connection refused".to_owned())),
        ]);
        let (out, n) = render(&infos);
        assert_eq!(n, 3, "{out}");
        assert!(out.contains("unreachable (connection refused)") && out.contains("DISAGREE"), "{out}");
    }
}
