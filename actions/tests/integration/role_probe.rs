//! `role-probe` against real redis-servers (standing in for pika), run as kbagent runs it.

use crate::support;

use std::collections::BTreeMap;

use support::{describe, eventually, run};
use testbed::RedisServer;

fn probe_env(server: &RedisServer, password: Option<&str>) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("PIKA_HOST".to_owned(), "127.0.0.1".to_owned()),
        ("PIKA_PORT".to_owned(), server.port().to_string()),
    ]);
    if let Some(p) = password {
        env.insert("PIKA_PASSWORD".to_owned(), p.to_owned());
    }
    env
}

#[test]
fn role_probe_prints_master_then_slave_after_slaveof() {
    let master = RedisServer::start();
    let replica = RedisServer::start();
    let out = run("role-probe", &probe_env(&replica, None));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "master\n", "{}", describe(&out));
    assert!(replica.command(&["SLAVEOF", "127.0.0.1", &master.port().to_string()]).contains("OK"));
    let out = run("role-probe", &probe_env(&replica, None));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "slave\n", "{}", describe(&out));
    assert_eq!(out.status.code(), Some(0));
    // A replica whose master is gone is still a slave, not nothing: KubeBlocks needs a role on every pod.
    drop(master);
    assert!(eventually(std::time::Duration::from_secs(5), || replica.master().is_some_and(|(_, _, up)| !up)));
    assert_eq!(String::from_utf8_lossy(&run("role-probe", &probe_env(&replica, None)).stdout), "slave\n");
}

#[test]
fn role_probe_of_an_unreachable_pika_is_exit_1_with_nothing_on_stdout() {
    let mut server = RedisServer::start();
    let env = probe_env(&server, None);
    server.kill();
    let out = run("role-probe", &env);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(out.stdout.is_empty());
}

#[test]
fn role_probe_authenticates_and_never_prints_the_password() {
    let server = RedisServer::start_with(Some("probe-secret-7"));
    let out = run("role-probe", &probe_env(&server, Some("probe-secret-7")));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "master\n", "{}", describe(&out));
    let out = run("role-probe", &probe_env(&server, Some("wrong-secret-9")));
    assert_eq!(out.status.code(), Some(1));
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!all.contains("wrong-secret-9") && out.stdout.is_empty(), "{all}");
}
