//! The kubelet's SELinux feature gates, parsed from `--feature-gates`.
//!
//! volumed follows Kubernetes **1.37** (the `k8s-openapi` feature `v1_37`):
//! `SELinuxMountReadWriteOncePod` is GA (on), `SELinuxChangePolicy` is
//! stable (on) and `SELinuxMount` is GA and on by default
//! (docs/kubelet.md, "SELinux"). Each can still be switched off
//! here, to reproduce an older kubelet's behaviour; the dependencies the
//! kubelet documents are enforced (`SELinuxMount` needs the other two,
//! `SELinuxChangePolicy` needs `SELinuxMountReadWriteOncePod`).

/// `SELinuxMountReadWriteOncePod`
pub const RWOP: &str = "SELinuxMountReadWriteOncePod";
/// `SELinuxMount`
pub const MOUNT: &str = "SELinuxMount";
/// `SELinuxChangePolicy`
pub const CHANGE_POLICY: &str = "SELinuxChangePolicy";

/// The Kubernetes version whose gate defaults and behaviour volumed follows.
pub const KUBERNETES_VERSION: &str = "1.37";

/// A bad `--feature-gates` value, naming the offending item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// Not `Name=value`.
    #[error("--feature-gates: {item:?} is not Name=true|false")]
    Syntax {
        /// the item as given
        item: String,
    },
    /// A name volumed does not know.
    #[error(
        "--feature-gates: unrecognized feature gate {name:?} (volumed knows {RWOP}, {MOUNT}, {CHANGE_POLICY})"
    )]
    Unknown {
        /// the name
        name: String,
    },
    /// A value that is not a boolean.
    #[error("--feature-gates: {name}={value:?}: the value must be true or false")]
    Value {
        /// the gate
        name: String,
        /// the value as given
        value: String,
    },
    /// A gate switched on without one it needs.
    #[error("--feature-gates: {gate} requires {needs} to be enabled")]
    Requires {
        /// the gate that is on
        gate: &'static str,
        /// the gate it needs
        needs: &'static str,
    },
}

/// The three SELinux gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    /// `SELinuxMountReadWriteOncePod`: all SELinux mount logic.
    pub rwop: bool,
    /// `SELinuxMount`: `-o context` for every access mode.
    pub mount: bool,
    /// `SELinuxChangePolicy`: `seLinuxChangePolicy: Recursive` opts a pod out.
    pub change_policy: bool,
}

impl Default for FeatureGates {
    /// The defaults of Kubernetes [`KUBERNETES_VERSION`].
    fn default() -> Self {
        Self {
            rwop: true,
            mount: true,
            change_policy: true,
        }
    }
}

impl FeatureGates {
    /// All three off: what a kubelet without SELinux mount support does.
    #[cfg(test)]
    pub fn all_off() -> Self {
        Self {
            rwop: false,
            mount: false,
            change_policy: false,
        }
    }

    /// Parses `Name=value` items (as clap splits `--feature-gates a=b,c=d`)
    /// over the defaults. Blank items are ignored; a later item wins.
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self, GateError> {
        let mut gates = Self::default();
        for item in items {
            let item = item.as_ref().trim();
            if item.is_empty() {
                continue;
            }
            let (name, value) = item.split_once('=').ok_or_else(|| GateError::Syntax {
                item: item.to_owned(),
            })?;
            let (name, value) = (name.trim(), value.trim());
            let on = parse_bool(value).ok_or_else(|| GateError::Value {
                name: name.to_owned(),
                value: value.to_owned(),
            })?;
            match name {
                RWOP => gates.rwop = on,
                MOUNT => gates.mount = on,
                CHANGE_POLICY => gates.change_policy = on,
                _ => {
                    return Err(GateError::Unknown {
                        name: name.to_owned(),
                    });
                }
            }
        }
        gates.validate()?;
        Ok(gates)
    }

    /// Checks the dependencies between the gates.
    pub fn validate(&self) -> Result<(), GateError> {
        if self.mount && !self.rwop {
            return Err(GateError::Requires {
                gate: MOUNT,
                needs: RWOP,
            });
        }
        if self.mount && !self.change_policy {
            return Err(GateError::Requires {
                gate: MOUNT,
                needs: CHANGE_POLICY,
            });
        }
        if self.change_policy && !self.rwop {
            return Err(GateError::Requires {
                gate: CHANGE_POLICY,
                needs: RWOP,
            });
        }
        Ok(())
    }
}

/// Go's `strconv.ParseBool`, which the kubelet's gate parser uses.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_parse_over_the_1_37_defaults_and_name_the_offender() {
        let on = FeatureGates::default();
        let rows: &[(&[&str], Result<FeatureGates, GateError>)] = &[
            (&[], Ok(on)),
            (&[""], Ok(on)),
            (
                &["SELinuxMount=false"],
                Ok(FeatureGates { mount: false, ..on }),
            ),
            (
                &["SELinuxMount=false", "SELinuxChangePolicy=False"],
                Ok(FeatureGates {
                    mount: false,
                    change_policy: false,
                    ..on
                }),
            ),
            (
                &[
                    " SELinuxMount = 0 ",
                    "SELinuxChangePolicy=f",
                    "SELinuxMountReadWriteOncePod=F",
                ],
                Ok(FeatureGates::all_off()),
            ),
            (&["SELinuxMount=false", "SELinuxMount=true"], Ok(on)),
            (
                &["SELinuxMount"],
                Err(GateError::Syntax {
                    item: "SELinuxMount".into(),
                }),
            ),
            (
                &["SELinuxMount=yes"],
                Err(GateError::Value {
                    name: MOUNT.into(),
                    value: "yes".into(),
                }),
            ),
            (
                &["CSIMigration=true"],
                Err(GateError::Unknown {
                    name: "CSIMigration".into(),
                }),
            ),
            (
                &["SELinuxMountReadWriteOncePod=false"],
                Err(GateError::Requires {
                    gate: MOUNT,
                    needs: RWOP,
                }),
            ),
            (
                &["SELinuxChangePolicy=false"],
                Err(GateError::Requires {
                    gate: MOUNT,
                    needs: CHANGE_POLICY,
                }),
            ),
            (
                &["SELinuxMount=false", "SELinuxMountReadWriteOncePod=false"],
                Err(GateError::Requires {
                    gate: CHANGE_POLICY,
                    needs: RWOP,
                }),
            ),
        ];
        for (items, want) in rows {
            assert_eq!(&FeatureGates::parse(items), want, "{items:?}");
        }
    }

    #[test]
    fn gate_errors_name_the_item() {
        let e = FeatureGates::parse(&["Bogus=true"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"Bogus\"") && e.contains("unrecognized"), "{e}");
    }
}
