//! What the benchmarks on the real servers share: a writer through the bed's proxy that times every write, running
//! an action as KubeBlocks does, reading what it logged, summing up.

// Included by several benches, each using its part.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testbed::real::bed::RealBed;

/// One write: when it was sent, and when it was acknowledged (`None`: an error or no answer).
#[derive(Clone, Debug)]
pub struct Beat {
    pub key: String,
    pub sent: Instant,
    pub acked: Option<Instant>,
}

/// A writer through the proxy's data port, timing every write.
pub struct Writer {
    stop: Arc<AtomicBool>,
    beats: Arc<Mutex<Vec<Beat>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Writer {
    pub fn start(bed: &RealBed) -> Self {
        Self::start_skipping(bed, |_| false)
    }

    /// A writer that leaves out the keys `skip` names (a slot whose writes stall for reasons of their own would hold
    /// back every write after it: the writer sends one after another).
    pub fn start_skipping(bed: &RealBed, skip: impl Fn(&str) -> bool + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let beats = Arc::new(Mutex::new(Vec::new()));
        let (s, b) = (Arc::clone(&stop), Arc::clone(&beats));
        let proxy = bed.proxies[0].connect().expect("connect to the proxy");
        let reconnect = {
            let addr = bed.proxies[0].data_addr().to_owned();
            let password = bed.password.clone();
            move || testbed::process::RespConnection::connect(&addr, Some(&password), Duration::from_secs(5)).ok()
        };
        let thread = std::thread::spawn(move || {
            let mut conn = Some(proxy);
            let mut n = 0u64;
            while !s.load(Ordering::SeqCst) {
                let key = format!("bench:{n}");
                n += 1;
                if skip(&key) {
                    continue;
                }
                let sent = Instant::now();
                let ok = match conn.as_mut() {
                    Some(c) => c.command(&["SET", &key, &format!("v-{key}")]).is_ok_and(|r| r == "+OK"),
                    None => false,
                };
                b.lock().unwrap().push(Beat { key, sent, acked: ok.then(Instant::now) });
                if !ok {
                    conn = reconnect();
                }
            }
        });
        Self { stop, beats, thread }
    }

    pub fn acked(&self) -> usize {
        self.beats.lock().unwrap().iter().filter(|b| b.acked.is_some()).count()
    }

    pub fn stop(self) -> Vec<Beat> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
        std::mem::take(&mut *self.beats.lock().unwrap())
    }
}

/// Runs the action until it exits 0, rerunning on 75 as KubeBlocks requeues; gives back what each run logged.
pub fn run_to_completion(bed: &RealBed, args: &[&str], env: &BTreeMap<String, String>) -> Vec<String> {
    let mut said = Vec::new();
    for _ in 0..10 {
        let out = bed.run(args, env);
        said.push(String::from_utf8_lossy(&out.stderr).into_owned());
        match out.status.code() {
            Some(0) => return said,
            Some(75) => continue,
            _ => panic!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr)),
        }
    }
    let path = std::env::temp_dir().join("real-bench-unfinished.log");
    let _ = std::fs::write(&path, said.join("\n----- next run -----\n"));
    panic!("{args:?} did not finish in 10 runs; what each run logged: {}", path.display());
}

/// The number the action logged as `<field>=<n>`.
pub fn logged(said: &str, field: &str) -> Option<u64> {
    let at = said.find(&format!("{field}="))? + field.len() + 1;
    said[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

pub fn summary(what: &str, mut values: Vec<u64>) {
    values.sort_unstable();
    if let (Some(min), Some(max)) = (values.first(), values.last()) {
        println!("{what}: min {min}, median {}, max {max} over {}", values[values.len() / 2], values.len());
    }
}

/// What a KubeBlocks 1.1 reconcile does with one change's shardAdds (or shardRemoves), `envs` in order: calls each
/// once, to its end; those that exit 75 are called again in the next reconcile, after the controller's backoff (5 ms
/// doubling). Gives back what every run logged.
pub fn reconcile(bed: &RealBed, args: &[&str], envs: &[BTreeMap<String, String>]) -> Vec<String> {
    use testbed::kubeblocks::retry::{one_call_each, Ended, BACKOFF_MAX};
    let progress = std::env::temp_dir().join("real-bench-reconcile");
    let _ = std::fs::remove_dir_all(&progress);
    let _ = std::fs::create_dir_all(&progress);
    let mut made = 0;
    let r = one_call_each(envs, 40, BACKOFF_MAX, |env| {
        let out = bed.run(args, env);
        made += 1;
        let name = format!("{made:03}-exit-{}.log", out.status.code().unwrap_or(-1));
        let _ = std::fs::write(progress.join(name), &out.stderr);
        out
    });
    let said: Vec<String> = r.outputs.iter().map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).collect();
    match r.ended {
        Ended::Done => said,
        Ended::Failed => panic!("{args:?} failed: {}", said.last().map(String::as_str).unwrap_or_default()),
        Ended::OutOfPasses => {
            let path = std::env::temp_dir().join("real-bench-unfinished.log");
            let _ = std::fs::write(&path, said.join("\n----- next run -----\n"));
            panic!("{args:?} did not finish in 40 reconciles; what each run logged: {}", path.display());
        }
    }
}
