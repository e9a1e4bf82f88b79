//! What an action runs with: the validated event, the secrets kept out of it, and the time budget.

use crate::budget::Budget;
use crate::error::Result;
use crate::input::cli::Action;
use crate::input::event::Event;
use crate::input::line::KbLine;
use crate::input::template;
use crate::input::vars::{self, VarMap};

/// Secrets from the environment; never part of the event, never printed (Debug is masked).
#[derive(Clone, Default)]
pub struct Secrets {
    /// pika `requirepass`.
    pub pika_password: Option<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets").field("pika_password", &self.pika_password.as_ref().map(|_| "[redacted]")).finish()
    }
}

/// Everything an action needs.
#[derive(Debug, Clone)]
pub struct Context {
    /// The action's name as KubeBlocks knows it (the tag of its event).
    pub action: String,
    /// The validated event.
    pub event: Event,
    /// Secrets.
    pub secrets: Secrets,
    /// This run's time box.
    pub budget: Budget,
}

impl Context {
    /// Collects the action's variables, renders and validates its event.
    pub fn prepare(action: &Action) -> Result<Self> {
        Self::from_parts(action.name(), &action.vars(), &action.options())
    }

    /// Like [`Context::prepare`], from an explicit variable map (no command-line options).
    pub fn from_vars(action: &str, vars: &VarMap) -> Result<Self> {
        Self::from_parts(action, vars, &[])
    }

    /// Like [`Context::prepare`], from an explicit variable map and the options given on the command line.
    pub fn from_parts(action: &str, vars: &VarMap, options: &[&str]) -> Result<Self> {
        for secret in vars::SECRETS {
            if let Some(value) = vars.get(*secret) {
                crate::redact::register(value);
            }
        }
        check_log_format(vars)?;
        let line = KbLine::from_vars(vars)?;
        line.check_environment(action, vars)?;
        let doc = template::render(action, line, vars, options)?;
        let template_var =
            if vars.contains_key(vars::ACTION_TEMPLATES_DIR) { vars::ACTION_TEMPLATES_DIR } else { "template" };
        let event = Event::from_document(action, doc, template_var)?;
        let secrets = Secrets { pika_password: vars.get(vars::PIKA_PASSWORD).filter(|p| !p.is_empty()).cloned() };
        let budget = Budget::new(event.budget_seconds());
        Ok(Self { action: action.to_owned(), event, secrets, budget })
    }
}

/// `LOG_FORMAT` is `text` or `json` (any case) or unset; logging has started by now with the text format for
/// anything else, but the run must not go on as if the setting had been understood.
fn check_log_format(vars: &VarMap) -> Result<()> {
    match vars.get(vars::LOG_FORMAT).map(|f| f.trim()) {
        None | Some("") => Ok(()),
        Some(f) if f.eq_ignore_ascii_case("text") || f.eq_ignore_ascii_case("json") => Ok(()),
        Some(other) => {
            Err(crate::error::Error::invalid(vars::LOG_FORMAT, format!("{other:?} is neither text nor json")))
        }
    }
}
