//! `member-join`: a pod added by replica scale-out becomes a server of its shard's group, replicating the group's
//! current master (whatever Codis says it is, never "ordinal 0").

use crate::error::Result;
use crate::input::context::Context;
use crate::steps::cluster::Session;
use crate::steps::register;

/// Runs the action.
pub async fn run(ctx: &Context, event: &crate::input::event::MemberJoin) -> Result<String> {
    let crate::input::event::MemberJoin { common, shard, member, .. } = event;
    let s = Session::open(ctx, common).await?;
    let reg = s
        .under_topology_lock(async |_| {
            // A registered shard takes just the new pod; one that never was (its post-provision has not run) is
            // registered whole, since every pod of the desired spec exists once scale-out runs memberJoin.
            let registered = crate::steps::cluster::group_of_shard(&s.stats().await?, &shard.name).is_some();
            let pods = if registered { std::slice::from_ref(&member.fqdn) } else { shard.pods.as_slice() };
            register::ensure_shard(&s, shard, pods).await
        })
        .await?;
    Ok(format!("{} joined group {} as a replica of {}", member.name, reg.gid, reg.master))
}
