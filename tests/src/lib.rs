//! chart-tests: the addon's Helm charts rendered faithfully and checked as the API server and KubeBlocks would.
//!
//! CI can run neither Helm nor a Kubernetes API server, so the pipeline is rebuilt from real parts:
//! [`render`] builds `chart-render` (Go's text/template, sprig and sigs.k8s.io/yaml, the pieces Helm is made of) and
//! renders a chart into JSON objects exactly as kubectl would send them; [`schema`] validates each object against
//! the `openAPIV3Schema` of its kind in the KubeBlocks CRDs of `../shared/kubeblocks-crds` (both v1.0.2 and main),
//! with the structural-schema rules the API server adds (unknown fields rejected, list-map keys unique, the CEL
//! rules of those CRDs); [`manifest`] gives the cross-reference tests a typed view of rendered objects.
#![warn(missing_docs)]

pub mod cel;
pub mod manifest;
pub mod render;
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
