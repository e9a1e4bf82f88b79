//! One pika pod: a real pika v4.0.1 in its own network namespace, started the way the chart's pika container starts
//! it (`/bin/sh pika-start.sh`: merge the config template into the persisted `pika.conf` on the volume, run
//! `pika-action rejoin`, exec pika), with its own volume directory, and stopped the way the kubelet stops it (the
//! chart's preStop hook, then SIGTERM, then SIGKILL at the end of the chart's grace period).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::network::{Network, PodNet};
use super::{ChartFiles, Servers};
use crate::process::{info_field, RespConnection};

/// The port every pod's pika serves (the chart's PIKA_PORT).
pub const PIKA_PORT: u16 = 9221;

/// Where the chart's pika container has pika-action (its init container copies it there).
const CONTAINER_ACTION: &str = "/tools/pika-action";

/// What the kubelet grants after a preStop hook that used the whole grace period, before SIGKILL.
const GRACE_AFTER_HOOK: Duration = Duration::from_secs(2);

/// A pod's pika.
#[derive(Debug)]
pub struct PikaPod {
    /// `<cluster>-<sharding>-<id>-<ordinal>`.
    pub name: String,
    /// Its FQDN (what Codis registers and every process of the bed resolves).
    pub fqdn: String,
    /// Its ordinal.
    pub ordinal: u32,
    /// Its namespace and address.
    pub net: PodNet,
    dir: PathBuf,
    password: Option<String>,
    /// `default-slot-num` in place of the chart's (the bed's slot count).
    slots: Option<u16>,
    child: Option<Child>,
    pre_stop: Option<PreStopHook>,
}

/// The container's preStop hook as the chart declares it, ready to run in the pod: its jail, the bed's binary in
/// place of the container's `PIKA_ACTION`, the container's environment.
#[derive(Debug, Clone)]
struct PreStopHook {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
}

impl PikaPod {
    pub(crate) fn new(
        name: String,
        fqdn: String,
        ordinal: u32,
        net: PodNet,
        dir: PathBuf,
        password: Option<String>,
        slots: Option<u16>,
    ) -> Self {
        Self { name, fqdn, ordinal, net, dir, password, slots, child: None, pre_stop: None }
    }

    /// `<fqdn>:9221`, the address Codis knows it by.
    #[must_use]
    pub fn server(&self) -> String {
        format!("{}:{PIKA_PORT}", self.fqdn)
    }

    /// `<pod address>:9221`.
    #[must_use]
    pub fn addr(&self) -> String {
        format!("{}:{PIKA_PORT}", self.net.addr)
    }

    /// The volume (`/data` in the chart): the persisted `pika.conf`, `db/`, `log/`, ...
    #[must_use]
    pub fn volume(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The config template the pod is started with: the chart's `pika.conf` with the bed's changes (module doc).
    #[must_use]
    pub fn template(&self) -> PathBuf {
        self.dir.join("etc/pika.conf")
    }

    /// Starts the pod's pika container: `pika-start.sh` of the chart with the container's environment (`env`: the
    /// component's vars), and waits until pika answers PING.
    ///
    /// # Errors
    /// When pika-start.sh exits (say, rejoin refused) or pika does not answer within 60 s: with the start log and
    /// the tail of pika's own log.
    pub fn start(
        &mut self,
        network: &Network,
        servers: &Servers,
        action: &Path,
        env: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        self.kill();
        let files = ChartFiles::rendered();
        let volume = self.volume();
        std::fs::create_dir_all(&volume).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(self.dir.join("etc")).map_err(|e| e.to_string())?;
        // The chart's own settings (maxclients too: pika-start.sh fits it to the open-file limit); only the paths
        // move to the pod's directory.
        let mut template = files.pika_conf.replace("/data/", &format!("{}/", volume.display()));
        if let Some(slots) = self.slots {
            template = super::set_conf(&template, "default-slot-num", &slots.to_string());
        }
        std::fs::write(self.template(), template).map_err(|e| e.to_string())?;
        let script = self.dir.join("pika-start.sh");
        std::fs::write(&script, &files.pika_start).map_err(|e| e.to_string())?;
        std::fs::write(self.dir.join("exec-redacted.sh"), &files.exec_redacted).map_err(|e| e.to_string())?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("start.log"))
            .map_err(|e| e.to_string())?;
        let mut container_env: BTreeMap<String, String> =
            [("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".to_owned())].into();
        container_env.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
        for (key, value) in [
            ("POD_NAME", self.name.clone()),
            ("PIKA_ACTION", action.display().to_string()),
            ("PIKA_BIN", servers.pika.display().to_string()),
            ("PIKA_CONFIG_TEMPLATE", self.template().display().to_string()),
            ("PIKA_CONFIG_FILE", volume.join("pika.conf").display().to_string()),
            ("PIKA_DATA_DIR", volume.join("db").display().to_string()),
        ] {
            container_env.insert(key.to_owned(), value);
        }
        self.pre_stop = match files.pika_pre_stop.split_first() {
            None => None,
            // The chart's container runs the binary its init container copied to /tools; the bed runs its own.
            Some((program, args)) if program == CONTAINER_ACTION => Some(PreStopHook {
                argv: network
                    .jail(Some(&self.net.ns))
                    .into_iter()
                    .chain([action.display().to_string()])
                    .chain(args.iter().cloned())
                    .collect(),
                env: container_env.clone(),
            }),
            Some((program, _)) => return Err(format!("the bed cannot run the pika container's preStop {program:?}")),
        };
        let child = network
            .command(Some(&self.net.ns), Path::new("/bin/sh"))
            .arg(&script)
            .env_clear()
            .envs(&container_env)
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: cannot start pika-start.sh: {e}", self.name))?;
        network.started(child.id());
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!(
                        "{}: the pika container exited ({status}) before pika served\n{}",
                        self.name,
                        self.logs()
                    ));
                }
            }
            if self.ping() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!("{}: pika did not answer PING within 60 s\n{}", self.name, self.logs()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn ping(&self) -> bool {
        RespConnection::connect(&self.addr(), self.password.as_deref(), Duration::from_millis(500))
            .and_then(|mut c| c.command(&["PING"]))
            .is_ok_and(|r| r == "+PONG")
    }

    /// What its preStop hooks printed, the start script's output and the tail of pika's newest log file.
    #[must_use]
    pub fn logs(&self) -> String {
        let start = std::fs::read_to_string(self.dir.join("start.log")).unwrap_or_default();
        let pika_log = self.pika_log();
        let tail: Vec<&str> = pika_log.lines().rev().take(20).collect();
        let pre_stop = self.pre_stop_log();
        let pre_stop = if pre_stop.is_empty() {
            String::new()
        } else {
            format!("--- pre-stop log ---\n{}\n", pre_stop.trim_end())
        };
        format!(
            "{pre_stop}--- start log ---\n{}\n--- pika log (last 20 lines) ---\n{}",
            start.trim_end(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    /// The whole of the running pika's log: its newest `INFO` file (glog writes every level there; the `WARNING` file
    /// repeats the warnings only).
    #[must_use]
    pub fn pika_log(&self) -> String {
        let newest = std::fs::read_dir(self.volume().join("log"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()) && e.file_name().to_string_lossy().contains(".INFO."))
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
        newest.map(|e| std::fs::read_to_string(e.path()).unwrap_or_default()).unwrap_or_default()
    }

    /// Cuts its link to its master as a dropped connection would: destroys, from inside its namespace, its sockets to
    /// a master's replication port (pika's port + 2000) with `ss -K`. The master drops it at once; pika tries to link
    /// again only about 10 s later.
    pub fn cut_replication_link(&self) {
        let port = self.addr().rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).expect("a port") + 2000;
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &self.net.ns, "ss", "-K", "dport", "=", &format!(":{port}")])
            .output()
            .expect("run ss -K");
        let listed = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && listed.contains(&format!(":{port}")), "no link of {} cut: {listed}", self.name);
    }

    /// SIGSTOP: a pika that hangs (a stalled node, a long pause). Its master keeps taking writes it does not get.
    pub fn freeze(&self) {
        crate::process::signal(self.child.as_ref(), "-STOP");
    }

    /// SIGCONT after [`PikaPod::freeze`].
    pub fn thaw(&self) {
        crate::process::signal(self.child.as_ref(), "-CONT");
    }

    /// SIGKILL from a shared borrow (another thread drives the bed meanwhile); [`PikaPod::kill`] reaps it later.
    pub fn crash(&self) {
        crate::process::signal(self.child.as_ref(), "-KILL");
    }

    /// SIGKILL: what a crashed pod looks like. Its volume stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops it as the kubelet stops a deleted pod's container: when pika runs, the chart's preStop hook first
    /// (`pika-action pre-stop`: a master hands over), then SIGTERM — pika applies what it received and stops (4 to
    /// 15 s here) — and SIGKILL at the end of the chart's grace period (which counts from the hook's start; 2 s more
    /// when the hook used it all). Its volume stays. A pika replica SIGKILLed instead can lose records it had already
    /// written to its binlog but not yet applied, while its binlog position says it holds them (seen here: 2
    /// acknowledged keys of 3352).
    pub fn stop(&mut self) {
        let grace = super::ChartFiles::rendered().pika_grace;
        let mut deadline = Instant::now() + grace;
        if self.is_running() {
            if let Some(hook) = self.pre_stop.clone() {
                self.run_pre_stop(&hook, deadline);
                deadline = deadline.max(Instant::now() + GRACE_AFTER_HOOK);
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs the preStop hook until it exits or `deadline`, its output appended to `pre-stop.log` (a failed hook
    /// does not stop the stop, as with the kubelet).
    fn run_pre_stop(&self, hook: &PreStopHook, deadline: Instant) {
        use std::io::Write as _;
        let Ok(mut log) = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("pre-stop.log"))
        else {
            return;
        };
        let _ = writeln!(log, "--- preStop {}", hook.argv.last().map_or("", String::as_str));
        let spawned = std::process::Command::new(&hook.argv[0])
            .args(&hook.argv[1..])
            .env_clear()
            .envs(&hook.env)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_or_else(|_| Stdio::null(), Stdio::from))
            .stderr(log.try_clone().map_or_else(|_| Stdio::null(), Stdio::from))
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = writeln!(log, "cannot run the hook: {e}");
                return;
            }
        };
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => break None,
            }
        };
        match status {
            Some(status) => {
                let _ = writeln!(log, "--- preStop ended: {status}");
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = writeln!(log, "--- preStop killed at the end of the grace period");
            }
        }
    }

    /// What its preStop hooks printed so far.
    #[must_use]
    pub fn pre_stop_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pre-stop.log")).unwrap_or_default()
    }

    /// Whether its pika still runs.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills it and empties its volume: the pod comes back on an empty disk at its next start.
    pub fn lose_volume(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(self.volume());
    }

    /// A connection to its pika.
    ///
    /// # Panics
    /// When pika cannot be reached.
    #[must_use]
    pub fn connect(&self) -> RespConnection {
        RespConnection::connect(&self.addr(), self.password.as_deref(), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }

    /// One command; the reply as text (see [`RespConnection::command`]).
    ///
    /// # Panics
    /// When pika cannot be reached.
    #[must_use]
    pub fn command(&self, args: &[&str]) -> String {
        self.connect().command(args).unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }

    /// Every key it holds (one full `SCAN`), pika's own bookkeeping keys included.
    ///
    /// # Panics
    /// When pika cannot be reached or a `SCAN` fails.
    #[must_use]
    pub fn keys(&self) -> Vec<String> {
        let mut conn = self.connect();
        let mut keys = Vec::new();
        let mut cursor = "0".to_owned();
        loop {
            let reply =
                conn.command(&["SCAN", &cursor, "COUNT", "1000"]).unwrap_or_else(|e| panic!("{}: {e}", self.name));
            let mut lines = reply.lines();
            cursor = lines.next().unwrap_or("0").to_owned();
            keys.extend(lines.filter(|l| !l.is_empty()).map(str::to_owned));
            if cursor == "0" {
                return keys;
            }
        }
    }

    /// `INFO replication`.
    #[must_use]
    pub fn info_replication(&self) -> String {
        self.command(&["INFO", "replication"])
    }

    /// What a stuck test prints of the pod: its `INFO replication` (or why it did not answer) and [`PikaPod::logs`].
    #[must_use]
    pub fn report(&self) -> String {
        let info = RespConnection::connect(&self.addr(), self.password.as_deref(), Duration::from_secs(2))
            .and_then(|mut c| c.command(&["INFO", "replication"]))
            .unwrap_or_else(|e| format!("no answer: {e}"));
        format!("=== {} ===\n{}\n{}", self.name, info.trim_end(), self.logs())
    }

    /// `role:` of `INFO replication`.
    #[must_use]
    pub fn role(&self) -> String {
        info_field(&self.info_replication(), "role").unwrap_or_default()
    }
}

impl Drop for PikaPod {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What pika's `INFO replication` says of a replica's link to its master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaState {
    /// `master_host`.
    pub master_host: String,
    /// `master_port`.
    pub master_port: u16,
    /// `master_link_status:up`.
    pub link_up: bool,
    /// The `db0` sync state of `repl_connect_status` (`connected`, `syncing_full`, `try_to_full_sync`, `error`, ...).
    pub db0: String,
}

impl ReplicaState {
    /// Reads a replica's state from `INFO replication`; `None` on a master.
    #[must_use]
    pub fn of(info: &str) -> Option<Self> {
        if info_field(info, "role")?.trim() != "slave" {
            return None;
        }
        // The first `db0:` line of a replica is its `repl_connect_status`; the second its binlog position.
        let db0 = info_field(info, "db0").filter(|s| !s.starts_with("binlog_offset")).unwrap_or_default();
        Some(Self {
            master_host: info_field(info, "master_host")?.trim().to_owned(),
            master_port: info_field(info, "master_port")?.trim().parse().ok()?,
            link_up: info_field(info, "master_link_status").is_some_and(|s| s.trim() == "up"),
            db0: db0.trim().to_owned(),
        })
    }

    /// Its link is up and db0 takes the binlog incrementally: pika's `master_link_status:up` alone does not say db0
    /// is in sync.
    #[must_use]
    pub fn in_sync(&self) -> bool {
        self.link_up && self.db0 == "connected"
    }

    /// In sync with the master it was told to follow as `master_host` (the spelling given to `SLAVEOF`).
    #[must_use]
    pub fn in_sync_with(&self, master_host: &str) -> bool {
        self.master_host == master_host && self.in_sync()
    }
}
