//! The real Helm: `helm template`, `helm lint --strict` and `helm package` on the charts, and YAML turned into the
//! JSON objects kubectl would send.
//!
//! Helm is found on `PATH` (scripts/setup.sh installs v3.17.2 at /usr/local/bin/helm). A machine without it fails
//! every chart test with what to run; nothing is skipped. YAML is converted by Helm too: a throw-away chart whose one
//! template passes each document through `fromYaml | toJson`, i.e. sigs.k8s.io/yaml, the library kubectl converts
//! manifests with (YAML 1.1 as Kubernetes reads it: `0444` is octal, `yes` is a boolean).

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::manifest::Doc;

/// The Helm release scripts/setup.sh installs; any Helm 3 renders these charts the same way.
pub const HELM_VERSION: &str = "v3.17.2";

/// Options of one `helm template` or `helm lint`, like their flags.
#[derive(Debug, Clone)]
pub struct Options {
    /// Release name.
    pub release: String,
    /// Release namespace (`--namespace`).
    pub namespace: String,
    /// `--set key=value` assignments.
    pub set: Vec<String>,
    /// `--values` files.
    pub values: Vec<PathBuf>,
    /// Extra raw arguments (`--dry-run=server`, `--kube-version`, ...).
    pub extra: Vec<String>,
    /// Extra environment (`KUBECONFIG` for `--dry-run=server`).
    pub env: Vec<(String, PathBuf)>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            release: "release-name".into(),
            namespace: "default".into(),
            set: Vec::new(),
            values: Vec::new(),
            extra: Vec::new(),
            env: Vec::new(),
        }
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

    /// Adds a raw argument.
    #[must_use]
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra.push(arg.into());
        self
    }

    /// Sets an environment variable for the helm process.
    #[must_use]
    pub fn env(mut self, name: &str, value: impl Into<PathBuf>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    fn args(&self) -> Vec<String> {
        let mut args = vec![format!("--namespace={}", self.namespace)];
        args.extend(self.set.iter().map(|s| format!("--set={s}")));
        args.extend(self.values.iter().map(|v| format!("--values={}", v.display())));
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// A Helm 3 binary.
#[derive(Debug)]
pub struct Helm {
    bin: PathBuf,
    /// What `helm version` reports, e.g. `v3.17.2`.
    pub version: String,
}

static HELM: OnceLock<Result<Helm, String>> = OnceLock::new();

/// The Helm on `PATH`.
///
/// # Panics
/// When there is none, or it is not Helm 3, saying how to install it.
#[must_use]
pub fn helm() -> &'static Helm {
    match HELM.get_or_init(|| Helm::locate(std::env::var_os("PATH").as_deref())) {
        Ok(h) => h,
        Err(e) => panic!("{e}"),
    }
}

impl Helm {
    /// Finds `helm` on that search path and checks that it is Helm 3.
    ///
    /// # Errors
    /// No helm on the path, one that does not run, or another major version; each says what to install.
    pub fn locate(path: Option<&OsStr>) -> Result<Self, String> {
        let install = format!("run `bash scripts/setup.sh`, which installs Helm {HELM_VERSION} at /usr/local/bin/helm");
        let bin = path
            .into_iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join("helm"))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("`helm` is not on PATH, so the charts cannot be rendered: {install}"))?;
        let out = Command::new(&bin)
            .args(["version", "--template", "{{.Version}}"])
            .output()
            .map_err(|e| format!("cannot run {}: {e}; {install}", bin.display()))?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() || !version.starts_with("v3.") {
            return Err(format!("{} is not Helm 3 (it says {version:?}): {install}", bin.display()));
        }
        Ok(Self { bin, version })
    }

    /// Runs helm with raw arguments; stdout, or stderr (and stdout) as the error.
    ///
    /// # Errors
    /// Helm's own message when it exits non-zero.
    pub fn run(&self, args: &[String], env: &[(String, PathBuf)]) -> Result<String, String> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args);
        // Helm keeps caches and repository lists under these; a test must not read or write the user's.
        let home = std::env::temp_dir().join("chart-tests-helm-home");
        cmd.env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("KUBECONFIG");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().map_err(|e| format!("cannot run helm: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            let mut err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !stdout.trim().is_empty() {
                let _ = write!(err, "\n{}", stdout.trim());
            }
            Err(err)
        }
    }

    /// The `helm template` stream of a chart.
    ///
    /// # Errors
    /// Helm's error (a failing template, values the chart's schema rejects, ...).
    pub fn template(&self, chart: &Path, opts: &Options) -> Result<String, String> {
        let mut args = vec!["template".to_owned(), opts.release.clone(), chart.display().to_string()];
        args.extend(opts.args());
        self.run(&args, &opts.env)
    }

    /// A chart's rendered objects, converted to JSON the way kubectl converts manifests.
    ///
    /// # Errors
    /// Helm's error, or a rendered document that is not a YAML map.
    pub fn render(&self, chart: &Path, opts: &Options) -> Result<Vec<Doc>, String> {
        let stream = self.template(chart, opts)?;
        let docs = split_stream(&stream);
        let objects = self.yaml_to_json(&docs.iter().map(|(_, text)| text.as_str()).collect::<Vec<_>>())?;
        let mut index_in_source: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        let mut out = Vec::new();
        for ((source, _), object) in docs.into_iter().zip(objects) {
            let Some(object) = object else { continue };
            let slot = index_in_source.entry(source.clone()).or_default();
            out.push(Doc { source, index: *slot, object });
            *slot += 1;
        }
        Ok(out)
    }

    /// `helm lint --strict` of a chart; its output.
    ///
    /// # Errors
    /// The lint report when helm finds an error (with `--strict`, a warning too).
    pub fn lint(&self, chart: &Path, opts: &Options) -> Result<String, String> {
        let mut args = vec!["lint".to_owned(), "--strict".to_owned(), chart.display().to_string()];
        args.extend(opts.args());
        self.run(&args, &opts.env)
    }

    /// `helm package` of a chart into `dest`; the archive's path.
    ///
    /// # Errors
    /// Helm's error, or output that does not name the archive.
    pub fn package(&self, chart: &Path, dest: &Path) -> Result<PathBuf, String> {
        let args = vec!["package".to_owned(), chart.display().to_string(), format!("--destination={}", dest.display())];
        let out = self.run(&args, &[])?;
        // "Successfully packaged chart and saved it to: <path>"
        out.rsplit_once(": ")
            .map(|(_, p)| PathBuf::from(p.trim()))
            .filter(|p| p.is_file())
            .ok_or_else(|| format!("helm package said: {out}"))
    }

    /// YAML documents as JSON objects (None for an empty or comment-only document), converted by Helm's `fromYaml`.
    ///
    /// # Errors
    /// A document that is not a YAML map, or helm failing.
    pub fn yaml_to_json(&self, docs: &[&str]) -> Result<Vec<Option<Value>>, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let chart = dir.path().join("yaml2json");
        std::fs::create_dir_all(chart.join("templates")).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(chart.join("docs")).map_err(|e| e.to_string())?;
        std::fs::write(chart.join("Chart.yaml"), "apiVersion: v2\nname: yaml2json\nversion: 0.0.0\n")
            .map_err(|e| e.to_string())?;
        // Files.Glob ranges in path order; the zero-padded names keep the documents' order.
        std::fs::write(
            chart.join("templates/docs.yaml"),
            "{{- $out := list }}\n{{- range $path, $_ := .Files.Glob \"docs/*.yaml\" }}\n\
             {{- $out = append $out ($.Files.Get $path | fromYaml) }}\n{{- end }}\n\
             {\"docs\": {{ toJson $out }}}\n",
        )
        .map_err(|e| e.to_string())?;
        for (i, d) in docs.iter().enumerate() {
            std::fs::write(chart.join(format!("docs/{i:08}.yaml")), d).map_err(|e| e.to_string())?;
        }
        let out = self.template(&chart, &Options::default())?;
        let body = out.lines().filter(|l| !l.starts_with('#') && *l != "---").collect::<Vec<_>>().join("\n");
        let parsed: Value = serde_json::from_str(&body).map_err(|e| format!("yaml2json output: {e}"))?;
        let list = parsed["docs"].as_array().cloned().unwrap_or_default();
        if list.len() != docs.len() {
            return Err(format!("yaml2json returned {} documents for {}", list.len(), docs.len()));
        }
        list.into_iter()
            .zip(docs)
            .map(|(v, text)| match &v {
                // fromYaml reports a parse failure as a map holding only "Error".
                Value::Object(m) if m.len() == 1 && m.contains_key("Error") && !text.contains("Error:") => {
                    Err(format!("not a YAML map: {}\n{text}", m["Error"]))
                }
                Value::Object(m) if m.is_empty() => Ok(None),
                Value::Object(_) => Ok(Some(v)),
                _ => Err(format!("not a YAML map: {text}")),
            })
            .collect()
    }

    /// YAML files (examples, CRDs) as JSON objects, one per non-empty document.
    ///
    /// # Errors
    /// A file that cannot be read or a document that is not a YAML map.
    pub fn yaml_files(&self, files: &[PathBuf]) -> Result<Vec<Doc>, String> {
        let mut docs = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
            for (i, (_, d)) in split_stream(&text).into_iter().enumerate() {
                docs.push((f.display().to_string(), i, d));
            }
        }
        let objects = self.yaml_to_json(&docs.iter().map(|(_, _, t)| t.as_str()).collect::<Vec<_>>())?;
        Ok(docs
            .into_iter()
            .zip(objects)
            .filter_map(|((source, index, _), o)| o.map(|object| Doc { source, index, object }))
            .collect())
    }
}

/// A YAML stream split at its `---` lines, each document with the template named by its `# Source:` line ("" when
/// there is none).
#[must_use]
pub fn split_stream(stream: &str) -> Vec<(String, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let flush = |current: &mut String, docs: &mut Vec<(String, String)>| {
        if current.trim().is_empty() {
            current.clear();
            return;
        }
        let source =
            current.lines().find_map(|l| l.strip_prefix("# Source: ")).map(|s| s.trim().to_owned()).unwrap_or_default();
        docs.push((source, std::mem::take(current)));
    };
    for line in stream.lines() {
        let is_separator = line == "---" || line.strip_prefix("--- ").is_some_and(|rest| rest.trim().is_empty());
        if is_separator {
            flush(&mut current, &mut docs);
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    flush(&mut current, &mut docs);
    docs
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_helm_is_told_to_run_setup() {
        let empty = tempfile::tempdir().expect("tempdir");
        let err = Helm::locate(Some(empty.path().as_os_str())).expect_err("no helm there");
        assert!(err.contains("scripts/setup.sh") && err.contains(HELM_VERSION), "{err}");
        let err = Helm::locate(None).expect_err("no PATH at all");
        assert!(err.contains("not on PATH"), "{err}");
    }

    #[test]
    fn a_helm_that_is_not_helm_3_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = dir.path().join("helm");
        std::fs::write(&fake, "#!/bin/sh\necho v4.1.4\n").expect("write");
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let err = Helm::locate(Some(dir.path().as_os_str())).expect_err("helm 4");
        assert!(err.contains("not Helm 3") && err.contains("v4.1.4"), "{err}");
    }

    #[test]
    fn a_stream_splits_at_separator_lines_only() {
        let docs = split_stream(
            "---\n# Source: c/templates/a.yaml\na: 1\nb: |\n  ---\n  x\n---\n# Source: c/t/b.yaml\nc: 2\n",
        );
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].0, "c/templates/a.yaml");
        assert!(docs[0].1.contains("  ---\n"), "a --- inside a block scalar stays");
        assert_eq!(docs[1].0, "c/t/b.yaml");
    }
}
