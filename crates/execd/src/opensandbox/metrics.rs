//! `GET /metrics` and `GET /metrics/watch`: CPU and memory use of the machine (or container)
//! from `/proc/stat` and `/proc/meminfo`. CPU use is the busy share between two samples: 100 ms
//! apart for a single reading, one second apart while watching.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use warren_protocol::opensandbox::Metrics;

use super::CompatError;
use super::stream::now_ms;

/// Cumulative (busy, total) jiffies over all CPUs.
#[derive(Debug, Clone, Copy, Default)]
struct CpuSample {
    busy: u64,
    total: u64,
}

async fn cpu_sample() -> CpuSample {
    let text = tokio::fs::read_to_string("/proc/stat")
        .await
        .unwrap_or_default();
    parse_cpu_line(&text).unwrap_or_default()
}

fn parse_cpu_line(stat: &str) -> Option<CpuSample> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().sum();
    // idle + iowait are not busy.
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    Some(CpuSample {
        busy: total.saturating_sub(idle),
        total,
    })
}

fn cpu_pct(before: CpuSample, after: CpuSample) -> f64 {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return 0.0;
    }
    let busy = after.busy.saturating_sub(before.busy);
    (busy as f64 / total as f64 * 10_000.0).round() / 100.0
}

/// (total, used) MiB.
async fn memory_mib() -> (f64, f64) {
    let text = tokio::fs::read_to_string("/proc/meminfo")
        .await
        .unwrap_or_default();
    parse_meminfo(&text)
}

fn parse_meminfo(text: &str) -> (f64, f64) {
    let field = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    let total = field("MemTotal:");
    let available = field("MemAvailable:");
    let mib = |kib: f64| (kib / 1024.0 * 100.0).round() / 100.0;
    (mib(total), mib((total - available).max(0.0)))
}

fn cpu_count() -> f64 {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64
}

async fn reading(before: CpuSample, after: CpuSample) -> Metrics {
    let (mem_total_mib, mem_used_mib) = memory_mib().await;
    Metrics {
        cpu_count: cpu_count(),
        cpu_used_pct: cpu_pct(before, after),
        mem_total_mib,
        mem_used_mib,
        timestamp: now_ms(),
    }
}

pub async fn current() -> Result<Metrics, CompatError> {
    let before = cpu_sample().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = cpu_sample().await;
    Ok(reading(before, after).await)
}

/// One JSON object per line, every second, until the client leaves.
pub fn watch() -> Response {
    let stream = futures_util::stream::unfold(None::<CpuSample>, |previous| async move {
        let before = match previous {
            Some(sample) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                sample
            }
            None => {
                let sample = cpu_sample().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                sample
            }
        };
        let after = cpu_sample().await;
        let metrics = reading(before, after).await;
        let mut line = serde_json::to_vec(&metrics).expect("metrics always serialize");
        line.push(b'\n');
        Some((
            Ok::<Bytes, std::convert::Infallible>(Bytes::from(line)),
            Some(after),
        ))
    });
    super::stream::streaming_response(Body::from_stream(stream), "application/x-ndjson")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_percentage_is_the_busy_share_between_samples() {
        let before = parse_cpu_line("cpu  100 0 100 700 100 0 0 0 0 0\n").expect("parses");
        let after = parse_cpu_line("cpu  150 0 150 750 150 0 0 0 0 0\n").expect("parses");
        assert_eq!(cpu_pct(before, after), 50.0);
        assert_eq!(cpu_pct(after, after), 0.0);
    }

    #[test]
    fn memory_used_is_total_minus_available() {
        let (total, used) =
            parse_meminfo("MemTotal:  2048 kB\nMemFree: 1 kB\nMemAvailable:  1024 kB\n");
        assert_eq!((total, used), (2.0, 1.0));
    }
}
