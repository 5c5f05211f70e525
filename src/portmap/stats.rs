//! rpcbind's statistics (GETSTAT of RFC 1833 version 4, which `rpcinfo -m` shows): the
//! calls of each procedure of each version, the SETs and UNSETs that took effect, and
//! the address lookups and remote calls per service asked for. The per-service lists
//! are bounded, so that callers asking for ever new programs cannot grow them.

use crate::xdr::XdrWriter;
use std::sync::Mutex;

/// Procedures counted per version: rpcbind version 4's, NULL to GETSTAT.
pub const COUNTED_PROCEDURES: usize = 13;
/// Services listed per version in each of the lookup and remote-call lists.
const MAX_LISTED: usize = 64;

/// A service asked for, over a netid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    pub program: u32,
    pub version: u32,
    pub netid: &'static str,
}

#[derive(Debug, Default)]
struct Outcomes {
    success: u32,
    failure: u32,
    /// Remote calls only: how many came as INDIRECT.
    indirect: u32,
}

impl Outcomes {
    fn count(&mut self, success: bool) {
        let counter = if success { &mut self.success } else { &mut self.failure };
        *counter = counter.wrapping_add(1);
    }
}

#[derive(Debug, Default)]
struct VersionStats {
    calls: [u32; COUNTED_PROCEDURES],
    sets: u32,
    unsets: u32,
    lookups: Vec<(Service, Outcomes)>,
    /// Keyed by the service and the procedure called through it.
    remote_calls: Vec<((Service, u32), Outcomes)>,
}

/// Finds `key`'s entry in `list`, adding it while the list has room.
fn entry<K: PartialEq, V: Default>(list: &mut Vec<(K, V)>, key: K) -> Option<&mut V> {
    match list.iter().position(|(k, _)| *k == key) {
        Some(i) => Some(&mut list[i].1),
        None if list.len() < MAX_LISTED => {
            list.push((key, V::default()));
            list.last_mut().map(|(_, v)| v)
        }
        None => None,
    }
}

/// The statistics of portmap version 2 and rpcbind versions 3 and 4.
#[derive(Debug, Default)]
pub struct Stats {
    by_version: Mutex<[VersionStats; 3]>,
}

impl Stats {
    fn with<R>(&self, version: u32, f: impl FnOnce(&mut VersionStats) -> R) -> Option<R> {
        let index = version.checked_sub(2).filter(|&i| i < 3)? as usize;
        let mut by_version = self.by_version.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Some(f(&mut by_version[index]))
    }

    /// A call of `procedure` of `version`.
    pub fn call(&self, version: u32, procedure: u32) {
        self.with(version, |v| {
            if let Some(calls) = v.calls.get_mut(procedure as usize) {
                *calls = calls.wrapping_add(1);
            }
        });
    }

    /// A SET (or, with `unset`, an UNSET) that took effect.
    pub fn changed(&self, version: u32, unset: bool) {
        self.with(version, |v| {
            let counter = if unset { &mut v.unsets } else { &mut v.sets };
            *counter = counter.wrapping_add(1);
        });
    }

    /// A GETPORT, GETADDR or GETVERSADDR of `service`, answered with an address if `found`.
    pub fn lookup(&self, version: u32, service: Service, found: bool) {
        self.with(version, |v| entry(&mut v.lookups, service).map(|o| o.count(found)));
    }

    /// A CALLIT, BCAST or INDIRECT of `procedure` through `service`, answered if `answered`.
    pub fn remote_call(&self, version: u32, service: Service, procedure: u32, indirect: bool, answered: bool) {
        self.with(version, |v| {
            entry(&mut v.remote_calls, (service, procedure)).map(|o| {
                o.count(answered);
                if indirect {
                    o.indirect = o.indirect.wrapping_add(1);
                }
            })
        });
    }

    /// GETSTAT's result, `rpcb_stat_byvers`: versions 2, 3 and 4 in turn.
    pub fn encode(&self, out: &mut XdrWriter) {
        let by_version = self.by_version.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for v in by_version.iter() {
            for calls in v.calls {
                out.u32(calls);
            }
            out.u32(v.sets);
            out.u32(v.unsets);
            // Linked lists: each entry is preceded by "one more follows".
            for (service, o) in &v.lookups {
                out.bool(true);
                for n in [service.program, service.version, o.success, o.failure] {
                    out.u32(n);
                }
                out.opaque(service.netid.as_bytes());
            }
            out.bool(false);
            for ((service, procedure), o) in &v.remote_calls {
                out.bool(true);
                for n in [service.program, service.version, *procedure, o.success, o.failure, o.indirect] {
                    out.u32(n);
                }
                out.opaque(service.netid.as_bytes());
            }
            out.bool(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdr::XdrReader;

    #[test]
    fn lists_stay_bounded_and_count_per_service() {
        let stats = Stats::default();
        for program in 0..1000 {
            stats.lookup(4, Service { program, version: 1, netid: "tcp" }, false);
        }
        let statd = Service { program: 100024, version: 1, netid: "udp" };
        stats.remote_call(3, statd, 0, false, true);
        stats.remote_call(3, statd, 0, false, false);
        stats.call(4, 12);
        stats.call(4, 99);
        stats.call(7, 0);
        stats.changed(2, false);

        let mut out = XdrWriter::new();
        stats.encode(&mut out);
        let bytes = out.into_inner();
        let mut r = XdrReader::new(&bytes);
        let mut versions = Vec::new();
        for _ in 0..3 {
            let calls: Vec<u32> = (0..COUNTED_PROCEDURES).map(|_| r.u32().unwrap()).collect();
            let (sets, unsets) = (r.u32().unwrap(), r.u32().unwrap());
            let mut lookups = 0;
            while r.bool().unwrap() {
                let _counts = [r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap()];
                r.opaque(16).unwrap();
                lookups += 1;
            }
            let mut remote = Vec::new();
            while r.bool().unwrap() {
                let counts: Vec<u32> = (0..6).map(|_| r.u32().unwrap()).collect();
                remote.push((counts, r.opaque(16).unwrap().to_vec()));
            }
            versions.push((calls, sets, unsets, lookups, remote));
        }
        assert_eq!(r.remaining(), 0);
        assert_eq!(versions[2].3, MAX_LISTED, "version 4's lookups: bounded");
        assert_eq!(versions[1].4, vec![(vec![100024, 1, 0, 1, 1, 0], b"udp".to_vec())]);
        assert_eq!(versions[2].0[12], 1, "GETSTAT counted once; procedure 99 not at all");
        assert_eq!(versions[2].0.iter().sum::<u32>(), 1);
        assert_eq!((versions[0].1, versions[0].2), (1, 0));
    }
}
