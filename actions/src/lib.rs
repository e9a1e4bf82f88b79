//! `pika-action`: KubeBlocks lifecycle actions for Pika sharded behind Codis.
//!
//! The layers, in the order of every run:
//! - [`input`]: the CLI collects the contract's variables, the action's template renders them into an event
//!   document, which is parsed and validated into a typed [`input::event::Event`];
//! - [`actions`]: one module per subcommand acts on its own event,
//! - through idempotent [`steps`] (register, move slots, drain, transfer, the topology lock),
//! - which ask the pure [`plan`] what to do (slots, master choice, failure detection)
//! - and talk through small typed [`clients`] for Codis, pika, etcd and Kubernetes.
//!
//! Failures map to exit codes in one place ([`error`]); secrets are scrubbed from every stderr byte ([`redact`]).
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod actions;
pub mod allocator;
pub mod budget;
pub mod clients;
pub mod error;
pub mod failpoint;
pub mod input;
pub mod plan;
pub mod redact;
pub mod steps;

use actions::{
    member_join, member_leave, post_provision, pre_stop, pre_terminate, rejoin, role_probe, shard_add, shard_remove,
    switchover, topology, watcher,
};
use error::{Error, Result};
use input::cli::{Cli, Command};
use input::context::Context;
use input::event::Event;
use input::vars;

/// Runs what the command line asks for and returns what goes on stdout.
pub fn run(cli: Cli) -> Result<String> {
    match cli.command {
        Command::Render { action } => {
            let ctx = Context::prepare(&action)?;
            Ok(serde_json::to_string_pretty(&ctx.event)?)
        }
        Command::Action(action) => {
            let ctx = Context::prepare(&action)?;
            dispatch(&ctx)
        }
    }
}

/// Hands the validated event to its action. `role-probe` runs without an async runtime: it is the hot path.
pub fn dispatch(ctx: &Context) -> Result<String> {
    if let Event::RoleProbe(event) = &ctx.event {
        return role_probe::run(ctx, event);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
    let result = runtime.block_on(async {
        match &ctx.event {
            Event::PostProvision(event) => post_provision::run(ctx, event).await,
            Event::ShardAdd(event) => shard_add::run(ctx, event).await,
            Event::ShardRemove(event) => shard_remove::run(ctx, event).await,
            Event::PreTerminate(event) => pre_terminate::run(ctx, event).await,
            Event::MemberJoin(event) => member_join::run(ctx, event).await,
            Event::MemberLeave(event) => member_leave::run(ctx, event).await,
            Event::Switchover(event) => switchover::run(ctx, event).await,
            Event::Rejoin(event) => rejoin::run(ctx, event).await,
            Event::PreStop(event) => pre_stop::run(ctx, event).await,
            Event::Topology(event) => topology::run(ctx, event).await,
            Event::Watch(event) => watcher::run(ctx, event).await,
            Event::RoleProbe(event) => role_probe::run(ctx, event),
        }
    });
    budget_ran_out(ctx, result)
}

/// A call to a pika that timed out once the budget is used up is the budget running out (every call's timeout is
/// capped by what is left of it), not a failure: exit 75, and the next run resumes, as the contract has it. Except for
/// the switchover and the pre-stop hook, each run once and never exiting 75, and the watcher, whose budget is each job's.
fn budget_ran_out(ctx: &Context, result: Result<String>) -> Result<String> {
    match result {
        Err(e @ Error::Pika(clients::pika::Error::Timeout { .. }))
            if ctx.budget.expired()
                && !matches!(ctx.event, Event::Switchover(_) | Event::PreStop(_) | Event::Watch(_)) =>
        {
            Err(Error::InProgress { progress: format!("the time budget ran out: {}", e.one_line()) })
        }
        other => other,
    }
}

/// Sets up `tracing` on stderr, secrets scrubbed, in the format `LOG_FORMAT` asks for.
pub fn init_logging(cli: &Cli) {
    let action = match &cli.command {
        Command::Action(a) | Command::Render { action: a } => a,
    };
    let json = action.vars().get(vars::LOG_FORMAT).is_some_and(|f| f.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt().with_writer(redact::ScrubbedStderr).with_target(false).with_ansi(false);
    // A second initialisation (tests calling in-process) is harmless. Without PIKA_ACTION_LOG a plain level does
    // what the filter `info` would, and keeps the filter's machinery out of every role-probe's memory.
    let _ = match std::env::var("PIKA_ACTION_LOG") {
        Ok(directives) => {
            let filter = tracing_subscriber::EnvFilter::try_new(directives)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            let builder = builder.with_env_filter(filter);
            if json {
                builder.json().try_init()
            } else {
                builder.try_init()
            }
        }
        Err(_) => {
            let builder = builder.with_max_level(tracing::Level::INFO);
            if json {
                builder.json().try_init()
            } else {
                builder.try_init()
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The context of `action` with the variables of its golden example, given `budget`.
    fn context(action: &str, example: &str, budget: budget::Budget) -> Context {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(example);
        let text = std::fs::read_to_string(&path).expect("the golden example");
        let vars: input::vars::VarMap =
            text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        Context { budget, ..Context::from_vars(action, &vars).expect("a valid example") }
    }

    fn timed_out() -> Result<String> {
        Err(Error::Pika(clients::pika::Error::Timeout { addr: "p-0:9221".into(), command: "INFO" }))
    }

    fn is_in_progress(result: &Result<String>) -> bool {
        matches!(result, Err(Error::InProgress { .. }))
    }

    #[test]
    fn a_pika_call_timed_out_once_the_budget_ran_out_is_exit_75_not_a_failure() {
        let ctx = context("shard-add", "shard-add.1.1.env", budget::Budget::of(std::time::Duration::ZERO));
        assert!(is_in_progress(&budget_ran_out(&ctx, timed_out())));
    }

    #[test]
    fn a_pika_call_timed_out_with_budget_left_stays_a_failure() {
        let ctx = context("shard-add", "shard-add.1.1.env", budget::Budget::new(60));
        assert!(matches!(budget_ran_out(&ctx, timed_out()), Err(Error::Pika(_))));
    }

    #[test]
    fn a_switchover_never_exits_75_for_a_budget_that_ran_out() {
        let ctx = context("switchover", "switchover.1.1.env", budget::Budget::of(std::time::Duration::ZERO));
        assert!(matches!(budget_ran_out(&ctx, timed_out()), Err(Error::Pika(_))));
    }

    #[test]
    fn another_error_at_the_end_of_the_budget_stays_what_it_was() {
        let ctx = context("shard-add", "shard-add.1.1.env", budget::Budget::of(std::time::Duration::ZERO));
        let refused = Err(Error::Pika(clients::pika::Error::Command {
            addr: "p-0:9221".into(),
            command: "SLAVEOF",
            message: "ERR".into(),
        }));
        assert!(!is_in_progress(&budget_ran_out(&ctx, refused)));
    }
}
