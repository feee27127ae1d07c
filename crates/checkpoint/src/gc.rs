//! Collecting chunks no kept checkpoint uses (mark and sweep), and the retention policy
//! ([`to_drop`]) that decides which checkpoints go.
//!
//! The sweep's rule: a chunk is deleted only when no kept manifest names it **and** it was last
//! written or refreshed more than the grace (`Config::grace`, an hour by default) before the
//! sweep started. That makes it safe against a take running meanwhile, whose manifest no caller
//! could have counted as kept: every chunk such a take writes is newer than the sweep's start,
//! and every chunk it finds already stored is refreshed when older than half the grace
//! (`crate::chunks`), so it is newer than the cutoff too. Chunks a take reuses from its
//! `previous` checkpoint (through the quick check, or because a changed file still holds them)
//! are not refreshed: that checkpoint is the caller's to keep until the new one is stored (the
//! newest is never dropped). In one process a sweep re-checks each chunk's time and deletes it under the gate a
//! take's check holds shared, so the two never interleave; across processes the grace (which
//! also absorbs clock differences with an object store) is the margin.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use crate::Error;
use crate::chunk::ChunkId;
use crate::chunks::Chunks;
use crate::listing::{Listed, newest_first};
use crate::manifest::Manifest;

/// Leftovers of interrupted writes are removed once at least this old (or the grace, if
/// longer): no take runs that long.
const LEFTOVER_AGE: Duration = Duration::from_secs(3600);

/// What a sweep found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectStats {
    /// Chunks a kept checkpoint names.
    pub n_kept: u64,
    /// Chunks deleted.
    pub n_deleted: u64,
    /// Chunks no kept checkpoint names but written within the grace: left for a later sweep.
    pub n_spared: u64,
    /// Leftovers of interrupted writes removed.
    pub n_leftovers: u64,
}

/// Deletes the chunks none of `kept` names, by the rule in the module's docs.
pub(crate) fn collect(chunks: &Chunks, kept: &[&Manifest]) -> Result<CollectStats, Error> {
    let started = SystemTime::now();
    let cutoff = started
        .checked_sub(chunks.grace)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let marked: HashSet<ChunkId> = kept.iter().flat_map(|m| m.chunk_ids()).collect();
    let mut stats = CollectStats::default();
    for (id, written) in chunks.backend.list_chunks()? {
        if marked.contains(&id) {
            stats.n_kept += 1;
            continue;
        }
        if written >= cutoff {
            stats.n_spared += 1;
            continue;
        }
        let _exclusive = chunks
            .gate
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // A take may have refreshed it since the listing.
        match chunks.backend.chunk_written_at(&id)? {
            Some(written) if written < cutoff => {
                chunks.backend.delete_chunk(&id)?;
                stats.n_deleted += 1;
            }
            Some(_) => stats.n_spared += 1,
            None => {}
        }
    }
    let leftovers_before = started
        .checked_sub(chunks.grace.max(LEFTOVER_AGE))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    stats.n_leftovers = chunks.backend.clean_leftovers(leftovers_before)?;
    Ok(stats)
}

/// The checkpoints of `listed` to drop: all but the newest `keep_n`, and those older than
/// `max_age` at `now`; the newest one is never dropped, whatever the limits.
pub fn to_drop(
    listed: &[Listed],
    keep_n: usize,
    max_age: Duration,
    now: SystemTime,
) -> Vec<String> {
    let mut sorted = listed.to_vec();
    newest_first(&mut sorted);
    let now_ms = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let max_age_ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
    sorted
        .into_iter()
        .enumerate()
        .filter(|(rank, listed)| {
            let too_many = *rank >= keep_n;
            let too_old = now_ms.saturating_sub(listed.created_at_ms) > max_age_ms;
            *rank > 0 && (too_many || too_old)
        })
        .map(|(_, listed)| listed.id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MS: u64 = 24 * 3600 * 1000;

    fn listed(ages_days: &[u64], now_ms: u64) -> Vec<Listed> {
        ages_days
            .iter()
            .map(|age| {
                let created_at_ms = now_ms - age * DAY_MS;
                Listed {
                    id: format!("{created_at_ms:012x}-00000000"),
                    created_at_ms,
                }
            })
            .collect()
    }

    #[test]
    fn the_policy_drops_beyond_the_count_and_the_age_but_never_the_newest() {
        let now_ms = 1_800_000_000_000;
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(now_ms);
        let month = Duration::from_secs(30 * 24 * 3600);
        // (ages in days, keep_n, max_age) → ages of those dropped.
        let table: &[(&[u64], usize, Duration, &[u64])] = &[
            (&[0, 1, 2], 100, month, &[]),
            (&[0, 1, 2, 3], 2, month, &[2, 3]),
            (&[0, 10, 40, 50], 100, month, &[40, 50]),
            (&[0, 10, 40], 1, month, &[10, 40]),
            (&[45], 100, month, &[]),
            (&[45, 60], 100, month, &[60]),
            (&[3, 1, 2], 0, month, &[2, 3]),
            (&[], 5, month, &[]),
        ];
        for (ages, keep_n, max_age, dropped_ages) in table {
            let all = listed(ages, now_ms);
            let dropped = to_drop(&all, *keep_n, *max_age, now);
            let expected: Vec<String> = listed(dropped_ages, now_ms)
                .into_iter()
                .map(|l| l.id)
                .collect();
            assert_eq!(dropped, expected, "ages {ages:?} keep {keep_n}");
        }
    }
}
