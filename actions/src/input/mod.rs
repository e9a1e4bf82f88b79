//! The edge: the contract's variables from the command line and environment ([`cli`], [`vars`]), the action's
//! template rendered over them ([`template`]), and the typed, validated event it yields ([`event`]), with the run's
//! context ([`context`]). Everything past this layer works on typed values only.

pub mod cli;
pub mod context;
pub mod event;
pub mod template;
pub mod vars;
