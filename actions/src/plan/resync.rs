//! Whether a member pointed at its group's master may sync incrementally, or must copy the master in full.
//!
//! pika's incremental sync checks only that the replica's binlog position exists on the master
//! (`pika_repl_server_conn.cc`): nothing checks that the two histories are the same. So a member may keep its data
//! only when its history is known to be a prefix of the master's; when that is not known, a full resync is forced.
//! What makes it known is the [`Handover`] the transfer wrote when it promoted the master: the master's binlog
//! position at its promotion (measured before the promote, so never above it) and whom it replaced. A member that
//! followed the replaced master and got no further than that position holds a prefix of what the new master holds;
//! so does the replaced master itself after a planned transfer, which waits for the new master to catch up. After
//! an unplanned one (a failover, a master handing over at restart) the replaced master may hold writes nobody got,
//! so it is never trusted.

use serde::{Deserialize, Serialize};

use crate::input::replication::{BinlogPosition, SyncState};

/// How a group's master came to be, written by the transfer right before the promote; `<prefix>/handover/<gid>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// The server promoted (`<fqdn>:<port>`, as Codis lists it).
    pub to: String,
    /// The master it replaced.
    pub from: String,
    /// A failover or a hand-over at restart: `from` was not waited for.
    pub unplanned: bool,
    /// `to`'s `ReplicationID` before the promote (pika keeps it across `SLAVEOF NO ONE`).
    pub replication_id: Option<String>,
    /// `to`'s binlog position before the promote.
    pub position: BinlogPosition,
    /// `from` kept taking writes after the promote: a split's donor, whose own slots it goes on serving. A member
    /// that followed it went on past `position` with writes the new master never gets, and its position, read before
    /// it is re-pointed, may be passed again before the `SLAVEOF` lands.
    #[serde(default)]
    pub from_kept_writing: bool,
}

/// What a member says of its history, as the step that re-points it reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberHistory {
    /// It is the handover's `from` (the replaced master).
    pub replaced_master: bool,
    /// It replicates the handover's `from`.
    pub follows_replaced: bool,
    /// Its `ReplicationID`.
    pub replication_id: Option<String>,
    /// Its binlog position.
    pub position: Option<BinlogPosition>,
    /// How its data stands with whatever it follows.
    pub sync: Option<SyncState>,
    /// A full copy of its master began and did not finish (pika's `is_eligible_for_master_election:false`: it marks
    /// the copy unfinished until it completes, across `SLAVEOF NO ONE`). It took its master's `ReplicationID` at the
    /// copy's start, so the ID matches; its binlog, though, says nothing of the data (seen at `0 0`), and a master whose
    /// binlog does not reach back there refuses its `TrySync` every 10 s for good.
    pub copy_unfinished: bool,
}

/// How to point a member at the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resync {
    /// Its history is a prefix of the master's: a plain `SLAVEOF` continues from its position.
    Incremental,
    /// Not known to be a prefix: copy the master in full (`SLAVEOF … force`), for this reason.
    Full(&'static str),
}

/// Decides [`Resync`] for a member of the group whose master is `master`, from the group's last `handover`.
#[must_use]
pub fn resync_for(master: &str, handover: Option<&Handover>, member: &MemberHistory) -> Resync {
    let Some(h) = handover.filter(|h| h.to.eq_ignore_ascii_case(master)) else {
        return Resync::Full("no record of how the master was promoted");
    };
    if member.sync == Some(SyncState::Error) {
        return Resync::Full("its last master refused its binlog position");
    }
    if member.copy_unfinished || member.sync == Some(SyncState::FullSync) {
        return Resync::Full("its full copy of its last master did not finish");
    }
    if member.replication_id.is_none() || member.replication_id != h.replication_id {
        return Resync::Full("its replication ID is not the master's");
    }
    match member.position {
        None => return Resync::Full("its binlog position is unknown"),
        Some(p) if p > h.position => return Resync::Full("it is past the master's position at the promotion"),
        Some(_) => {}
    }
    if member.replaced_master {
        if h.unplanned {
            return Resync::Full("it was replaced without waiting for it and may hold writes nobody else got");
        }
        return Resync::Incremental;
    }
    if member.follows_replaced && h.from_kept_writing {
        Resync::Full("it followed a master that kept taking writes after the promotion")
    } else if member.follows_replaced {
        Resync::Incremental
    } else {
        Resync::Full("it did not follow the replaced master")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MASTER: &str = "pk-1.h:9221";

    fn handover(unplanned: bool) -> Handover {
        Handover {
            to: MASTER.into(),
            from: "pk-0.h:9221".into(),
            unplanned,
            replication_id: Some("id".into()),
            position: BinlogPosition::new(2, 500),
            from_kept_writing: false,
        }
    }

    fn follower(position: BinlogPosition) -> MemberHistory {
        MemberHistory {
            replaced_master: false,
            follows_replaced: true,
            replication_id: Some("id".into()),
            position: Some(position),
            sync: Some(SyncState::Connecting),
            copy_unfinished: false,
        }
    }

    #[test]
    fn a_follower_of_the_replaced_master_not_past_the_promotion_keeps_its_data() {
        let h = handover(true);
        assert_eq!(resync_for(MASTER, Some(&h), &follower(BinlogPosition::new(2, 500))), Resync::Incremental);
        assert_eq!(resync_for(MASTER, Some(&h), &follower(BinlogPosition::new(1, 900))), Resync::Incremental);
        assert!(matches!(resync_for(MASTER, Some(&h), &follower(BinlogPosition::new(2, 501))), Resync::Full(_)));
        // A later file with a smaller offset is further, not behind.
        assert!(matches!(resync_for(MASTER, Some(&h), &follower(BinlogPosition::new(3, 1))), Resync::Full(_)));
    }

    #[test]
    fn the_replaced_master_keeps_its_data_only_after_a_planned_transfer_that_caught_up() {
        let old = MemberHistory {
            replaced_master: true,
            follows_replaced: false,
            sync: None,
            ..follower(BinlogPosition::new(2, 500))
        };
        assert_eq!(resync_for(MASTER, Some(&handover(false)), &old), Resync::Incremental);
        assert!(matches!(resync_for(MASTER, Some(&handover(true)), &old), Resync::Full(_)));
        let ahead = MemberHistory { position: Some(BinlogPosition::new(2, 600)), ..old };
        assert!(matches!(resync_for(MASTER, Some(&handover(false)), &ahead), Resync::Full(_)));
    }

    #[test]
    fn a_follower_of_a_split_donor_copies_the_new_master_in_full_wherever_it_stood() {
        // The donor's master goes on taking writes for its own slots: a position read before the re-point may be
        // passed, with records the new master never gets, before the `SLAVEOF` lands.
        let h = Handover { from_kept_writing: true, ..handover(false) };
        for at in [BinlogPosition::new(1, 900), BinlogPosition::new(2, 500)] {
            assert!(matches!(resync_for(MASTER, Some(&h), &follower(at)), Resync::Full(_)), "at {at}");
        }
    }

    #[test]
    fn a_follower_whose_full_copy_did_not_finish_is_copied_again_in_full() {
        // It carries the master's ID from the copy's start and a position (here nothing) not past the promotion.
        let copying = MemberHistory { sync: Some(SyncState::FullSync), ..follower(BinlogPosition::new(0, 0)) };
        assert!(matches!(resync_for(MASTER, Some(&handover(false)), &copying), Resync::Full(_)));
        let cut_off = MemberHistory { copy_unfinished: true, ..follower(BinlogPosition::new(0, 0)) };
        assert!(matches!(resync_for(MASTER, Some(&handover(false)), &cut_off), Resync::Full(_)));
        let done = MemberHistory { copy_unfinished: false, ..follower(BinlogPosition::new(0, 0)) };
        assert_eq!(resync_for(MASTER, Some(&handover(false)), &done), Resync::Incremental);
    }

    #[test]
    fn without_a_record_for_this_master_every_member_copies_it_in_full() {
        let member = follower(BinlogPosition::new(0, 1));
        assert!(matches!(resync_for(MASTER, None, &member), Resync::Full(_)));
        let other = Handover { to: "pk-2.h:9221".into(), ..handover(false) };
        assert!(matches!(resync_for(MASTER, Some(&other), &member), Resync::Full(_)));
    }

    fn position() -> impl Strategy<Value = BinlogPosition> {
        (0u64..4, 0u64..1000).prop_map(|(f, o)| BinlogPosition::new(f, o))
    }

    fn history() -> impl Strategy<Value = MemberHistory> {
        (
            any::<bool>(),
            any::<bool>(),
            prop_oneof![Just(None), Just(Some("id".to_owned())), Just(Some("other".to_owned()))],
            prop::option::of(position()),
            prop_oneof![
                Just(None),
                Just(Some(SyncState::Connected)),
                Just(Some(SyncState::Connecting)),
                Just(Some(SyncState::FullSync)),
                Just(Some(SyncState::Error)),
            ],
            any::<bool>(),
        )
            .prop_map(
                |(replaced_master, follows_replaced, replication_id, position, sync, copy_unfinished)| MemberHistory {
                    replaced_master,
                    follows_replaced,
                    replication_id,
                    position,
                    sync,
                    copy_unfinished,
                },
            )
    }

    proptest! {
        /// Incremental only when every fact that makes the member a prefix of the master holds.
        #[test]
        fn incremental_only_for_a_known_prefix(
            unplanned in any::<bool>(),
            at in position(),
            member in history(),
            recorded in any::<bool>(),
            kept_writing in any::<bool>(),
        ) {
            let h = Handover { position: at, from_kept_writing: kept_writing, ..handover(unplanned) };
            let decided = resync_for(MASTER, recorded.then_some(&h), &member);
            let prefix = recorded
                && member.sync != Some(SyncState::Error)
                && member.sync != Some(SyncState::FullSync)
                && !member.copy_unfinished
                && member.replication_id.as_deref() == Some("id")
                && member.position.is_some_and(|p| p <= at)
                && if member.replaced_master { !unplanned } else { member.follows_replaced && !kept_writing };
            prop_assert_eq!(decided == Resync::Incremental, prefix, "{:?}", decided);
        }
    }
}
