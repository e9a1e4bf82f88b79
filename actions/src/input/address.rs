//! Names and addresses as the edge accepts them: the validation rules (DNS labels, pod FQDNs, hosts) and the typed
//! values built with them once, when the event is parsed ([`HostPort`], [`Endpoints`]). Nothing past the edge
//! splits an address string again.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A host and port a client can dial: a DNS name, an IPv4 address, or an IPv6 address (kept without its brackets,
/// which are only how `host:port` writes it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPort {
    host: String,
    port: u16,
}

impl HostPort {
    /// Reads `host:port` ([`check_host_port`]'s rules), surrounding whitespace ignored.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (host, port) = split_host_port(raw.trim())?;
        Ok(Self::new(host.to_owned(), port))
    }

    /// The address of `port` on `host`, a host already checked ([`check_host`]); IPv6 without brackets.
    #[must_use]
    pub fn new(host: String, port: u16) -> Self {
        let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(inner) => inner.to_owned(),
            None => host,
        };
        Self { host, port }
    }

    /// The host, IPv6 addresses without brackets.
    #[must_use]
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl TryFrom<String> for HostPort {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, String> {
        Self::parse(&raw)
    }
}

impl From<HostPort> for String {
    fn from(addr: HostPort) -> Self {
        addr.to_string()
    }
}

/// The endpoints of a service reached through any of them (etcd), in the order given; possibly none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Endpoints(Vec<HostPort>);

impl Endpoints {
    /// Reads a comma-separated list of `host:port` (empty items ignored); empty input is no endpoint.
    pub fn parse(raw: &str) -> Result<Self, String> {
        raw.split(',').map(str::trim).filter(|e| !e.is_empty()).map(HostPort::parse).collect::<Result<_, _>>().map(Self)
    }

    /// Whether no endpoint was given.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The endpoints.
    pub fn iter(&self) -> impl Iterator<Item = &HostPort> {
        self.0.iter()
    }
}

impl fmt::Display for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, endpoint) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{endpoint}")?;
        }
        Ok(())
    }
}

impl FromIterator<HostPort> for Endpoints {
    fn from_iter<I: IntoIterator<Item = HostPort>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// A DNS-1123 label: lower-case alphanumerics and `-`, 1..=63, not starting or ending with `-`.
pub fn check_label(label: &str) -> std::result::Result<(), String> {
    let ok = !label.is_empty()
        && label.len() <= 63
        && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!("{label:?} is not a DNS label"))
    }
}

/// A pod FQDN: `<pod>.<service>.<namespace>.svc[.<domain>]`, every label DNS-1123, at most 253 characters.
pub fn check_fqdn(fqdn: &str) -> std::result::Result<(), String> {
    let fqdn = fqdn.trim_end_matches('.').to_ascii_lowercase();
    if fqdn.len() > 253 {
        return Err(format!("{fqdn:?} is longer than 253 characters"));
    }
    let labels: Vec<&str> = fqdn.split('.').collect();
    if labels.len() < 4 || labels[3] != "svc" {
        return Err(format!("{fqdn:?} is not a pod FQDN <pod>.<service>.<namespace>.svc[.<domain>]"));
    }
    for label in &labels {
        check_label(label).map_err(|e| format!("{fqdn:?}: {e}"))?;
    }
    Ok(())
}

/// `host:port` with a valid host ([`check_host`]) and a port in 1..=65535.
pub fn check_host_port(raw: &str) -> std::result::Result<(), String> {
    split_host_port(raw).map(drop)
}

/// [`check_host_port`]'s rule, keeping the parts: the host as written (brackets included) and the port.
fn split_host_port(raw: &str) -> std::result::Result<(&str, u16), String> {
    let (host, port) = raw.rsplit_once(':').ok_or_else(|| format!("{raw:?} is not host:port"))?;
    check_host(host).map_err(|why| format!("{raw:?} has no valid host: {why}"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok((host, p)),
        _ => Err(format!("{raw:?} has no valid port")),
    }
}

/// A host a client can dial: a DNS name (labels of letters, digits and `-`, at most 253 characters), an IPv4
/// address, or an IPv6 address in brackets. Anything else (`etcd:`, `user@host`, `a b`) would only fail later, when
/// dialled, after other work was done.
pub fn check_host(host: &str) -> std::result::Result<(), String> {
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or_else(|| format!("{host:?} opens a bracket it does not close"))?;
        return inner.parse::<std::net::Ipv6Addr>().map(drop).map_err(|_| format!("{inner:?} is not an IPv6 address"));
    }
    if host.is_empty() {
        return Err("the host is empty".into());
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return host.parse::<std::net::Ipv4Addr>().map(drop).map_err(|_| format!("{host:?} is not an IPv4 address"));
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.len() > 253 {
        return Err(format!("{host:?} is longer than 253 characters"));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!("{host:?} is not a host name: label {label:?}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fqdn_checks_accept_pod_fqdns_and_reject_others() {
        assert!(check_fqdn("c-pika-x7k-0.c-pika-x7k-headless.default.svc.cluster.local").is_ok());
        assert!(check_fqdn("c-pika-x7k-0.c-pika-x7k-headless.default.svc").is_ok());
        assert!(check_fqdn("127.0.0.1").is_err());
        assert!(check_fqdn("Pod_0.svc.ns.svc").is_err());
        assert!(check_fqdn("a..b.svc").is_err());
    }

    #[test]
    fn host_port_needs_a_numeric_port() {
        assert!(check_host_port("dash:18080").is_ok());
        assert!(check_host_port("dash:port").is_err());
        assert!(check_host_port("dash").is_err());
        assert!(check_host_port("dash:0").is_err());
    }

    #[test]
    fn hosts_are_names_or_addresses_and_nothing_else() {
        for ok in ["etcd", "c1-etcd-0.c1-etcd-headless.prod.svc.cluster.local", "10.0.0.7", "[::1]", "[fd00::7]", "a."]
        {
            assert!(check_host(ok).is_ok(), "{ok}");
        }
        for bad in
            ["", "etcd:", "user@etcd", "a b", "-a", "a-.b", "a..b", "300.1.1.1", "1.2.3", "[::1", "[etcd]", "a_b"]
        {
            assert!(check_host(bad).is_err(), "{bad}");
        }
        assert!(check_host_port("etcd::2379").is_err());
        assert!(check_host_port("[::1]:2379").is_ok());
    }

    #[test]
    fn a_host_port_reads_once_and_writes_back_as_given() {
        let v6 = HostPort::parse(" [::1]:2379 ").unwrap();
        assert_eq!((v6.host(), v6.port()), ("::1", 2379));
        assert_eq!(v6.to_string(), "[::1]:2379");
        let named = HostPort::parse("Dash:18080").unwrap();
        assert_eq!((named.host(), named.port()), ("Dash", 18080));
        assert_eq!(String::from(named), "Dash:18080");
        for bad in ["dash", "dash:0", "http://dash:18080", "etcd::2379", "a b:1"] {
            assert!(HostPort::parse(bad).is_err(), "{bad}");
        }
        let endpoints: Endpoints = serde_json::from_str(r#"["e0:2379","[fd00::7]:2379"]"#).unwrap();
        assert_eq!(endpoints.to_string(), "e0:2379,[fd00::7]:2379");
        assert!(serde_json::from_str::<Endpoints>(r#"["e0"]"#).is_err());
    }
}
