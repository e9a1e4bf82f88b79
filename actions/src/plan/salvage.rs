//! What a failed-over master's binlog tail asks to write again. The tail (past the position its promoted replica had
//! reached) holds writes the master acknowledged and its replica never got: keys a drain migrated onto it (Codis
//! deleted them at the source once this master took them), and the writes of its last moments. Each key's commands
//! are kept in order, so a key is rebuilt as the old master last held it; the key is written only where it is absent
//! now (never over what the new master took since), which [`crate::steps::salvage`] checks key by key.

use std::collections::BTreeMap;

use crate::input::replication::BinlogCommand as Command;

/// Commands that move data between keys: their keys' histories cannot be rebuilt one key at a time.
const ACROSS_KEYS: &[&str] = &[
    "rename",
    "renamenx",
    "rpoplpush",
    "lmove",
    "smove",
    "sdiffstore",
    "sinterstore",
    "sunionstore",
    "zunionstore",
    "zinterstore",
    "bitop",
    "pfmerge",
];

/// One key's commands from the tail, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyHistory {
    /// The key.
    pub key: Vec<u8>,
    /// Its commands, in the tail's order.
    pub commands: Vec<Command>,
}

/// The plan: each key the tail wrote, in the order first written, and the keys left out.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Salvage {
    /// Each key written, in the order first written.
    pub keys: Vec<KeyHistory>,
    /// Keys a command across keys touched (their history is incomplete one key at a time), by command name.
    pub left_out: Vec<(String, Vec<u8>)>,
}

/// Each key's commands, and the keys in the order first written.
#[derive(Default)]
struct Histories {
    order: Vec<Vec<u8>>,
    by_key: BTreeMap<Vec<u8>, Vec<Command>>,
}

impl Histories {
    fn record(&mut self, key: &[u8], command: Command) {
        if !self.by_key.contains_key(key) {
            self.order.push(key.to_vec());
        }
        self.by_key.entry(key.to_vec()).or_default().push(command);
    }
}

/// The plan for `tail`, a master's commands past its promoted replica's position.
#[must_use]
pub fn plan(tail: &[Command]) -> Salvage {
    let mut histories = Histories::default();
    let mut tainted: BTreeMap<Vec<u8>, String> = BTreeMap::new();
    for command in tail {
        let Some(name) = command.first() else { continue };
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let args = &command[1..];
        match name.as_str() {
            // A flush drops everything the tail wrote before it.
            "flushdb" | "flushall" => {
                histories = Histories::default();
            }
            // pika's filler records carry no key.
            "padding" => {}
            _ if args.is_empty() => {}
            "del" | "unlink" => {
                for key in args {
                    histories.record(key, vec![b"DEL".to_vec(), key.clone()]);
                }
            }
            "mset" | "msetnx" => {
                for pair in args.chunks_exact(2) {
                    histories.record(&pair[0], vec![b"SET".to_vec(), pair[0].clone(), pair[1].clone()]);
                }
            }
            // pika's own record of a write with an absolute expiry (`SET … EX`, `SETEX`, `INCR` of a key that
            // expires): `pksetexat key unix-seconds value`, which a proxy does not take.
            "pksetexat" if args.len() == 3 => {
                let (key, at, value) = (&args[0], &args[1], &args[2]);
                histories.record(key, vec![b"SET".to_vec(), key.clone(), value.clone()]);
                let expires = std::str::from_utf8(at).ok().and_then(|a| a.parse::<i64>().ok()).is_some_and(|a| a > 0);
                if expires {
                    histories.record(key, vec![b"EXPIREAT".to_vec(), key.clone(), at.clone()]);
                }
            }
            // Every argument counts as a key: leaving out a key that shares a member's name only costs its salvage.
            _ if ACROSS_KEYS.contains(&name.as_str()) => {
                for key in args {
                    tainted.entry(key.clone()).or_insert_with(|| name.clone());
                }
            }
            _ => histories.record(&args[0], command.clone()),
        }
    }
    let mut out = Salvage::default();
    for key in histories.order {
        if let Some(name) = tainted.get(&key) {
            out.left_out.push((name.clone(), key));
        } else if let Some(commands) = histories.by_key.remove(&key) {
            out.keys.push(KeyHistory { key, commands });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn cmd(args: &[&str]) -> Command {
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    fn keys(s: &Salvage) -> Vec<String> {
        s.keys.iter().map(|k| String::from_utf8_lossy(&k.key).into_owned()).collect()
    }

    #[test]
    fn each_key_keeps_its_commands_in_order_and_keys_come_in_the_order_first_written() {
        let s = plan(&[
            cmd(&["SET", "b", "1"]),
            cmd(&["RPUSH", "a", "x", "y"]),
            cmd(&["EXPIREAT", "a", "1900000000"]),
            cmd(&["DEL", "b", "a"]),
            cmd(&["SET", "b", "2"]),
        ]);
        assert_eq!(keys(&s), vec!["b", "a"]);
        assert_eq!(s.keys[0].commands, vec![cmd(&["SET", "b", "1"]), cmd(&["DEL", "b"]), cmd(&["SET", "b", "2"])]);
        assert_eq!(
            s.keys[1].commands,
            vec![cmd(&["RPUSH", "a", "x", "y"]), cmd(&["EXPIREAT", "a", "1900000000"]), cmd(&["DEL", "a"])]
        );
    }

    #[test]
    fn pikas_own_expiring_set_becomes_a_set_and_an_expireat_and_mset_one_set_per_key() {
        let s = plan(&[cmd(&["pksetexat", "k", "1900000000", "v"]), cmd(&["pksetexat", "n", "0", "5"])]);
        assert_eq!(s.keys[0].commands, vec![cmd(&["SET", "k", "v"]), cmd(&["EXPIREAT", "k", "1900000000"])]);
        assert_eq!(s.keys[1].commands, vec![cmd(&["SET", "n", "5"])]);
        let s = plan(&[cmd(&["MSET", "a", "1", "b", "2"])]);
        assert_eq!(keys(&s), vec!["a", "b"]);
        assert_eq!(s.keys[1].commands, vec![cmd(&["SET", "b", "2"])]);
    }

    #[test]
    fn keys_a_command_across_keys_touched_are_left_out_and_a_flush_drops_what_came_before() {
        let s = plan(&[cmd(&["SET", "a", "1"]), cmd(&["RENAME", "a", "b"]), cmd(&["SET", "c", "1"])]);
        assert_eq!(keys(&s), vec!["c"]);
        assert_eq!(s.left_out, vec![("rename".to_owned(), b"a".to_vec())]);
        let s = plan(&[cmd(&["SET", "a", "1"]), cmd(&["FLUSHDB"]), cmd(&["SET", "c", "1"]), cmd(&["padding", "***"])]);
        assert_eq!(keys(&s), vec!["c"]);
    }

    proptest! {
        /// Every single-key write of the tail lands in its key's history, in the tail's order, and nowhere else.
        #[test]
        fn every_single_key_write_is_kept_once_in_its_keys_history(
            writes in proptest::collection::vec((0u8..6, 0u8..100), 0..60),
        ) {
            let tail: Vec<Command> =
                writes.iter().map(|(k, v)| cmd(&["SET", &format!("k{k}"), &v.to_string()])).collect();
            let s = plan(&tail);
            let total: usize = s.keys.iter().map(|k| k.commands.len()).sum();
            prop_assert_eq!(total, tail.len());
            for history in &s.keys {
                let expected: Vec<Command> = tail.iter().filter(|c| c[1] == history.key).cloned().collect();
                prop_assert_eq!(&history.commands, &expected);
            }
        }
    }
}
