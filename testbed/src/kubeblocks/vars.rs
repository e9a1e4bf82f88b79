//! Resolution of a ComponentDefinition's `vars` for one component, as each line's
//! `pkg/controller/component/vars.go` does it (`ResolveTemplateNEnvVars`).
//!
//! Emulated, value by value:
//! - `value`, `clusterVarRef` (`namespace`, `clusterName`, `clusterUID`), `componentVarRef` (`componentName`,
//!   `shortName` — always the *resolving* component's short name, `replicas`, `podNames`, `podFQDNs` from the desired
//!   replicas), `serviceVarRef` (`host`: the Service name, `<cluster>-<comp>[-<serviceName>]`, or
//!   `<cluster>-<comp>-headless` for `name: headless`), `credentialVarRef` (`password`/`username` of a system account);
//! - which components a reference names (`resolveReferentComponents`): the resolving component itself when `compDef`
//!   is empty or matches its own definition without a multiple-object option; otherwise every existing Component
//!   object of the cluster whose definition matches (prefix or regex, `PrefixOrRegexMatched`), one being deleted
//!   included; without `requireAllComponentObjects` one match is used, none is "not found", several need the option;
//!   with it, the count is compared with the cluster spec's (1 per component spec, `shards` per sharding): **1.0
//!   requires it equal** ("insufficient component objects to resolve vars, expected: N, actual: M"), **1.1 fails only
//!   when fewer exist** (or when the spec expects none but some exist);
//! - `multipleClusterObjectOption`: exactly one object gives the bare value without its key; several give
//!   `individual` (`NAME` empty plus `NAME_<UPPER(short name, - → _)>`) or `combined` (`<short>:<value>` joined with
//!   `,`, or the `flattenFormat` delimiters, in sorted short-name order; `newVarSuffix` moves it to `NAME_<suffix>`);
//! - `expression`: evaluated over the resolved non-credential values (names with `-` as `_`); only `{{ .NAME }}`
//!   substitutions are supported, anything else is refused as unsupported by the emulation;
//! - the error texts KubeBlocks reports (`has no Component object  found when resolving vars`, ...).
//!
//! Credential vars stay out of the template vars (KubeBlocks passes them as `secretKeyRef`), so an action's
//! parameters never carry them; they reach actions through the kbagent container's environment only.
//!
//! Does NOT model: `configMapKeyRef`, `secretKeyRef`, `hostNetworkVarRef`, `tlsVarRef`, `serviceRefVarRef`,
//! `resourceVarRef`, `podNamesForRole`/`podFQDNsForRole`, `serviceVersion`, service `port`/`loadBalancer`/
//! `serviceType`, pod services, instance templates and offline instances (pod names are `<comp>-0..replicas-1`),
//! `$(VAR)` references inside values, Go template functions in expressions. A chart using one of these makes the
//! resolution fail with an "unsupported by the emulation" error rather than pass silently.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::Line;

/// One entry of `spec.vars`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VarDef {
    /// Name.
    pub name: String,
    /// Literal value.
    #[serde(default)]
    pub value: Option<String>,
    /// Where the value comes from.
    #[serde(default)]
    pub value_from: Option<VarSource>,
    /// A Go template over the resolved values.
    #[serde(default)]
    pub expression: Option<String>,
}

/// `valueFrom` of a var.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VarSource {
    /// Cluster facts.
    #[serde(default)]
    pub cluster_var_ref: Option<ClusterVarSelector>,
    /// Component facts.
    #[serde(default)]
    pub component_var_ref: Option<ComponentVarSelector>,
    /// Service facts.
    #[serde(default)]
    pub service_var_ref: Option<ServiceVarSelector>,
    /// A system account's credential.
    #[serde(default)]
    pub credential_var_ref: Option<CredentialVarSelector>,
    /// Other sources (unsupported).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `clusterVarRef`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterVarSelector {
    /// The namespace.
    pub namespace: Option<String>,
    /// The cluster name.
    pub cluster_name: Option<String>,
    /// The cluster UID.
    #[serde(rename = "clusterUID")]
    pub cluster_uid: Option<String>,
}

/// `multipleClusterObjectOption.combinedOption.flattenFormat`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlattenFormat {
    /// Between pairs.
    pub delimiter: String,
    /// Between key and value.
    pub key_value_delimiter: String,
}

/// `multipleClusterObjectOption.combinedOption`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CombinedOption {
    /// Put the value in `NAME_<suffix>` and leave `NAME` empty.
    pub new_var_suffix: Option<String>,
    /// `Flatten` (only supported format).
    pub value_format: Option<String>,
    /// Delimiters.
    pub flatten_format: Option<FlattenFormat>,
}

/// `multipleClusterObjectOption`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MultipleClusterObjectOption {
    /// Compare the number of matching objects with the spec's.
    pub require_all_component_objects: Option<bool>,
    /// `individual | combined`.
    #[serde(default)]
    pub strategy: String,
    /// For `combined`.
    pub combined_option: Option<CombinedOption>,
}

/// `ClusterObjectReference`, shared by the referencing selectors.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterObjectReference {
    /// Definition pattern; empty = the resolving component.
    pub comp_def: Option<String>,
    /// Object name (services, accounts).
    pub name: Option<String>,
    /// Whether the object may be missing.
    pub optional: Option<bool>,
    /// How several matches combine.
    pub multiple_cluster_object_option: Option<MultipleClusterObjectOption>,
}

/// `componentVarRef`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentVarSelector {
    /// Reference.
    #[serde(flatten)]
    pub object: ClusterObjectReference,
    /// `<cluster>-<comp>`.
    pub component_name: Option<String>,
    /// The resolving component's short name.
    pub short_name: Option<String>,
    /// Desired replicas.
    pub replicas: Option<String>,
    /// Pod names.
    pub pod_names: Option<String>,
    /// Pod FQDNs.
    #[serde(rename = "podFQDNs")]
    pub pod_fqdns: Option<String>,
    /// Anything else (unsupported).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `serviceVarRef`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceVarSelector {
    /// Reference (`name` is the service's name in the definition).
    #[serde(flatten)]
    pub object: ClusterObjectReference,
    /// The Service name.
    pub host: Option<String>,
    /// Anything else (unsupported).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `credentialVarRef`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialVarSelector {
    /// Reference (`name` is the system account).
    #[serde(flatten)]
    pub object: ClusterObjectReference,
    /// The account name.
    pub username: Option<String>,
    /// The account password.
    pub password: Option<String>,
    /// Anything else (unsupported).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// What the API server holds about one Component of the cluster, as var resolution reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentFacts {
    /// Short name, `<comp>` (`<sharding>-<id>` for a shard).
    pub short: String,
    /// Its ComponentDefinition's name.
    pub comp_def: String,
    /// `spec.replicas`.
    pub replicas: u32,
    /// Services of its definition: var name → Service name suffix (`serviceName`, may be empty).
    pub services: BTreeMap<String, String>,
    /// System accounts: name → password.
    pub accounts: BTreeMap<String, String>,
}

/// Everything var resolution of one component reads.
#[derive(Debug, Clone)]
pub struct VarContext {
    /// The line whose rules apply.
    pub line: Line,
    /// Namespace.
    pub namespace: String,
    /// Cluster name.
    pub cluster: String,
    /// Cluster UID.
    pub cluster_uid: String,
    /// The cluster domain of pod FQDNs.
    pub cluster_domain: String,
    /// The resolving component's short name.
    pub self_short: String,
    /// The resolving component's definition.
    pub self_comp_def: String,
    /// Every Component object of the cluster that exists (those being deleted included).
    pub components: Vec<ComponentFacts>,
    /// Definition name → how many components the Cluster spec asks for (`CompDef2CompCnt`).
    pub expected: BTreeMap<String, u32>,
}

/// The result of a resolution.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvedVars {
    /// Non-credential vars (KubeBlocks' `TemplateVars`): what action parameters carry.
    pub template: BTreeMap<String, String>,
    /// Credential vars with their secret values: only in the containers' environment.
    pub credentials: BTreeMap<String, String>,
}

impl ResolvedVars {
    /// Both sets: a container's environment.
    pub fn all(&self) -> BTreeMap<String, String> {
        let mut all = self.template.clone();
        all.extend(self.credentials.clone());
        all
    }
}

/// `PrefixOrRegexMatched`: a prefix of the name, or (when the pattern contains a regular-expression metacharacter,
/// as Go's `regexp.QuoteMeta` sees them) a regular expression matching it.
pub fn prefix_or_regex_matched(name: &str, pattern: &str) -> bool {
    if name.starts_with(pattern) {
        return true;
    }
    let is_regex = pattern.chars().any(|c| "\\.+*?()|[]{}^$".contains(c));
    is_regex && compiled(pattern).is_some_and(|re| re.is_match(name))
}

/// Patterns compiled once: resolution matches the same few patterns over and over.
fn compiled(pattern: &str) -> Option<regex::Regex> {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<BTreeMap<String, Option<regex::Regex>>>> =
        std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    cache.entry(pattern.to_owned()).or_insert_with(|| regex::Regex::new(pattern).ok()).clone()
}

/// A pod's FQDN, `PodFQDN`: `<pod>.<cluster>-<comp>-headless.<namespace>.svc.<domain>`.
pub fn pod_fqdn(namespace: &str, comp_full: &str, pod: &str, domain: &str) -> String {
    format!("{pod}.{comp_full}-headless.{namespace}.svc.{domain}")
}

#[derive(Debug)]
enum Referents {
    NotFound,
    Names(Vec<String>),
}

impl VarContext {
    fn full(&self, short: &str) -> String {
        format!("{}-{short}", self.cluster)
    }

    fn comp(&self, short: &str) -> Option<&ComponentFacts> {
        self.components.iter().find(|c| c.short == short)
    }

    /// `resolveReferentComponents`.
    fn referents(&self, object: &ClusterObjectReference) -> Result<Referents, String> {
        let mopt = object.multiple_cluster_object_option.as_ref();
        let pattern = object.comp_def.as_deref().unwrap_or_default();
        if pattern.is_empty() || (prefix_or_regex_matched(&self.self_comp_def, pattern) && mopt.is_none()) {
            return Ok(Referents::Names(vec![self.self_short.clone()]));
        }
        let mut names: Vec<String> = self
            .components
            .iter()
            .filter(|c| prefix_or_regex_matched(&c.comp_def, pattern))
            .map(|c| c.short.clone())
            .collect();
        names.sort();
        let require_all = mopt.and_then(|m| m.require_all_component_objects).unwrap_or(false);
        if !require_all {
            return match names.len() {
                0 => Ok(Referents::NotFound),
                1 => Ok(Referents::Names(names)),
                _ if mopt.is_none() => Err(format!("more than one referent component found: {}", names.join(","))),
                _ => Ok(Referents::Names(names)),
            };
        }
        let total: u32 =
            self.expected.iter().filter(|(def, _)| prefix_or_regex_matched(def, pattern)).map(|(_, n)| n).sum();
        let actual = names.len();
        let insufficient =
            || format!("insufficient component objects to resolve vars, expected: {total}, actual: {actual}");
        match self.line {
            Line::V1_0 => {
                if actual != total as usize {
                    return Err(insufficient());
                }
            }
            Line::V1_1 => {
                if total == 0 && actual > 0 {
                    return Err(format!("unexpected component objects found when resolving vars, actual: {actual}"));
                }
                if actual < total as usize {
                    return Err(insufficient());
                }
            }
        }
        if names.is_empty() {
            return Ok(Referents::NotFound);
        }
        Ok(Referents::Names(names))
    }

    /// The value of one selector for one referent component, `None` when the object does not exist.
    fn value_of(&self, kind: Kind<'_>, short: &str) -> Result<Option<String>, String> {
        let Some(comp) = self.comp(short) else { return Ok(None) };
        let full = self.full(short);
        match kind {
            Kind::ComponentName => Ok(Some(full)),
            Kind::ShortName => Ok(Some(self.self_short.clone())),
            Kind::Replicas => Ok(Some(comp.replicas.to_string())),
            Kind::PodNames | Kind::PodFqdns => {
                let names: Vec<String> = (0..comp.replicas)
                    .map(|i| {
                        let pod = format!("{full}-{i}");
                        if kind == Kind::PodFqdns {
                            pod_fqdn(&self.namespace, &full, &pod, &self.cluster_domain)
                        } else {
                            pod
                        }
                    })
                    .collect();
                Ok(Some(names.join(",")))
            }
            Kind::ServiceHost(name) => {
                if name == "headless" {
                    return Ok(Some(format!("{full}-headless")));
                }
                match comp.services.get(name) {
                    Some(suffix) if suffix.is_empty() => Ok(Some(full)),
                    Some(suffix) => Ok(Some(format!("{full}-{suffix}"))),
                    None => Err(format!(
                        "service {name} not defined in the component definition that component {short} used"
                    )),
                }
            }
            Kind::Password(account) => Ok(comp.accounts.get(account).cloned()),
            Kind::Username(account) => Ok(comp.accounts.contains_key(account).then(|| account.to_owned())),
        }
    }

    /// `resolveClusterObjectVars` + the multiple-object handling, for one var.
    fn resolve_object_var(
        &self,
        name: &str,
        kind_name: &str,
        object: &ClusterObjectReference,
        kind: Kind<'_>,
    ) -> Result<Vec<(String, String)>, String> {
        let obj_name = object.name.as_deref().unwrap_or_default();
        let referents = self
            .referents(object)
            .map_err(|e| format!("resolving vars from {kind_name} object {obj_name} error: {e}"))?;
        let names = match referents {
            Referents::NotFound => Vec::new(),
            Referents::Names(names) => names,
        };
        let mut values: BTreeMap<String, Option<String>> = BTreeMap::new();
        for short in &names {
            let v = self
                .value_of(kind, short)
                .map_err(|e| format!("resolving vars from {kind_name} object {obj_name} error: {e}"))?;
            values.insert(short.clone(), v);
        }
        let optional = object.optional == Some(true);
        let all_missing = values.values().all(Option::is_none);
        if optional && all_missing {
            return Ok(Vec::new());
        }
        if !optional && (values.is_empty() || values.values().any(Option::is_none)) {
            return Err(format!("has no {kind_name} object {obj_name} found when resolving vars"));
        }
        if values.len() <= 1 {
            return Ok(values.into_values().flatten().map(|v| (name.to_owned(), v)).collect());
        }
        let mopt = object.multiple_cluster_object_option.clone().unwrap_or_default();
        match mopt.strategy.as_str() {
            "individual" => {
                let mut out = vec![(name.to_owned(), String::new())];
                for (short, v) in &values {
                    out.push((
                        format!("{name}_{}", short.replace('-', "_").to_uppercase()),
                        v.clone().unwrap_or_default(),
                    ));
                }
                Ok(out)
            }
            "combined" => {
                if matches!(kind, Kind::Password(_) | Kind::Username(_)) {
                    let first = values.keys().next().cloned().unwrap_or_default();
                    return Err(format!(
                        "combined strategy doesn't support vars with valueFrom values, var: {name}, component: {first}"
                    ));
                }
                let opt = mopt.combined_option.unwrap_or_default();
                let (pair, kv) = opt
                    .flatten_format
                    .as_ref()
                    .map_or((",", ":"), |f| (f.delimiter.as_str(), f.key_value_delimiter.as_str()));
                let value = values
                    .iter()
                    .map(|(short, v)| format!("{short}{kv}{}", v.clone().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(pair);
                match &opt.new_var_suffix {
                    None => Ok(vec![(name.to_owned(), value)]),
                    Some(suffix) => Ok(vec![(name.to_owned(), String::new()), (format!("{name}_{suffix}"), value)]),
                }
            }
            other => Err(format!("unknown multiple cluster objects strategy: {other}")),
        }
    }

    /// Resolves `defs` for the component this context describes.
    pub fn resolve(&self, defs: &[VarDef]) -> Result<ResolvedVars, String> {
        let mut template: Vec<(String, String)> = Vec::new();
        let mut credentials: BTreeMap<String, String> = BTreeMap::new();
        for def in defs {
            let Some(source) = &def.value_from else {
                template.push((def.name.clone(), def.value.clone().unwrap_or_default()));
                continue;
            };
            if !source.other.is_empty() {
                return Err(unsupported(
                    &def.name,
                    &format!("valueFrom {:?}", source.other.keys().collect::<Vec<_>>()),
                ));
            }
            if let Some(sel) = &source.cluster_var_ref {
                let value = if sel.namespace.is_some() {
                    self.namespace.clone()
                } else if sel.cluster_name.is_some() {
                    self.cluster.clone()
                } else if sel.cluster_uid.is_some() {
                    self.cluster_uid.clone()
                } else {
                    continue;
                };
                template.push((def.name.clone(), value));
            } else if let Some(sel) = &source.component_var_ref {
                if !sel.other.is_empty() {
                    return Err(unsupported(
                        &def.name,
                        &format!("componentVarRef {:?}", sel.other.keys().collect::<Vec<_>>()),
                    ));
                }
                let kind = if sel.component_name.is_some() {
                    Kind::ComponentName
                } else if sel.short_name.is_some() {
                    Kind::ShortName
                } else if sel.replicas.is_some() {
                    Kind::Replicas
                } else if sel.pod_fqdns.is_some() {
                    Kind::PodFqdns
                } else if sel.pod_names.is_some() {
                    Kind::PodNames
                } else {
                    continue;
                };
                template.extend(self.resolve_object_var(&def.name, "Component", &sel.object, kind)?);
            } else if let Some(sel) = &source.service_var_ref {
                if !sel.other.is_empty() || sel.host.is_none() {
                    return Err(unsupported(&def.name, "serviceVarRef other than host"));
                }
                let svc = sel.object.name.as_deref().unwrap_or_default();
                template.extend(self.resolve_object_var(&def.name, "Service", &sel.object, Kind::ServiceHost(svc))?);
            } else if let Some(sel) = &source.credential_var_ref {
                if !sel.other.is_empty() {
                    return Err(unsupported(&def.name, "credentialVarRef other than username/password"));
                }
                let account = sel.object.name.as_deref().unwrap_or_default();
                let kind = if sel.password.is_some() { Kind::Password(account) } else { Kind::Username(account) };
                credentials.extend(self.resolve_object_var(&def.name, "Credential", &sel.object, kind)?);
            } else {
                return Err(unsupported(&def.name, "an empty valueFrom"));
            }
        }
        // Expressions see every non-credential value (credentials are secretKeyRefs there), names with - as _.
        let mut values: BTreeMap<String, String> =
            template.iter().map(|(k, v)| (k.replace('-', "_"), v.clone())).collect();
        for def in defs {
            let Some(expr) = def.expression.as_deref().filter(|e| !e.is_empty()) else { continue };
            if credentials.contains_key(&def.name) {
                continue;
            }
            let value = evaluate(expr, &values).map_err(|e| unsupported(&def.name, &e))?;
            match template.iter_mut().find(|(k, _)| *k == def.name) {
                Some(entry) => entry.1 = value.clone(),
                None => template.push((def.name.clone(), value.clone())),
            }
            values.insert(def.name.replace('-', "_"), value);
        }
        Ok(ResolvedVars { template: template.into_iter().collect(), credentials })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind<'a> {
    ComponentName,
    ShortName,
    Replicas,
    PodNames,
    PodFqdns,
    ServiceHost(&'a str),
    Password(&'a str),
    Username(&'a str),
}

fn unsupported(var: &str, what: &str) -> String {
    format!("var {var}: {what} is unsupported by the KubeBlocks emulation")
}

/// `{{ .NAME }}` substitution, Go's text/template restricted to field references.
fn evaluate(expr: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or_else(|| format!("expression {expr:?} has an unclosed action"))?;
        let action = after[..end].trim().trim_start_matches('-').trim_end_matches('-').trim();
        let name = action
            .strip_prefix('.')
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .ok_or_else(|| format!("expression {expr:?}: only {{{{ .NAME }}}} is understood"))?;
        out.push_str(values.get(name).map_or("<no value>", String::as_str));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATTERN: &str = "^pika-group-[0-9]";

    fn shard(short: &str, replicas: u32) -> ComponentFacts {
        ComponentFacts {
            short: short.into(),
            comp_def: "pika-group-0.1.0".into(),
            replicas,
            services: BTreeMap::new(),
            accounts: BTreeMap::new(),
        }
    }

    fn ctx(line: Line, shards: &[(&str, u32)], expected: u32) -> VarContext {
        let mut components: Vec<ComponentFacts> = shards.iter().map(|(s, r)| shard(s, *r)).collect();
        components.push(ComponentFacts {
            short: "codis-dashboard".into(),
            comp_def: "pika-codis-dashboard-0.1.0".into(),
            replicas: 1,
            services: BTreeMap::from([("dashboard".into(), String::new())]),
            accounts: BTreeMap::from([("default".into(), "s3cret".into())]),
        });
        VarContext {
            line,
            namespace: "ns1".into(),
            cluster: "c1".into(),
            cluster_uid: "uid-1".into(),
            cluster_domain: "cluster.local".into(),
            self_short: shards[0].0.into(),
            self_comp_def: "pika-group-0.1.0".into(),
            components,
            expected: BTreeMap::from([("pika-group-0.1.0".into(), expected), ("pika-codis-dashboard-0.1.0".into(), 1)]),
        }
    }

    fn all_shards(require_all: Option<bool>) -> VarDef {
        let mopt = match require_all {
            Some(r) => format!("requireAllComponentObjects: {r}\n      "),
            None => String::new(),
        };
        let yaml = format!(
            "name: ALL_SHARDS_POD_FQDNS\nvalueFrom:\n  componentVarRef:\n    compDef: \"{PATTERN}\"\n    optional: false\n    podFQDNs: Required\n    multipleClusterObjectOption:\n      {mopt}strategy: combined\n      combinedOption:\n        flattenFormat:\n          delimiter: \";\"\n          keyValueDelimiter: \":\"\n"
        );
        serde_saphyr::from_str(&yaml).unwrap()
    }

    fn fqdn(comp: &str, i: u32) -> String {
        format!("c1-{comp}-{i}.c1-{comp}-headless.ns1.svc.cluster.local")
    }

    #[test]
    fn combined_fqdns_are_keyed_by_sorted_short_names_with_the_flatten_delimiters() {
        // Created in this order; KubeBlocks sorts the short names.
        let c = ctx(Line::V1_0, &[("pika-x2z", 2), ("pika-b7k", 2), ("pika-m4q", 1)], 3);
        let got = c.resolve(&[all_shards(Some(true))]).unwrap();
        let expected = format!(
            "pika-b7k:{},{};pika-m4q:{};pika-x2z:{},{}",
            fqdn("pika-b7k", 0),
            fqdn("pika-b7k", 1),
            fqdn("pika-m4q", 0),
            fqdn("pika-x2z", 0),
            fqdn("pika-x2z", 1)
        );
        assert_eq!(got.template["ALL_SHARDS_POD_FQDNS"], expected);
    }

    #[test]
    fn one_shard_gives_the_bare_value_without_its_key_on_both_lines() {
        for line in [Line::V1_0, Line::V1_1] {
            let c = ctx(line, &[("pika-b7k", 2)], 1);
            let got = c.resolve(&[all_shards(Some(true))]).unwrap();
            assert_eq!(
                got.template["ALL_SHARDS_POD_FQDNS"],
                format!("{},{}", fqdn("pika-b7k", 0), fqdn("pika-b7k", 1))
            );
        }
    }

    #[test]
    fn require_all_on_1_0_needs_the_exact_count_so_a_shard_scale_in_deadlocks() {
        // shards: 3 → 2; the deleted shard's Component still exists.
        let c = ctx(Line::V1_0, &[("pika-b7k", 2), ("pika-m4q", 2), ("pika-x2z", 2)], 2);
        let err = c.resolve(&[all_shards(Some(true))]).unwrap_err();
        assert_eq!(
            err,
            "resolving vars from Component object  error: insufficient component objects to resolve vars, expected: 2, actual: 3"
        );
        // And while a new shard's Component is not created yet.
        let c = ctx(Line::V1_0, &[("pika-b7k", 2)], 2);
        assert!(c.resolve(&[all_shards(Some(true))]).unwrap_err().ends_with("expected: 2, actual: 1"));
    }

    #[test]
    fn require_all_on_1_1_fails_only_when_fewer_exist() {
        let c = ctx(Line::V1_1, &[("pika-b7k", 2), ("pika-m4q", 2), ("pika-x2z", 2)], 2);
        let got = c.resolve(&[all_shards(Some(true))]).unwrap();
        assert_eq!(
            got.template["ALL_SHARDS_POD_FQDNS"].matches(';').count(),
            2,
            "all three, the deleting one included"
        );
        let c = ctx(Line::V1_1, &[("pika-b7k", 2)], 2);
        assert_eq!(
            c.resolve(&[all_shards(Some(true))]).unwrap_err(),
            "resolving vars from Component object  error: insufficient component objects to resolve vars, expected: 2, actual: 1"
        );
        let c = ctx(Line::V1_1, &[("pika-b7k", 2)], 0);
        assert!(c
            .resolve(&[all_shards(Some(true))])
            .unwrap_err()
            .ends_with("unexpected component objects found when resolving vars, actual: 1"));
    }

    #[test]
    fn without_require_all_every_existing_component_counts_on_both_lines() {
        for line in [Line::V1_0, Line::V1_1] {
            let c = ctx(line, &[("pika-m4q", 1), ("pika-b7k", 1)], 1);
            let got = c.resolve(&[all_shards(None)]).unwrap();
            assert_eq!(
                got.template["ALL_SHARDS_POD_FQDNS"],
                format!("pika-b7k:{};pika-m4q:{}", fqdn("pika-b7k", 0), fqdn("pika-m4q", 0))
            );
        }
    }

    #[test]
    fn self_references_names_and_individual_strategy() {
        let yaml = r#"
- name: SHARD_NAME
  valueFrom: {componentVarRef: {optional: false, componentName: Required}}
- name: SHORT
  valueFrom: {componentVarRef: {compDef: "^pika-codis-dashboard-[0-9]", optional: false, shortName: Required}}
- name: SHARD_POD_FQDNS
  valueFrom: {componentVarRef: {optional: false, podFQDNs: Required}}
- name: PODS
  valueFrom: {componentVarRef: {compDef: "^pika-group-", optional: false, podNames: Required, multipleClusterObjectOption: {strategy: individual}}}
- name: CLUSTER_NAME
  valueFrom: {clusterVarRef: {clusterName: Required}}
- name: NS
  valueFrom: {clusterVarRef: {namespace: Required}}
- name: PORT
  value: "9221"
- name: EMPTY
"#;
        let defs: Vec<VarDef> = serde_saphyr::from_str(yaml).unwrap();
        let c = ctx(Line::V1_1, &[("pika-b7k", 2), ("pika-m4q", 1)], 2);
        let got = c.resolve(&defs).unwrap();
        let want: BTreeMap<String, String> = [
            ("SHARD_NAME", "c1-pika-b7k".to_owned()),
            ("SHORT", "pika-b7k".to_owned()),
            ("SHARD_POD_FQDNS", format!("{},{}", fqdn("pika-b7k", 0), fqdn("pika-b7k", 1))),
            ("PODS", String::new()),
            ("PODS_PIKA_B7K", "c1-pika-b7k-0,c1-pika-b7k-1".to_owned()),
            ("PODS_PIKA_M4Q", "c1-pika-m4q-0".to_owned()),
            ("CLUSTER_NAME", "c1".to_owned()),
            ("NS", "ns1".to_owned()),
            ("PORT", "9221".to_owned()),
            ("EMPTY", String::new()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(got.template, want);
        assert!(got.credentials.is_empty());
    }

    #[test]
    fn services_expressions_and_credentials() {
        let yaml = r#"
- name: CODIS_DASHBOARD_ADDR
  valueFrom: {serviceVarRef: {compDef: "^pika-codis-dashboard-[0-9]", name: dashboard, optional: false, host: Required}}
  expression: "{{ .CODIS_DASHBOARD_ADDR }}:18080"
- name: PIKA_PASSWORD
  valueFrom: {credentialVarRef: {compDef: "^pika-codis-dashboard-[0-9]", name: default, optional: false, password: Required}}
- name: ETCD_ENDPOINTS
  valueFrom: {serviceVarRef: {compDef: "^pika-etcd-[0-9]", name: client, optional: false, host: Required}}
"#;
        let defs: Vec<VarDef> = serde_saphyr::from_str(yaml).unwrap();
        let c = ctx(Line::V1_0, &[("pika-b7k", 2)], 1);
        let err = c.resolve(&defs).unwrap_err();
        assert_eq!(err, "has no Service object client found when resolving vars", "etcd does not exist yet");
        let got = c.resolve(&defs[..2]).unwrap();
        assert_eq!(
            got.template,
            BTreeMap::from([("CODIS_DASHBOARD_ADDR".to_owned(), "c1-codis-dashboard:18080".to_owned())])
        );
        assert_eq!(got.credentials, BTreeMap::from([("PIKA_PASSWORD".to_owned(), "s3cret".to_owned())]));
        let bad: Vec<VarDef> =
            serde_saphyr::from_str("- {name: X, valueFrom: {serviceVarRef: {compDef: \"^pika-codis-dashboard-\", name: nope, host: Required}}}").unwrap();
        assert_eq!(
            c.resolve(&bad).unwrap_err(),
            "resolving vars from Service object nope error: service nope not defined in the component definition that component codis-dashboard used"
        );
    }

    #[test]
    fn no_match_and_unsupported_sources_are_errors() {
        let c = ctx(Line::V1_0, &[("pika-b7k", 2)], 1);
        let none: Vec<VarDef> = serde_saphyr::from_str(
            "- {name: X, valueFrom: {componentVarRef: {compDef: \"^nothing-\", optional: false, replicas: Required}}}",
        )
        .unwrap();
        assert_eq!(c.resolve(&none).unwrap_err(), "has no Component object  found when resolving vars");
        let optional: Vec<VarDef> = serde_saphyr::from_str(
            "- {name: X, valueFrom: {componentVarRef: {compDef: \"^nothing-\", optional: true, replicas: Required}}}",
        )
        .unwrap();
        assert_eq!(c.resolve(&optional).unwrap(), ResolvedVars::default());
        // A pattern matching the resolving component's own definition, without the option, means itself.
        let own: Vec<VarDef> = serde_saphyr::from_str(
            "- {name: X, valueFrom: {componentVarRef: {compDef: \"^pika-\", optional: false, replicas: Required}}}",
        )
        .unwrap();
        assert_eq!(c.resolve(&own).unwrap().template["X"], "2");
        let mut c2 = c.clone();
        c2.components.push(ComponentFacts {
            short: "codis-proxy".into(),
            comp_def: "pika-codis-proxy-0.1.0".into(),
            ..shard("x", 2)
        });
        let two: Vec<VarDef> =
            serde_saphyr::from_str("- {name: X, valueFrom: {componentVarRef: {compDef: \"^pika-codis-\", optional: false, replicas: Required}}}").unwrap();
        assert_eq!(
            c2.resolve(&two).unwrap_err(),
            "resolving vars from Component object  error: more than one referent component found: codis-dashboard,codis-proxy"
        );
        let odd: Vec<VarDef> =
            serde_saphyr::from_str("- {name: X, valueFrom: {configMapKeyRef: {name: a, key: b}}}").unwrap();
        assert!(c.resolve(&odd).unwrap_err().contains("unsupported by the KubeBlocks emulation"));
    }

    #[test]
    fn prefixes_and_regular_expressions_match_as_kubeblocks_matches_them() {
        assert!(prefix_or_regex_matched("pika-group-0.1.0", "pika-group"));
        assert!(prefix_or_regex_matched("pika-group-0.1.0", "^pika-group-[0-9]"));
        assert!(!prefix_or_regex_matched("pika-group-config", "^pika-group-[0-9]"));
        // No metacharacter: a plain string, never a regular expression.
        assert!(!prefix_or_regex_matched("pika-group-0.1.0", "group"));
    }
}
