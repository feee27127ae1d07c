//! Checkpoint ids and pages of them. An id is opaque to callers; inside it is the creation
//! time in milliseconds (12 hex digits, so ids sort by time) and 8 random hex digits (so two
//! stores writing one bucket never collide). Ids given by callers are checked before they
//! name anything in storage. Pages run newest first and continue from an id (`before`), so a
//! session with 10,000 checkpoints lists them a page at a time.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Error;

/// The last creation time this process gave an id, so its ids strictly increase.
static LAST_MS: AtomicU64 = AtomicU64::new(0);

/// One stored checkpoint in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    pub created_at_ms: u64,
}

/// A page of checkpoints, newest first; `next` is the `before` of the following page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub checkpoints: Vec<Listed>,
    pub next: Option<String>,
}

/// A new id for a checkpoint created at `now_ms` (or later, when this process already gave
/// out that millisecond), and its creation time.
pub(crate) fn new_id(now_ms: u64) -> (String, u64) {
    let mut ms = now_ms;
    let _ = LAST_MS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
        ms = now_ms.max(last + 1);
        Some(ms)
    });
    (format!("{ms:012x}-{:08x}", rand::random::<u32>()), ms)
}

/// The checkpoint `id` names, or `None` when it is not an id this crate makes.
pub(crate) fn parse_id(id: &str) -> Option<Listed> {
    let (time, random) = id.split_once('-')?;
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !hex(time, 12) || !hex(random, 8) {
        return None;
    }
    Some(Listed {
        id: id.to_owned(),
        created_at_ms: u64::from_str_radix(time, 16).ok()?,
    })
}

/// `id` if this crate could have made it, else [`Error::NotFound`] (an id from a request that
/// names nothing).
pub(crate) fn checked(id: &str) -> Result<&str, Error> {
    parse_id(id)
        .map(|_| id)
        .ok_or_else(|| Error::NotFound(id.to_owned()))
}

/// Sorts `listed` newest first.
pub(crate) fn newest_first(listed: &mut [Listed]) {
    listed.sort_unstable_by(|a, b| b.id.cmp(&a.id));
}

/// At most `limit` of `listed` (newest first) older than `before`, and where the next page
/// starts.
pub(crate) fn page_of(listed: &[Listed], before: Option<&str>, limit: usize) -> Page {
    let start = before.map_or(0, |before| {
        listed.partition_point(|l| l.id.as_str() >= before)
    });
    let end = start.saturating_add(limit.max(1)).min(listed.len());
    let checkpoints = listed[start..end].to_vec();
    let next = (end < listed.len())
        .then(|| checkpoints.last().map(|l| l.id.clone()))
        .flatten();
    Page { checkpoints, next }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_creation_and_parse_back() {
        let (a, a_ms) = new_id(1_700_000_000_000);
        let (b, b_ms) = new_id(1_700_000_000_000);
        assert!(b_ms > a_ms, "one process never gives a millisecond twice");
        assert!(b > a);
        assert_eq!(parse_id(&a).map(|l| l.created_at_ms), Some(a_ms));
        for bad in [
            "",
            "../x",
            "0123456789ab-0123456",
            "0123456789AB-01234567",
            "x-y",
        ] {
            assert!(parse_id(bad).is_none(), "{bad}");
            assert!(matches!(checked(bad), Err(Error::NotFound(_))));
        }
    }

    #[test]
    fn ten_thousand_checkpoints_page_newest_first_without_gaps_or_repeats() {
        let mut listed: Vec<Listed> = (0..10_000u64)
            .map(|i| Listed {
                id: format!("{i:012x}-00000000"),
                created_at_ms: i,
            })
            .collect();
        newest_first(&mut listed);
        let mut seen = Vec::new();
        let mut before: Option<String> = None;
        let mut n_pages = 0;
        loop {
            let page = page_of(&listed, before.as_deref(), 100);
            n_pages += 1;
            seen.extend(page.checkpoints.iter().map(|l| l.created_at_ms));
            match page.next {
                Some(next) => before = Some(next),
                None => break,
            }
        }
        assert_eq!(n_pages, 100);
        let expected: Vec<u64> = (0..10_000).rev().collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn a_page_starts_after_before_even_when_before_is_gone() {
        let mut listed: Vec<Listed> = [1u64, 2, 4, 5]
            .iter()
            .map(|i| Listed {
                id: format!("{i:012x}-00000000"),
                created_at_ms: *i,
            })
            .collect();
        newest_first(&mut listed);
        let ids = |page: Page| {
            page.checkpoints
                .iter()
                .map(|l| l.created_at_ms)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(page_of(&listed, None, 2)), [5, 4]);
        assert_eq!(
            ids(page_of(&listed, Some("000000000003-00000000"), 10)),
            [2, 1]
        );
        assert_eq!(
            ids(page_of(&listed, Some("000000000001-00000000"), 10)),
            Vec::<u64>::new()
        );
        assert_eq!(page_of(&listed, None, 4).next, None);
        assert_eq!(
            page_of(&listed, None, 3).next.as_deref(),
            Some("000000000002-00000000")
        );
    }
}
