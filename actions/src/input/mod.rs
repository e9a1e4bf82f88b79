//! The edge: the contract's variables from the command line and environment ([`cli`], [`vars`]), the KubeBlocks
//! line they come from ([`line`]), the action's template rendered over them ([`template`]), and the typed,
//! validated event it yields ([`event`]), whose names and addresses follow the rules of [`address`], with the run's
//! context ([`context`]), and the replication values every layer shares ([`replication`]). Everything past this
//! layer works on typed values only.

pub mod address;
pub mod cli;
pub mod context;
pub mod event;
pub mod line;
pub mod replication;
pub mod template;
pub mod vars;
