//! The one environment policy: every child's environment is built here, by [`build_env`],
//! from an explicit [`EnvPolicy`] and the variables the caller adds.
//!
//! - [`EnvPolicy::Agent`]: agents (brains) get the daemon's environment minus Warren's own
//!   credentials ([`is_warren_credential`]): the app key, the admin token, any access token.
//!   Model keys and the rest of the host's variables stay, because an agent on the host needs
//!   them.
//! - [`EnvPolicy::Hands`]: the hands (`warren execd`) and everything they run start from a clean
//!   allowlist ([`HANDS_ALLOWLIST`]) plus what `--hands-env` names; never the gateway's or the
//!   agent's variables.
//! - [`EnvPolicy::Daemon`]: a daemon's own children (execd's PTY shells and OpenSandbox
//!   commands) inherit the daemon's environment minus Warren's credentials.
//! - [`EnvPolicy::Exec`]: exec-tool sessions: the daemon's environment scrubbed of every
//!   secret-looking name ([`is_secret_name`]) except `pass_env`, plus defaults that stop tools
//!   from paging, prompting or painting ([`EXEC_DEFAULTS`]) and `TERM`.
//!
//! The caller's own variables (a request's `env`) are applied last, under every policy. The
//! tree marker is not part of the policy: the spawner adds it after, so no policy removes it.
//! This module is pure: the daemon's environment is passed in, which keeps it table-testable.

use std::ffi::{OsStr, OsString};

/// The variables the hands keep from the daemon's environment.
pub const HANDS_ALLOWLIST: &[&str] = &["PATH", "HOME", "LANG", "TERM", "USER"];

/// Variables every exec-tool command gets; `TERM` depends on the mode.
pub const EXEC_DEFAULTS: &[(&str, &str)] = &[
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GH_PAGER", "cat"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("NO_COLOR", "1"),
    ("LANG", "C.UTF-8"),
];

/// The names Warren's own credentials travel under, besides `WARREN_*` names that look
/// secret: execd's access token and the token `warren mcp --execd` reads.
const WARREN_CREDENTIALS: &[&str] = &["EXECD_ACCESS_TOKEN", "WARREN_EXECD_TOKEN"];

const SECRET_PARTS: &[&str] = &["KEY", "SECRET", "TOKEN", "PASSWORD"];

/// Which environment a child starts from. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvPolicy {
    /// The daemon's environment minus Warren's credentials.
    Daemon,
    /// The daemon's environment minus Warren's credentials (an agent on the host).
    Agent,
    /// Only [`HANDS_ALLOWLIST`] from the daemon, plus `pass`: a name alone copies the daemon's
    /// value, `NAME=VALUE` sets it.
    Hands { pass: Vec<HandsVar> },
    /// The daemon's environment (or `base` instead of it) without secret-looking names except
    /// `pass_env`, plus [`EXEC_DEFAULTS`] and `TERM` (`xterm-256color` on a terminal, else
    /// `dumb`).
    Exec {
        base: Option<Vec<(String, String)>>,
        pass_env: Vec<String>,
        tty: bool,
    },
}

/// One `--hands-env` entry: `NAME` (the daemon's value) or `NAME=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandsVar {
    pub name: String,
    pub value: Option<String>,
}

impl std::str::FromStr for HandsVar {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (name, value) = match text.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (text, None),
        };
        if name.is_empty()
            || name.contains('\0')
            || value.as_ref().is_some_and(|v| v.contains('\0'))
        {
            return Err(format!("{text:?} is not NAME or NAME=VALUE"));
        }
        Ok(Self {
            name: name.to_owned(),
            value,
        })
    }
}

/// True when `name` looks like it holds a credential (`KEY`, `SECRET`, `TOKEN` or `PASSWORD`
/// in any case).
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_PARTS.iter().any(|part| upper.contains(part))
}

/// True for Warren's own credentials: `WARREN_*` names that look secret (`WARREN_APP_KEY`,
/// `WARREN_ADMIN_TOKEN`...) and the access-token variables.
pub fn is_warren_credential(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    WARREN_CREDENTIALS.contains(&name)
        || (name.to_ascii_uppercase().starts_with("WARREN_") && is_secret_name(name))
}

/// The complete environment for a child: `policy` applied to `daemon` (the daemon's own
/// variables), then `extra` (later entries win). No name appears twice.
pub fn build_env(
    policy: &EnvPolicy,
    daemon: impl IntoIterator<Item = (OsString, OsString)>,
    extra: &[(OsString, OsString)],
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = match policy {
        EnvPolicy::Daemon | EnvPolicy::Agent => daemon
            .into_iter()
            .filter(|(name, _)| !is_warren_credential(name))
            .collect(),
        EnvPolicy::Hands { pass } => {
            let daemon: Vec<(OsString, OsString)> = daemon.into_iter().collect();
            let from_daemon = |name: &str| {
                daemon
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            let mut env: Vec<(OsString, OsString)> = HANDS_ALLOWLIST
                .iter()
                .filter_map(|name| Some((OsString::from(name), from_daemon(name)?)))
                .collect();
            for var in pass {
                let value = match &var.value {
                    Some(value) => Some(OsString::from(value)),
                    None => from_daemon(&var.name),
                };
                if let Some(value) = value {
                    env.push((OsString::from(&var.name), value));
                }
            }
            env
        }
        EnvPolicy::Exec {
            base,
            pass_env,
            tty,
        } => {
            let base: Vec<(OsString, OsString)> = match base {
                Some(base) => base
                    .iter()
                    .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                    .collect(),
                None => daemon.into_iter().collect(),
            };
            let mut env: Vec<(OsString, OsString)> = base
                .into_iter()
                .filter(|(name, _)| {
                    let name = name.to_string_lossy();
                    !is_secret_name(&name) || pass_env.iter().any(|p| *p == name)
                })
                .collect();
            let term = if *tty { "xterm-256color" } else { "dumb" };
            for (name, value) in EXEC_DEFAULTS.iter().copied().chain([("TERM", term)]) {
                env.push((name.into(), value.into()));
            }
            env
        }
    };
    env.extend(extra.iter().cloned());
    dedup_last_wins(env)
}

/// Keeps the last value of each name, in the order names were last set.
fn dedup_last_wins(env: Vec<(OsString, OsString)>) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = Vec::with_capacity(env.len());
    for (name, value) in env {
        out.retain(|(existing, _)| *existing != name);
        out.push((name, value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn names(env: &[(OsString, OsString)]) -> Vec<String> {
        env.iter()
            .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
            .collect()
    }

    /// The gateway's environment in every row: three of Warren's credentials, a model key, an
    /// ordinary variable and the basics.
    fn gateway_env() -> Vec<(OsString, OsString)> {
        vars(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/root"),
            ("USER", "root"),
            ("WARREN_APP_KEY", "wk_app"),
            ("WARREN_ADMIN_TOKEN", "admin"),
            ("EXECD_ACCESS_TOKEN", "hands-token"),
            ("OPENAI_API_KEY", "sk-model"),
            ("WARREN_DATA", "/srv/warren"),
            ("PROJECT_COLOR", "blue"),
        ])
    }

    /// One row: what the case is, the policy, the variables the caller adds, the environment
    /// expected.
    type PolicyCase = (
        &'static str,
        EnvPolicy,
        Vec<(OsString, OsString)>,
        Vec<&'static str>,
    );

    #[test]
    fn each_policy_builds_the_environment_it_promises() {
        let table: Vec<PolicyCase> = vec![
            (
                "agent: everything but Warren's credentials, plus --agent-env",
                EnvPolicy::Agent,
                vars(&[("AGENT_MODE", "fast")]),
                vec![
                    "PATH=/usr/bin",
                    "HOME=/root",
                    "USER=root",
                    "OPENAI_API_KEY=sk-model",
                    "WARREN_DATA=/srv/warren",
                    "PROJECT_COLOR=blue",
                    "AGENT_MODE=fast",
                ],
            ),
            (
                "daemon children: the same removal",
                EnvPolicy::Daemon,
                vars(&[("TERM", "xterm-256color")]),
                vec![
                    "PATH=/usr/bin",
                    "HOME=/root",
                    "USER=root",
                    "OPENAI_API_KEY=sk-model",
                    "WARREN_DATA=/srv/warren",
                    "PROJECT_COLOR=blue",
                    "TERM=xterm-256color",
                ],
            ),
            (
                "hands: the allowlist, --hands-env by name and by value, then the caller's",
                EnvPolicy::Hands {
                    pass: vec![
                        "PROJECT_COLOR".parse().expect("parses"),
                        "NODE_ENV=development".parse().expect("parses"),
                        "NOT_SET_ANYWHERE".parse().expect("parses"),
                    ],
                },
                vars(&[("EXECD_ACCESS_TOKEN", "fresh")]),
                vec![
                    "PATH=/usr/bin",
                    "HOME=/root",
                    "USER=root",
                    "PROJECT_COLOR=blue",
                    "NODE_ENV=development",
                    "EXECD_ACCESS_TOKEN=fresh",
                ],
            ),
            (
                "exec: secrets scrubbed unless passed, defaults, TERM, then the request's",
                EnvPolicy::Exec {
                    base: None,
                    pass_env: vec!["OPENAI_API_KEY".into()],
                    tty: false,
                },
                vars(&[("NO_COLOR", "0"), ("MY_API_KEY", "given")]),
                vec![
                    "PATH=/usr/bin",
                    "HOME=/root",
                    "USER=root",
                    "OPENAI_API_KEY=sk-model",
                    "WARREN_DATA=/srv/warren",
                    "PROJECT_COLOR=blue",
                    "PAGER=cat",
                    "GIT_PAGER=cat",
                    "GH_PAGER=cat",
                    "GIT_TERMINAL_PROMPT=0",
                    "LANG=C.UTF-8",
                    "TERM=dumb",
                    "NO_COLOR=0",
                    "MY_API_KEY=given",
                ],
            ),
            (
                "exec on a terminal from a given base",
                EnvPolicy::Exec {
                    base: Some(vec![("PATH".into(), "/bin".into())]),
                    pass_env: Vec::new(),
                    tty: true,
                },
                Vec::new(),
                vec![
                    "PATH=/bin",
                    "PAGER=cat",
                    "GIT_PAGER=cat",
                    "GH_PAGER=cat",
                    "GIT_TERMINAL_PROMPT=0",
                    "NO_COLOR=1",
                    "LANG=C.UTF-8",
                    "TERM=xterm-256color",
                ],
            ),
        ];
        for (what, policy, extra, expected) in table {
            let env = build_env(&policy, gateway_env(), &extra);
            assert_eq!(names(&env), expected, "{what}");
        }
    }

    #[test]
    fn warren_credentials_and_secret_names_are_recognised() {
        let table = [
            ("WARREN_APP_KEY", true, true),
            ("WARREN_ADMIN_TOKEN", true, true),
            ("warren_admin_token", true, true),
            ("EXECD_ACCESS_TOKEN", true, true),
            ("WARREN_EXECD_TOKEN", true, true),
            ("WARREN_DATA", false, false),
            ("WARREN_TREE_ID", false, false),
            ("OPENAI_API_KEY", false, true),
            ("aws_secret_access_key", false, true),
            ("PGPASSWORD", false, true),
            ("Monkey", false, true),
            ("PATH", false, false),
        ];
        for (name, credential, secret) in table {
            assert_eq!(is_warren_credential(OsStr::new(name)), credential, "{name}");
            assert_eq!(is_secret_name(name), secret, "{name}");
        }
    }

    #[test]
    fn hands_vars_parse_a_name_or_a_name_and_value() {
        let parsed: HandsVar = "A=b=c".parse().expect("parses");
        assert_eq!(
            (parsed.name.as_str(), parsed.value.as_deref()),
            ("A", Some("b=c"))
        );
        let parsed: HandsVar = "A".parse().expect("parses");
        assert_eq!(parsed.value, None);
        for bad in ["", "=x", "A\0=x", "A=x\0"] {
            assert!(bad.parse::<HandsVar>().is_err(), "{bad:?}");
        }
    }
}
