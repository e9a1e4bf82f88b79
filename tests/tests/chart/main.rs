//! The charts as KubeBlocks and kbcli meet them: rendered by the real Helm, checked against the CRD schemas and
//! their CEL rules, cross-checked with the action contract, and driven through kbcli's flag building. One test
//! binary, one module per subject; `support` renders and loads what they share.

mod cel;
mod crossref;
mod helm;
mod kbcli;
mod schemas;
mod scripts;
mod support;
