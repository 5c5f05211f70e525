//! Credential squashing (exports(5) "User ID Mapping").

use super::ExportOptions;
use crate::rpc::Credential;
use crate::vfs::{Cred, INVALID_ID};

/// The identity a call runs as. AUTH_NONE is always anonymous; `all_squash` maps
/// everyone; `root_squash` maps uid 0 and gid 0 (also among the supplementary groups) to
/// the anonymous ids. An id of -1 is the anonymous one too (as knfsd has it), and a
/// supplementary group of -1, which matches no file, is left out.
pub fn squash(opts: &ExportOptions, cred: &Credential) -> Cred {
    let anon = Cred { uid: opts.anonuid, gid: opts.anongid, groups: Vec::new() };
    let sys = match cred {
        Credential::None => return anon,
        Credential::Sys(s) => s,
    };
    if opts.all_squash {
        return anon;
    }
    let squashed = |id: u32| id == INVALID_ID || (opts.root_squash && id == 0);
    Cred {
        uid: if squashed(sys.uid) { opts.anonuid } else { sys.uid },
        gid: if squashed(sys.gid) { opts.anongid } else { sys.gid },
        groups: sys.gids.iter().filter(|&&g| g != INVALID_ID).map(|&g| if squashed(g) { opts.anongid } else { g }).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::AuthSys;

    fn sys(uid: u32, gid: u32, gids: Vec<u32>) -> Credential {
        Credential::Sys(AuthSys { stamp: 0, machine_name: "c".into(), uid, gid, gids })
    }

    #[test]
    fn root_squash_maps_root_only() {
        let o = ExportOptions { root_squash: true, anonuid: 65534, anongid: 65533, ..Default::default() };
        assert_eq!(squash(&o, &sys(0, 0, vec![0, 5])), Cred { uid: 65534, gid: 65533, groups: vec![65533, 5] });
        assert_eq!(squash(&o, &sys(1000, 100, vec![10])), Cred { uid: 1000, gid: 100, groups: vec![10] });
    }

    #[test]
    fn all_squash_and_no_squash_and_auth_none() {
        let all = ExportOptions { all_squash: true, anonuid: 7, anongid: 8, ..Default::default() };
        assert_eq!(squash(&all, &sys(1000, 100, vec![1])), Cred { uid: 7, gid: 8, groups: vec![] });
        let none = ExportOptions { root_squash: false, ..Default::default() };
        assert_eq!(squash(&none, &sys(0, 0, vec![])), Cred::root());
        assert_eq!(squash(&none, &Credential::None).uid, 65534);
        // all_squash wins over no_root_squash: they are independent
        let both = ExportOptions { all_squash: true, root_squash: false, anonuid: 7, anongid: 8, ..Default::default() };
        assert_eq!(squash(&both, &sys(0, 0, vec![])), Cred { uid: 7, gid: 8, groups: vec![] });
    }

    #[test]
    fn the_invalid_id_is_the_anonymous_one_whatever_the_squashing() {
        for root_squash in [true, false] {
            let o = ExportOptions { root_squash, anonuid: 11, anongid: 12, ..Default::default() };
            assert_eq!(squash(&o, &sys(INVALID_ID, 100, vec![INVALID_ID, 5])), Cred { uid: 11, gid: 100, groups: vec![5] });
            assert_eq!(squash(&o, &sys(1000, INVALID_ID, vec![INVALID_ID])), Cred { uid: 1000, gid: 12, groups: vec![] });
        }
    }
}
