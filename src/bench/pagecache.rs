//! Page-cache facts of the machine that bear on the figures.
//!
//! A host that reclaims page cache left idle (a DAMON `pageout` scheme, say) drops part or
//! all of a target's file while the other targets take their turn at a job, and the state
//! the file is then cached in (4 KiB folios fetched by random reads, or large folios from
//! sequential I/O) changes what later jobs cost: large writes into 4 KiB folios take the
//! kernel about twice the work per MiB, and 4 KiB random writes into large folios ran at a
//! sixth of their rate into 4 KiB ones (docs/performance.md). The report names such a
//! policy so that figures are read with it in mind.

use std::path::Path;

/// Host policies that drop idle page cache behind the bench's back, for the report's
/// machine facts: DAMON `pageout` schemes of running kdamonds (`damon` is the DAMON sysfs
/// admin directory, `/sys/kernel/mm/damon/admin`). None when there are none.
pub fn idle_page_reclaim(damon: &Path) -> Option<String> {
    let read = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let subdirs = |p: &Path| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(p).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        v.sort();
        v
    };
    let mut found = Vec::new();
    for kd in subdirs(&damon.join("kdamonds")) {
        if read(&kd.join("state")).as_deref() != Some("on") {
            continue;
        }
        for ctx in subdirs(&kd.join("contexts")) {
            let aggr_us: Option<u64> = read(&ctx.join("monitoring_attrs/intervals/aggr_us")).and_then(|v| v.parse().ok());
            for scheme in subdirs(&ctx.join("schemes")) {
                if read(&scheme.join("action")).as_deref() != Some("pageout") {
                    continue;
                }
                let min_age: Option<u64> = read(&scheme.join("access_pattern/age/min")).and_then(|v| v.parse().ok());
                found.push(match (aggr_us, min_age) {
                    (Some(a), Some(m)) => format!("DAMON pageout of memory idle ≥ {} s", a.saturating_mul(m) as f64 / 1e6),
                    _ => "DAMON pageout".to_string(),
                });
            }
        }
    }
    found.dedup();
    (!found.is_empty()).then(|| found.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_running_damon_pageout_schemes_and_their_idle_age() {
        let dir = tempfile::tempdir().unwrap();
        let put = |rel: &str, v: &str| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, format!("{v}\n")).unwrap();
        };
        assert_eq!(idle_page_reclaim(dir.path()), None);
        put("kdamonds/0/state", "on");
        put("kdamonds/0/contexts/0/monitoring_attrs/intervals/aggr_us", "5000000");
        put("kdamonds/0/contexts/0/schemes/0/action", "stat");
        put("kdamonds/0/contexts/0/schemes/0/access_pattern/age/min", "6");
        assert_eq!(idle_page_reclaim(dir.path()), None, "a scheme that only counts drops nothing");
        put("kdamonds/0/contexts/0/schemes/1/action", "pageout");
        put("kdamonds/0/contexts/0/schemes/1/access_pattern/age/min", "6");
        assert_eq!(idle_page_reclaim(dir.path()).as_deref(), Some("DAMON pageout of memory idle ≥ 30 s"));
        put("kdamonds/0/state", "off");
        assert_eq!(idle_page_reclaim(dir.path()), None, "a stopped kdamond reclaims nothing");
    }
}
