//! `rejoin`: run by the pika container before pika starts serving, so that a restarted or rescheduled pod (even
//! one on an empty volume) comes back as a replica of its group's current master as Codis sees it, never as a
//! second master.
//!
//! Pika is not running yet, so the role is set where pika reads it at boot: the `slaveof` item of its config file (only
//! `CONFIG REWRITE` puts a `SLAVEOF` there). The file is edited in place: the one replication line is replaced,
//! everything else (including pika's own `replication-id`) is kept. redis-server's `replicaof <host> <port>` syntax is
//! handled too, since it stands in for pika in tests.

use std::path::Path;

use crate::cluster::{Session, CALL_TIMEOUT};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::Event;

/// Runs the action.
pub async fn run(ctx: &Context) -> Result<String> {
    let Event::Rejoin { shard, pod, config_file, .. } = &ctx.event else {
        return Err(Error::Refused("rejoin got another action's event".into()));
    };
    let me = shard
        .pods
        .iter()
        .find(|p| p.name() == pod)
        .ok_or_else(|| Error::invalid(crate::vars::POD_NAME, format!("{pod} is not a pod of {}", shard.name)))?;
    // The dashboard starts before the shards; while it cannot be reached, retry within the budget, then start
    // with the role pika last persisted rather than keep the pod down.
    let s = loop {
        match Session::open_without_etcd_if_down(ctx).await {
            Ok(s) => break s,
            // A configuration error (the dashboard serves another product) does not fix itself: say so now.
            Err(e @ Error::InvalidInput { .. }) => return Err(e),
            Err(e) if ctx.budget.remaining() > CALL_TIMEOUT => {
                tracing::warn!(error = %e.one_line(), "codis not reachable yet; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => {
                return Ok(format!("codis unreachable ({}); starting with the persisted role", e.one_line()));
            }
        }
    };
    let server = s.server(me);
    let stats = s.stats().await?;
    let Some(group) = stats.group_of_server(&server) else {
        return Ok(format!("{server} is not in any codis group yet; nothing to do"));
    };
    let Some(master) = group.master() else {
        return Ok(format!("group {} has no master; nothing to do", group.id));
    };
    let target = if master.eq_ignore_ascii_case(&server) { None } else { Some(s.dial(master)?) };
    let changed = set_replication(Path::new(config_file), target.as_ref().map(|(h, p)| (h.as_str(), *p)))?;
    let what = match &target {
        None => format!("{server} is group {}'s master", group.id),
        Some(_) => format!("{server} follows {master} in group {}", group.id),
    };
    Ok(if changed {
        format!("{what}; {config_file} updated")
    } else {
        format!("{what}; {config_file} already says so")
    })
}

/// Sets (or clears, for `None`) the replication line of the config file; returns whether the file changed.
pub fn set_replication(path: &Path, master: Option<(&str, u16)>) -> Result<bool> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid(crate::vars::PIKA_CONFIG_FILE, format!("cannot read {}: {e}", path.display())))?;
    let updated = with_replication(&text, master);
    if updated == text {
        return Ok(false);
    }
    // Write beside and rename, so a crash never leaves pika a half-written config.
    let tmp = path.with_extension("rejoin.tmp");
    std::fs::write(&tmp, &updated)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::Refused(format!("cannot write {}: {e}", path.display())))?;
    Ok(true)
}

/// The config text with its replication line replaced. Pika's syntax is `key : value`; redis's is `key value`.
#[must_use]
pub fn with_replication(text: &str, master: Option<(&str, u16)>) -> String {
    let pika_syntax = text.lines().any(|l| {
        let l = l.trim_start();
        !l.starts_with('#') && l.split_once(':').is_some_and(|(k, _)| !k.trim().is_empty() && k.ends_with(' '))
    });
    let is_replication_line = |line: &str| {
        let key = line.trim_start().split([' ', ':', '\t']).next().unwrap_or_default().to_ascii_lowercase();
        !line.trim_start().starts_with('#') && (key == "slaveof" || key == "replicaof")
    };
    let mut out: Vec<String> = text.lines().filter(|l| !is_replication_line(l)).map(str::to_owned).collect();
    match (master, pika_syntax) {
        (Some((host, port)), true) => out.push(format!("slaveof : {host}:{port}")),
        (Some((host, port)), false) => out.push(format!("replicaof {host} {port}")),
        // Pika keeps an explicit empty item; redis simply has no line.
        (None, true) => out.push("slaveof : ".to_owned()),
        (None, false) => {}
    }
    let mut joined = out.join("\n");
    joined.push('\n');
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pika_config_gets_its_slaveof_item_replaced_and_everything_else_kept() {
        let conf = "port : 9221\nslaveof : old-master:9221\nreplication-id : abc\n";
        let out = with_replication(conf, Some(("new-master.svc", 9221)));
        assert_eq!(out, "port : 9221\nreplication-id : abc\nslaveof : new-master.svc:9221\n");
        assert_eq!(with_replication(&out, Some(("new-master.svc", 9221))), out, "idempotent");
        assert_eq!(with_replication(&out, None), "port : 9221\nreplication-id : abc\nslaveof : \n");
    }

    #[test]
    fn redis_config_uses_replicaof() {
        let conf = "port 7001\n# slaveof a b\nslaveof 127.0.0.1 7000\n";
        assert_eq!(
            with_replication(conf, Some(("127.0.0.1", 7002))),
            "port 7001\n# slaveof a b\nreplicaof 127.0.0.1 7002\n"
        );
        assert_eq!(with_replication(conf, None), "port 7001\n# slaveof a b\n");
    }
}
