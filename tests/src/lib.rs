//! chart-tests: the addon's Helm charts rendered by the real Helm and checked as the API server, KubeBlocks and kbcli
//! would.
//!
//! [`helm`] runs Helm (`template`, `lint --strict`, `package`) and turns its YAML into the JSON objects kubectl would
//! send; [`schema`] validates each object against the `openAPIV3Schema` of its kind in the KubeBlocks CRDs of
//! `../shared/kubeblocks-crds` (v1.0.2 and main), with what the API server adds (defaulting, unknown fields
//! rejected, list-map keys unique) and the CRDs' CEL rules evaluated by a CEL interpreter ([`cel`]); [`kbcli`]
//! emulates how `kbcli cluster create` turns the cluster chart's values.schema.json into flags and values;
//! [`manifest`] gives the cross-reference tests a typed view of rendered objects.
#![warn(missing_docs)]

pub mod cel;
pub mod helm;
pub mod kbcli;
pub mod manifest;
pub mod schema;

use std::path::{Path, PathBuf};

/// The repository root (the workspace this crate belongs to).
#[must_use]
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// The shared reference directory beside the repository clone (`../shared`).
#[must_use]
pub fn shared_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared"))
}

/// The KubeBlocks CRD schemas of one release line (`v1.0.2` or `main`).
#[must_use]
pub fn crds_dir(version: &str) -> PathBuf {
    shared_dir().join("kubeblocks-crds").join(version)
}

/// The two KubeBlocks schema versions every rendered object must satisfy.
pub const SCHEMA_VERSIONS: [&str; 2] = ["v1.0.2", "main"];
