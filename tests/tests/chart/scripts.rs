//! The few scripts the charts ship, run from the real files (never a pasted copy) in a temporary directory, with the
//! programs they drive (pika-action, pika, codis-admin, etcd, etcdctl, datasafed) replaced by recording stubs. The
//! etcd scripts run under busybox sh with only busybox applets on PATH, as in the distroless etcd pods.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use chart_tests::repo_root;

fn script(dir: &str, name: &str) -> PathBuf {
    let p = repo_root().join("addon").join(dir).join(name);
    assert!(p.is_file(), "{} is missing", p.display());
    p
}

/// Writes an executable stub that appends `<name> <args>` to `log` and runs `body`.
fn stub(dir: &Path, name: &str, log: &Path, body: &str) {
    let path = dir.join(name);
    let text = format!("#!/bin/sh\necho \"{name} $*\" >> '{}'\n{body}\n", log.display());
    std::fs::write(&path, text).expect("write stub");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// `key : value` settings of a pika config file, asserting every setting line has pika's syntax.
fn pika_conf(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (k, v) = line.split_once(':').unwrap_or_else(|| panic!("not `key : value`: {line:?}"));
        assert!(k.ends_with(' ') && !k.trim().contains(' '), "not `key : value`: {line:?}");
        out.entry(k.trim().to_owned()).or_default().push(v.trim().to_owned());
    }
    out
}

struct PikaStart {
    dir: tempfile::TempDir,
}

impl PikaStart {
    fn new(rejoin_rc: i32) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        std::fs::create_dir_all(dir.path().join("data")).expect("data");
        let log = dir.path().join("log");
        stub(
            &bin,
            "pika-action",
            &log,
            &format!("echo \"config=$PIKA_CONFIG_FILE\" >> '{}'\nexit {rejoin_rc}", log.display()),
        );
        stub(&bin, "pika", &log, "exit 0");
        // A maxclients that fits any open-file limit a test machine has (the chart's 20000 needs 25000 files).
        let template = read(&script("config", "pika.conf")).replace("\nmaxclients 20000\n", "\nmaxclients 1000\n");
        assert!(template.contains("\nmaxclients 1000\n"), "the chart's pika.conf names maxclients 20000");
        std::fs::write(dir.path().join("template.conf"), template).expect("template");
        Self { dir }
    }

    /// The chart's own template, whose maxclients needs more open files than a test machine may allow.
    fn with_the_charts_maxclients(self) -> Self {
        std::fs::copy(script("config", "pika.conf"), self.dir.path().join("template.conf")).expect("template");
        self
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("data/pika.conf")
    }

    fn run(&self) -> Output {
        self.command(Command::new("sh").arg(script("scripts", "pika-start.sh"))).output().expect("sh runs")
    }

    /// Runs it with the hard open-file limit lowered to `files` (a limit can be lowered without privilege).
    fn run_with_open_files(&self, files: u32) -> Output {
        let mut sh = Command::new("sh");
        sh.args(["-c", "ulimit -n \"$1\" && exec sh \"$2\"", "sh"])
            .arg(files.to_string())
            .arg(script("scripts", "pika-start.sh"));
        self.command(&mut sh).output().expect("sh runs")
    }

    /// `command` with the container's environment for this pod.
    fn command<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        let p = self.dir.path();
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("PIKA_CONFIG_TEMPLATE", p.join("template.conf"))
            .env("PIKA_CONFIG_FILE", self.config())
            .env("PIKA_ACTION", p.join("bin/pika-action"))
            .env("PIKA_BIN", p.join("bin/pika"))
            .env("PIKA_PASSWORD", "s3cret")
    }

    fn log(&self) -> String {
        read(&self.dir.path().join("log"))
    }
}

#[test]
fn pika_start_writes_the_config_from_the_template_then_rejoins_then_execs_pika() {
    let t = PikaStart::new(0);
    let out = t.run();
    assert!(out.status.success(), "{}", describe(&out));
    let conf = pika_conf(&read(&t.config()));
    assert_eq!(conf["slotmigrate"], ["yes"]);
    assert_eq!(conf["port"], ["9221"]);
    assert_eq!(conf["requirepass"], ["s3cret"]);
    assert_eq!(conf["masterauth"], ["s3cret"]);
    assert_eq!(conf["db-path"], ["/data/db/"]);
    let template = read(&t.dir.path().join("template.conf"));
    let settings = template.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).count();
    assert_eq!(conf.len(), settings + 3, "every template setting plus requirepass, masterauth and userpass");
    let userpass = &conf["userpass"][0];
    assert!(userpass.len() >= 32 && userpass != "s3cret", "the second account's secret is random: {userpass}");
    let config = t.config().display().to_string();
    assert_eq!(t.log(), format!("pika-action rejoin\nconfig={config}\npika -c {config}\n"), "rejoin before pika");
}

#[test]
fn pika_start_keeps_what_pika_persisted_and_applies_the_templates_settings() {
    let t = PikaStart::new(0);
    std::fs::write(
        t.config(),
        "# pika.conf\nport : 9221\nmaxclients : 10\nslaveof : pika-demo-pika-x7k-0.pika-demo-pika-x7k-headless:9221\n\
         replication-id : 4f0c1ab9\nrun-id : 0123456789012345678901234567890123456789\nrequirepass : old\n\
         # Generated by CONFIG REWRITE\nslotmigrate : no\ninternal-used-unfinished-full-sync : \nuser-set-key : 5\n",
    )
    .expect("persisted");
    let out = t.run();
    assert!(out.status.success(), "{}", describe(&out));
    let text = read(&t.config());
    let conf = pika_conf(&text);
    assert_eq!(conf["slaveof"], ["pika-demo-pika-x7k-0.pika-demo-pika-x7k-headless:9221"], "pika owns slaveof");
    assert_eq!(conf["replication-id"], ["4f0c1ab9"]);
    assert_eq!(conf["run-id"], ["0123456789012345678901234567890123456789"]);
    assert_eq!(conf["maxclients"], ["1000"], "the template's setting wins");
    assert_eq!(conf["slotmigrate"], ["yes"]);
    assert_eq!(conf["requirepass"], ["s3cret"], "the password comes from PIKA_PASSWORD");
    assert_eq!(conf["user-set-key"], ["5"], "settings the template does not name are kept");
    assert!(text.starts_with("# pika.conf\nport : 9221\nmaxclients : 1000\n"), "edited in place, order kept:\n{text}");
    // Idempotent: a second start changes nothing.
    let out = t.run();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&t.config()), text);
}

#[test]
fn pika_start_lowers_maxclients_to_what_the_open_file_limit_allows_beside_pikas_reserve() {
    // pika v4.0.1 needs maxclients + 5000 files and aborts at start when the hard limit is lower.
    let t = PikaStart::new(0).with_the_charts_maxclients();
    let out = t.run_with_open_files(8192);
    assert!(out.status.success(), "{}", describe(&out));
    let text = read(&t.config());
    assert_eq!(pika_conf(&text)["maxclients"], ["3192"], "8192 files less pika's 5000");
    assert!(String::from_utf8_lossy(&out.stdout).contains("maxclients 20000 lowered to 3192"), "{}", describe(&out));
    // Again: the same file.
    assert!(t.run_with_open_files(8192).status.success());
    assert_eq!(read(&t.config()), text);
    // A lower limit lowers it further; a template value that fits stands.
    let out = t.run_with_open_files(7000);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(pika_conf(&read(&t.config()))["maxclients"], ["2000"]);
    let fits = PikaStart::new(0);
    assert!(fits.run_with_open_files(7000).status.success());
    assert_eq!(pika_conf(&read(&fits.config()))["maxclients"], ["1000"]);
    // Too few for any client: refused before pika starts.
    let t = PikaStart::new(0).with_the_charts_maxclients();
    let out = t.run_with_open_files(5050);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(!t.log().contains("pika -c"), "pika must not start: {}", t.log());
}

#[test]
fn pika_start_never_takes_replication_state_from_a_template() {
    let t = PikaStart::new(0);
    std::fs::write(t.dir.path().join("template.conf"), "port 9221\nslaveof 10.0.0.1:9221\nreplication-id xyz\n")
        .expect("t");
    let out = t.run();
    assert!(out.status.success(), "{}", describe(&out));
    let conf = pika_conf(&read(&t.config()));
    assert!(!conf.contains_key("slaveof") && !conf.contains_key("replication-id"), "{conf:?}");
}

#[test]
fn pika_start_does_not_start_pika_when_rejoin_fails() {
    let t = PikaStart::new(1);
    let out = t.run();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(!t.log().contains("pika -c"), "pika must not start: {}", t.log());
    assert!(String::from_utf8_lossy(&out.stderr).contains("rejoin failed (exit 1)"), "{}", describe(&out));
    let t = PikaStart::new(2);
    assert_eq!(t.run().status.code(), Some(2), "invalid configuration is passed on");
}

#[test]
fn pika_start_refuses_to_run_without_a_template() {
    let t = PikaStart::new(0);
    std::fs::remove_file(t.dir.path().join("template.conf")).expect("rm");
    let out = t.run();
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(t.log().is_empty(), "nothing runs: {}", t.log());
}

#[test]
fn exec_redacted_blanks_the_password_and_password_settings_and_passes_the_rest_and_the_exit_code() {
    let printed = "echo 'option --product_auth = p@ss.*'; echo 'x p@ss.*p@ss.* y' >&2; \
                   echo 'I1204 base_conf.cc:336] 43 requirepass other'; echo 'session_auth = \"q\"'; \
                   echo 'kept: p@ss'; exit 3";
    let out = Command::new("sh")
        .arg(script("scripts", "exec-redacted.sh"))
        .args(["sh", "-c", printed])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("PIKA_PASSWORD", "p@ss.*")
        .output()
        .expect("sh");
    assert_eq!(out.status.code(), Some(3), "the program's exit code: {}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "option --product_auth = <redacted>\nx <redacted><redacted> y\n\
         I1204 base_conf.cc:336] 43 requirepass <redacted>\nsession_auth = <redacted>\nkept: p@ss\n"
    );
}

#[test]
fn codis_proxy_stop_removes_the_proxy_by_its_stable_address_and_never_fails() {
    for (rc, removed) in [(0, true), (1, false)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log");
        stub(dir.path(), "codis-admin", &log, &format!("exit {rc}"));
        let out = Command::new("sh")
            .arg(script("scripts", "codis-proxy-stop.sh"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("CODIS_ADMIN", dir.path().join("codis-admin"))
            .env("CODIS_DASHBOARD_ADDR", "demo-codis-dashboard:18080")
            .env("PROXY_ADMIN_ADDR", "demo-codis-proxy-1.demo-codis-proxy-headless.ns.svc.cluster.local:11080")
            .output()
            .expect("sh");
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert_eq!(
            read(&log),
            "codis-admin --dashboard=demo-codis-dashboard:18080 --remove-proxy \
             --addr=demo-codis-proxy-1.demo-codis-proxy-headless.ns.svc.cluster.local:11080 --force\n"
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).contains("removed"), removed, "{}", describe(&out));
    }
}

fn busybox() -> PathBuf {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("busybox is not installed: run `bash scripts/setup.sh` (Debian package busybox)"))
}

/// A directory of busybox applets made by the real install-shell.sh, as the etcd pods get it.
fn busybox_shell(dir: &Path) -> PathBuf {
    let shell = dir.join("shell");
    let out = Command::new("sh")
        .arg(script("scripts", "install-shell.sh"))
        .env("BUSYBOX", busybox())
        .env("SHELL_DIR", &shell)
        .output()
        .expect("sh");
    assert!(out.status.success(), "install-shell.sh: {}", describe(&out));
    shell
}

#[test]
fn install_shell_links_the_busybox_applets_the_etcd_scripts_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shell = busybox_shell(dir.path());
    for applet in ["sh", "awk", "tr", "ls", "cat", "printf"] {
        assert!(shell.join("bin").join(applet).exists(), "no {applet} applet");
    }
    let out = Command::new(shell.join("bin/sh")).args(["-c", "printf ok"]).output().expect("runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok");
}

const PEERS: &str = "etcd-0.demo-etcd-headless.ns.svc.cluster.local,etcd-1.demo-etcd-headless.ns.svc.cluster.local,\
                     etcd-2.demo-etcd-headless.ns.svc.cluster.local";

fn member(id: &str, status: &str, name: &str, pod: &str) -> String {
    format!(
        "{id}, {status}, {name}, http://{pod}.demo-etcd-headless.ns.svc.cluster.local:2380, \
         http://{pod}.demo-etcd-headless.ns.svc.cluster.local:2379, false"
    )
}

/// An etcd pod's script environment: busybox applets, stub etcd/etcdctl, a scripts dir with the real files.
struct Etcd {
    dir: tempfile::TempDir,
    shell: PathBuf,
}

impl Etcd {
    /// `members`: what `member list` prints (None: it fails, as with no reachable peer).
    fn new(members: Option<&[String]>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let shell = busybox_shell(dir.path());
        let p = dir.path();
        let stubs = p.join("stubs");
        std::fs::create_dir_all(&stubs).expect("stubs");
        std::fs::create_dir_all(p.join("data")).expect("data");
        let log = p.join("log");
        let list = p.join("members");
        if let Some(m) = members {
            std::fs::write(&list, format!("{}\n", m.join("\n"))).expect("members");
        }
        let l = list.display();
        stub(
            &stubs,
            "etcdctl",
            &log,
            &format!(
                r#"case "$*" in
  *"member list"*) [ -f '{l}' ] || exit 1; cat '{l}' ;;
  *"member add"*) for a in "$@"; do case "$a" in --peer-urls=*) peer="${{a#--peer-urls=}}";; esac; done
                  echo "ffff, unstarted, , $peer, , false" >> '{l}'; echo "Member ffff added" ;;
  *"member remove"*) id=""; for a in "$@"; do id="$a"; done; grep -v "^$id, " '{l}' > '{l}.new'; mv '{l}.new' '{l}' ;;
esac"#
            ),
        );
        stub(&stubs, "etcd", &log, "exit 0");
        let scripts = p.join("scripts");
        std::fs::create_dir_all(&scripts).expect("scripts");
        for s in ["etcd-lib.sh", "etcd-start.sh", "etcd-member-leave.sh"] {
            std::fs::copy(script("scripts", s), scripts.join(s)).expect("copy");
        }
        Self { dir, shell }
    }

    fn run(&self, script_name: &str, env: &[(&str, &str)]) -> Output {
        let p = self.dir.path();
        let mut cmd = Command::new(self.shell.join("bin/sh"));
        cmd.arg(p.join("scripts").join(script_name))
            .env_clear()
            .env("PATH", format!("{}:{}", p.join("stubs").display(), self.shell.join("bin").display()))
            .env("ETCD_SCRIPTS_DIR", p.join("scripts"))
            .env("ETCD_DATA_DIR", p.join("data/etcd"))
            .env("PEER_FQDNS", PEERS)
            .env("ETCD_CLUSTER_TOKEN", "demo-etcd");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("busybox sh runs")
    }

    fn log(&self) -> Vec<String> {
        read(&self.dir.path().join("log")).lines().map(str::to_owned).collect()
    }

    fn etcd_flags(&self) -> BTreeMap<String, String> {
        let log = self.log();
        let line = log.iter().find(|l| l.starts_with("etcd ")).unwrap_or_else(|| panic!("etcd did not start: {log:?}"));
        line.split_whitespace()
            .skip(1)
            .filter_map(|a| a.strip_prefix("--"))
            .map(|a| a.split_once('=').map_or((a.to_owned(), String::new()), |(k, v)| (k.to_owned(), v.to_owned())))
            .collect()
    }
}

fn fqdn(pod: &str) -> String {
    format!("{pod}.demo-etcd-headless.ns.svc.cluster.local")
}

#[test]
fn etcd_start_bootstraps_a_new_cluster_from_the_pods_when_no_peer_answers() {
    let e = Etcd::new(None);
    let out = e.run("etcd-start.sh", &[("POD_NAME", "etcd-1")]);
    assert!(out.status.success(), "{}", describe(&out));
    let f = e.etcd_flags();
    assert_eq!(f["initial-cluster-state"], "new");
    let want: Vec<String> =
        ["etcd-0", "etcd-1", "etcd-2"].iter().map(|p| format!("{p}=http://{}:2380", fqdn(p))).collect();
    assert_eq!(f["initial-cluster"], want.join(","));
    assert_eq!(f["name"], "etcd-1");
    assert_eq!(f["enable-v2"], "true", "Codis needs the v2 API");
    assert_eq!(f["advertise-client-urls"], format!("http://{}:2379", fqdn("etcd-1")));
    assert_eq!(f["initial-cluster-token"], "demo-etcd");
    assert!(!e.log().iter().any(|l| l.contains("member add")), "{:?}", e.log());
}

#[test]
fn etcd_start_adds_a_scaled_out_pod_to_the_running_cluster_and_joins_it_existing() {
    let members = [
        member("a1", "started", "etcd-0", "etcd-0"),
        member("b2", "started", "etcd-1", "etcd-1"),
        member("c3", "started", "etcd-2", "etcd-2"),
    ];
    let e = Etcd::new(Some(&members));
    let peers = format!("{PEERS},{}", fqdn("etcd-3"));
    let out = e.run("etcd-start.sh", &[("POD_NAME", "etcd-3"), ("PEER_FQDNS", &peers)]);
    assert!(out.status.success(), "{}", describe(&out));
    let add = e.log().into_iter().find(|l| l.contains("member add")).expect("member add");
    assert!(add.contains(&format!("member add etcd-3 --peer-urls=http://{}:2380", fqdn("etcd-3"))), "{add}");
    assert!(
        add.contains(&format!("--endpoints=http://{}:2379,", fqdn("etcd-0")))
            && !add.contains(&format!("http://{}:2379", fqdn("etcd-3"))),
        "asks the others: {add}"
    );
    let f = e.etcd_flags();
    assert_eq!(f["initial-cluster-state"], "existing");
    let want: Vec<String> =
        ["etcd-0", "etcd-1", "etcd-2", "etcd-3"].iter().map(|p| format!("{p}=http://{}:2380", fqdn(p))).collect();
    assert_eq!(f["initial-cluster"], want.join(","));
}

#[test]
fn etcd_start_replaces_the_member_of_a_pod_that_lost_its_volume() {
    let members = [
        member("a1", "started", "etcd-0", "etcd-0"),
        member("b2", "started", "etcd-1", "etcd-1"),
        member("c3", "started", "etcd-2", "etcd-2"),
    ];
    let e = Etcd::new(Some(&members));
    let out = e.run("etcd-start.sh", &[("POD_NAME", "etcd-1")]);
    assert!(out.status.success(), "{}", describe(&out));
    let log = e.log();
    let remove = log.iter().position(|l| l.contains("member remove b2")).expect("old member removed");
    let add = log.iter().position(|l| l.contains("member add etcd-1")).expect("re-added");
    assert!(remove < add, "{log:?}");
    assert_eq!(e.etcd_flags()["initial-cluster-state"], "existing");
}

#[test]
fn etcd_start_joins_a_bootstrapping_cluster_that_already_lists_it() {
    let members = [
        member("a1", "started", "etcd-0", "etcd-0"),
        member("b2", "unstarted", "", "etcd-1"),
        member("c3", "started", "etcd-2", "etcd-2"),
    ];
    let e = Etcd::new(Some(&members));
    let out = e.run("etcd-start.sh", &[("POD_NAME", "etcd-1")]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!e.log().iter().any(|l| l.contains("member add") || l.contains("member remove")), "{:?}", e.log());
    let f = e.etcd_flags();
    assert_eq!(f["initial-cluster-state"], "existing");
    assert!(
        f["initial-cluster"].contains(&format!("etcd-1=http://{}:2380", fqdn("etcd-1"))),
        "unnamed member named after its pod"
    );
}

#[test]
fn etcd_start_restarts_a_member_from_its_data_without_asking_anyone() {
    let e = Etcd::new(Some(&[member("a1", "started", "etcd-0", "etcd-0")]));
    let wal = e.dir.path().join("data/etcd/member/wal");
    std::fs::create_dir_all(&wal).expect("wal");
    std::fs::write(wal.join("0000000000000000-0000000000000000.wal"), "x").expect("wal file");
    let out = e.run("etcd-start.sh", &[("POD_NAME", "etcd-0")]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!e.log().iter().any(|l| l.starts_with("etcdctl")), "{:?}", e.log());
    let _ = e.etcd_flags();
}

#[test]
fn etcd_start_refuses_a_pod_that_is_not_a_peer() {
    let e = Etcd::new(None);
    let out = e.run("etcd-start.sh", &[("POD_NAME", "etcd-9")]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn etcd_member_leave_removes_the_leaving_member_once_and_only_that_one() {
    let members = [
        member("a1", "started", "etcd-0", "etcd-0"),
        member("b2", "started", "etcd-1", "etcd-1"),
        member("c3", "started", "etcd-2", "etcd-2"),
    ];
    let e = Etcd::new(Some(&members));
    let env = [
        ("KB_LEAVE_MEMBER_POD_NAME", "etcd-2"),
        ("KB_LEAVE_MEMBER_POD_FQDN", "etcd-2.demo-etcd-headless.ns.svc.cluster.local"),
    ];
    let out = e.run("etcd-member-leave.sh", &env);
    assert!(out.status.success(), "{}", describe(&out));
    let removes: Vec<String> = e.log().into_iter().filter(|l| l.contains("member remove")).collect();
    assert_eq!(removes.len(), 1, "{removes:?}");
    assert!(removes[0].ends_with("member remove c3") && !removes[0].contains(&fqdn("etcd-2")), "{removes:?}");
    // Again: already gone, nothing to do.
    let out = e.run("etcd-member-leave.sh", &env);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(e.log().iter().filter(|l| l.contains("member remove")).count(), 1);
}

#[test]
fn etcd_member_leave_fails_when_the_cluster_cannot_be_asked() {
    let e = Etcd::new(None);
    let out = e
        .run("etcd-member-leave.sh", &[("KB_LEAVE_MEMBER_POD_FQDN", "etcd-2.demo-etcd-headless.ns.svc.cluster.local")]);
    assert_ne!(out.status.code(), Some(0), "KubeBlocks retries a failure: {}", describe(&out));
}

/// A RESP server that answers AUTH, BGSAVE (creating a dump directory, as pika does) and INFO stats (busy once).
fn fake_pika(dump: PathBuf) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut infos = 0;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 {
                    break;
                }
                let n: usize = header.trim().trim_start_matches('*').parse().unwrap_or(0);
                let mut args = Vec::new();
                for _ in 0..n {
                    let mut len = String::new();
                    reader.read_line(&mut len).expect("len");
                    let len: usize = len.trim().trim_start_matches('$').parse().expect("bulk length");
                    let mut buf = vec![0; len + 2];
                    reader.read_exact(&mut buf).expect("bulk");
                    args.push(String::from_utf8_lossy(&buf[..len]).into_owned());
                }
                record.lock().expect("lock").push(args.join(" "));
                let reply = match args.first().map(|a| a.to_uppercase()).as_deref() {
                    Some("AUTH") if args.get(1).map(String::as_str) == Some("s3cret") => "+OK\r\n".to_owned(),
                    Some("AUTH") => "-ERR invalid password\r\n".to_owned(),
                    Some("BGSAVE") => {
                        std::fs::create_dir_all(dump.join("20260101/db0/strings")).expect("dump");
                        std::fs::write(dump.join("20260101/db0/strings/000001.sst"), "data").expect("sst");
                        "+20260101120000 : 3: 52428800\r\n".to_owned()
                    }
                    Some("INFO") => {
                        infos += 1;
                        let busy = if infos == 1 { "Yes, 20260101120000, 1" } else { "No, 20260101120000, 2" };
                        let body = format!("# Stats\r\ntotal_connections_received:3\r\nis_bgsaving:{busy}\r\n");
                        format!("${}\r\n{body}\r\n", body.len())
                    }
                    _ => "-ERR unknown command\r\n".to_owned(),
                };
                stream.write_all(reply.as_bytes()).expect("reply");
            }
        }
    });
    (port, seen)
}

#[test]
fn pika_backup_bgsaves_waits_for_the_dump_and_pushes_it_as_one_tar() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let data = p.join("data");
    let dump = data.join("dump");
    std::fs::create_dir_all(&dump).expect("dump");
    std::fs::write(
        data.join("pika.conf"),
        format!("port : 9221\nrequirepass : s3cret\ndump-path : {}/\n", dump.display()),
    )
    .expect("conf");
    let (port, seen) = fake_pika(dump.clone());
    let log = p.join("log");
    let pushed = p.join("pushed.tar");
    stub(p, "datasafed", &log, &format!("cat > '{}'", pushed.display()));
    let out = Command::new("bash")
        .arg(script("dataprotection", "pika-backup.sh"))
        .env("DATA_DIR", &data)
        .env("DP_DB_HOST", "127.0.0.1")
        .env("DP_DB_PORT", port.to_string())
        .env("DP_BACKUP_NAME", "pika-demo-backup")
        .env("DATASAFED", p.join("datasafed"))
        .output()
        .expect("bash");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&log), "datasafed push - /pika-demo-backup.tar\n");
    let commands = seen.lock().expect("lock").clone();
    assert_eq!(commands.iter().filter(|c| c.starts_with("BGSAVE")).count(), 1, "{commands:?}");
    assert!(commands.iter().filter(|c| c.starts_with("INFO")).count() >= 2, "waited for the dump: {commands:?}");
    assert!(commands.iter().all(|c| c == "AUTH s3cret" || !c.starts_with("AUTH")), "password from pika.conf");
    let listing = Command::new("tar").arg("-tf").arg(&pushed).output().expect("tar");
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("20260101/db0/strings/000001.sst"), "{listing}");
    assert!(!dump.join("20260101").exists(), "the pushed dump is removed");
}

#[test]
fn pika_restore_turns_the_dump_into_the_database_directory_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let src = p.join("src/20260101/db0/strings");
    std::fs::create_dir_all(&src).expect("src");
    std::fs::write(src.join("000001.sst"), "data").expect("sst");
    let tar = p.join("backup.tar");
    let made =
        Command::new("tar").arg("-cf").arg(&tar).arg("-C").arg(p.join("src")).arg("20260101").status().expect("tar");
    assert!(made.success());
    let log = p.join("log");
    stub(p, "datasafed", &log, &format!("cat '{}'", tar.display()));
    let data = p.join("data");
    std::fs::create_dir_all(&data).expect("data");
    let run = || {
        Command::new("bash")
            .arg(script("dataprotection", "pika-restore.sh"))
            .env("DATA_DIR", &data)
            .env("DP_BACKUP_NAME", "pika-demo-backup")
            .env("DATASAFED", p.join("datasafed"))
            .output()
            .expect("bash")
    };
    let out = run();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(read(&log), "datasafed pull /pika-demo-backup.tar -\n");
    assert_eq!(read(&data.join("db/db0/strings/000001.sst")), "data");
    assert!(!data.join(".restore").exists());
    let out = run();
    assert_eq!(out.status.code(), Some(1), "a second restore must not overwrite data: {}", describe(&out));
}
