//! `pika-action`: parse, set up logging, run, map the result to an exit code.

use std::process::ExitCode;

use clap::Parser;
use pika_action::input::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    pika_action::init_logging(&cli);
    let result = pika_action::run(cli).map(|out| {
        if !out.is_empty() {
            println!("{out}");
        }
    });
    pika_action::error::finish(result)
}
