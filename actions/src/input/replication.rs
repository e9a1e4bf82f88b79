//! What a pika server says about its replication, as values every layer shares: where its binlog stands
//! ([`BinlogPosition`]) and how its DB stands with its master ([`SyncState`]). The pika client builds them once from
//! `INFO replication`; planning compares them and never reads pika's text again.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One command as pika's binlog holds it: its arguments, the name first.
pub type BinlogCommand = Vec<Vec<u8>>;

/// A binlog position, `db0:binlog_offset=<file> <offset>`. A replica writes its master's records at the same
/// positions, so positions of one history compare directly, as pairs: pika's single `slave_repl_offset` folds them
/// into `file × binlog-file-size + offset`, which goes backwards whenever a file that outgrew that size rolls.
/// redis-server (the stand-in) has one offset, kept as file 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct BinlogPosition {
    /// The binlog file number.
    pub file: u64,
    /// The byte offset inside that file.
    pub offset: u64,
}

impl BinlogPosition {
    /// The position `offset` bytes into binlog file `file`.
    #[must_use]
    pub fn new(file: u64, offset: u64) -> Self {
        Self { file, offset }
    }
}

impl BinlogPosition {
    /// Bytes from `earlier` to here, counting each whole file in between as pika's default `binlog-file-size`
    /// (100 MiB): a file rolls only once it has grown past that size, so this never counts more than there is.
    /// Zero when `earlier` is not before this position.
    #[must_use]
    pub fn bytes_after(self, earlier: Self) -> u64 {
        const FILE_SIZE: u64 = 104_857_600;
        if self <= earlier {
            0
        } else if self.file == earlier.file {
            self.offset - earlier.offset
        } else {
            // The rest of the earlier file (at least), the files in between, and this file so far.
            let rest = FILE_SIZE.saturating_sub(earlier.offset);
            let between = (self.file - earlier.file - 1).saturating_mul(FILE_SIZE);
            rest.saturating_add(between).saturating_add(self.offset)
        }
    }
}

impl fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.offset)
    }
}

/// How a replica's data stands with its master, the worst over its DBs (pika's `repl_connect_status` and
/// `db_repl_state`; redis' `master_link_status` and `master_sync_in_progress`). Ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SyncState {
    /// `connected`: it takes its master's binlog incrementally.
    Connected,
    /// Not connected yet, or reconnecting (`no_connect`, `connecting`, `try_to_incr_sync`, a master that went away).
    Connecting,
    /// Copying its master's whole data (`syncing_full`, `try_to_full_sync`, `WaitDBSync`): it holds no consistent
    /// copy until that ends.
    FullSync,
    /// pika's `error`: its master refused its binlog position (ahead of the master's, or off a record boundary),
    /// so its history differs from the master's. pika never retries from here and still reports itself eligible
    /// for election; only a forced full resync gets it out.
    Error,
}

impl SyncState {
    /// Reads one state word of pika (either spelling) or redis; `None` for a word it does not know.
    #[must_use]
    pub fn parse(word: &str) -> Option<Self> {
        match word.trim().to_ascii_lowercase().as_str() {
            "connected" => Some(Self::Connected),
            "no_connect" | "noconnect" | "connecting" | "try_to_incr_sync" | "kwaitreply" | "ktryconnect"
            | "kdbnoconnect" | "other" => Some(Self::Connecting),
            "syncing_full" | "try_to_full_sync" | "waitdbsync" | "ktrydbsync" => Some(Self::FullSync),
            "error" | "internalerror" => Some(Self::Error),
            _ => None,
        }
    }

    /// pika's word for it (`repl_connect_status`), which [`SyncState::parse`] reads back.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Connecting => "connecting",
            Self::FullSync => "syncing_full",
            Self::Error => "error",
        }
    }

    /// What a log line or a refusal says about it.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Connected => "in sync",
            Self::Connecting => "connecting to its master",
            Self::FullSync => "in a full sync",
            Self::Error => "in pika's replication error state (its history differs from its master's)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_compare_as_pairs_so_a_rolled_file_is_ahead_of_a_long_one() {
        // 1 × 100 MiB + 5 folds below 0 × 100 MiB + 150 MiB: the fold would rank them the wrong way round.
        assert!(BinlogPosition::new(1, 5) > BinlogPosition::new(0, 150 << 20));
        assert!(BinlogPosition::new(2, 10) > BinlogPosition::new(2, 9));
        assert_eq!(BinlogPosition::new(3, 7).to_string(), "3:7");
    }

    #[test]
    fn the_distance_between_positions_never_counts_more_than_there_is() {
        assert_eq!(BinlogPosition::new(2, 90).bytes_after(BinlogPosition::new(2, 40)), 50);
        assert_eq!(BinlogPosition::new(2, 40).bytes_after(BinlogPosition::new(2, 90)), 0, "not before");
        // Across a roll: the earlier file held at least 100 MiB.
        assert_eq!(BinlogPosition::new(3, 10).bytes_after(BinlogPosition::new(2, 104_857_500)), 110);
        assert_eq!(BinlogPosition::new(4, 0).bytes_after(BinlogPosition::new(2, 104_857_600)), 104_857_600);
    }

    #[test]
    fn every_pika_state_word_reads_and_ranks_from_best_to_worst() {
        assert_eq!(SyncState::parse("connected"), Some(SyncState::Connected));
        assert_eq!(SyncState::parse("try_to_incr_sync"), Some(SyncState::Connecting));
        assert_eq!(SyncState::parse("no_connect"), Some(SyncState::Connecting));
        assert_eq!(SyncState::parse("syncing_full"), Some(SyncState::FullSync));
        assert_eq!(SyncState::parse("WaitDBSync"), Some(SyncState::FullSync));
        assert_eq!(SyncState::parse("error"), Some(SyncState::Error));
        assert_eq!(SyncState::parse("Error"), Some(SyncState::Error));
        assert_eq!(SyncState::parse("keys=3"), None);
        assert!(SyncState::Connected < SyncState::Connecting);
        assert!(SyncState::Connecting < SyncState::FullSync);
        assert!(SyncState::FullSync < SyncState::Error);
        for state in [SyncState::Connected, SyncState::Connecting, SyncState::FullSync, SyncState::Error] {
            assert_eq!(SyncState::parse(state.word()), Some(state), "its word reads back");
        }
    }
}
