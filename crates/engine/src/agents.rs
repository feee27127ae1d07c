//! Agent presets (agents.md): `--agent claude | codex | gemini | shell | "<command line>"`.
//! A preset knows its program, the environment and config it needs to reach the model through
//! the gateway's model proxy with the session's `wm_` token, and how to say it is missing.
//! [`Agent::resolve`] finds the program on the gateway's `PATH` once at start; with the brain in
//! the hands, the directory it is installed in is bound read-only at `/opt/warren/agent`
//! ([`Agent::install_prefix`]) and the program runs from there.

use std::path::{Path, PathBuf};

use warren_brain::AgentCommand;

use crate::config::BrainPlacement;

/// Where an agent's install prefix is mounted inside the hands.
pub const INNER_PREFIX: &str = warren_sandbox::AGENT_PREFIX;

/// Which agent `--agent` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// The built-in `warren shell-agent`.
    Shell,
    /// `claude-agent-acp` (npm `@zed-industries/claude-agent-acp`), Anthropic Messages.
    Claude,
    /// `codex-acp` (npm `@zed-industries/codex-acp`), OpenAI Responses.
    Codex,
    /// `gemini --acp` (npm `@google/gemini-cli`), Gemini.
    Gemini,
    /// Any other ACP agent command line; it gets no model settings.
    Command,
}

impl Preset {
    /// The preset a `--agent` value names, if it is one.
    fn named(name: &str) -> Option<Preset> {
        match name {
            "shell" => Some(Preset::Shell),
            "claude" => Some(Preset::Claude),
            "codex" => Some(Preset::Codex),
            "gemini" => Some(Preset::Gemini),
            _ => None,
        }
    }

    /// The program and arguments of a preset (not the shell agent), and its npm package.
    fn program(self) -> Option<(&'static str, &'static [&'static str], &'static str)> {
        match self {
            Preset::Claude => Some(("claude-agent-acp", &[], "@zed-industries/claude-agent-acp")),
            Preset::Codex => Some(("codex-acp", &[], "@zed-industries/codex-acp")),
            Preset::Gemini => Some(("gemini", &["--acp"], "@google/gemini-cli")),
            Preset::Shell | Preset::Command => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Preset::Shell => "shell",
            Preset::Claude => "claude",
            Preset::Codex => "codex",
            Preset::Gemini => "gemini",
            Preset::Command => "command",
        }
    }
}

/// The session's agent, resolved at start.
#[derive(Debug, Clone)]
pub struct Agent {
    pub preset: Preset,
    /// The program as found on the gateway's host, its arguments and `--agent-env`.
    pub command: AgentCommand,
    pub placement: BrainPlacement,
    /// With the brain in the hands: the host directory bound at [`INNER_PREFIX`] (`None` when
    /// the program is under `/usr`, which every sandbox has).
    prefix: Option<PathBuf>,
    /// With the brain in the hands: the program's path inside.
    inner_program: String,
    /// `--agent-model`: the model a preset asks for instead of its default.
    model: Option<String>,
}

/// The model the `codex` preset asks for unless `--agent-model` says otherwise: one the pinned
/// Codex has metadata for (an unknown name makes Codex fall back to generic settings, which
/// offer no `apply_patch` tool and print a warning into the conversation).
pub const CODEX_DEFAULT_MODEL: &str = "gpt-5.4";

/// What one session's agent needs to reach the model proxy.
pub struct ModelAccess<'a> {
    /// The proxy's origin as the agent reaches it, e.g. `http://127.0.0.1:8080`.
    pub proxy_origin: &'a str,
    /// The session's `wm_` token.
    pub token: &'a str,
    /// Whether the agent runs as root (Claude refuses some modes as root unless told it is
    /// sandboxed).
    pub as_root: bool,
    /// The agent's home as the agent sees it.
    pub home: &'a str,
}

impl Agent {
    /// Resolves `--agent` (default `shell`) and `--brain-placement` (default `hands` for every
    /// agent but the shell agent). A preset whose program is not installed is an error that
    /// says how to install it.
    pub fn resolve(
        agent: Option<&str>,
        program_path: Option<&Path>,
        placement: Option<BrainPlacement>,
        warren_bin: &Path,
        agent_env: &[(String, String)],
    ) -> Result<Agent, String> {
        let agent = agent.map(str::trim).filter(|agent| !agent.is_empty());
        let preset = match agent {
            None => Preset::Shell,
            Some(name) => Preset::named(name).unwrap_or(Preset::Command),
        };
        let command = match (preset, agent) {
            (Preset::Shell, _) => AgentCommand::shell_agent(warren_bin.to_string_lossy()),
            (Preset::Command, Some(line)) => {
                AgentCommand::parse(line).map_err(|e| format!("--agent: {e}"))?
            }
            _ => {
                let (program, args, package) = preset.program().unwrap_or(("", &[], ""));
                let found = match program_path {
                    Some(path) => find_on_path(&path.to_string_lossy()),
                    None => find_on_path(program),
                };
                let found = found.ok_or_else(|| {
                    format!(
                        "the {} agent runs `{program}`, which is not installed here (not on \
                         PATH); install it with `npm install -g {package}`",
                        preset.label()
                    )
                })?;
                AgentCommand {
                    program: found.to_string_lossy().into_owned(),
                    args: args.iter().map(|arg| (*arg).to_owned()).collect(),
                    env: Vec::new(),
                }
            }
        };
        let command = AgentCommand {
            env: agent_env.to_vec(),
            ..command
        };
        let placement = placement.unwrap_or(match preset {
            Preset::Shell => BrainPlacement::Host,
            _ => BrainPlacement::Hands,
        });
        let (prefix, inner_program) = match (placement, preset) {
            (BrainPlacement::Host, _) => (None, command.program.clone()),
            // The shell agent is the warren binary, which every sandbox has.
            (BrainPlacement::Hands, Preset::Shell) => (None, warren_sandbox::WARREN_BIN.to_owned()),
            // A command line whose program is missing fails when a brain starts, saying so.
            (BrainPlacement::Hands, _) => match resolve_program(&command.program) {
                Some(program) => inside_view(&program),
                None => (None, command.program.clone()),
            },
        };
        Ok(Agent {
            preset,
            command,
            placement,
            prefix,
            inner_program,
            model: None,
        })
    }

    /// `--agent-model`: the model a preset's agent asks for (Codex's `model`, Claude's
    /// `ANTHROPIC_MODEL`, Gemini's `GEMINI_MODEL`). Only the presets have a model to set; for
    /// the shell agent or a command line it is an error that says so.
    pub fn with_model(self, model: Option<&str>) -> Result<Agent, String> {
        let Some(model) = model else {
            return Ok(self);
        };
        let model = model.trim();
        if model.is_empty()
            || model
                .chars()
                .any(|c| c.is_control() || c == '"' || c == '\\')
        {
            return Err(format!(
                "--agent-model: {model:?} is not a model name (non-empty, no control characters, quotes or backslashes)"
            ));
        }
        if !self.needs_session_env() {
            return Err(format!(
                "--agent-model applies to the claude, codex and gemini presets, not to the {} agent; \
                 give a command line its model in its own arguments or --agent-env",
                self.preset.label()
            ));
        }
        Ok(Agent {
            model: Some(model.to_owned()),
            ..self
        })
    }

    /// The model the preset's agent is told to use, if any (Codex always gets one).
    pub fn model(&self) -> Option<&str> {
        match (self.preset, self.model.as_deref()) {
            (_, Some(model)) => Some(model),
            (Preset::Codex, None) => Some(CODEX_DEFAULT_MODEL),
            _ => None,
        }
    }

    /// The host directory to bind read-only at [`INNER_PREFIX`] in every sandbox.
    pub fn install_prefix(&self) -> Option<&Path> {
        self.prefix.as_deref()
    }

    /// Whether the agent is started per session (it needs the session's token) rather than
    /// taken warm from the pool.
    pub fn needs_session_env(&self) -> bool {
        matches!(self.preset, Preset::Claude | Preset::Codex | Preset::Gemini)
    }

    /// The program and arguments to run for one session: inside the hands when `inside`,
    /// else on the host. A preset that needs config files (Codex's `config.toml`, Gemini's
    /// `settings.json`) runs under `/bin/sh -c`, which writes them into its home first: in the
    /// hands that runs inside the sandbox, as the agent, so the gateway never writes into a
    /// directory the sandbox controls.
    pub fn session_command(&self, inside: bool, access: &ModelAccess<'_>) -> AgentCommand {
        let program = if inside {
            self.inner_program.clone()
        } else {
            self.command.program.clone()
        };
        let mut env = self.command.env.clone();
        env.extend(self.session_env(access));
        let setup = self.setup_script(access);
        if setup.is_empty() {
            return AgentCommand {
                program,
                args: self.command.args.clone(),
                env,
            };
        }
        let mut args = vec![
            "-c".to_owned(),
            format!("{setup}exec \"$0\" \"$@\""),
            program,
        ];
        args.extend(self.command.args.iter().cloned());
        AgentCommand {
            program: "/bin/sh".to_owned(),
            args,
            env,
        }
    }

    /// The preset's variables for one session (after `--agent-env`, so a preset's own win).
    fn session_env(&self, access: &ModelAccess<'_>) -> Vec<(String, String)> {
        let origin = access.proxy_origin.trim_end_matches('/');
        let mut pairs: Vec<(&str, String)> = match self.preset {
            Preset::Claude => {
                let mut pairs = vec![
                    ("ANTHROPIC_BASE_URL", format!("{origin}/v1/model/anthropic")),
                    ("ANTHROPIC_API_KEY", access.token.to_owned()),
                    ("DISABLE_AUTOUPDATER", "1".to_owned()),
                    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_owned()),
                    ("DISABLE_TELEMETRY", "1".to_owned()),
                    ("DISABLE_ERROR_REPORTING", "1".to_owned()),
                ];
                if access.as_root {
                    pairs.push(("IS_SANDBOX", "1".to_owned()));
                }
                if let Some(model) = self.model() {
                    pairs.push(("ANTHROPIC_MODEL", model.to_owned()));
                }
                pairs
            }
            Preset::Codex => vec![
                ("CODEX_HOME", format!("{}/.codex", access.home)),
                ("WARREN_MODEL_TOKEN", access.token.to_owned()),
            ],
            Preset::Gemini => {
                let mut pairs = vec![
                    (
                        "GOOGLE_GEMINI_BASE_URL",
                        format!("{origin}/v1/model/gemini"),
                    ),
                    ("GEMINI_API_KEY", access.token.to_owned()),
                ];
                if let Some(model) = self.model() {
                    pairs.push(("GEMINI_MODEL", model.to_owned()));
                }
                pairs
            }
            Preset::Shell | Preset::Command => Vec::new(),
        };
        if self.needs_session_env() {
            pairs.push(("HOME", access.home.to_owned()));
        }
        pairs
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect()
    }

    /// The shell commands that prepare the agent's home (each ending in `; `), or nothing.
    fn setup_script(&self, access: &ModelAccess<'_>) -> String {
        let origin = access.proxy_origin.trim_end_matches('/');
        let mut script = String::new();
        let mut write = |dir: &str, file: &str, content: &str| {
            script.push_str(&format!(
                "mkdir -p \"$HOME/{dir}\" && printf '%s' {} > \"$HOME/{dir}/{file}\"; ",
                shell_quote(content)
            ));
        };
        match self.preset {
            Preset::Codex => write(
                ".codex",
                "config.toml",
                &codex_config(origin, self.model().unwrap_or(CODEX_DEFAULT_MODEL)),
            ),
            Preset::Gemini => {
                write(".gemini", "settings.json", GEMINI_SETTINGS);
                // Gemini names a loaded session's new file by the current minute, which
                // overwrites the recording when the load comes within the same minute; the
                // recordings are renamed out of the way first (their content is what counts).
                script.push_str(GEMINI_KEEP_RECORDINGS);
            }
            Preset::Claude | Preset::Shell | Preset::Command => {}
        }
        script
    }
}

/// Gemini's settings: API-key auth (no login), no update checks, no telemetry.
const GEMINI_SETTINGS: &str = r#"{"security":{"auth":{"selectedType":"gemini-api-key"}},"general":{"disableAutoUpdate":true,"disableUpdateNag":true},"privacy":{"usageStatisticsEnabled":false},"telemetry":{"enabled":false}}"#;

/// Renames `~/.gemini/tmp/*/chats/session-<minute>-<id>.jsonl` to `session-restored-…`.
const GEMINI_KEEP_RECORDINGS: &str = r#"for f in "$HOME"/.gemini/tmp/*/chats/session-*.jsonl; do case "${f##*/}" in session-restored-*) ;; *) [ -f "$f" ] && mv "$f" "${f%/*}/session-restored-${f##*/session-}";; esac; done; "#;

/// Codex's `config.toml`: the model provider is the proxy (Responses API); bwrap is the
/// sandbox (Codex's own cannot nest in it: measured, every command fails with ENOSPC), and
/// every command is offered to the person first (with `on-request` Codex never asks).
fn codex_config(origin: &str, model: &str) -> String {
    format!(
        r#"model = "{model}"
model_provider = "warren"
approval_policy = "untrusted"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.warren]
name = "Warren model proxy"
base_url = "{origin}/v1/model/openai/v1"
wire_api = "responses"
env_key = "WARREN_MODEL_TOKEN"

[analytics]
enabled = false

[otel]
exporter = "none"
"#
    )
}

pub use warren_hands::shell_quote;

/// `program` as a path: as given when it has a slash, else the first match on `PATH`.
fn find_on_path(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return path.is_file().then_some(path);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The absolute path of a program (found on `PATH` when it has no slash).
fn resolve_program(program: &str) -> Option<PathBuf> {
    let found = find_on_path(program)?;
    std::path::absolute(found).ok()
}

/// Where `program` (an absolute host path) is inside a sandbox, and the prefix to bind for
/// it: nothing under `/usr`; for an npm install (`…/node_modules/…`) the directory holding the
/// outermost `node_modules`, so the package's dependencies come along; else the program's
/// own directory.
fn inside_view(program: &Path) -> (Option<PathBuf>, String) {
    let real = std::fs::canonicalize(program).unwrap_or(program.to_path_buf());
    if real.starts_with("/usr") && program.starts_with("/usr") {
        return (None, program.to_string_lossy().into_owned());
    }
    let prefix = npm_prefix(program)
        .or_else(|| npm_prefix(&real))
        .or_else(|| real.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("/"));
    // The program as reached on PATH (a `.bin` link) when it is under the prefix, else its
    // real file.
    let inner = [program, real.as_path()]
        .into_iter()
        .find_map(|path| path.strip_prefix(&prefix).ok())
        .map(|rest| format!("{INNER_PREFIX}/{}", rest.display()))
        .unwrap_or_else(|| format!("{INNER_PREFIX}/{}", program.display()));
    (Some(prefix), inner)
}

/// The directory holding the outermost `node_modules` component of `path`.
fn npm_prefix(path: &Path) -> Option<PathBuf> {
    let mut prefix = PathBuf::new();
    for component in path.components() {
        if component.as_os_str() == "node_modules" {
            return Some(prefix);
        }
        prefix.push(component);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_npm_program_binds_its_install_prefix_and_runs_from_its_bin_link() {
        let cases: [(&str, Option<&str>, &str); 3] = [
            (
                "/srv/agents/node_modules/.bin/claude-agent-acp",
                Some("/srv/agents"),
                "/opt/warren/agent/node_modules/.bin/claude-agent-acp",
            ),
            (
                "/home/me/.nvm/versions/node/v20/lib/node_modules/pkg/dist/index.js",
                Some("/home/me/.nvm/versions/node/v20/lib"),
                "/opt/warren/agent/node_modules/pkg/dist/index.js",
            ),
            (
                "/srv/tools/my-agent",
                Some("/srv/tools"),
                "/opt/warren/agent/my-agent",
            ),
        ];
        for (program, prefix, inner) in cases {
            let (got_prefix, got_inner) = inside_view(Path::new(program));
            assert_eq!(got_prefix.as_deref(), prefix.map(Path::new), "{program}");
            assert_eq!(got_inner, inner, "{program}");
        }
    }

    #[test]
    fn a_program_under_usr_binds_nothing() {
        let (prefix, inner) = inside_view(Path::new("/usr/bin/env"));
        assert_eq!((prefix, inner.as_str()), (None, "/usr/bin/env"));
    }

    #[test]
    fn a_missing_preset_program_says_how_to_install_it() {
        // SAFETY of the test: PATH is read, never set, so an empty PATH is simulated by a
        // program name nobody has.
        let error = find_on_path("warren-no-such-agent-program");
        assert!(error.is_none());
        let message = Agent::resolve(Some("codex"), None, None, Path::new("/w"), &[]);
        if find_on_path("codex-acp").is_none() {
            let message = message.expect_err("codex-acp is not installed");
            assert!(
                message.contains("npm install -g @zed-industries/codex-acp"),
                "{message}"
            );
        }
    }

    #[test]
    fn presets_default_to_the_hands_and_the_shell_agent_to_the_host() {
        let shell =
            Agent::resolve(None, None, None, Path::new("/opt/w/warren"), &[]).expect("shell");
        assert_eq!(
            (shell.preset, shell.placement),
            (Preset::Shell, BrainPlacement::Host)
        );
        let custom = Agent::resolve(Some("/usr/bin/env x"), None, None, Path::new("/w"), &[])
            .expect("a command line");
        assert_eq!(
            (custom.preset, custom.placement),
            (Preset::Command, BrainPlacement::Hands)
        );
        assert_eq!(custom.install_prefix(), None);
        assert_eq!(custom.inner_program, "/usr/bin/env");
    }

    #[test]
    fn the_claude_preset_points_at_the_proxy_with_the_session_token() {
        let agent = preset(Preset::Claude, "claude-agent-acp");
        let access = access("http://127.0.0.1:8080/");
        let command = agent.session_command(true, &access);
        assert_eq!(command.program, agent.inner_program);
        assert!(command.args.is_empty());
        let env: std::collections::HashMap<_, _> = command.env.into_iter().collect();
        assert_eq!(
            env.get("ANTHROPIC_BASE_URL").map(String::as_str),
            Some("http://127.0.0.1:8080/v1/model/anthropic")
        );
        assert_eq!(
            env.get("ANTHROPIC_API_KEY").map(String::as_str),
            Some("wm_t")
        );
        assert!(!env.contains_key("IS_SANDBOX"), "not root: no IS_SANDBOX");
        assert_eq!(env.get("HOME").map(String::as_str), Some("/home/agent"));
    }

    #[test]
    fn codex_writes_its_provider_config_in_its_home_before_it_starts() {
        let agent = preset(Preset::Codex, "codex-acp");
        let access = access("http://127.0.0.1:9");
        let command = agent.session_command(true, &access);
        assert_eq!(command.program, "/bin/sh");
        assert_eq!(command.args[0], "-c");
        assert!(command.args[1].contains("> \"$HOME/.codex/config.toml\""));
        assert!(command.args[1].contains("base_url = \"http://127.0.0.1:9/v1/model/openai/v1\""));
        assert!(
            !command.args[1].contains("wm_t"),
            "the token travels in the environment"
        );
        assert_eq!(command.args[2], agent.inner_program);
        let env: std::collections::HashMap<_, _> = command.env.into_iter().collect();
        assert_eq!(
            env.get("WARREN_MODEL_TOKEN").map(String::as_str),
            Some("wm_t")
        );
        assert_eq!(
            env.get("CODEX_HOME").map(String::as_str),
            Some("/home/agent/.codex")
        );
    }

    /// A session's access to the model proxy at `proxy_origin`, token `wm_t`, not as root.
    fn access(proxy_origin: &str) -> ModelAccess<'_> {
        ModelAccess {
            proxy_origin,
            token: "wm_t",
            as_root: false,
            home: "/home/agent",
        }
    }

    fn preset(preset: Preset, program: &str) -> Agent {
        Agent {
            preset,
            command: AgentCommand::parse(program).expect("parses"),
            placement: BrainPlacement::Hands,
            prefix: None,
            inner_program: format!("/opt/warren/agent/node_modules/.bin/{program}"),
            model: None,
        }
    }

    /// The model each preset is told to use: Codex always one its pinned metadata knows,
    /// `--agent-model` overriding it; Claude and Gemini their own default unless given one.
    #[test]
    fn each_preset_asks_for_its_model_and_agent_model_overrides_it() {
        let access = access("http://127.0.0.1:9");
        let codex_line = |agent: &Agent| agent.session_command(true, &access).args[1].clone();
        let env_of = |agent: &Agent, name: &str| {
            agent
                .session_command(true, &access)
                .env
                .into_iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value)
        };
        let codex = preset(Preset::Codex, "codex-acp");
        assert!(
            codex_line(&codex).contains(&format!("model = \"{CODEX_DEFAULT_MODEL}\"\n")),
            "{}",
            codex_line(&codex)
        );
        let chosen = codex.with_model(Some("gpt-5.5")).expect("a model");
        assert!(codex_line(&chosen).contains("model = \"gpt-5.5\"\n"));
        assert!(!codex_line(&chosen).contains(CODEX_DEFAULT_MODEL));

        let claude = preset(Preset::Claude, "claude-agent-acp");
        assert_eq!(env_of(&claude, "ANTHROPIC_MODEL"), None);
        let claude = claude
            .with_model(Some("claude-sonnet-4-5"))
            .expect("a model");
        assert_eq!(
            env_of(&claude, "ANTHROPIC_MODEL").as_deref(),
            Some("claude-sonnet-4-5")
        );
        let gemini = preset(Preset::Gemini, "gemini")
            .with_model(Some("gemini-2.5-flash"))
            .expect("a model");
        assert_eq!(
            env_of(&gemini, "GEMINI_MODEL").as_deref(),
            Some("gemini-2.5-flash")
        );
    }

    #[test]
    fn agent_model_is_refused_where_it_cannot_apply_or_is_no_name() {
        let shell = Agent::resolve(None, None, None, Path::new("/opt/w/warren"), &[])
            .expect("shell")
            .with_model(Some("gpt-5.4"))
            .expect_err("the shell agent has no model");
        assert!(
            shell.contains("claude, codex and gemini presets"),
            "{shell}"
        );
        for bad in ["", "  ", "a\"b", "a\nb", "a\\b"] {
            let error = preset(Preset::Codex, "codex-acp")
                .with_model(Some(bad))
                .expect_err("not a model name");
            assert!(error.starts_with("--agent-model:"), "{bad:?}: {error}");
        }
    }
}
