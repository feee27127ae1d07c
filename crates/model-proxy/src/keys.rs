//! The real model keys and where the proxy sends requests: read once at start from the
//! gateway's environment and `--model-key-file` (which overrides it, provider by provider), and
//! the `--model-upstream NAME=URL` origins.
//!
//! A key lives only in a [`Key`], whose `Debug` is redacted; no error message here quotes a key
//! file's values (a malformed line is named by its number).

use std::collections::HashMap;
use std::path::Path;

use axum::http::HeaderValue;

use super::provider::Provider;

/// A real API key.
#[derive(Clone)]
pub struct Key(String);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl Key {
    /// The credential header's value (`prefix` + key), marked sensitive so no header dump
    /// shows it.
    pub fn header_value(&self, prefix: &str) -> Option<HeaderValue> {
        let mut value = HeaderValue::from_str(&format!("{prefix}{}", self.0)).ok()?;
        value.set_sensitive(true);
        Some(value)
    }

    #[cfg(test)]
    fn reveal(&self) -> &str {
        &self.0
    }
}

/// `--model-upstream NAME=URL`: a provider and its origin (with an optional path prefix, no
/// trailing slash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub provider: Provider,
    pub base: String,
}

/// Parses `NAME=URL` (clap's value parser for `--model-upstream`).
pub fn parse_upstream(text: &str) -> Result<Upstream, String> {
    let (name, url) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=URL"))?;
    let provider = Provider::from_name(name.trim()).ok_or_else(|| {
        format!("unknown model provider {name:?} (one of anthropic, openai, gemini)")
    })?;
    let url = url.trim();
    let parsed =
        reqwest::Url::parse(url).map_err(|e| format!("{name}: {url:?} is not a URL: {e}"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // Credentials come from the key file or the environment, never a URL that is logged.
        return Err(format!(
            "{name}: the upstream URL must not carry credentials"
        ));
    }
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!("{name}: {url:?} is not an http(s) origin"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!("{name}: {url:?} has a query or fragment"));
    }
    Ok(Upstream {
        provider,
        base: parsed.as_str().trim_end_matches('/').to_string(),
    })
}

/// The keys, one per provider at most.
#[derive(Debug, Default)]
pub struct Keys {
    by_provider: HashMap<Provider, Key>,
}

impl Keys {
    /// The environment's keys (`env` looks a variable up), then the key file's, which replace
    /// them provider by provider; an empty value in the file means "no key" even if the
    /// environment has one.
    pub fn load(
        key_file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Keys, String> {
        let mut by_provider = HashMap::new();
        for provider in Provider::ALL {
            let from_env = provider
                .key_variables()
                .iter()
                .filter_map(|name| env(name))
                .find(|value| !value.trim().is_empty());
            if let Some(value) = from_env {
                by_provider.insert(
                    provider,
                    checked(value.trim().to_string(), "the environment")?,
                );
            }
        }
        if let Some(path) = key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--model-key-file {}: cannot read it: {e}", path.display()))?;
            let from_file = parse_key_file(&text)
                .map_err(|e| format!("--model-key-file {}: {e}", path.display()))?;
            for (provider, key) in from_file {
                match key {
                    Some(key) => by_provider.insert(provider, key),
                    None => by_provider.remove(&provider),
                };
            }
        }
        Ok(Keys { by_provider })
    }

    pub fn get(&self, provider: Provider) -> Option<&Key> {
        self.by_provider.get(&provider)
    }
}

fn checked(value: String, source: &str) -> Result<Key, String> {
    let key = Key(value);
    match key.header_value("Bearer ") {
        Some(_) => Ok(key),
        None => Err(format!(
            "a model key from {source} has characters no HTTP header can carry"
        )),
    }
}

/// `NAME=VALUE` lines (`#` comments, blank lines, an optional `export `, optional quotes) for
/// the key variables; `None` for a provider whose value is empty.
fn parse_key_file(text: &str) -> Result<Vec<(Provider, Option<Key>)>, String> {
    let mut keys = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let n = index + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("line {n} is not NAME=VALUE"));
        };
        let name = name.trim();
        let provider = Provider::ALL
            .into_iter()
            .find(|p| p.key_variables().contains(&name))
            .ok_or_else(|| {
                format!(
                    "line {n}: unknown name {name:?} (ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY or GOOGLE_API_KEY)"
                )
            })?;
        let value = value.trim();
        let value = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(value);
        let key = if value.is_empty() {
            None
        } else {
            Some(checked(value.to_string(), &format!("line {n}"))?)
        };
        keys.push((provider, key));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    fn revealed(keys: &Keys) -> Vec<(Provider, &str)> {
        Provider::ALL
            .into_iter()
            .filter_map(|p| keys.get(p).map(|k| (p, k.reveal())))
            .collect()
    }

    #[test]
    fn the_key_file_overrides_the_environment_provider_by_provider() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("keys");
        std::fs::write(
            &file,
            "# keys\n\nANTHROPIC_API_KEY=sk-ant-file\nexport OPENAI_API_KEY=\"sk-file\"\nGOOGLE_API_KEY=\n",
        )
        .expect("write");
        let vars = [
            ("ANTHROPIC_API_KEY", "sk-ant-env"),
            ("OPENAI_API_KEY", "sk-env"),
            ("GOOGLE_API_KEY", "g-env"),
        ];
        let keys = Keys::load(Some(&file), env(&vars)).expect("keys load");
        assert_eq!(
            revealed(&keys),
            [
                (Provider::Anthropic, "sk-ant-file"),
                (Provider::OpenAi, "sk-file")
            ]
        );
        let keys = Keys::load(None, env(&vars)).expect("keys load");
        assert_eq!(revealed(&keys)[2], (Provider::Gemini, "g-env"));
        let vars = [("GEMINI_API_KEY", "gm"), ("GOOGLE_API_KEY", "g")];
        let keys = Keys::load(None, env(&vars)).expect("keys load");
        assert_eq!(
            revealed(&keys),
            [(Provider::Gemini, "gm")],
            "GEMINI_API_KEY first"
        );
    }

    #[test]
    fn a_bad_key_file_is_refused_without_quoting_its_values() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cases = [
            ("sk-secret-1\n", "line 1 is not NAME=VALUE"),
            (
                "ANTHROPIC_API_KEY=ok\nAWS_SECRET=sk-secret-2\n",
                "line 2: unknown name \"AWS_SECRET\"",
            ),
            ("OPENAI_API_KEY=sk-secret-3\u{7}\n", "line 1"),
        ];
        for (text, expected) in cases {
            let file = dir.path().join("keys");
            std::fs::write(&file, text).expect("write");
            let error = Keys::load(Some(&file), |_| None).expect_err(text);
            assert!(error.contains(expected), "{error}");
            assert!(!error.contains("sk-secret"), "{error}");
        }
        let missing = Keys::load(Some(&dir.path().join("absent")), |_| None).expect_err("absent");
        assert!(missing.contains("cannot read"), "{missing}");
    }

    #[test]
    fn upstreams_are_http_origins_with_an_optional_prefix() {
        let ok = [
            (
                "anthropic=https://api.anthropic.com",
                "https://api.anthropic.com",
            ),
            (
                "openai=http://127.0.0.1:9000/prefix/",
                "http://127.0.0.1:9000/prefix",
            ),
            (
                "gemini=https://example.test/a/b",
                "https://example.test/a/b",
            ),
        ];
        for (text, base) in ok {
            assert_eq!(parse_upstream(text).expect(text).base, base);
        }
        for text in [
            "mistral=https://x.test",
            "anthropic",
            "anthropic=ftp://x.test",
            "anthropic=not a url",
            "openai=https://user:pw@x.test",
            "openai=https://x.test/?a=1",
        ] {
            assert!(parse_upstream(text).is_err(), "{text}");
        }
    }

    #[test]
    fn debug_never_shows_a_key() {
        let keys = Keys::load(None, env(&[("OPENAI_API_KEY", "sk-visible")])).expect("keys");
        assert!(!format!("{keys:?}").contains("sk-visible"));
    }
}
