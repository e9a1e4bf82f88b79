//! Which slot a key lives in, as codis-proxy routes it and pika buckets it: CRC-32 (IEEE) of the key's hash tag
//! (the bytes between its first `{` and the first `}` after that) or of the whole key when it has none, modulo the
//! slot count.

/// The slot of `key` among `slots` slots (`slots` ≥ 1).
#[must_use]
pub fn slot_of(key: &[u8], slots: usize) -> usize {
    (crc32_ieee(tag(key)) as usize) % slots.max(1)
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

    proptest! {
        /// Agrees with the test bed's own implementation (a table-driven one), key by key.
        #[test]
        fn agrees_with_the_test_beds_slot_hash(key in prop::collection::vec(any::<u8>(), 0..40), slots in 1usize..2048) {
            prop_assert_eq!(slot_of(&key, slots), testbed::codis::slothash::slot_of(&key, slots));
        }
    }
}
