//! The CEL rules (`x-kubernetes-validations`) of the KubeBlocks CRDs, as predicates.
//!
//! No CEL interpreter is available offline, so each rule the shared CRDs contain is implemented here by its exact
//! text. A rule that is not known fails validation instead of being skipped, so that a CRD update cannot silently
//! weaken the tests. Transition rules (those reading `oldSelf`) only apply to updates and are skipped: the charts
//! create objects.

use serde_json::Value;

/// What a rule says about a node.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The node satisfies the rule.
    Holds,
    /// The node violates the rule.
    Violated,
    /// The rule compares with the old object: not applicable to a create.
    Transition,
}

fn has(v: &Value, field: &str) -> bool {
    v.get(field).is_some_and(|f| !f.is_null())
}

fn int(v: &Value, field: &str) -> i64 {
    v.get(field).and_then(Value::as_i64).unwrap_or_default()
}

fn verdict(ok: bool) -> Verdict {
    if ok {
        Verdict::Holds
    } else {
        Verdict::Violated
    }
}

/// Evaluates one rule on the node it is attached to.
///
/// # Errors
/// A rule these tests do not implement (its text is returned).
pub fn eval(rule: &str, node: &Value) -> Result<Verdict, String> {
    if rule.contains("oldSelf") {
        return Ok(Verdict::Transition);
    }
    let empty = serde_json::Map::new();
    let obj = node.as_object().unwrap_or(&empty);
    let items = node.as_array().map_or(&[][..], Vec::as_slice);
    Ok(match rule {
        "self.minReplicas <= self.maxReplicas" => verdict(int(node, "minReplicas") <= int(node, "maxReplicas")),
        "self.minReplicas >= 0 && self.maxReplicas <= 16384" => {
            verdict(int(node, "minReplicas") >= 0 && int(node, "maxReplicas") <= 16384)
        }
        "self.minShards <= self.maxShards" => verdict(int(node, "minShards") <= int(node, "maxShards")),
        "self.minShards >= 0 && self.maxShards <= 2048" => {
            verdict(int(node, "minShards") >= 0 && int(node, "maxShards") <= 2048)
        }
        "self.all(key, size(key) <= 32)" => verdict(obj.keys().all(|k| k.chars().count() <= 32)),
        "self.all(key, size(self[key]) <= 256)" => {
            verdict(obj.values().all(|v| v.as_str().is_some_and(|s| s.chars().count() <= 256)))
        }
        "self.all(x, size(self.filter(c, c.name == x.name)) == 1)" => {
            verdict(items.iter().all(|x| items.iter().filter(|c| c.get("name") == x.get("name")).count() == 1))
        }
        "self.all(x, size(self.filter(c, has(c.componentDef))) == 0) || self.all(x, size(self.filter(c, \
         has(c.componentDef))) == size(self))" => {
            let with = items.iter().filter(|c| has(c, "componentDef")).count();
            verdict(with == 0 || with == items.len())
        }
        "!has(self.secretRefRevision) || size(self.secretRefRevision) == 0 || has(self.secretRef)" => verdict(
            !has(node, "secretRefRevision")
                || node["secretRefRevision"].as_str().is_some_and(str::is_empty)
                || has(node, "secretRef"),
        ),
        "(has(self.componentName) && !has(self.componentObjectName)) || (!has(self.componentName) && \
         has(self.componentObjectName))" => verdict(has(node, "componentName") != has(node, "componentObjectName")),
        "has(self.cancel) && self.cancel ? (self.type in ['VerticalScaling', 'HorizontalScaling']) : true" => {
            let cancel = node.get("cancel").and_then(Value::as_bool).unwrap_or(false);
            let ty = node.get("type").and_then(Value::as_str).unwrap_or_default();
            verdict(!cancel || ty == "VerticalScaling" || ty == "HorizontalScaling")
        }
        "has(self.componentDefinitionName) || has(self.serviceVersion)" => {
            verdict(has(node, "componentDefinitionName") || has(node, "serviceVersion"))
        }
        "has(self.objectKey) || has(self.actionName)" => verdict(has(node, "objectKey") || has(node, "actionName")),
        "has(self.shards) ? (!has(self.scaleOut) && !has(self.scaleIn)) : true" => {
            verdict(!has(node, "shards") || (!has(node, "scaleOut") && !has(node, "scaleIn")))
        }
        "has(self.type) && self.type == 'Helm' ?  has(self.helm) : !has(self.helm)" => {
            let helm_type = node.get("type").and_then(Value::as_str) == Some("Helm");
            verdict(if helm_type { has(node, "helm") } else { !has(node, "helm") })
        }
        "self.chartLocationURL.startsWith('file://') ? has(self.chartsImage) : true" => {
            let file = node.get("chartLocationURL").and_then(Value::as_str).is_some_and(|u| u.starts_with("file://"));
            verdict(!file || has(node, "chartsImage"))
        }
        "has(self.workloadType) && self.workloadType == 'Consensus' ? (has(self.consensusSpec) || \
         has(self.rsmSpec)) : !has(self.consensusSpec)" => {
            let consensus = node.get("workloadType").and_then(Value::as_str) == Some("Consensus");
            verdict(if consensus {
                has(node, "consensusSpec") || has(node, "rsmSpec")
            } else {
                !has(node, "consensusSpec")
            })
        }
        other => return Err(other.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn switchover_needs_exactly_one_of_component_name_and_object_name() {
        let rule = "(has(self.componentName) && !has(self.componentObjectName)) || (!has(self.componentName) && \
                    has(self.componentObjectName))";
        assert_eq!(eval(rule, &json!({"componentName": "a"})), Ok(Verdict::Holds));
        assert_eq!(eval(rule, &json!({"componentName": "a", "componentObjectName": "b"})), Ok(Verdict::Violated));
        assert_eq!(eval(rule, &json!({})), Ok(Verdict::Violated));
    }

    #[test]
    fn unknown_rules_are_reported_not_skipped() {
        assert_eq!(eval("self.size() > 1", &json!({})), Err("self.size() > 1".to_owned()));
    }

    #[test]
    fn transition_rules_do_not_apply_to_creation() {
        assert_eq!(eval("self == oldSelf", &json!("x")), Ok(Verdict::Transition));
    }
}
