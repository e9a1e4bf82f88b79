//! Which slot a key lives in, as codis-proxy routes it and pika buckets it: CRC-32 (IEEE) of the key's hash tag
//! (the bytes between its first `{` and the first `}` after that) or of the whole key when it has none, modulo the
//! slot count.
//!
//! Pika with `slotmigrate` keeps, per slot, a set of the slot's keys (and of its hash tags) under keys of its own,
//! `_internal:slotkey:4migrate:<slot>` and `_internal:slottag:4migrate:<slot>` (some versions write
//! `_internal:4migrate:slotkey:<slot>`); such a key belongs to the slot it names, whatever its hash, so that deleting
//! the keys of slots a group no longer owns takes their bookkeeping with them and never another slot's.

/// The slot of `key` among `slots` slots (`slots` ≥ 1).
#[must_use]
pub fn slot_of(key: &[u8], slots: usize) -> usize {
    bookkeeping_slot(key).unwrap_or_else(|| crc32_ieee(tag(key)) as usize) % slots.max(1)
}

/// The slot a pika per-slot bookkeeping key names.
fn bookkeeping_slot(key: &[u8]) -> Option<usize> {
    let name = std::str::from_utf8(key).ok()?.strip_prefix("_internal:")?;
    let (kind, slot) = name.rsplit_once(':')?;
    let known = ["slotkey:4migrate", "slottag:4migrate", "4migrate:slotkey", "4migrate:slottag"];
    (known.contains(&kind) && !slot.is_empty() && slot.bytes().all(|b| b.is_ascii_digit()))
        .then(|| slot.parse().ok())?
}

fn tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else { return key };
    let rest = &key[open + 1..];
    rest.iter().position(|&b| b == b'}').map_or(key, |close| &rest[..close])
}

/// Bitwise CRC-32, reflected polynomial 0xEDB88320 (Go's `crc32.ChecksumIEEE`): a cleanup hashes each key once, so
/// a table buys nothing worth its size.
fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = u32::MAX;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_checksum_is_crc32_ieee() {
        // The standard check value of CRC-32/ISO-HDLC, and the empty input.
        assert_eq!(crc32_ieee(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_ieee(b""), 0);
    }

    #[test]
    fn a_hash_tag_decides_the_slot() {
        assert_eq!(slot_of(b"{user1000}.following", 1024), slot_of(b"user1000", 1024));
        assert_eq!(slot_of(b"{}x", 1024), 0, "an empty tag hashes nothing");
        assert_eq!(slot_of(b"a{b", 1024), slot_of(b"a{b", 1024));
        assert_eq!(tag(b"a{b"), b"a{b");
        assert_eq!(tag(b"x}{y}z"), b"y");
    }

    #[test]
    fn pikas_bookkeeping_of_a_slot_belongs_to_that_slot() {
        for kind in ["slotkey:4migrate", "slottag:4migrate", "4migrate:slotkey", "4migrate:slottag"] {
            assert_eq!(slot_of(format!("_internal:{kind}:517").as_bytes(), 1024), 517, "{kind}");
        }
        // Anything else hashes as usual.
        for key in ["_internal:slotkey:4migrate:x", "_internal:other:517", "user:_internal:slotkey:4migrate:5"] {
            assert_eq!(slot_of(key.as_bytes(), 1024), crc32_ieee(key.as_bytes()) as usize % 1024, "{key}");
        }
    }

    proptest! {
        /// Agrees with the test bed's own implementation (a table-driven one), key by key (random bytes never spell
        /// a bookkeeping key).
        #[test]
        fn agrees_with_the_test_beds_slot_hash(key in prop::collection::vec(any::<u8>(), 0..40), slots in 1usize..2048) {
            prop_assert_eq!(slot_of(&key, slots), testbed::codis::slothash::slot_of(&key, slots));
        }
    }
}
