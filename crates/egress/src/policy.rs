//! What a session's hands may reach (network.md "Policy"): the policy, its allow and deny rules,
//! the built-in list of package registries, and the address ranges refused in every policy.
//!
//! A connection is judged twice: by name before the proxy resolves it ([`Policy::judge`]), and
//! each resolved address after ([`Policy::check_address`]), so no name can rebind into a range
//! the policy refuses.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// `--hands-egress`: what passes without asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Nothing.
    None,
    /// The built-in registries and code hosts ([`REGISTRIES`]); anything else is asked.
    Registries,
    /// Nothing passes without asking.
    Ask,
    /// Any public address.
    Open,
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "none" => Ok(Mode::None),
            "registries" => Ok(Mode::Registries),
            "ask" => Ok(Mode::Ask),
            "open" => Ok(Mode::Open),
            other => Err(format!(
                "expected none, registries, ask or open, not {other:?}"
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::None => "none",
            Mode::Registries => "registries",
            Mode::Ask => "ask",
            Mode::Open => "open",
        })
    }
}

/// The hosts `registries` lets through on ports 80 and 443: package registries and code hosts.
pub const REGISTRIES: &[&str] = &[
    // npm
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    // PyPI and its file host
    "pypi.org",
    "files.pythonhosted.org",
    // crates.io, its index and static hosts, and rustup's
    "crates.io",
    "index.crates.io",
    "static.crates.io",
    "static.rust-lang.org",
    // Go's module proxy and checksum database
    "proxy.golang.org",
    "sum.golang.org",
    // RubyGems
    "rubygems.org",
    "index.rubygems.org",
    // Maven Central
    "repo.maven.apache.org",
    "repo1.maven.org",
    // Debian and Ubuntu archives
    "deb.debian.org",
    "security.debian.org",
    "archive.ubuntu.com",
    "security.ubuntu.com",
    "ports.ubuntu.com",
    // GitHub and its content hosts
    "github.com",
    "api.github.com",
    "codeload.github.com",
    "*.githubusercontent.com",
    // GitLab
    "gitlab.com",
    "registry.gitlab.com",
];

/// [`REGISTRIES`] as rules, parsed once.
fn registry_rules() -> &'static [Rule] {
    static RULES: std::sync::LazyLock<Vec<Rule>> = std::sync::LazyLock::new(|| {
        REGISTRIES
            .iter()
            .map(|entry| entry.parse().expect("the built-in registry list parses"))
            .collect()
    });
    &RULES
}

/// One host a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// A name (lowercase, no trailing dot) or an IP address in its canonical text.
    Exact(String),
    /// `*.suffix`: every name under `suffix` (not `suffix` itself).
    Under(String),
}

/// `HOST[:PORT]`, `*.DOMAIN[:PORT]`, `IP[:PORT]` or `[IPV6][:PORT]`; without a port every port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    host: HostPattern,
    port: Option<u16>,
}

/// A rule that does not parse: the rule as given and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad egress rule {rule:?}: {why}")]
pub struct RuleError {
    pub rule: String,
    pub why: &'static str,
}

/// A host as a connection names it: a lowercase name without a trailing dot, or an IP address
/// in canonical text (IPv6 without brackets). `None` when it is neither.
pub fn normalize_host(host: &str) -> Option<String> {
    let bare = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Some(ip.to_string());
    }
    if bare.len() != host.len() {
        return None;
    }
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    is_name(&name).then_some(name)
}

fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let error = |why| RuleError {
            rule: value.to_owned(),
            why,
        };
        if value.is_empty() {
            return Err(error("empty"));
        }
        // A bare IPv6 address: its colons are not a port's.
        if let Ok(ip) = value.parse::<Ipv6Addr>() {
            return Ok(Rule {
                host: HostPattern::Exact(IpAddr::V6(ip).to_string()),
                port: None,
            });
        }
        let (host, port) = if let Some(rest) = value.strip_prefix('[') {
            let (inner, after) = rest.split_once(']').ok_or_else(|| error("no `]`"))?;
            (&value[..inner.len() + 2], after)
        } else {
            match value.rsplit_once(':') {
                Some((host, _)) => (host, &value[host.len()..]),
                None => (value, ""),
            }
        };
        let port = match port.strip_prefix(':') {
            None if port.is_empty() => None,
            None => return Err(error("text after the host")),
            Some(digits) => match digits.parse::<u16>() {
                Ok(port) if port > 0 && digits.bytes().all(|b| b.is_ascii_digit()) => Some(port),
                _ => return Err(error("the port is not a number from 1 to 65535")),
            },
        };
        let host = if let Some(suffix) = host.strip_prefix("*.") {
            let suffix = suffix.to_ascii_lowercase();
            if !is_name(&suffix) || suffix.parse::<IpAddr>().is_ok() {
                return Err(error("`*.` must be followed by a domain name"));
            }
            HostPattern::Under(suffix)
        } else {
            if host.contains('*') {
                return Err(error("a wildcard is only `*.` at the start"));
            }
            HostPattern::Exact(
                normalize_host(host).ok_or_else(|| error("not a host name or IP address"))?,
            )
        };
        Ok(Rule { host, port })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(host) if host.contains(':') && self.port.is_some() => {
                write!(f, "[{host}]")?
            }
            HostPattern::Exact(host) => f.write_str(host)?,
            HostPattern::Under(suffix) => write!(f, "*.{suffix}")?,
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

impl serde::Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Rule {
    /// A rule for exactly this host and port (what "allow for this session" adds).
    pub fn exact(host: &str, port: u16) -> Option<Rule> {
        Some(Rule {
            host: HostPattern::Exact(normalize_host(host)?),
            port: Some(port),
        })
    }

    /// The port the rule is for; `None`: every port.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether the rule covers `host` (normalized) on `port`.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let host_matches = match &self.host {
            HostPattern::Exact(exact) => exact == host,
            HostPattern::Under(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|prefix| prefix.len() > 1 && prefix.ends_with('.')),
        };
        host_matches && self.port.is_none_or(|p| p == port)
    }

    /// Whether the rule names exactly this host (no wildcard) and this port: the only kind that
    /// opens a refused address range.
    fn names_exactly(&self, host: &str, port: u16) -> bool {
        matches!(&self.host, HostPattern::Exact(exact) if exact == host) && self.port == Some(port)
    }
}

/// A session's policy and rules; deny wins over allow, and both over the mode.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Policy {
    pub mode: Mode,
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    /// Allow rules the person added by answering a question ("allow for this session"): they
    /// let a host through by name like `allow`, but never open a refused address range, so no
    /// name the person allowed can later resolve into one.
    pub answered: Vec<Rule>,
}

/// What the policy says of a host before it is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Passes; the rule that let it (`allow HOST`, `registries`, `open`).
    Allow(String),
    /// Refused; the rule that refused it (`deny HOST`, `none`).
    Refuse(String),
    /// No rule covers it: the person is asked.
    Ask,
}

impl Policy {
    pub fn new(mode: Mode) -> Policy {
        Policy {
            mode,
            allow: Vec::new(),
            deny: Vec::new(),
            answered: Vec::new(),
        }
    }

    /// The verdict on `host` (normalized, see [`normalize_host`]) and `port`, by name.
    pub fn judge(&self, host: &str, port: u16) -> Verdict {
        if let Some(rule) = self.deny.iter().find(|rule| rule.matches(host, port)) {
            return Verdict::Refuse(format!("deny {rule}"));
        }
        if let Some(rule) = self.allow.iter().find(|rule| rule.matches(host, port)) {
            return Verdict::Allow(format!("allow {rule}"));
        }
        if let Some(rule) = self.answered.iter().find(|rule| rule.matches(host, port)) {
            return Verdict::Allow(format!("allowed for the session: {rule}"));
        }
        match self.mode {
            Mode::None => Verdict::Refuse("policy none".to_owned()),
            Mode::Open => Verdict::Allow("policy open".to_owned()),
            Mode::Ask => Verdict::Ask,
            Mode::Registries => {
                let listed = matches!(port, 80 | 443)
                    && registry_rules().iter().any(|rule| rule.matches(host, port));
                if listed {
                    Verdict::Allow("policy registries".to_owned())
                } else {
                    Verdict::Ask
                }
            }
        }
    }

    /// Whether `host` may be reached at `ip` (one of its resolved addresses): an address in a
    /// range refused in every policy ([`special_range`]) passes only when an allow rule (not an
    /// answer) names this exact host, or this exact address, and port. `Err` says which range
    /// and how to open it.
    pub fn check_address(&self, host: &str, port: u16, ip: IpAddr) -> Result<(), String> {
        let Some(range) = special_range(ip) else {
            return Ok(());
        };
        let ip_text = ip.to_canonical().to_string();
        let named = self
            .allow
            .iter()
            .any(|rule| rule.names_exactly(host, port) || rule.names_exactly(&ip_text, port));
        if named {
            Ok(())
        } else {
            Err(format!(
                "{ip_text} is a {range} address, reachable only through an allow rule naming \
                 {host}:{port} exactly"
            ))
        }
    }
}

/// The range `ip` is in when it is one no policy reaches by default: loopback, private
/// (RFC 1918, RFC 4193), link-local, CGNAT, cloud metadata, unspecified, multicast, broadcast
/// and reserved; IPv4 inside IPv6 (mapped, NAT64, 6to4) is judged as the IPv4 address.
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, _, _] = ip.octets();
    Some(match (a, b) {
        _ if ip == Ipv4Addr::new(169, 254, 169, 254) => "metadata",
        (0, _) => "unspecified",
        (127, _) => "loopback",
        (10, _) | (192, 168) => "private",
        (172, 16..=31) => "private",
        (169, 254) => "link-local",
        (100, 64..=127) => "CGNAT",
        (224..=239, _) => "multicast",
        (240..=255, _) => "reserved",
        _ => return None,
    })
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let segments = ip.segments();
    let embedded = |high: u16, low: u16| Ipv4Addr::from(((high as u32) << 16) | low as u32);
    Some(match segments {
        _ if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) => "metadata",
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address.
        [0x64, 0xff9b, 0, 0, 0, 0, high, low] => return special_v4(embedded(high, low)),
        [0x2002, high, low, ..] => return special_v4(embedded(high, low)),
        [first, ..] if first & 0xfe00 == 0xfc00 => "private",
        [first, ..] if first & 0xffc0 == 0xfe80 => "link-local",
        [first, ..] if first & 0xff00 == 0xff00 => "multicast",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_print_and_match_as_written() {
        // (rule, printed, matching (host, port), not matching)
        type Row<'a> = (&'a str, &'a str, &'a [(&'a str, u16)], &'a [(&'a str, u16)]);
        let table: &[Row<'_>] = &[
            (
                "example.com",
                "example.com",
                &[("example.com", 1)],
                &[("a.example.com", 443)],
            ),
            (
                "Example.COM.:443",
                "example.com:443",
                &[("example.com", 443)],
                &[("example.com", 80)],
            ),
            (
                "*.example.com",
                "*.example.com",
                &[("a.example.com", 443), ("a.b.example.com", 1)],
                &[("example.com", 443), ("badexample.com", 443)],
            ),
            (
                "127.0.0.2:8080",
                "127.0.0.2:8080",
                &[("127.0.0.2", 8080)],
                &[("127.0.0.2", 80)],
            ),
            ("[::1]:80", "[::1]:80", &[("::1", 80)], &[("::1", 81)]),
            ("::1", "::1", &[("::1", 9)], &[]),
            ("[0:0::1]", "::1", &[("::1", 9)], &[]),
        ];
        for (text, printed, hits, misses) in table {
            let rule: Rule = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(rule.to_string(), *printed, "{text}");
            assert_eq!(
                printed.parse::<Rule>().as_ref(),
                Ok(&rule),
                "{printed} round-trips"
            );
            for (host, port) in *hits {
                assert!(rule.matches(host, *port), "{text} matches {host}:{port}");
            }
            for (host, port) in *misses {
                assert!(
                    !rule.matches(host, *port),
                    "{text} does not match {host}:{port}"
                );
            }
        }
    }

    #[test]
    fn a_bad_rule_is_refused_with_its_reason() {
        for (text, why) in [
            ("", "empty"),
            ("*", "a wildcard is only `*.` at the start"),
            ("*.", "`*.` must be followed by a domain name"),
            ("*.1.2.3.4", "`*.` must be followed by a domain name"),
            ("a.*.com", "a wildcard is only `*.` at the start"),
            ("example.com:0", "the port is not a number from 1 to 65535"),
            (
                "example.com:65536",
                "the port is not a number from 1 to 65535",
            ),
            (
                "example.com:+80",
                "the port is not a number from 1 to 65535",
            ),
            ("example.com:", "the port is not a number from 1 to 65535"),
            ("exa mple.com", "not a host name or IP address"),
            (
                "http://example.com",
                "the port is not a number from 1 to 65535",
            ),
            ("[::1", "no `]`"),
            ("[::1]x", "text after the host"),
            ("[example.com]:80", "not a host name or IP address"),
        ] {
            let error = text.parse::<Rule>().expect_err(text);
            assert_eq!((error.rule.as_str(), error.why), (text, why));
        }
    }

    #[test]
    fn deny_wins_then_allow_then_the_mode() {
        let mut policy = Policy::new(Mode::Registries);
        policy.allow = vec!["*.example.com".parse().expect("rule")];
        policy.deny = vec!["bad.example.com".parse().expect("rule")];
        for (host, port, verdict) in [
            (
                "bad.example.com",
                443,
                Verdict::Refuse("deny bad.example.com".into()),
            ),
            (
                "ok.example.com",
                443,
                Verdict::Allow("allow *.example.com".into()),
            ),
            ("pypi.org", 443, Verdict::Allow("policy registries".into())),
            (
                "objects.githubusercontent.com",
                443,
                Verdict::Allow("policy registries".into()),
            ),
            ("pypi.org", 22, Verdict::Ask),
            ("unknown.org", 443, Verdict::Ask),
        ] {
            assert_eq!(policy.judge(host, port), verdict, "{host}:{port}");
        }
        for (mode, verdict) in [
            (Mode::None, Verdict::Refuse("policy none".into())),
            (Mode::Ask, Verdict::Ask),
            (Mode::Open, Verdict::Allow("policy open".into())),
        ] {
            assert_eq!(Policy::new(mode).judge("pypi.org", 443), verdict, "{mode}");
        }
    }

    #[test]
    fn special_ranges_are_refused_unless_an_exact_rule_names_them() {
        for (ip, range) in [
            ("127.0.0.1", Some("loopback")),
            ("10.1.2.3", Some("private")),
            ("172.31.0.1", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("169.254.169.254", Some("metadata")),
            ("169.254.1.1", Some("link-local")),
            ("100.64.0.1", Some("CGNAT")),
            ("0.0.0.0", Some("unspecified")),
            ("224.0.0.1", Some("multicast")),
            ("255.255.255.255", Some("reserved")),
            ("8.8.8.8", None),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("64:ff9b::a00:1", Some("private")),
            ("2002:7f00:1::", Some("loopback")),
            ("fd00:ec2::254", Some("metadata")),
            ("fd12::1", Some("private")),
            ("fe80::1", Some("link-local")),
            ("ff02::1", Some("multicast")),
            ("2606:4700::1", None),
        ] {
            let ip: IpAddr = ip.parse().expect(ip);
            assert_eq!(special_range(ip), range, "{ip}");
        }
        let open = Policy::new(Mode::Open);
        let loopback: IpAddr = "127.0.0.2".parse().expect("ip");
        assert_eq!(
            open.check_address("localhost", 80, loopback),
            Err(
                "127.0.0.2 is a loopback address, reachable only through an allow rule naming \
                 localhost:80 exactly"
                    .into()
            )
        );
        let mut named = Policy::new(Mode::Open);
        named.allow = vec![
            "127.0.0.2:8080".parse().expect("rule"),
            "*.internal:80".parse().expect("rule"),
            "db.local:5432".parse().expect("rule"),
        ];
        assert_eq!(named.check_address("127.0.0.2", 8080, loopback), Ok(()));
        assert_eq!(named.check_address("db.local", 5432, loopback), Ok(()));
        assert!(named.check_address("127.0.0.2", 8081, loopback).is_err());
        assert!(
            named.check_address("a.internal", 80, loopback).is_err(),
            "wildcards never open a range"
        );
        let mut answered = Policy::new(Mode::Ask);
        answered.answered = vec!["db.local:5432".parse().expect("rule")];
        assert_eq!(
            answered.judge("db.local", 5432),
            Verdict::Allow("allowed for the session: db.local:5432".into()),
            "an answer lets the name through"
        );
        assert!(
            answered.check_address("db.local", 5432, loopback).is_err(),
            "but never into a refused range"
        );
    }
}
