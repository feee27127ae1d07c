//! The environment a command starts with: the daemon's variables minus secrets, plus defaults
//! that stop tools from paging, prompting or painting, plus the request's own variables.
//!
//! A name is a secret when it contains `KEY`, `SECRET`, `TOKEN` or `PASSWORD` (any case) and is
//! not listed in `pass_env`. The request's `env` is applied last and never logged or echoed.

/// Variables every command gets; `TERM` depends on the mode and is added by [`command_env`].
pub const DEFAULT_ENV: &[(&str, &str)] = &[
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GH_PAGER", "cat"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("NO_COLOR", "1"),
    ("LANG", "C.UTF-8"),
];

const SECRET_PARTS: &[&str] = &["KEY", "SECRET", "TOKEN", "PASSWORD"];

/// True when `name` looks like it holds a credential.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_PARTS.iter().any(|part| upper.contains(part))
}

/// The complete environment for a command: `base` scrubbed of secrets (except `pass_env`
/// names), the defaults, `TERM`, then `extra`. Later entries win.
pub fn command_env(
    base: impl IntoIterator<Item = (String, String)>,
    pass_env: &[String],
    tty: bool,
    extra: impl IntoIterator<Item = (String, String)>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = base
        .into_iter()
        .filter(|(name, _)| !is_secret_name(name) || pass_env.iter().any(|p| p == name))
        .collect();
    let term = if tty { "xterm-256color" } else { "dumb" };
    let defaults = DEFAULT_ENV.iter().copied().chain([("TERM", term)]);
    let overrides: Vec<(String, String)> = defaults
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .chain(extra)
        .collect();
    for (name, value) in overrides {
        env.retain(|(existing, _)| *existing != name);
        env.push((name, value));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn get<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn secret_names_match_case_insensitively() {
        let table = [
            ("OPENAI_API_KEY", true),
            ("aws_secret_access_key", true),
            ("GITHUB_TOKEN", true),
            ("PGPASSWORD", true),
            ("Monkey", true),
            ("PATH", false),
            ("HOME", false),
            ("LANG", false),
        ];
        for (name, secret) in table {
            assert_eq!(is_secret_name(name), secret, "{name}");
        }
    }

    #[test]
    fn secrets_are_scrubbed_unless_passed_and_defaults_then_request_env_win() {
        let base = vars(&[
            ("PATH", "/bin"),
            ("GITHUB_TOKEN", "ghp_x"),
            ("NPM_TOKEN", "npm_x"),
            ("PAGER", "less"),
            ("TERM", "xterm"),
        ]);
        let env = command_env(
            base,
            &["NPM_TOKEN".to_string()],
            false,
            vars(&[("NO_COLOR", "0"), ("MY_API_KEY", "given")]),
        );
        assert_eq!(get(&env, "PATH"), Some("/bin"));
        assert_eq!(get(&env, "GITHUB_TOKEN"), None);
        assert_eq!(get(&env, "NPM_TOKEN"), Some("npm_x"));
        assert_eq!(get(&env, "PAGER"), Some("cat"));
        assert_eq!(get(&env, "TERM"), Some("dumb"));
        assert_eq!(get(&env, "NO_COLOR"), Some("0"));
        assert_eq!(
            get(&env, "MY_API_KEY"),
            Some("given"),
            "the request's env is always applied"
        );
        assert_eq!(get(&env, "GIT_TERMINAL_PROMPT"), Some("0"));
        assert_eq!(env.iter().filter(|(k, _)| k == "PAGER").count(), 1);
    }

    #[test]
    fn tty_sessions_get_a_colour_terminal() {
        let env = command_env(Vec::new(), &[], true, Vec::new());
        assert_eq!(get(&env, "TERM"), Some("xterm-256color"));
        assert_eq!(get(&env, "LANG"), Some("C.UTF-8"));
    }
}
