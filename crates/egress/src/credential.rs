//! Named credentials (network.md "Credentials"): `NAME=HOST[,HOST…]:HEADER:VALUE`, where VALUE
//! names a variable of the gateway's environment, alone (`$TOKEN`) or after a scheme
//! (`Bearer $TOKEN`; `Basic $PAIR` with `user:token`, sent base64-encoded). The value is read
//! once, when the flag is parsed, and is kept only here: nothing prints it (`Debug` names the
//! variable, never its value), and [`Credential::secrets`] lists what must never reach a
//! sandbox so the proxy can mask it in what comes back.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use http::{HeaderName, HeaderValue};

use crate::policy::Rule;

/// One credential: the hosts it is for, the header it sets and its value.
#[derive(Clone)]
pub struct Credential {
    name: String,
    hosts: Vec<Rule>,
    header: HeaderName,
    /// What the header is set to (marked sensitive).
    value: HeaderValue,
    /// The environment variable the value came from (said instead of the value).
    variable: String,
    /// The byte strings of the value that must not reach the sandbox: the header value, the
    /// variable's value, and for a `user:token` pair the token alone.
    secrets: Vec<Vec<u8>>,
}

/// A credential that does not parse: what was wrong, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad --hands-credential {name:?}: {why}")]
pub struct CredentialError {
    /// The credential's name, or the text before `=` (never the value).
    pub name: String,
    pub why: String,
}

/// Headers a credential may not set: the proxy and HTTP itself own them.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
];

/// Parts of a value shorter than this are not masked on their own (a short `user` or token
/// would mask ordinary text); the whole header value always is.
const MIN_MASKED: usize = 6;

impl Credential {
    /// Parses `NAME=HOST[,HOST…]:HEADER:VALUE`, reading the variable VALUE names with `lookup`.
    pub fn parse(
        spec: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Credential, CredentialError> {
        let (name, rest) = spec.split_once('=').ok_or_else(|| CredentialError {
            name: String::new(),
            why: "expected NAME=HOST[,HOST…]:HEADER:VALUE".into(),
        })?;
        let name = name.trim();
        let error = |why: String| CredentialError {
            name: name.to_owned(),
            why,
        };
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(error(
                "the name must be 1 to 64 letters, digits, `-`, `_` or `.`".into(),
            ));
        }
        let hosts_end = host_list_end(rest)
            .ok_or_else(|| error("expected HOST[,HOST…]:HEADER:VALUE after the name".into()))?;
        let (hosts_text, rest) = (&rest[..hosts_end], &rest[hosts_end + 1..]);
        let mut hosts = Vec::new();
        for host in hosts_text.split(',').map(str::trim) {
            let rule: Rule = host
                .parse()
                .map_err(|e: crate::RuleError| error(format!("host {host:?}: {}", e.why)))?;
            if rule.port().is_some() {
                return Err(error(format!(
                    "host {host:?}: a credential is for a host on every port; give no port"
                )));
            }
            hosts.push(rule);
        }
        let (header, value_spec) = rest
            .split_once(':')
            .ok_or_else(|| error("expected HEADER:VALUE after the hosts".into()))?;
        let header = HeaderName::from_str(header.trim())
            .map_err(|_| error(format!("{:?} is not an HTTP header name", header.trim())))?;
        if RESERVED_HEADERS.contains(&header.as_str()) {
            return Err(error(format!(
                "the header {header} is the proxy's, not a credential's"
            )));
        }
        let value_spec = value_spec.trim();
        let (scheme, variable) = match value_spec.rsplit_once(' ') {
            Some((scheme, variable)) => (Some(scheme.trim()), variable),
            None => (None, value_spec),
        };
        let variable = variable.strip_prefix('$').ok_or_else(|| {
            error("VALUE must name an environment variable: $VAR or SCHEME $VAR".into())
        })?;
        if variable.is_empty()
            || !variable
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(error(format!("{variable:?} is not a variable name")));
        }
        if let Some(scheme) = scheme
            && (scheme.is_empty()
                || !scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        {
            return Err(error(format!("{scheme:?} is not an authentication scheme")));
        }
        let raw = lookup(variable)
            .filter(|raw| !raw.is_empty())
            .ok_or_else(|| error(format!("the environment variable {variable} is not set")))?;
        let mut secrets = Vec::new();
        let value_text = match scheme {
            Some(scheme) if scheme.eq_ignore_ascii_case("basic") => {
                if let Some((_, token)) = raw.split_once(':')
                    && token.len() >= MIN_MASKED
                {
                    secrets.push(token.as_bytes().to_vec());
                }
                let encoded = base64::engine::general_purpose::STANDARD.encode(raw.as_bytes());
                secrets.push(encoded.as_bytes().to_vec());
                format!("{scheme} {encoded}")
            }
            Some(scheme) => format!("{scheme} {raw}"),
            None => raw.clone(),
        };
        if raw.len() >= MIN_MASKED {
            secrets.push(raw.as_bytes().to_vec());
        }
        let mut value = HeaderValue::from_str(&value_text).map_err(|_| {
            error(format!(
                "the value of {variable} cannot be an HTTP header value (a line break or a control character)"
            ))
        })?;
        value.set_sensitive(true);
        secrets.push(value.as_bytes().to_vec());
        secrets.sort();
        secrets.dedup();
        Ok(Credential {
            name: name.to_owned(),
            hosts,
            header,
            value,
            variable: variable.to_owned(),
            secrets,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hosts, as given (`*.` wildcards kept).
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.iter().map(Rule::to_string).collect()
    }

    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    pub(crate) fn value(&self) -> &HeaderValue {
        &self.value
    }

    /// Whether the credential is for `host` (normalized), on any port.
    pub fn covers(&self, host: &str) -> bool {
        self.hosts.iter().any(|rule| rule.matches(host, 0))
    }

    /// What must never reach the sandbox, longest first.
    pub(crate) fn secrets(&self) -> &[Vec<u8>] {
        &self.secrets
    }
}

/// Where the host list ends: the first `:` outside `[...]`.
fn host_list_end(text: &str) -> Option<usize> {
    let mut in_brackets = false;
    for (at, c) in text.char_indices() {
        match c {
            '[' => in_brackets = true,
            ']' => in_brackets = false,
            ':' if !in_brackets => return Some(at),
            _ => {}
        }
    }
    None
}

impl FromStr for Credential {
    type Err = CredentialError;

    /// Reads the variable from the process's environment.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        Credential::parse(spec, |variable| std::env::var(variable).ok())
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("name", &self.name)
            .field("hosts", &self.hosts())
            .field("header", &self.header)
            .field("value", &format_args!("${} (not shown)", self.variable))
            .finish()
    }
}

impl fmt::Display for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={}:{}:${}",
            self.name,
            self.hosts().join(","),
            self.header,
            self.variable
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANARY: &str = "canary-3f9a1c7e5b";

    fn lookup(variable: &str) -> Option<String> {
        match variable {
            "TOKEN" => Some(CANARY.to_owned()),
            "PAIR" => Some(format!("git:{CANARY}")),
            "EMPTY" => Some(String::new()),
            "BROKEN" => Some("a\nb".to_owned()),
            _ => None,
        }
    }

    fn parse(spec: &str) -> Result<Credential, CredentialError> {
        Credential::parse(spec, lookup)
    }

    #[test]
    fn a_bearer_credential_covers_its_hosts_and_never_prints_its_value() {
        let credential = parse("github=github.com,*.github.com:Authorization:Bearer $TOKEN")
            .expect("the credential parses");
        assert_eq!(credential.name(), "github");
        assert_eq!(credential.hosts(), ["github.com", "*.github.com"]);
        assert_eq!(
            credential.value().to_str().expect("the credential parses"),
            format!("Bearer {CANARY}")
        );
        assert!(credential.value().is_sensitive());
        assert!(credential.covers("github.com"));
        assert!(credential.covers("api.github.com"));
        assert!(!credential.covers("github.com.evil.example"));
        assert!(!credential.covers("gitlab.com"));
        for printed in [format!("{credential:?}"), credential.to_string()] {
            assert!(!printed.contains(CANARY), "{printed}");
            assert!(printed.contains("$TOKEN"), "{printed}");
        }
        assert!(credential.secrets().iter().any(|s| s == CANARY.as_bytes()));
    }

    #[test]
    fn basic_sends_the_pair_base64_encoded_and_masks_the_token_alone() {
        let credential =
            parse("git=127.0.0.2:Authorization:Basic $PAIR").expect("the credential parses");
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("git:{CANARY}"));
        assert_eq!(
            credential.value().to_str().expect("the credential parses"),
            format!("Basic {encoded}")
        );
        let secrets = credential.secrets();
        assert!(secrets.iter().any(|s| s == CANARY.as_bytes()));
        assert!(secrets.iter().any(|s| s == encoded.as_bytes()));
        assert!(credential.covers("127.0.0.2"));
        assert!(
            parse("v6=[::1]:X-Token:$TOKEN")
                .expect("the credential parses")
                .covers("::1")
        );
    }

    #[test]
    fn each_bad_credential_says_what_is_wrong_without_the_value() {
        for (spec, says) in [
            ("no-equals", "NAME=HOST"),
            ("=github.com:Authorization:$TOKEN", "the name"),
            ("a b=github.com:Authorization:$TOKEN", "the name"),
            ("gh=github.com", "HOST[,HOST…]:HEADER:VALUE"),
            ("gh=github.com:Authorization", "HEADER:VALUE"),
            ("gh=not a host:Authorization:$TOKEN", "host \"not a host\""),
            ("gh=*github.com:Authorization:$TOKEN", "wildcard"),
            ("gh=github.com:Bad Header:$TOKEN", "not an HTTP header name"),
            ("gh=github.com:Host:$TOKEN", "the proxy's"),
            (
                "gh=github.com:Authorization:TOKEN",
                "must name an environment variable",
            ),
            (
                "gh=github.com:Authorization:Bearer TOKEN",
                "must name an environment variable",
            ),
            ("gh=github.com:Authorization:$", "not a variable name"),
            (
                "gh=github.com:Authorization:Be/arer $TOKEN",
                "not an authentication scheme",
            ),
            ("gh=github.com:Authorization:$MISSING", "MISSING is not set"),
            ("gh=github.com:Authorization:$EMPTY", "EMPTY is not set"),
            (
                "gh=github.com:Authorization:$BROKEN",
                "cannot be an HTTP header value",
            ),
        ] {
            let error = parse(spec).expect_err(spec).to_string();
            assert!(error.contains(says), "{spec}: {error}");
            assert!(!error.contains(CANARY), "{spec}: {error}");
        }
    }
}
