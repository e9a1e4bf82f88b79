//! Codis's key → slot mapping: CRC-32 (IEEE) of the key, or of its hash tag (the bytes between the first `{` and the
//! first `}` after it, when both exist), modulo the slot count. codis-proxy routes with it and codis-server buckets
//! its keys with it, so the double's data path uses the same function on both sides.

/// The CRC-32 (IEEE 802.3, reflected polynomial `0xEDB88320`) lookup table, built at compile time.
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 1 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32 IEEE of `data` (what Go's `crc32.ChecksumIEEE` returns).
#[must_use]
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// The part of `key` that is hashed: its `{tag}` when it has one, else the whole key.
#[must_use]
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(beg) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[beg + 1..].iter().position(|&b| b == b'}') {
            return &key[beg + 1..beg + 1 + len];
        }
    }
    key
}

/// The slot of `key` among `max_slot_num` slots (Codis: 1024).
#[must_use]
pub fn slot_of(key: &[u8], max_slot_num: usize) -> usize {
    let n = u32::try_from(max_slot_num.max(1)).unwrap_or(u32::MAX);
    // u32 → usize never truncates on the 32/64-bit targets this crate builds for.
    (crc32(hash_tag(key)) % n) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_ieee_check_value() {
        // The standard check value of CRC-32/IEEE ("123456789" → 0xCBF43926), as Go's ChecksumIEEE returns it.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn hash_tags_follow_codis() {
        assert_eq!(hash_tag(b"user:{42}:name"), b"42");
        assert_eq!(hash_tag(b"{}x"), b"");
        assert_eq!(hash_tag(b"no-tag"), b"no-tag");
        assert_eq!(hash_tag(b"open{only"), b"open{only");
        assert_eq!(hash_tag(b"a}b{c}"), b"c");
        assert_eq!(slot_of(b"user:{42}:name", 1024), slot_of(b"42", 1024));
        assert_eq!(slot_of(b"123456789", 1024), 0xCBF4_3926 % 1024);
    }
}
