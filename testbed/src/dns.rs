//! What the bed's DNS would do with an address: a host written with the root's trailing dot (`<fqdn>.:<port>`) is
//! the same name as without it. The double and the proxy dial registered servers through their override maps, which
//! hold the relative spelling only.

use std::borrow::Cow;

/// `addr` (`host:port`) with a trailing dot of its host removed; any other address as it is.
#[must_use]
pub fn rooted_as_relative(addr: &str) -> Cow<'_, str> {
    match addr.rsplit_once(':') {
        Some((host, port)) if host.ends_with('.') => Cow::Owned(format!("{}:{port}", host.trim_end_matches('.'))),
        _ => Cow::Borrowed(addr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rooted_host_dials_like_the_relative_one() {
        assert_eq!(
            rooted_as_relative("p-0.s-headless.ns.svc.cluster.local.:9221"),
            "p-0.s-headless.ns.svc.cluster.local:9221"
        );
        assert_eq!(
            rooted_as_relative("p-0.s-headless.ns.svc.cluster.local:9221"),
            "p-0.s-headless.ns.svc.cluster.local:9221"
        );
        assert_eq!(rooted_as_relative("127.0.0.1:7000"), "127.0.0.1:7000");
    }
}
