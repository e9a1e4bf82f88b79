//! Secrets: with a password on every pika (and so on Codis, whose `product_auth` it is), every action of the contract
//! runs its whole life cycle — provisioning, scaling out and in, replicas joining and leaving, a switchover, a rejoin,
//! the people's commands — and the failures around it (a wrong password, bad input), with logs at debug and trace level
//! in both formats. The password must appear in no captured stdout or stderr, no rendered event, no etcd record and no
//! request the dashboard received, neither as written nor percent-encoded.

use crate::attack;
use crate::summary;
use crate::support;

use std::collections::BTreeMap;
use std::process::{Command, Output};

use attack::{etcd_entries, run_until_done, texts};
use summary::{Category, Kind};
use support::{describe, run, Bed};
use testbed::DoubleOptions;

/// Characters that get escaped in URLs and shells, so an encoded leak would show too.
const PASSWORD: &str = "Rel!ab@s3cret#x9";
const WRONG: &str = "Wr0ng!pass@word#7";

type Env = BTreeMap<String, String>;

fn leaks(text: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    for secret in [PASSWORD, WRONG] {
        let encoded: String = secret
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        if text.contains(secret) || text.contains(&encoded) {
            found.push(secret);
        }
    }
    found
}

/// Collects every output and judges it.
struct Audit {
    category: Category,
}

impl Audit {
    fn check(&mut self, label: &str, out: &Output) {
        let (stdout, stderr) = texts(out);
        let found = leaks(&format!("{stdout}\n{stderr}"));
        self.category.judge(label, found.is_empty(), || format!("leaked {found:?}: {}", describe(out)));
    }

    /// Runs `action` (rerunning on 75) and checks every run; the last output.
    fn run(&mut self, label: &str, action: &str, env: &Env) -> Output {
        for format in ["text", "json"] {
            let mut env = env.clone();
            env.insert("LOG_FORMAT".into(), format.into());
            env.insert("PIKA_ACTION_LOG".into(), "debug".into());
            let outputs = match run_until_done(action, &env, 10) {
                Ok(outputs) => outputs,
                Err(e) => {
                    let leaked = leaks(&e);
                    self.category
                        .judge(format!("{label} ({format})"), false, || format!("failed (leaked {leaked:?}): {e}"));
                    return run(action, &env);
                }
            };
            for out in &outputs {
                self.check(&format!("{label} ({format})"), out);
            }
            if format == "json" {
                return outputs.into_iter().last().expect("a run");
            }
        }
        unreachable!()
    }

    /// Runs `pika-action render <action>` and checks the event.
    fn render(&mut self, label: &str, action: &str, env: &Env) {
        let out = Command::new(env!("CARGO_BIN_EXE_pika-action"))
            .args(["render", action])
            .env_clear()
            .envs(env)
            .output()
            .expect("render");
        self.category.judge(format!("render {label}: exit 0"), out.status.code() == Some(0), || describe(&out));
        self.check(&format!("render {label}"), &out);
    }
}

#[test]
fn no_output_log_line_event_or_record_carries_the_password() {
    let options = DoubleOptions::default();
    let mut bed = Bed::builder().shards(2).pods(2).password(PASSWORD).bed(options);
    let mut audit =
        Audit { category: Category::of(Kind::Check, "secrets: outputs, logs and events without the password") };

    // The whole life cycle.
    audit.run("post-provision", "post-provision", &bed.env(0));
    let added = bed.add_shard(2);
    let mut add = bed.env(0);
    add.insert("KB_ADD_SHARD_NAME".into(), bed.cluster.shards[added].full.clone());
    audit.run("shard-add", "shard-add", &add);
    let joining = bed.add_pod(0);
    let pod = bed.cluster.shards[0].pod(joining);
    let mut join = bed.env(0);
    join.insert("KB_JOIN_MEMBER_POD_NAME".into(), pod.name.clone());
    join.insert("KB_JOIN_MEMBER_POD_FQDN".into(), pod.fqdn.clone());
    audit.run("member-join", "member-join", &join);
    let master = bed.cluster.shards[0].pod(0);
    let mut switchover = bed.env(0);
    switchover.insert("KB_SWITCHOVER_CURRENT_NAME".into(), master.name.clone());
    switchover.insert("KB_SWITCHOVER_CURRENT_FQDN".into(), master.fqdn.clone());
    switchover.insert("KB_SWITCHOVER_ROLE".into(), "master".into());
    audit.run("switchover of the master", "switchover", &switchover);
    let mut leave = bed.env(0);
    leave.insert("KB_LEAVE_MEMBER_POD_NAME".into(), pod.name.clone());
    leave.insert("KB_LEAVE_MEMBER_POD_FQDN".into(), pod.fqdn.clone());
    audit.run("member-leave", "member-leave", &leave);
    let mut remove = bed.env(added);
    remove.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[added].full.clone());
    audit.run("shard-remove", "shard-remove", &remove);
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("pika.conf");
    std::fs::copy(bed.cluster.shards[0].pod(1).redis.dir().join("redis.conf"), &config).expect("config");
    let mut rejoin = bed.env(0);
    rejoin.insert("POD_NAME".into(), bed.cluster.shards[0].pod(1).name.clone());
    rejoin.insert("PIKA_CONFIG_FILE".into(), config.display().to_string());
    audit.run("rejoin", "rejoin", &rejoin);
    audit.run("topology", "topology", &bed.env(0));
    for p in &bed.cluster.shards[0].pods {
        let probe = Env::from([
            ("PIKA_HOST".to_owned(), "127.0.0.1".to_owned()),
            ("PIKA_PORT".to_owned(), p.redis.port().to_string()),
            ("PIKA_PASSWORD".to_owned(), PASSWORD.to_owned()),
        ]);
        audit.run(&format!("role-probe of {}", p.name), "role-probe", &probe);
    }
    let mut deletion = bed.env_v1_0(1, &[0, 1]);
    deletion.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "false".into());
    audit.run("pre-terminate on cluster deletion", "pre-terminate", &deletion);
    let mut scaling_in = bed.env_v1_0(1, &[1]);
    scaling_in.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
    scaling_in.insert("ALL_SHARDS_POD_FQDNS".into(), bed.cluster.all_shards_of(&[0, 1]));
    audit.run("pre-terminate scaling in", "pre-terminate", &scaling_in);

    // Every event an environment renders.
    for (label, action, env) in [
        ("post-provision", "post-provision", &bed.env(0)),
        ("shard-add", "shard-add", &add),
        ("member-join", "member-join", &join),
        ("switchover", "switchover", &switchover),
        ("member-leave", "member-leave", &leave),
        ("shard-remove", "shard-remove", &remove),
        ("rejoin", "rejoin", &rejoin),
        ("pre-terminate", "pre-terminate", &scaling_in),
        ("topology", "topology", &bed.env(0)),
    ] {
        audit.render(label, action, env);
    }

    // Failures: a wrong password (pika and Codis refuse it), bad input, help, trace-level logs.
    let mut wrong = bed.env(0);
    wrong.insert("ALL_SHARDS_POD_FQDNS".into(), bed.cluster.all_shards_of(&[0]));
    wrong.insert("PIKA_PASSWORD".into(), WRONG.into());
    wrong.insert("PIKA_ACTION_LOG".into(), "trace".into());
    let out = run("post-provision", &wrong);
    audit.category.judge("post-provision with a wrong password fails", out.status.code() == Some(1), || describe(&out));
    audit.check("post-provision with a wrong password", &out);
    let probe = Env::from([
        ("PIKA_PORT".to_owned(), bed.cluster.shards[0].pod(0).redis.port().to_string()),
        ("PIKA_PASSWORD".to_owned(), WRONG.to_owned()),
        ("PIKA_ACTION_LOG".to_owned(), "trace".to_owned()),
    ]);
    let out = run("role-probe", &probe);
    audit.category.judge("role-probe with a wrong password fails", out.status.code() == Some(1), || describe(&out));
    audit.check("role-probe with a wrong password", &out);
    let mut bad = bed.env(0);
    bad.insert("PIKA_PORT".into(), "92a1".into());
    let out = run("post-provision", &bad);
    audit.category.judge("bad input with a password exits 2", out.status.code() == Some(2), || describe(&out));
    audit.check("bad input", &out);
    let mut traced = bed.env(0);
    traced.insert("ALL_SHARDS_POD_FQDNS".into(), bed.cluster.all_shards_of(&[0]));
    traced.insert("PIKA_ACTION_LOG".into(), "trace".into());
    let out = run("post-provision", &traced);
    audit.check("post-provision at trace level", &out);
    for sub in ["post-provision", "switchover", "role-probe"] {
        let out = Command::new(env!("CARGO_BIN_EXE_pika-action"))
            .args([sub, "--help"])
            .env_clear()
            .env("PIKA_PASSWORD", PASSWORD)
            .output()
            .expect("help");
        audit.check(&format!("{sub} --help"), &out);
    }

    // The detector itself: pika's own config file does hold the password, and it is seen there.
    let conf = std::fs::read_to_string(&config).unwrap_or_default();
    audit
        .category
        .judge("control: the password is found where it belongs", leaks(&conf) == [PASSWORD], || conf.clone());

    // What the actions left elsewhere.
    let records = format!("{:?}", etcd_entries(&bed));
    audit.category.judge("etcd records", leaks(&records).is_empty(), || records.clone());
    let requests: Vec<String> = bed.codis.requests().into_iter().map(|r| r.path).collect();
    let requests = requests.join("\n");
    audit.category.judge("requests the dashboard received", leaks(&requests).is_empty(), || requests.clone());
    audit.category.finish();
}
