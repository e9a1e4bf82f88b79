//! `codis-double`: the Codis dashboard double as a process, for the project's demo.
//!
//! `codis-double --listen 127.0.0.1:18080 --product NAME --overrides server=host:port,... --tick-ms 50 [--fork]
//! [--password PW] [--dead-checks N]` prints `listening on ADDR` on stdout once serving and runs until killed.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use testbed::{CodisDouble, DoubleOptions};

const USAGE: &str = "usage: codis-double [--listen ADDR] [--product NAME] [--overrides server=host:port,...] \
                     [--tick-ms N] [--fork] [--password PW] [--dead-checks N]";

fn parse(args: &[String]) -> Result<DoubleOptions, String> {
    // The demo wants the real dashboard's pace unless told otherwise: 50 ms ticks, 1 s stats.
    let mut opts = DoubleOptions {
        tick: Duration::from_millis(50),
        stats_interval: Duration::from_secs(1),
        ..DoubleOptions::default()
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => opts.listen = Some(value()?.parse().map_err(|e| format!("--listen: {e}"))?),
            "--product" => opts.product = value()?.clone(),
            "--password" => opts.password = Some(value()?.clone()),
            "--tick-ms" => {
                let ms: u64 = value()?.parse().map_err(|e| format!("--tick-ms: {e}"))?;
                opts.tick = Duration::from_millis(ms.max(1));
            }
            "--dead-checks" => opts.dead_checks = value()?.parse().map_err(|e| format!("--dead-checks: {e}"))?,
            "--overrides" => opts.overrides = overrides(value()?)?,
            "--fork" => opts.fork = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(opts)
}

/// `server=host:port,...`; server names contain `:` but never `=`.
fn overrides(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("--overrides: {pair:?} is not server=host:port"))
        })
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("codis-double: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let double = match CodisDouble::try_start(opts) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("codis-double: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on {}", double.addr());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::park();
    }
}
