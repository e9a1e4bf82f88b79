//! Which shard components a sharding should have (`GenShardingCompSpecList`, `pkg/controllerutil/sharding_utils.go`),
//! and the emulation's source of randomness.
//!
//! Emulated: shards are named `<sharding>-<3 random characters>` from `k8s.io/apimachinery`'s alphabet
//! (`bcdfghjklmnpqrstvwxz2456789`), unique among the existing ones; the undeleted shards are kept while there are
//! at most `shards` of them, new names are added to reach `shards`, and with too many the list is sorted and cut, so
//! a scale-in removes the lexicographically last names (in effect random ones). Shards being deleted take no part.
//!
//! Does NOT model: `shardTemplates` and `offline` shards (1.1+), host-network annotations, scheduling policies.

/// The characters of KubeBlocks' random suffixes (`utilrand.String`).
pub const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A small deterministic generator (SplitMix64): the emulation's choices (shard ids, `pods[0]`, `Any`) are random
/// as in KubeBlocks, but a seed replays them.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// From a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64() % n.max(1) as u64).unwrap_or(0)
    }

    /// Shuffles in place (what an unordered listing looks like).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }

    /// `n` random characters of [`ALPHANUMS`].
    pub fn suffix(&mut self, n: usize) -> String {
        (0..n).map(|_| ALPHANUMS[self.below(ALPHANUMS.len())] as char).collect()
    }
}

/// The short names of the shards a sharding of `shards` should have, given the undeleted ones that exist. New
/// names take their suffix from `chosen` first (a test choosing among the suffixes KubeBlocks could draw), then
/// from `rng`.
pub fn desired_shards(
    sharding: &str,
    undeleted: &[String],
    shards: u32,
    rng: &mut Rng,
    chosen: &mut Vec<String>,
) -> Vec<String> {
    let shards = shards as usize;
    let mut names: Vec<String> = undeleted.to_vec();
    match names.len() {
        n if n == shards => names,
        n if n < shards => {
            while names.len() < shards {
                let suffix = if chosen.is_empty() { rng.suffix(3) } else { chosen.remove(0) };
                let name = format!("{sharding}-{suffix}");
                if !names.contains(&name) {
                    names.push(name);
                }
            }
            names
        }
        _ => {
            names.sort();
            names.truncate(shards);
            names
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_shards_get_random_unique_names_and_a_scale_in_keeps_the_first_sorted_ones() {
        let mut rng = Rng::new(7);
        let three = desired_shards("pika", &[], 3, &mut rng, &mut Vec::new());
        assert_eq!(three.len(), 3);
        for name in &three {
            let id = name.strip_prefix("pika-").unwrap();
            assert_eq!(id.len(), 3);
            assert!(id.bytes().all(|b| ALPHANUMS.contains(&b)), "{name}");
        }
        let existing = vec!["pika-x2z".to_owned(), "pika-b7k".to_owned(), "pika-m4q".to_owned()];
        assert_eq!(desired_shards("pika", &existing, 3, &mut rng, &mut Vec::new()), existing, "kept as they are");
        assert_eq!(desired_shards("pika", &existing, 1, &mut rng, &mut Vec::new()), vec!["pika-b7k".to_owned()]);
        assert_eq!(
            desired_shards("pika", &existing, 2, &mut rng, &mut Vec::new()),
            vec!["pika-b7k".to_owned(), "pika-m4q".to_owned()],
            "the last name in order goes"
        );
        let four = desired_shards("pika", &existing, 4, &mut rng, &mut vec!["zzz".to_owned()]);
        assert_eq!(four[3], "pika-zzz", "a chosen suffix");
        assert_eq!(&four[..3], &existing[..]);
        assert!(!existing.contains(&four[3]));
    }

    #[test]
    fn the_generator_replays_from_its_seed() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        let mut items = vec![1, 2, 3, 4, 5];
        Rng::new(1).shuffle(&mut items);
        items.sort_unstable();
        assert_eq!(items, vec![1, 2, 3, 4, 5]);
    }
}
