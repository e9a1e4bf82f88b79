//! The project's demo (`scripts/demo.sh`): [`testbed::real::demo`], with the `pika-action` built beside this
//! executable, or the one named as the first argument.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let action = std::env::args()
        .nth(1)
        .map_or_else(|| std::env::current_exe().unwrap_or_default().with_file_name("pika-action"), PathBuf::from);
    // Actions run with working directory `/`, as under kbagent: the path must not be relative.
    let action = std::fs::canonicalize(&action).unwrap_or(action);
    if !action.exists() {
        eprintln!("demo: {} not found; build it first (cargo build --bin pika-action)", action.display());
        return ExitCode::FAILURE;
    }
    if testbed::real::demo::run(&action, &mut std::io::stdout()) == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
