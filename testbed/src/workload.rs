//! A writer and verifier for tests that must see a lost key: [`Workload`] writes keys through proxy data ports
//! (or any RESP endpoint) while the test does its worst, records every acknowledged write, and the resulting
//! [`Ledger`] reads every acknowledged key back — through a proxy, or straight from the backend that owns its
//! slot — and reports what is missing or different.
//!
//! Every key is written once, with a value naming the key, so an acknowledged key has exactly one right value. A
//! write whose outcome is unknown (error, timeout, dropped connection) is counted as failed and its key is not
//! checked: it may or may not have landed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::codis::slothash::slot_of;
use crate::CodisDouble;

/// How a [`Workload`] writes.
#[derive(Clone, Debug)]
pub struct WorkloadOptions {
    /// RESP addresses to write through (proxy data ports); writer `i` uses `targets[i % len]`.
    pub targets: Vec<String>,
    /// Concurrent writers, one connection each. Default 2.
    pub writers: usize,
    /// Key prefix: keys are `<prefix>:<writer>:<n>`. Default `wl`.
    pub prefix: String,
    /// Pause between two writes of one writer, so a test bed on two shared cores keeps CPU for the system under
    /// test. Default 1 ms.
    pub pace: Duration,
    /// Timeout of one request. Default 2 s.
    pub timeout: Duration,
    /// The password every connection sends first (`AUTH`), as a codis-proxy with `session_auth` requires. Default
    /// none.
    pub auth: Option<String>,
    /// Write only keys of these slots, out of the given slot count (`max_slot_num`): a writer aimed at the slots an
    /// operation moves. Default: every key.
    pub only_slots: Option<(usize, std::collections::BTreeSet<usize>)>,
    /// Keys each writer cycles through (`<n>` modulo this), writing each again with a new value: the data stays this
    /// small however long the writers run. A key whose last write failed is then of unknown value and leaves the
    /// ledger. Default: every key new.
    pub keys_per_writer: Option<u64>,
}

impl WorkloadOptions {
    /// Defaults writing through `targets`.
    #[must_use]
    pub fn through(targets: &[String]) -> Self {
        Self {
            targets: targets.to_vec(),
            writers: 2,
            prefix: "wl".into(),
            pace: Duration::from_millis(1),
            timeout: Duration::from_secs(2),
            auth: None,
            only_slots: None,
            keys_per_writer: None,
        }
    }
}

#[derive(Default)]
struct Progress {
    acked: AtomicUsize,
    failed: AtomicUsize,
    /// Every writer's records, read while the writers go on ([`Workload::acked_so_far`]) and once they stopped.
    ledger: Mutex<Ledger>,
}

/// Writers running in background threads until [`Workload::stop`].
pub struct Workload {
    stop: Arc<AtomicBool>,
    progress: Arc<Progress>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload").field("acked", &self.acked()).field("failed", &self.failed()).finish()
    }
}

impl Workload {
    /// Starts the writers.
    ///
    /// # Panics
    /// When `opts.targets` is empty or a thread cannot be started.
    #[must_use]
    pub fn start(opts: WorkloadOptions) -> Self {
        assert!(!opts.targets.is_empty(), "a workload needs somewhere to write");
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(Progress::default());
        let threads = (0..opts.writers.max(1))
            .map(|w| {
                let (stop, progress, opts) = (stop.clone(), progress.clone(), opts.clone());
                std::thread::Builder::new()
                    .name(format!("workload-{w}"))
                    .spawn(move || write_loop(w, &opts, &stop, &progress))
                    .expect("start a writer thread")
            })
            .collect();
        Self { stop, progress, threads }
    }

    /// Writes acknowledged so far.
    #[must_use]
    pub fn acked(&self) -> usize {
        self.progress.acked.load(Ordering::SeqCst)
    }

    /// Writes failed so far (outcome unknown).
    #[must_use]
    pub fn failed(&self) -> usize {
        self.progress.failed.load(Ordering::SeqCst)
    }

    /// The writes acknowledged so far, while the writers go on: a check in the middle of a run. Only keys written
    /// once ([`WorkloadOptions::keys_per_writer`] unset) keep the value read here while the writers go on.
    #[must_use]
    pub fn acked_so_far(&self) -> Ledger {
        self.progress.ledger.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Waits until at least `n` writes were acknowledged; false after `timeout`.
    #[must_use]
    pub fn wait_for_acked(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.acked() < n {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Stops the writers and returns what they recorded.
    #[must_use]
    pub fn stop(self) -> Ledger {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        std::mem::take(&mut *self.progress.ledger.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

fn write_loop(writer: usize, opts: &WorkloadOptions, stop: &AtomicBool, progress: &Progress) {
    let target = &opts.targets[writer % opts.targets.len()];
    let mut conn: Option<Client> = None;
    let mut n: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        let key = format!("{}:{writer}:{}", opts.prefix, opts.keys_per_writer.map_or(n, |k| n % k));
        n += 1;
        if let Some((count, slots)) = &opts.only_slots {
            if !slots.contains(&crate::codis::slothash::slot_of(key.as_bytes(), *count)) {
                continue;
            }
        }
        // A key written again carries the write's number: it must read back its last acknowledged value.
        let value = match opts.keys_per_writer {
            Some(_) => format!("value-of-{key}-{n}"),
            None => format!("value-of-{key}"),
        };
        let outcome = match conn.take().map_or_else(|| Client::connect(target, opts.timeout, opts.auth.as_deref()), Ok)
        {
            Ok(mut c) => match c.command(&[b"SET", key.as_bytes(), value.as_bytes()]) {
                Ok(Resp::Status(s)) if s == "OK" => {
                    conn = Some(c);
                    Ok(())
                }
                Ok(other) => {
                    conn = Some(c);
                    Err(format!("SET {key}: {other:?}"))
                }
                Err(e) => Err(format!("SET {key}: {e}")),
            },
            Err(e) => Err(format!("connect {target}: {e}")),
        };
        {
            let mut ledger = progress.ledger.lock().unwrap_or_else(PoisonError::into_inner);
            match outcome {
                Ok(()) => {
                    ledger.acked.insert(key, value);
                    progress.acked.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => {
                    ledger.acked.remove(&key);
                    ledger.note_failure(e);
                    progress.failed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        if !opts.pace.is_zero() {
            std::thread::sleep(opts.pace);
        }
    }
}

/// Acknowledged writes (key → value) and failures.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Every acknowledged write.
    pub acked: BTreeMap<String, String>,
    /// Writes whose outcome is unknown.
    pub failed: usize,
    /// The first few failure messages.
    pub errors: Vec<String>,
}

/// What a read-back found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verification {
    /// Acknowledged keys read back.
    pub checked: usize,
    /// Acknowledged keys that are gone.
    pub lost: Vec<String>,
    /// Acknowledged keys with another value: `(key, expected, found)`.
    pub wrong: Vec<(String, String, String)>,
    /// Reads that failed (the keys they covered are not judged).
    pub errors: Vec<String>,
}

impl Verification {
    /// Every acknowledged key read back with its value.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.lost.is_empty() && self.wrong.is_empty() && self.errors.is_empty()
    }

    /// One line for assertion messages.
    #[must_use]
    pub fn summary(&self) -> String {
        format!(
            "{} checked, {} lost (first: {:?}), {} wrong (first: {:?}), {} read errors (first: {:?})",
            self.checked,
            self.lost.len(),
            self.lost.iter().take(5).collect::<Vec<_>>(),
            self.wrong.len(),
            self.wrong.iter().take(3).collect::<Vec<_>>(),
            self.errors.len(),
            self.errors.iter().take(3).collect::<Vec<_>>()
        )
    }

    fn judge(&mut self, keys: &[(&String, &String)], found: Vec<Option<String>>) {
        for ((key, expected), got) in keys.iter().zip(found) {
            self.checked += 1;
            match got {
                None => self.lost.push((*key).clone()),
                Some(v) if v != **expected => self.wrong.push(((*key).clone(), (*expected).clone(), v)),
                Some(_) => {}
            }
        }
    }
}

impl Ledger {
    /// Writes `count` keys `<prefix>:pre:<n>` through `addr` (pipelined, 500 at a time) and records the
    /// acknowledged ones: a data set for a migration to move.
    ///
    /// # Errors
    /// When `addr` cannot be reached.
    pub fn preload(addr: &str, prefix: &str, count: usize) -> std::io::Result<Self> {
        let keys: Vec<String> = (0..count).map(|n| format!("{prefix}:pre:{n}")).collect();
        Self::write_keys(addr, &keys)
    }

    /// Writes `keys` (value `value-of-<key>`) through `addr`, pipelined 500 at a time, and records the
    /// acknowledged ones.
    ///
    /// # Errors
    /// When `addr` cannot be reached.
    pub fn write_keys(addr: &str, keys: &[String]) -> std::io::Result<Self> {
        Self::write_keys_authed(addr, None, keys)
    }

    /// Like [`Ledger::write_keys`], authenticating with `auth` first.
    ///
    /// # Errors
    /// When `addr` cannot be reached or refuses the password.
    pub fn write_keys_authed(addr: &str, auth: Option<&str>, keys: &[String]) -> std::io::Result<Self> {
        let mut client = Client::connect(addr, Duration::from_secs(10), auth)?;
        let mut ledger = Self::default();
        for chunk in keys.chunks(500) {
            let values: Vec<String> = chunk.iter().map(|k| format!("value-of-{k}")).collect();
            let commands: Vec<Vec<&[u8]>> =
                chunk.iter().zip(&values).map(|(k, v)| vec![b"SET".as_slice(), k.as_bytes(), v.as_bytes()]).collect();
            let replies = client.pipeline(&commands)?;
            for ((k, v), r) in chunk.iter().zip(values).zip(replies) {
                match r {
                    Resp::Status(s) if s == "OK" => {
                        ledger.acked.insert(k.clone(), v);
                    }
                    other => ledger.note_failure(format!("SET {k}: {other:?}")),
                }
            }
        }
        Ok(ledger)
    }

    /// Adds another ledger's records.
    pub fn merge(&mut self, other: Self) {
        self.acked.extend(other.acked);
        self.failed += other.failed;
        for e in other.errors {
            if self.errors.len() < 20 {
                self.errors.push(e);
            }
        }
    }

    fn note_failure(&mut self, e: String) {
        self.failed += 1;
        if self.errors.len() < 20 {
            self.errors.push(e);
        }
    }

    /// Reads every acknowledged key back through `addr` (a proxy data port), `MGET` 100 at a time.
    #[must_use]
    pub fn verify_through(&self, addr: &str) -> Verification {
        self.verify_through_authed(addr, None)
    }

    /// Like [`Ledger::verify_through`], authenticating with `auth` first.
    #[must_use]
    pub fn verify_through_authed(&self, addr: &str, auth: Option<&str>) -> Verification {
        let keys: Vec<(&String, &String)> = self.acked.iter().collect();
        let mut out = Verification::default();
        let mut client = match Client::connect(addr, Duration::from_secs(10), auth) {
            Ok(c) => c,
            Err(e) => {
                out.errors.push(format!("connect {addr}: {e}"));
                return out;
            }
        };
        for chunk in keys.chunks(100) {
            let mut tries = 0;
            loop {
                tries += 1;
                match client.mget(chunk.iter().map(|(k, _)| k.as_str())) {
                    Ok(found) => out.judge(chunk, found),
                    // A reply that came late would be read as the next request's: that connection is done. Tried
                    // once more on a new one.
                    Err(e) => match Client::connect(addr, Duration::from_secs(10), auth) {
                        Ok(fresh) if tries < 2 => {
                            client = fresh;
                            continue;
                        }
                        Ok(fresh) => {
                            client = fresh;
                            out.errors.push(format!("MGET through {addr}: {e}"));
                        }
                        Err(again) => {
                            out.errors.push(format!("MGET through {addr}: {e}; connect again: {again}"));
                            return out;
                        }
                    },
                }
                break;
            }
        }
        out
    }

    /// Reads every acknowledged key back both ways a client could find it: through the proxy at `proxy` (its data
    /// port) and from the master owning its slot as `double` lists it ([`Self::verify_on_backends`]).
    ///
    /// # Errors
    /// What is missing, wrong or unreadable on either side, or that nothing was acknowledged at all (a ledger that
    /// proves nothing).
    pub fn verify_kept(&self, proxy: &str, double: &CodisDouble) -> Result<(), String> {
        if self.acked.is_empty() {
            return Err("no write was acknowledged".to_owned());
        }
        let through = self.verify_through(proxy);
        let stored = self.verify_on_backends(double);
        match (through.is_clean(), stored.is_clean()) {
            (true, true) => Ok(()),
            (false, true) => Err(format!("through the proxy: {}", through.summary())),
            (true, false) => Err(format!("on the masters: {}", stored.summary())),
            (false, false) => {
                Err(format!("through the proxy: {}; on the masters: {}", through.summary(), stored.summary()))
            }
        }
    }

    /// Reads every acknowledged key straight from the master of the group owning its slot, as `double` lists them
    /// (registered addresses mapped through its overrides): what a client would find once proxies follow that
    /// table. A key whose slot is still migrating is looked up on the target.
    #[must_use]
    pub fn verify_on_backends(&self, double: &CodisDouble) -> Verification {
        let snap = double.snapshot();
        let nslots = snap.slots.len();
        let mut by_backend: BTreeMap<String, Vec<(&String, &String)>> = BTreeMap::new();
        let mut out = Verification::default();
        for (key, value) in &self.acked {
            let m = snap.slots[slot_of(key.as_bytes(), nslots)];
            let gid = if m.action.state.is_nothing() { m.group_id } else { m.action.target_id };
            match snap.master(gid) {
                Some(master) => by_backend.entry(double.real_addr(master)).or_default().push((key, value)),
                None => out.lost.push(key.clone()),
            }
        }
        for (addr, keys) in by_backend {
            let mut client = match Client::connect(&addr, Duration::from_secs(10), None) {
                Ok(c) => c,
                Err(e) => {
                    out.errors.push(format!("connect {addr}: {e}"));
                    continue;
                }
            };
            let password = double.options().password.clone();
            if let Some(pw) = password.filter(|p| !p.is_empty()) {
                if let Err(e) = client.command(&[b"AUTH", pw.as_bytes()]) {
                    out.errors.push(format!("AUTH {addr}: {e}"));
                    continue;
                }
            }
            for chunk in keys.chunks(100) {
                match client.mget(chunk.iter().map(|(k, _)| k.as_str())) {
                    Ok(found) => out.judge(chunk, found),
                    Err(e) => out.errors.push(format!("MGET on {addr}: {e}")),
                }
            }
        }
        out
    }
}

/// A RESP reply, as the blocking client reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Resp {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

/// A blocking RESP client (one connection).
struct Client {
    stream: BufReader<TcpStream>,
}

impl Client {
    fn connect(addr: &str, timeout: Duration, auth: Option<&str>) -> std::io::Result<Self> {
        let sock =
            addr.parse().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
        let stream = TcpStream::connect_timeout(&sock, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        let mut client = Self { stream: BufReader::new(stream) };
        if let Some(password) = auth {
            match client.command(&[b"AUTH", password.as_bytes()])? {
                Resp::Status(s) if s == "OK" => {}
                // The reply only: it never carries the password.
                other => return Err(std::io::Error::other(format!("AUTH at {addr} refused: {other:?}"))),
            }
        }
        Ok(client)
    }

    fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
    }

    fn command(&mut self, args: &[&[u8]]) -> std::io::Result<Resp> {
        Ok(self.pipeline(&[args.to_vec()])?.remove(0))
    }

    fn pipeline(&mut self, commands: &[Vec<&[u8]>]) -> std::io::Result<Vec<Resp>> {
        let mut out = Vec::new();
        for c in commands {
            Self::encode(&mut out, c);
        }
        self.stream.get_mut().write_all(&out)?;
        commands.iter().map(|_| self.read()).collect()
    }

    fn mget<'a>(&mut self, keys: impl Iterator<Item = &'a str>) -> std::io::Result<Vec<Option<String>>> {
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(keys.map(str::as_bytes));
        match self.command(&args)? {
            Resp::Array(Some(items)) if items.len() == args.len() - 1 => Ok(items
                .into_iter()
                .map(|i| match i {
                    Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
                    _ => None,
                })
                .collect()),
            other => Err(std::io::Error::other(format!("MGET answered {other:?}"))),
        }
    }

    fn read(&mut self) -> std::io::Result<Resp> {
        let mut line = String::new();
        if self.stream.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches(['\r', '\n']);
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad RESP line {line:?}"));
        let (kind, rest) = line.split_at(line.len().min(1));
        match kind {
            "+" => Ok(Resp::Status(rest.to_owned())),
            "-" => Ok(Resp::Error(rest.to_owned())),
            ":" => rest.parse().map(Resp::Int).map_err(|_| bad()),
            "$" => {
                let len: i64 = rest.parse().map_err(|_| bad())?;
                let Ok(len) = usize::try_from(len) else {
                    return Ok(Resp::Bulk(None));
                };
                let mut buf = vec![0; len + 2];
                std::io::Read::read_exact(&mut self.stream, &mut buf)?;
                buf.truncate(len);
                Ok(Resp::Bulk(Some(buf)))
            }
            "*" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                let Ok(n) = usize::try_from(n) else {
                    return Ok(Resp::Array(None));
                };
                (0..n).map(|_| self.read()).collect::<std::io::Result<Vec<_>>>().map(|v| Resp::Array(Some(v)))
            }
            _ => Err(bad()),
        }
    }
}
