//! One network per bed, one network namespace per pod, as Kubernetes gives a pod: pika listens on 0.0.0.0 (client
//! port, port+2000 for replication, port+10001 for rsync) and reports to its master the address of its default-route
//! interface, so pikas can neither share a host's ports nor be told apart on loopback.
//!
//! A bed leases a /24 (`10.213.<n>.0/24`): a bridge `pkb<n>` holds the node address `.1` in the root namespace; each
//! pod gets a namespace `pkb<n>-<slot>` with `eth0` (the far end of the veth `pkb<n>v<slot>` on the bridge) at
//! `.<10 + slot>` and a default route via `.1`. Names resolve through the bed's own hosts file, bind-mounted over
//! `/etc/hosts` in a private mount namespace of every process the bed starts (pika, the dashboard and proxy, and
//! pika-action): the host's `/etc/hosts` is never written.
//!
//! Everything a bed makes is found by name: the lease directory `/tmp/pkb-bed/<n>` (owner pid, pids started, hosts
//! file, data), namespaces `pkb<n>-*`, links `pkb<n>*`. A bed cleans up on drop, also when its test panicked; what a
//! killed run left (its owner no longer runs) is cleaned up by the next bed of any run before it leases.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, Once, PoisonError};

/// Where leases live.
const LEASES: &str = "/tmp/pkb-bed";
/// The first two octets of every bed's /24.
const PREFIX: [u8; 2] = [10, 213];

static SWEEP: Once = Once::new();

/// A bed's network: its /24, bridge, namespaces, hosts file and lease directory.
#[derive(Debug)]
pub struct Network {
    n: u8,
    dir: PathBuf,
    namespaces: Mutex<BTreeSet<String>>,
    hosts: Mutex<Vec<(String, Ipv4Addr)>>,
    dummies: std::sync::atomic::AtomicU32,
    next_port: std::sync::atomic::AtomicU16,
}

/// The first port [`Network::node_port`] hands out; below the kernel's ephemeral range (32768 and up by default).
const FIRST_NODE_PORT: u16 = 21_000;

/// A pod's namespace and address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNet {
    /// The namespace's name (`/var/run/netns/<ns>`).
    pub ns: String,
    /// The pod's address on the bed's bridge.
    pub addr: Ipv4Addr,
    /// Its slot in the bed's /24, from which `addr` was made ([`Network::pod_addr`]).
    pub slot: u8,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn ip_output(args: &[&str]) -> String {
    Command::new("ip").args(args).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The command line of `pid`, NUL separators as spaces.
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Removes what lease `n` made: processes started under its directory, its namespaces (and what still runs in them),
/// its links, its directory.
fn clean(n: u8) {
    let dir = Path::new(LEASES).join(n.to_string());
    let marker = dir.display().to_string();
    if let Ok(pids) = std::fs::read_to_string(dir.join("pids")) {
        for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            // Only a process whose command line names this lease's directory is ours (pids are reused).
            if alive(pid) && cmdline(pid).contains(&marker) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
    }
    clean_network(n);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Removes lease `n`'s namespaces (and what still runs in them) and links.
fn clean_network(n: u8) {
    let prefix = format!("pkb{n}-");
    for line in ip_output(&["netns", "list"]).lines() {
        let Some(ns) = line.split_whitespace().next() else { continue };
        if ns.starts_with(&prefix) {
            for pid in ip_output(&["netns", "pids", ns]).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
            let _ = ip(&["netns", "del", ns]);
        }
    }
    let bridge = format!("pkb{n}");
    for line in ip_output(&["-o", "link", "show"]).lines() {
        // "<index>: <name>[@<peer>]: <flags> ..."
        let Some(name) = line.split(": ").nth(1).map(|s| s.split('@').next().unwrap_or(s)) else { continue };
        if name == bridge || name.strip_prefix(&bridge).is_some_and(|rest| rest.starts_with('v')) {
            let _ = ip(&["link", "del", name]);
        }
    }
}

/// Every lease operation of every run (taking, cleaning, sweeping) holds this lock: a cleaner racing another
/// cleaner, or a lease taken while a cleaner still removes the last owner's links, would remove a live bed. The lock
/// is on the directory of the installed servers, which every bed needs and nothing removes, so that the last bed
/// can remove the lease directory whole (a lock file in it could not go: a run waiting on it would then lock a
/// removed file while the next run locks a new one).
fn leases_locked() -> Result<std::fs::File, String> {
    let path = Path::new(super::INSTALL_DIR);
    let dir = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    dir.lock().map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::create_dir_all(LEASES).map_err(|e| format!("{LEASES}: {e}"))?;
    Ok(dir)
}

/// Cleans every lease whose owner no longer runs: what killed runs left behind. Under [`leases_locked`].
fn sweep() {
    let Ok(entries) = std::fs::read_dir(LEASES) else { return };
    for entry in entries.flatten() {
        let Some(n) = entry.file_name().to_str().and_then(|s| s.parse::<u8>().ok()) else { continue };
        let owner = std::fs::read_to_string(entry.path().join("owner")).ok().and_then(|s| s.trim().parse::<u32>().ok());
        if owner.is_none_or(|pid| !alive(pid)) {
            clean(n);
        }
    }
}

impl Network {
    /// Leases a /24 no other bed (of this run or another that still runs) holds, and sets up its bridge.
    ///
    /// # Errors
    /// When no /24 is free or the bridge cannot be made (not root, no iproute2).
    pub fn lease() -> Result<Self, String> {
        let _locked = leases_locked()?;
        SWEEP.call_once(sweep);
        // Under the lock, a lease of this process is one whose owner (this process) runs: `claim` skips it.
        for n in 0..=255u8 {
            if !Self::claim(n) {
                continue;
            }
            // Links or namespaces a lost cleaner left under this number are nobody's now.
            clean_network(n);
            let dir = Path::new(LEASES).join(n.to_string());
            let network = Self {
                n,
                dir,
                namespaces: Mutex::new(BTreeSet::new()),
                hosts: Mutex::new(Vec::new()),
                dummies: std::sync::atomic::AtomicU32::new(0),
                next_port: std::sync::atomic::AtomicU16::new(FIRST_NODE_PORT),
            };
            network.write_hosts()?;
            std::fs::write(network.dir.join("resolv.conf"), "").map_err(|e| e.to_string())?;
            let bridge = network.bridge();
            ip(&["link", "add", &bridge, "type", "bridge"])?;
            ip(&["addr", "add", &format!("{}/24", network.node()), "dev", &bridge])?;
            ip(&["link", "set", &bridge, "up"])?;
            return Ok(network);
        }
        Err("every 10.213.<n>.0/24 is leased by a running bed".to_owned())
    }

    /// Takes lease `n` (under [`leases_locked`]): its directory is made whole (with its owner file) under a private
    /// name and renamed into place, so a lease directory never lacks its owner. A lease whose owner no longer runs is
    /// cleaned and taken.
    fn claim(n: u8) -> bool {
        let dir = Path::new(LEASES).join(n.to_string());
        let place = || {
            let fresh = Path::new(LEASES).join(format!(".new-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&fresh);
            let made = std::fs::create_dir(&fresh).is_ok()
                && std::fs::write(fresh.join("owner"), std::process::id().to_string()).is_ok();
            let placed = made && std::fs::rename(&fresh, &dir).is_ok();
            let _ = std::fs::remove_dir_all(&fresh);
            placed
        };
        if place() {
            return true;
        }
        let owner = std::fs::read_to_string(dir.join("owner")).ok().and_then(|s| s.trim().parse::<u32>().ok());
        if owner.is_some_and(alive) {
            return false;
        }
        clean(n);
        place()
    }

    fn bridge(&self) -> String {
        format!("pkb{}", self.n)
    }

    /// The node address (the bridge's, in the root namespace).
    #[must_use]
    pub fn node(&self) -> Ipv4Addr {
        Ipv4Addr::new(PREFIX[0], PREFIX[1], self.n, 1)
    }

    /// A port for a server of the root namespace to listen on at [`Network::node`], not handed out before. The node
    /// address is this bed's alone, and the port is below the kernel's ephemeral range, so no other bed's server and
    /// no outgoing connection from the node address (the actions', the watcher's, to the pods) can hold it; a port
    /// picked from the ephemeral range sometimes was by the time the server bound it ("address already in use").
    ///
    /// # Panics
    /// After 2,000 ports.
    pub fn node_port(&self) -> u16 {
        let n = self.next_port.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        assert!(n < FIRST_NODE_PORT + 2000, "the bed ran out of node ports");
        n
    }

    /// The address pod namespace `slot` has (or will have).
    #[must_use]
    pub fn pod_addr(&self, slot: u8) -> Ipv4Addr {
        Ipv4Addr::new(PREFIX[0], PREFIX[1], self.n, 10u8.saturating_add(slot))
    }

    /// The lease directory: everything the bed writes lives under it.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bed's hosts file (what `/etc/hosts` is in every process the bed starts).
    fn hosts_file(&self) -> PathBuf {
        self.dir.join("hosts")
    }

    /// Makes pod namespace `slot` (0..=200): its own `eth0` at `.<10 + slot>` with a default route via the node.
    ///
    /// # Errors
    /// When iproute2 refuses.
    pub fn add_pod(&self, slot: u8) -> Result<PodNet, String> {
        if slot > 200 {
            return Err(format!("pod slot {slot} is beyond the /24"));
        }
        let ns = format!("pkb{}-{slot}", self.n);
        let addr = self.pod_addr(slot);
        let host_end = format!("pkb{}v{slot}", self.n);
        let pod_end = format!("pkb{}p{slot}", self.n);
        // A pod made again (a replica scaled in, then out) keeps its namespace and address, as a StatefulSet pod
        // keeps its name.
        if !self.namespaces.lock().unwrap_or_else(PoisonError::into_inner).insert(ns.clone()) {
            return Ok(PodNet { ns, addr, slot });
        }
        ip(&["netns", "add", &ns])?;
        ip(&["link", "add", &host_end, "type", "veth", "peer", "name", &pod_end])?;
        ip(&["link", "set", &host_end, "master", &self.bridge()])?;
        ip(&["link", "set", &host_end, "up"])?;
        ip(&["link", "set", &pod_end, "netns", &ns])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["-n", ns.as_str()];
            all.extend_from_slice(args);
            ip(&all)
        };
        inside(&["link", "set", &pod_end, "name", "eth0"])?;
        inside(&["link", "set", "lo", "up"])?;
        inside(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
        inside(&["link", "set", "eth0", "up"])?;
        inside(&["route", "add", "default", "via", &self.node().to_string()])?;
        Ok(PodNet { ns, addr, slot })
    }

    /// Adds a veth pair of its own to the root namespace, down (removed with the lease's links). The fork's proxy
    /// token hashes the host's MAC addresses: a proxy started after this one is added gets another token at the same
    /// address, as a pod made again on another node's network.
    ///
    /// # Errors
    /// When iproute2 refuses.
    pub fn add_dummy_link(&self) -> Result<(), String> {
        let n = self.dummies.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (one, other) = (format!("pkb{}vd{n}", self.n), format!("pkb{}ve{n}", self.n));
        ip(&["link", "add", &one, "type", "veth", "peer", "name", &other])
    }

    /// Strands the connections the root namespace holds to `pod` now, as a middlebox that dropped them would: they
    /// hang from here on, with no reset either way, while new ones work. New connections from the root namespace to
    /// the pod leave from a second node address (`.250`); the pod blackholes its packets to the first.
    ///
    /// # Errors
    /// When iproute2 refuses.
    pub fn strand_node_connections(&self, pod: &PodNet) -> Result<(), String> {
        let second = Ipv4Addr::new(PREFIX[0], PREFIX[1], self.n, 250);
        if !ip_output(&["-o", "addr", "show", "dev", &self.bridge()]).contains(&format!("{second}/")) {
            ip(&["addr", "add", &format!("{second}/24"), "dev", &self.bridge()])?;
        }
        let bridge = self.bridge();
        let (to, from) = (format!("{}/32", pod.addr), second.to_string());
        ip(&["route", "replace", &to, "dev", &bridge, "src", &from])?;
        ip(&["-n", &pod.ns, "route", "replace", "blackhole", &format!("{}/32", self.node())])
    }

    /// Adds `name` → `addr` to the bed's hosts file (rewritten in place: the bind mounts see the same file).
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn resolve(&self, name: &str, addr: Ipv4Addr) -> Result<(), String> {
        {
            let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
            hosts.retain(|(n, _)| n != name);
            hosts.push((name.to_owned(), addr));
        }
        self.write_hosts()
    }

    /// Removes `name` from the bed's hosts file: a deleted pod's name stops resolving, as its DNS record goes.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn unresolve(&self, name: &str) -> Result<(), String> {
        self.hosts.lock().unwrap_or_else(PoisonError::into_inner).retain(|(n, _)| n != name);
        self.write_hosts()
    }

    fn write_hosts(&self) -> Result<(), String> {
        let hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        let mut text = String::from("127.0.0.1\tlocalhost\n");
        for (name, addr) in hosts.iter() {
            // Rooted too (`<name>.`), as cluster DNS answers it: the product lists a split's alias under the rooted
            // FQDN, and glibc's hosts lookup (the fork's Go binaries resolve through it) matches names literally.
            let _ = writeln!(text, "{addr}\t{name} {name}.");
        }
        // In place (truncate and write), never a rename: a bind mount holds the inode.
        std::fs::write(self.hosts_file(), text).map_err(|e| format!("{}: {e}", self.hosts_file().display()))
    }

    /// A command that runs `program` with the bed's hosts file as `/etc/hosts`, inside pod namespace `ns` when given,
    /// else in the root network namespace. The process execs through (`unshare`, `sh`, `nsenter` all exec), so the
    /// child's pid is the program's.
    #[must_use]
    pub fn command(&self, ns: Option<&str>, program: &Path) -> Command {
        let prefix = self.jail(ns);
        let mut cmd = Command::new(&prefix[0]);
        cmd.args(&prefix[1..]).arg(program).stdin(Stdio::null());
        cmd
    }

    /// What [`Network::command`] puts before the program: for callers that build their own argv.
    #[must_use]
    pub fn jail(&self, ns: Option<&str>) -> Vec<String> {
        // An empty resolv.conf as well: a name the bed does not know fails at once (no nameserver answers on the
        // pods' loopback) instead of waiting for DNS servers the pods cannot reach.
        let mut argv: Vec<String> = [
            "/usr/bin/unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            r#"/usr/bin/mount --bind "$0/hosts" /etc/hosts && /usr/bin/mount --bind "$0/resolv.conf" /etc/resolv.conf && exec "$@""#,
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        argv.push(self.dir.display().to_string());
        if let Some(ns) = ns {
            argv.extend(["/usr/bin/nsenter".to_owned(), format!("--net=/var/run/netns/{ns}"), "--".to_owned()]);
        }
        argv
    }

    /// Records a process the bed started, so that a killed run's next bed can stop it.
    pub fn started(&self, pid: u32) {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("pids")) {
            let _ = writeln!(f, "{pid}");
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _locked = leases_locked();
        clean(self.n);
        // The last lease gone, nothing of the beds stays (removing a directory that is not empty fails).
        let _ = std::fs::remove_dir(LEASES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_reach_each_other_and_resolve_names_and_everything_goes_on_drop() {
        let network = Network::lease().expect("lease a bed network (root and iproute2 needed)");
        let a = network.add_pod(0).unwrap();
        let b = network.add_pod(1).unwrap();
        network.resolve("b.pod.test", b.addr).unwrap();
        let rooted = network
            .command(Some(&a.ns), Path::new("/usr/bin/getent"))
            .args(["ahostsv4", "b.pod.test."])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&rooted.stdout).contains(&b.addr.to_string()), "{rooted:?}");
        let out = network
            .command(Some(&a.ns), Path::new("/bin/sh"))
            .args(["-c", "getent hosts b.pod.test; getent hosts unknown.pod.test; ip -4 -o addr show dev eth0"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("{}", b.addr)), "b.pod.test does not resolve in pod a: {text} {out:?}");
        assert!(text.contains(&format!("{}/24", a.addr)), "pod a's eth0 is not {}: {text}", a.addr);
        let ns = a.ns.clone();
        let dir = network.dir().to_owned();
        drop(network);
        assert!(!ip_output(&["netns", "list"]).contains(&ns), "namespace {ns} left behind");
        assert!(!dir.exists(), "{} left behind", dir.display());
        assert!(std::fs::read_to_string("/etc/hosts").unwrap_or_default().lines().all(|l| !l.contains("b.pod.test")));
    }
}
