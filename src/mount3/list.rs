//! The mount list MOUNT DUMP reports: which client mounted which path.
//!
//! The list is informational (clients never rely on it), and MNT over UDP can come from a
//! forged source, so it is bounded per client and in all. When a bound is reached the
//! mount listed longest ago gives way: a flood of forged mounts can churn the list, but a
//! real client that mounts again is listed again, and a client's own excess only pushes
//! out its own entries.

use std::collections::BTreeMap;

/// A client address and the path it mounted, as DUMP lists them.
pub type Mount = (String, String);

pub struct MountList {
    per_client_max: usize,
    max: usize,
    /// Each mount and the number of its latest MNT.
    mounts: BTreeMap<Mount, u64>,
    /// The same mounts by the number of their latest MNT, oldest first.
    by_age: BTreeMap<u64, Mount>,
    next: u64,
}

impl MountList {
    pub fn new(per_client_max: usize, max: usize) -> Self {
        Self { per_client_max: per_client_max.max(1), max: max.max(1), mounts: BTreeMap::new(), by_age: BTreeMap::new(), next: 0 }
    }

    /// Lists a mount, or renews it; returns the mount that gave way for it, if any.
    pub fn add(&mut self, host: String, path: String) -> Option<Mount> {
        let key = (host, path);
        let age = self.next;
        self.next += 1;
        if let Some(old) = self.mounts.insert(key.clone(), age) {
            self.by_age.remove(&old);
            self.by_age.insert(age, key);
            return None;
        }
        self.by_age.insert(age, key.clone());
        let evicted = if self.of_client(&key.0).count() > self.per_client_max {
            let (oldest, _) = self.of_client(&key.0).min_by_key(|(_, age)| **age).expect("the client has mounts");
            Some(oldest.clone())
        } else if self.mounts.len() > self.max {
            self.by_age.first_key_value().map(|(_, m)| m.clone())
        } else {
            None
        };
        if let Some(mount) = &evicted {
            self.remove(&mount.0, &mount.1);
        }
        evicted
    }

    pub fn remove(&mut self, host: &str, path: &str) {
        if let Some(age) = self.mounts.remove(&(host.to_string(), path.to_string())) {
            self.by_age.remove(&age);
        }
    }

    pub fn remove_client(&mut self, host: &str) {
        let paths: Vec<String> = self.of_client(host).map(|((_, p), _)| p.clone()).collect();
        for path in paths {
            self.remove(host, &path);
        }
    }

    /// The mounts in (client, path) order.
    pub fn iter(&self) -> impl Iterator<Item = &Mount> {
        self.mounts.keys()
    }

    pub fn len(&self) -> usize {
        self.mounts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty()
    }

    fn of_client<'a>(&'a self, host: &'a str) -> impl Iterator<Item = (&'a Mount, &'a u64)> + 'a {
        self.mounts.range((host.to_string(), String::new())..).take_while(move |((h, _), _)| h == host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(list: &MountList) -> Vec<(&str, &str)> {
        list.iter().map(|(h, p)| (h.as_str(), p.as_str())).collect()
    }

    #[test]
    fn a_full_list_gives_way_to_a_new_mount_oldest_first() {
        let mut list = MountList::new(8, 3);
        assert_eq!(list.add("10.0.0.1".into(), "/a".into()), None);
        assert_eq!(list.add("10.0.0.2".into(), "/a".into()), None);
        assert_eq!(list.add("10.0.0.3".into(), "/a".into()), None);
        // A mount made again counts as new: 10.0.0.2 is now the oldest.
        assert_eq!(list.add("10.0.0.1".into(), "/a".into()), None);
        assert_eq!(list.add("10.0.0.4".into(), "/a".into()), Some(("10.0.0.2".into(), "/a".into())));
        assert_eq!(listed(&list), [("10.0.0.1", "/a"), ("10.0.0.3", "/a"), ("10.0.0.4", "/a")]);
        assert_eq!(list.len(), 3);
    }

    #[test]
    fn a_client_past_its_bound_pushes_out_only_its_own_mounts() {
        let mut list = MountList::new(2, 100);
        list.add("10.0.0.9".into(), "/other".into());
        list.add("10.0.0.1".into(), "/x".into());
        list.add("10.0.0.1".into(), "/y".into());
        assert_eq!(list.add("10.0.0.1".into(), "/z".into()), Some(("10.0.0.1".into(), "/x".into())));
        assert_eq!(listed(&list), [("10.0.0.1", "/y"), ("10.0.0.1", "/z"), ("10.0.0.9", "/other")]);
        // A flood from one address never reaches another client's entry.
        for i in 0..1000 {
            list.add("10.0.0.1".into(), format!("/flood{i}"));
        }
        assert_eq!(list.len(), 3);
        assert!(list.iter().any(|(h, _)| h == "10.0.0.9"));
    }

    #[test]
    fn unmounts_remove_one_mount_or_all_of_a_client() {
        let mut list = MountList::new(8, 8);
        list.add("10.0.0.1".into(), "/a".into());
        list.add("10.0.0.1".into(), "/b".into());
        list.add("10.0.0.10".into(), "/a".into());
        list.remove("10.0.0.1", "/a");
        assert_eq!(listed(&list), [("10.0.0.1", "/b"), ("10.0.0.10", "/a")]);
        list.remove_client("10.0.0.1");
        assert_eq!(listed(&list), [("10.0.0.10", "/a")]);
        // What was removed no longer counts towards the bound or the age order.
        for i in 0..7 {
            assert_eq!(list.add("10.0.0.2".into(), format!("/{i}")), None);
        }
        assert_eq!(list.add("10.0.0.3".into(), "/a".into()), Some(("10.0.0.10".into(), "/a".into())));
    }
}
