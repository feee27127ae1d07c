//! The sessions' model tokens (`wm_` + 43 base64url chars): made on a session's first request
//! for one, the same until revoked. A presented token is found by its SHA-256, so checking one
//! compares digests, never the token's own bytes, and timing says nothing useful about it.
//!
//! Held in memory only: a restarted gateway hands out new tokens with the agents it starts.
//! Deliberately absent: any `Debug` or log of a token.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use warren_http::secret::new_secret;

/// Token prefix: what a `wm_` token in a log or a leak would be recognised by.
pub const TOKEN_PREFIX: &str = "wm_";

#[derive(Default)]
pub struct Tokens {
    state: Mutex<TokenState>,
}

#[derive(Default)]
struct TokenState {
    /// Session id → its token, to hand the same one out again.
    by_session: HashMap<String, String>,
    /// SHA-256 of a token → session id.
    by_hash: HashMap<[u8; 32], String>,
}

fn sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    fn lock(&self) -> std::sync::MutexGuard<'_, TokenState> {
        // Every change is two map operations under the lock; a poisoned lock still holds
        // consistent maps.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The session's token, made on first call.
    pub fn token(&self, session_id: &str) -> String {
        let mut state = self.lock();
        if let Some(token) = state.by_session.get(session_id) {
            return token.clone();
        }
        let token = new_secret(TOKEN_PREFIX);
        state.by_hash.insert(sha256(&token), session_id.to_string());
        state
            .by_session
            .insert(session_id.to_string(), token.clone());
        token
    }

    /// The session a presented token belongs to.
    pub fn session_of(&self, presented: &str) -> Option<String> {
        if !presented.starts_with(TOKEN_PREFIX) {
            return None;
        }
        // Looked up by digest: how long the lookup takes depends on the digest, which says
        // nothing about any stored token's bytes.
        let hash = sha256(presented);
        self.lock().by_hash.get(&hash).cloned()
    }

    pub fn revoke(&self, session_id: &str) {
        let mut state = self.lock();
        if let Some(token) = state.by_session.remove(session_id) {
            state.by_hash.remove(&sha256(&token));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_stable_until_revoked_and_names_its_session() {
        let tokens = Tokens::default();
        let first = tokens.token("s1");
        assert!(
            first.starts_with("wm_") && first.len() == 3 + 43,
            "{}",
            first.len()
        );
        assert_eq!(tokens.token("s1"), first);
        let other = tokens.token("s2");
        assert_ne!(other, first);
        assert_eq!(tokens.session_of(&first).as_deref(), Some("s1"));
        assert_eq!(tokens.session_of(&other).as_deref(), Some("s2"));
        assert_eq!(tokens.session_of(&format!("{first}x")), None);
        assert_eq!(tokens.session_of(""), None);
        tokens.revoke("s1");
        assert_eq!(tokens.session_of(&first), None);
        assert_eq!(tokens.session_of(&other).as_deref(), Some("s2"));
        let renewed = tokens.token("s1");
        assert_ne!(renewed, first, "a revoked token is never handed out again");
    }
}
