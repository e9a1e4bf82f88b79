//! The real servers the addon ships, in a test bed: pika v4.0.1 (one per pod, each in its own network namespace,
//! started by the chart's own `pika-start.sh` from the chart's own `pika.conf`), and Pika's Codis fork
//! (codis-dashboard and codis-proxy configured from the chart's own `dashboard.toml` and `proxy.toml`) over real
//! etcd. `scripts/setup.sh` installs the servers; nothing here falls back to a stand-in.
//!
//! What the bed changes from what the chart renders, and why:
//! - pika's paths (`/data/...`) point into the pod's directory: the pods share one filesystem here;
//! - pika's `maxclients` is 10000, not 20000: pika aborts at start unless `maxclients` plus its reserve is within
//!   `ulimit -n`, which is 20000 on these machines and cannot be raised here (a container's is usually 1048576);
//! - the dashboard, proxy and etcd listen on ports of the bed's node address in the root namespace (they run beside
//!   the test, not in pods; pods reach them there as they would reach a Service), and advertise those addresses.

pub mod bed;
pub mod codis;
pub mod demo;
pub mod network;
pub mod pika;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

use crate::kubeblocks::chart::{helm_template, repo_chart};

/// The pika release the real tier runs: its git tag (also the tag of the pikadb images the chart names) and commit
/// (what `pika -v` prints as `pika_git_sha`; the tag did not bump pika's version string).
pub const PIKA_RELEASE: (&str, &str) = ("v4.0.1", "23d9bf6f4a400f3648be514d5f674bd9b8ae632f");

/// Where `scripts/setup.sh` installs the real servers.
pub const INSTALL_DIR: &str = "/usr/local/lib/pika-kubeblocks";

/// The installed real servers.
#[derive(Debug, Clone)]
pub struct Servers {
    /// pika v4.0.1.
    pub pika: PathBuf,
    /// The fork's codis-dashboard.
    pub dashboard: PathBuf,
    /// The fork's codis-proxy.
    pub proxy: PathBuf,
    /// The fork's codis-admin.
    pub admin: PathBuf,
}

impl Servers {
    /// The servers `scripts/setup.sh` installed.
    ///
    /// # Panics
    /// When they are not installed: a test of the real tier never passes without them.
    #[must_use]
    pub fn installed() -> Self {
        let dir = Path::new(INSTALL_DIR);
        let servers = Self {
            pika: dir.join("pika/bin/pika"),
            dashboard: dir.join("codis/bin/codis-dashboard"),
            proxy: dir.join("codis/bin/codis-proxy"),
            admin: dir.join("codis/bin/codis-admin"),
        };
        for path in [&servers.pika, &servers.dashboard, &servers.proxy, &servers.admin] {
            assert!(
                path.is_file(),
                "{} is not installed: run scripts/setup.sh (it installs pika v4.0.1 and Pika's Codis fork from \
                 PIKA_BIN/CODIS_BIN or ../shared/servers)",
                path.display()
            );
        }
        servers
    }
}

/// The files the addon chart renders for the servers, as KubeBlocks mounts them.
#[derive(Debug, Clone)]
pub struct ChartFiles {
    /// `pika.conf` of the pika config template (the "key value" lines KubeBlocks manages).
    pub pika_conf: String,
    /// `pika-start.sh` of the scripts ConfigMap: the pika container's command.
    pub pika_start: String,
    /// `exec-redacted.sh` of the scripts ConfigMap: how the pika, dashboard and proxy containers run their server.
    pub exec_redacted: String,
    /// `dashboard.toml`.
    pub dashboard_toml: String,
    /// `proxy.toml`.
    pub proxy_toml: String,
    /// The pika container's `lifecycle.preStop.exec.command` in the pika-group ComponentDefinition (empty: none).
    pub pika_pre_stop: Vec<String>,
    /// The pika pods' `terminationGracePeriodSeconds` (Kubernetes' 30 s when the chart sets none).
    pub pika_grace: std::time::Duration,
}

impl ChartFiles {
    /// `helm template` of `addon/` with its default values (once per process).
    ///
    /// # Panics
    /// When the chart does not render or lacks one of the files.
    #[must_use]
    pub fn rendered() -> &'static Self {
        static FILES: OnceLock<Result<ChartFiles, String>> = OnceLock::new();
        FILES
            .get_or_init(|| {
                let objects =
                    helm_template(&repo_chart("addon"), "pika", "kb-system", &[]).map_err(|e| e.to_string())?;
                let data = |key: &str| -> Result<String, String> {
                    objects
                        .iter()
                        .filter(|o| o.get("kind").and_then(Value::as_str) == Some("ConfigMap"))
                        .find_map(|o| o.pointer(&format!("/data/{key}")).and_then(Value::as_str))
                        .map(str::to_owned)
                        .ok_or_else(|| format!("the addon chart renders no ConfigMap holding {key}"))
                };
                let pika_group = objects
                    .iter()
                    .filter(|o| o.get("kind").and_then(Value::as_str) == Some("ComponentDefinition"))
                    .find(|o| o.pointer("/spec/serviceKind").and_then(Value::as_str) == Some("pika"))
                    .ok_or("the addon chart renders no ComponentDefinition of serviceKind pika")?;
                let pika_container = pika_group
                    .pointer("/spec/runtime/containers")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c.get("name").and_then(Value::as_str) == Some("pika")))
                    .ok_or("the pika-group ComponentDefinition has no pika container")?;
                let pika_pre_stop = pika_container
                    .pointer("/lifecycle/preStop/exec/command")
                    .and_then(Value::as_array)
                    .map(|argv| argv.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                    .unwrap_or_default();
                let pika_grace = std::time::Duration::from_secs(
                    pika_group
                        .pointer("/spec/runtime/terminationGracePeriodSeconds")
                        .and_then(Value::as_u64)
                        .unwrap_or(30),
                );
                Ok(ChartFiles {
                    pika_pre_stop,
                    pika_grace,
                    pika_conf: data("pika.conf")?,
                    pika_start: data("pika-start.sh")?,
                    exec_redacted: data("exec-redacted.sh")?,
                    dashboard_toml: data("dashboard.toml")?,
                    proxy_toml: data("proxy.toml")?,
                })
            })
            .as_ref()
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// `text` with the value of every `key = ...` line (TOML) replaced by `value` (already quoted as TOML needs).
#[must_use]
pub fn set_toml(text: &str, key: &str, value: &str) -> String {
    let names =
        |line: &str| !line.trim_start().starts_with('#') && line.split('=').next().is_some_and(|k| k.trim() == key);
    set_line(text, names, &format!("{key} = {value}"))
}

/// `text` with the value of every `key value` line (pika.conf) replaced by `value`.
#[must_use]
pub fn set_conf(text: &str, key: &str, value: &str) -> String {
    set_line(text, |line: &str| line.split_whitespace().next() == Some(key), &format!("{key} {value}"))
}

/// `text` with every line `names` picks replaced by `setting`, or `setting` appended when none is.
fn set_line(text: &str, names: impl Fn(&str) -> bool, setting: &str) -> String {
    let mut found = false;
    let mut out: Vec<&str> = text
        .lines()
        .map(|line| {
            if names(line) {
                found = true;
                setting
            } else {
                line
            }
        })
        .collect();
    if !found {
        out.push(setting);
    }
    out.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_conf_replaces_a_pika_setting_and_leaves_comments_and_longer_names_alone() {
        let conf = "# default-slot-num 1\ndefault-slot-num 1024\ndefault-slot-num-x 3\n";
        let set = set_conf(conf, "default-slot-num", "128");
        assert_eq!(set, "# default-slot-num 1\ndefault-slot-num 128\ndefault-slot-num-x 3\n");
    }

    #[test]
    fn settings_are_replaced_where_they_are_and_added_where_they_are_not() {
        let toml = "# admin_addr = \"x\"\nadmin_addr = \"0.0.0.0:18080\"\nmax_slot_num = 1024\n";
        let set = set_toml(toml, "admin_addr", "\"127.0.0.1:1\"");
        assert_eq!(set, "# admin_addr = \"x\"\nadmin_addr = \"127.0.0.1:1\"\nmax_slot_num = 1024\n");
        assert!(set_toml(toml, "jodis_name", "\"\"").ends_with("jodis_name = \"\"\n"));
    }

    #[test]
    fn the_chart_renders_every_file_the_bed_runs() {
        let files = ChartFiles::rendered();
        assert!(files.pika_conf.lines().any(|l| l.trim() == "slotmigrate yes"), "{}", files.pika_conf);
        assert!(files.pika_start.contains("exec-redacted.sh\" \"$pika\" -c"), "{}", files.pika_start);
        assert!(files.exec_redacted.contains("exec \"$@\""), "{}", files.exec_redacted);
        assert!(files.dashboard_toml.contains("coordinator_name"));
        assert!(files.proxy_toml.contains("proxy_addr"));
    }
}
