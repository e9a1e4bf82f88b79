//! Building and running `chart-render` (tests/chart-render/main.go), the `helm template` stand-in.
//!
//! The renderer is compiled once per source revision with the Debian Go toolchain in GOPATH mode (no network: sprig,
//! yaml.v3, sigs.k8s.io/yaml and gojsonschema come from Debian's `golang-*-dev` packages under /usr/share/gocode)
//! into the cargo target directory, and reused by every test binary afterwards.

use std::collections::hash_map::DefaultHasher;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::manifest::Doc;

/// Where the Debian Go library packages install their sources.
pub const GOPATH: &str = "/usr/share/gocode";

/// The Debian packages the renderer is built from (installed by scripts/setup.sh).
pub const GO_PACKAGES: &str = "golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev \
                                golang-k8s-sigs-yaml-dev golang-github-xeipuuv-gojsonschema-dev";

/// Options of one rendering, like `helm template`'s flags.
#[derive(Debug, Clone)]
pub struct Options {
    /// Release name (`--name`).
    pub release: String,
    /// Release namespace (`--namespace`).
    pub namespace: String,
    /// `--set key=value` assignments.
    pub set: Vec<String>,
    /// `--values` files.
    pub values: Vec<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Self { release: "release-name".into(), namespace: "default".into(), set: Vec::new(), values: Vec::new() }
    }
}

impl Options {
    /// Options for a release of that name in that namespace.
    #[must_use]
    pub fn release(name: &str, namespace: &str) -> Self {
        Self { release: name.into(), namespace: namespace.into(), ..Self::default() }
    }

    /// Adds a `--set` assignment.
    #[must_use]
    pub fn set(mut self, assignment: &str) -> Self {
        self.set.push(assignment.into());
        self
    }

    /// Adds a values file.
    #[must_use]
    pub fn values(mut self, file: impl Into<PathBuf>) -> Self {
        self.values.push(file.into());
        self
    }

    fn args(&self) -> Vec<String> {
        let mut args = vec![format!("--name={}", self.release), format!("--namespace={}", self.namespace)];
        args.extend(self.set.iter().map(|s| format!("--set={s}")));
        args.extend(self.values.iter().map(|v| format!("--values={}", v.display())));
        args
    }
}

/// A built `chart-render` binary.
#[derive(Debug)]
pub struct Renderer {
    bin: PathBuf,
}

static RENDERER: OnceLock<Result<Renderer, String>> = OnceLock::new();

/// The renderer, built on first use.
///
/// # Panics
/// When Go or the Go packages are missing (saying what to install), or the build fails.
#[must_use]
pub fn renderer() -> &'static Renderer {
    match RENDERER.get_or_init(Renderer::build) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("chart-render")
}

/// The cargo target profile directory of the running test executable (target/debug).
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().and_then(Path::parent).map(Path::to_path_buf))
        .unwrap_or_else(std::env::temp_dir)
}

impl Renderer {
    fn build() -> Result<Self, String> {
        Self::build_with(which("go").as_deref())
    }

    /// Builds the renderer with that `go` binary; `None` is a machine without Go.
    ///
    /// # Errors
    /// What to install when Go or its packages are missing; the compiler's output when the build fails.
    pub fn build_with(go: Option<&Path>) -> Result<Self, String> {
        let go = go.ok_or_else(|| {
            format!(
                "`go` is not installed, so the charts cannot be rendered: run `bash scripts/setup.sh` \
                 (Debian packages: {GO_PACKAGES})"
            )
        })?;
        for lib in
            ["github.com/Masterminds/sprig", "sigs.k8s.io/yaml", "gopkg.in/yaml.v3", "github.com/xeipuuv/gojsonschema"]
        {
            if !Path::new(GOPATH).join("src").join(lib).is_dir() {
                return Err(format!(
                    "the Go package {lib} is missing from {GOPATH}: run `bash scripts/setup.sh` \
                     (Debian packages: {GO_PACKAGES})"
                ));
            }
        }
        let main = std::fs::read(source_dir().join("main.go")).map_err(|e| format!("chart-render source: {e}"))?;
        let mut hasher = DefaultHasher::new();
        main.hash(&mut hasher);
        let dir = target_dir().join("chart-render");
        let bin = dir.join(format!("chart-render-{:016x}", hasher.finish()));
        if bin.is_file() {
            return Ok(Self { bin });
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let tmp = dir.join(format!("chart-render.tmp.{}", std::process::id()));
        let out = Command::new(go)
            .current_dir(source_dir())
            .args(["build", "-o"])
            .arg(&tmp)
            .arg(".")
            .env("GOPATH", GOPATH)
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("CGO_ENABLED", "0")
            .env("GOCACHE", dir.join("gocache"))
            .output()
            .map_err(|e| format!("cannot run go build: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "go build of tests/chart-render failed (are {GO_PACKAGES} installed?):\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::fs::rename(&tmp, &bin).map_err(|e| format!("{}: {e}", bin.display()))?;
        Ok(Self { bin })
    }

    /// Runs the renderer with raw arguments; returns stdout, or stderr as the error.
    ///
    /// # Errors
    /// The renderer's error output when it exits non-zero.
    pub fn run(&self, args: &[String]) -> Result<String, String> {
        let out = Command::new(&self.bin).args(args).output().map_err(|e| format!("cannot run chart-render: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// The `helm template` stream of a chart.
    ///
    /// # Errors
    /// The renderer's error (a template that fails, a values file that does not parse, ...).
    pub fn template(&self, chart: &Path, opts: &Options) -> Result<String, String> {
        let mut args = opts.args();
        args.push(chart.display().to_string());
        self.run(&args)
    }

    /// A chart's rendered objects, converted to JSON the way kubectl converts manifests.
    ///
    /// # Errors
    /// The renderer's error, or output that is not the expected JSON lines.
    pub fn render(&self, chart: &Path, opts: &Options) -> Result<Vec<Doc>, String> {
        let mut args = opts.args();
        args.push("--output=json".into());
        args.push(chart.display().to_string());
        parse_lines(&self.run(&args)?)
    }

    /// Plain YAML files (examples, CRDs) converted to JSON objects, one per document.
    ///
    /// # Errors
    /// A file that cannot be read or is not valid YAML.
    pub fn yaml_to_json(&self, files: &[PathBuf]) -> Result<Vec<Doc>, String> {
        let mut args = vec!["--to-json".to_owned()];
        args.extend(files.iter().map(|f| f.display().to_string()));
        parse_lines(&self.run(&args)?)
    }
}

fn parse_lines(out: &str) -> Result<Vec<Doc>, String> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line).map_err(|e| format!("chart-render output: {e}: {line}"))?;
            let source = v["source"].as_str().unwrap_or_default().to_owned();
            let index = v["index"].as_u64().and_then(|i| usize::try_from(i).ok()).unwrap_or_default();
            Ok(Doc { source, index, object: v["object"].clone() })
        })
        .collect()
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file())
}

/// A short human summary of documents: `kind/name (source)` per line, for failure messages.
#[must_use]
pub fn summary(docs: &[Doc]) -> String {
    let mut s = String::new();
    for d in docs {
        let _ = writeln!(s, "{}/{} ({})", d.kind(), d.name(), d.source);
    }
    s
}
