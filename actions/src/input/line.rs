//! The KubeBlocks release line an action runs on: it decides which actions run and which variables exist.

use crate::error::{Error, Result};
use crate::input::vars::{self, VarMap};

/// The KubeBlocks release lines the addon supports; they differ in which actions run and which variables exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KbLine {
    /// 1.0.x GA: component postProvision/preTerminate with the legacy `KB_CLUSTER_COMPONENT_*` variables.
    #[serde(rename = "1.0")]
    V1_0,
    /// 1.1 and later: ShardingDefinition postProvision, shardAdd and shardRemove.
    #[serde(rename = "1.1")]
    V1_1,
}

impl KbLine {
    /// The line's name as used in template file names and events.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1_0 => "1.0",
            Self::V1_1 => "1.1",
        }
    }

    /// `KUBEBLOCKS_LINE` when set (`1.0`, `1.0.2`, `1.1`, `v1.2.0-alpha.3`, ...); otherwise 1.0 exactly when the
    /// legacy component list is present, since 1.1 removed it.
    pub fn from_vars(vars: &VarMap) -> Result<Self> {
        let Some(raw) = vars.get(vars::KUBEBLOCKS_LINE).filter(|v| !v.trim().is_empty()) else {
            return Ok(if vars.contains_key(vars::KB_CLUSTER_COMPONENT_LIST) { Self::V1_0 } else { Self::V1_1 });
        };
        let text = raw.trim().trim_start_matches('v');
        let mut parts = text.split(['.', '-']);
        let major = parts.next().and_then(|p| p.parse::<u32>().ok());
        let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
        match (major, minor) {
            (Some(1), Some(0)) => Ok(Self::V1_0),
            (Some(1), Some(m)) if m >= 1 => Ok(Self::V1_1),
            _ => Err(Error::invalid(
                vars::KUBEBLOCKS_LINE,
                format!("unknown KubeBlocks line {raw:?}: expected 1.0 or 1.1 (or a version such as 1.0.2 or 1.2.0)"),
            )),
        }
    }
    /// Refuses (exit 2 naming `KUBEBLOCKS_LINE`) a `KUBEBLOCKS_LINE` that the environment of `action` contradicts.
    /// Component `postProvision` and `preTerminate` get the legacy `KB_CLUSTER_COMPONENT_LIST` from KubeBlocks 1.0.x
    /// only, so for them its presence tells the line for sure: an addon installed for the other line would register
    /// shards wrongly (or drain them at the wrong time), and is stopped before anything is contacted. Unset, the
    /// line is detected from that same variable, so nothing can contradict it.
    pub fn check_environment(self, action: &str, vars: &VarMap) -> Result<()> {
        if !matches!(action, "post-provision" | "pre-terminate") {
            return Ok(());
        }
        if vars.get(vars::KUBEBLOCKS_LINE).is_none_or(|v| v.trim().is_empty()) {
            return Ok(());
        }
        let legacy = vars.contains_key(vars::KB_CLUSTER_COMPONENT_LIST);
        let (other, why) = match (self, legacy) {
            (Self::V1_0, false) => (
                Self::V1_1,
                format!(
                    "{} is not set, and KubeBlocks 1.0.x always sets it for {action}",
                    vars::KB_CLUSTER_COMPONENT_LIST
                ),
            ),
            (Self::V1_1, true) => {
                (Self::V1_0, format!("{} is set, which only KubeBlocks 1.0.x does", vars::KB_CLUSTER_COMPONENT_LIST))
            }
            _ => return Ok(()),
        };
        Err(Error::invalid(
            vars::KUBEBLOCKS_LINE,
            format!(
                "is {} but {why}: this KubeBlocks runs the {} line; install the addon with kubeblocksLine={}; \
                 nothing was changed",
                self.as_str(),
                other.as_str(),
                other.as_str()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeblocks_line_is_read_or_detected() {
        let mut vars = VarMap::new();
        assert_eq!(KbLine::from_vars(&vars).ok(), Some(KbLine::V1_1));
        vars.insert(vars::KB_CLUSTER_COMPONENT_LIST.into(), "a,b".into());
        assert_eq!(KbLine::from_vars(&vars).ok(), Some(KbLine::V1_0));
        vars.insert(vars::KUBEBLOCKS_LINE.into(), "v1.2.0-alpha.3".into());
        assert_eq!(KbLine::from_vars(&vars).ok(), Some(KbLine::V1_1));
        vars.insert(vars::KUBEBLOCKS_LINE.into(), "0.9".into());
        assert!(matches!(KbLine::from_vars(&vars), Err(Error::InvalidInput { var, .. }) if var == "KUBEBLOCKS_LINE"));
    }
}
