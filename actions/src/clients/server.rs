//! The one reader of the addresses pods have in Codis: `<pod>.<shard>-headless.<namespace>.svc.<domain>:<port>`.
//!
//! Codis lists servers as plain strings, and the product registers pods by FQDN, so every fact it reads back from
//! Codis (which pod, which shard, which ordinal, which namespace) comes from this layout. A [`Pod`](crate::input::event::Pod)
//! reads its own FQDN through it too.
//!
//! An *alias* is a pod's address spelled with the DNS root's trailing dot (`<fqdn>.:<port>`): DNS resolves it to the
//! same pod, Codis takes it for another server. A shard splitting off a donor lists the donor's master under its
//! alias as its own master for a while (see [`crate::steps::split`]); an alias names no pod, shard or ordinal of the
//! group that lists it, and the product never commands the pika behind it through that group.

/// A registered server's address, split into the labels the product reads; borrowed from the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerAddr<'a> {
    host: &'a str,
}

impl<'a> ServerAddr<'a> {
    /// Reads `addr` (`host:port`, or a bare host such as a pod FQDN).
    #[must_use]
    pub fn of(addr: &'a str) -> Self {
        Self { host: addr.rsplit_once(':').map_or(addr, |(h, _)| h) }
    }

    fn label(&self, n: usize) -> Option<&'a str> {
        self.host.split('.').nth(n).filter(|l| !l.is_empty())
    }

    /// The alias of `server` (`host:port`): the host with the DNS root's trailing dot.
    #[must_use]
    pub fn alias_of(server: &str) -> String {
        match server.rsplit_once(':') {
            Some((host, port)) => format!("{}.:{port}", host.trim_end_matches('.')),
            None => format!("{}.", server.trim_end_matches('.')),
        }
    }

    /// Whether the address is an alias.
    #[must_use]
    pub fn is_alias(&self) -> bool {
        self.host.ends_with('.')
    }

    /// The server an alias stands for (`<fqdn>:<port>`); any other address as it is.
    #[must_use]
    pub fn unaliased(addr: &str) -> std::borrow::Cow<'_, str> {
        match addr.rsplit_once(':') {
            Some((host, port)) if host.ends_with('.') => format!("{}:{port}", host.trim_end_matches('.')).into(),
            None if addr.ends_with('.') => addr.trim_end_matches('.').into(),
            _ => addr.into(),
        }
    }

    /// The pod name: the first label (the whole host when it has no dot).
    #[must_use]
    pub fn pod(&self) -> &'a str {
        self.host.split('.').next().unwrap_or(self.host)
    }

    /// The service: the second label.
    #[must_use]
    pub fn service(&self) -> Option<&'a str> {
        self.label(1)
    }

    /// The shard (full component name): the service without `-headless`; none for an alias, which another shard's
    /// pod stands behind.
    #[must_use]
    pub fn shard(&self) -> Option<&'a str> {
        if self.is_alias() {
            return None;
        }
        self.service()?.strip_suffix("-headless")
    }

    /// The namespace: the third label.
    #[must_use]
    pub fn namespace(&self) -> Option<&'a str> {
        self.label(2)
    }

    /// The pod's ordinal: the number after the pod name's last `-`.
    #[must_use]
    pub fn ordinal(&self) -> Option<u32> {
        self.pod().rsplit_once('-').and_then(|(_, n)| n.parse().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_pod_reads_as_pod_shard_namespace_and_ordinal() {
        let s = ServerAddr::of("c1-pika-x7k-12.c1-pika-x7k-headless.prod.svc.cluster.local:9221");
        assert_eq!(s.pod(), "c1-pika-x7k-12");
        assert_eq!(s.service(), Some("c1-pika-x7k-headless"));
        assert_eq!(s.shard(), Some("c1-pika-x7k"));
        assert_eq!(s.namespace(), Some("prod"));
        assert_eq!(s.ordinal(), Some(12));
        assert_eq!(ServerAddr::of("c1-pika-x7k-3.c1-pika-x7k-headless.prod.svc").ordinal(), Some(3));
    }

    #[test]
    fn an_alias_names_the_same_pod_but_no_shard() {
        let server = "c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc.cluster.local:9221";
        let alias = ServerAddr::alias_of(server);
        assert_eq!(alias, "c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc.cluster.local.:9221");
        assert_eq!(ServerAddr::alias_of(&alias), alias);
        assert!(ServerAddr::of(&alias).is_alias());
        assert!(!ServerAddr::of(server).is_alias());
        assert_eq!(ServerAddr::of(&alias).shard(), None);
        assert_eq!(ServerAddr::of(server).shard(), Some("c1-pika-x7k"));
        assert_eq!(ServerAddr::unaliased(&alias), server);
        assert_eq!(ServerAddr::unaliased(server), server);
        assert_eq!(ServerAddr::unaliased("127.0.0.1:6379"), "127.0.0.1:6379");
    }

    #[test]
    fn other_addresses_have_no_shard() {
        let ip = ServerAddr::of("127.0.0.1:6379");
        assert_eq!(ip.shard(), None);
        assert_eq!(ip.ordinal(), None);
        assert_eq!(ServerAddr::of("a.b.c:1").shard(), None);
        assert_eq!(ServerAddr::of("redis:6379").pod(), "redis");
        assert_eq!(ServerAddr::of("redis:6379").namespace(), None);
    }
}
