//! Writes again what a failed-over master acknowledged and its promoted replica never got, from the old master's
//! binlog, when its pod comes back with its volume: before `rejoin` makes it a replica (a full copy that wipes it).
//!
//! The tail past the position the promoted replica had reached is sorted into each key's history
//! ([`crate::plan::salvage`]); a key is rebuilt through a proxy (which routes it to the group that owns its slot now,
//! a migrating slot included) only where it is absent, so nothing the new master took since is overwritten. What this
//! cannot tell apart: a key of the tail that a client deleted after the failover comes back. A volume lost with its
//! node loses the tail.

use std::path::Path;

use futures_util::StreamExt as _;

use crate::clients::binlog;
use crate::error::{Error, Result};
use crate::input::replication::BinlogPosition;
use crate::plan::salvage::plan;
use crate::steps::cluster::Session;
use crate::steps::failover::FailoverRecord;

/// Keys checked and rebuilt at once.
const KEYS_AT_ONCE: usize = 32;

/// Why nothing could be written.
#[derive(Debug, thiserror::Error)]
pub enum Unsalvaged {
    /// No registered proxy answered.
    #[error("no codis-proxy answered to write the salvaged keys through ({tried})")]
    NoProxy {
        /// Each proxy tried and why it failed.
        tried: String,
    },
}

/// What a salvage did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Salvaged {
    /// Commands read past the promoted replica's position.
    pub commands: usize,
    /// Keys written again (absent where they live now).
    pub written: usize,
    /// Keys present where they live now, left as they are.
    pub present: usize,
    /// Keys left out: a command across keys touched them.
    pub left_out: usize,
    /// Items of the binlog that did not decode.
    pub undecoded: usize,
}

impl Salvaged {
    /// One line, for logs and Events.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "{} commands past the promoted replica's position: {} keys written again, {} present already, {} left out \
             (a command across keys), {} records undecoded",
            self.commands, self.written, self.present, self.left_out, self.undecoded
        )
    }
}

/// What [`salvage`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The tail was read and written again where missing.
    Done(Salvaged),
    /// This failover's tail was salvaged already (a rerun).
    AlreadyDone,
    /// No binlog to read from that position (a new volume, or a history that is not this one's).
    NoTail(String),
}

/// `<prefix>/salvaged/<gid>`: the `at` of the failover whose tail was salvaged, so a rerun does not write it again
/// over deletes that came since.
#[must_use]
pub fn salvaged_key(prefix: &str, gid: u32) -> String {
    format!("{}/salvaged/{gid}", prefix.trim_end_matches('/'))
}

/// Salvages the tail of `log_dir` (this pod's binlog, pika stopped) past `from`, the position `record`'s new master
/// had at its promotion.
///
/// # Errors
/// etcd or every proxy unreachable, a proxy refusing a write, or the budget spent (exit 75: the rerun skips what it
/// wrote, which exists then).
pub async fn salvage(
    s: &Session<'_>,
    record: &FailoverRecord,
    from: BinlogPosition,
    log_dir: &Path,
) -> Result<Outcome> {
    let etcd = s.etcd()?;
    let key = salvaged_key(&s.prefix(), record.gid);
    if etcd.get(&key).await?.is_some_and(|e| e.value == record.at) {
        return Ok(Outcome::AlreadyDone);
    }
    // Once per failover, whatever it found: this pod becomes a replica next, and a later read of its binlog from
    // that position would read the new master's history and write back keys deleted since.
    let tail = match binlog::read_after(log_dir, from) {
        Ok(tail) => tail,
        Err(e) => {
            etcd.put(&key, &record.at, None).await?;
            return Ok(Outcome::NoTail(e.to_string()));
        }
    };
    let planned = plan(&tail.commands);
    let mut done = Salvaged {
        commands: tail.commands.len(),
        left_out: planned.left_out.len(),
        undecoded: tail.undecoded,
        ..Salvaged::default()
    };
    if !planned.keys.is_empty() {
        let proxy = proxy(s).await?;
        let total = planned.keys.len();
        // Keys are independent: many at once over the one connection (pipelined), each key's commands in order.
        let rebuilt: Vec<Result<bool>> = futures_util::stream::iter(&planned.keys)
            .map(|history| {
                let proxy = proxy.clone();
                async move {
                    s.ctx.budget.check(|| format!("salvage in progress: {total} keys to check again"))?;
                    if proxy.exists(&history.key).await? {
                        return Ok(false);
                    }
                    for command in &history.commands {
                        proxy.send(command).await?;
                    }
                    Ok(true)
                }
            })
            .buffer_unordered(KEYS_AT_ONCE)
            .collect()
            .await;
        for result in rebuilt {
            if result? {
                done.written += 1;
            } else {
                done.present += 1;
            }
        }
    }
    etcd.put(&key, &record.at, None).await?;
    Ok(Outcome::Done(done))
}

/// A connection to the first registered proxy that answers.
async fn proxy(s: &Session<'_>) -> Result<crate::clients::pika::Pika> {
    let stats = s.stats().await?;
    let mut tried = Vec::new();
    for proxy in &stats.proxy.models {
        match s.pika(&proxy.proxy_addr).await {
            Ok(conn) => return Ok(conn),
            Err(e) => tried.push(format!("{}: {}", proxy.proxy_addr, e.one_line())),
        }
    }
    Err(Error::from(Unsalvaged::NoProxy {
        tried: if tried.is_empty() { "none registered".into() } else { tried.join("; ") },
    }))
}
