//! Credential squashing (exports(5) "User ID Mapping").

use super::{ExportOptions, Squash};
use crate::rpc::Credential;
use crate::vfs::Cred;

/// The identity a call runs as. AUTH_NONE is always anonymous; `root_squash` maps uid 0
/// and gid 0 (also among the supplementary groups) to the anonymous ids; `all_squash`
/// maps everyone.
pub fn squash(opts: &ExportOptions, cred: &Credential) -> Cred {
    let anon = Cred { uid: opts.anonuid, gid: opts.anongid, groups: Vec::new() };
    let sys = match cred {
        Credential::None => return anon,
        Credential::Sys(s) => s,
    };
    match opts.squash {
        Squash::All => anon,
        Squash::None => Cred { uid: sys.uid, gid: sys.gid, groups: sys.gids.clone() },
        Squash::Root => {
            let map_gid = |g: u32| if g == 0 { opts.anongid } else { g };
            Cred {
                uid: if sys.uid == 0 { opts.anonuid } else { sys.uid },
                gid: map_gid(sys.gid),
                groups: sys.gids.iter().map(|&g| map_gid(g)).collect(),
            }
        }
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
        let o = ExportOptions { squash: Squash::Root, anonuid: 65534, anongid: 65533, ..Default::default() };
        assert_eq!(squash(&o, &sys(0, 0, vec![0, 5])), Cred { uid: 65534, gid: 65533, groups: vec![65533, 5] });
        assert_eq!(squash(&o, &sys(1000, 100, vec![10])), Cred { uid: 1000, gid: 100, groups: vec![10] });
    }

    #[test]
    fn all_squash_and_no_squash_and_auth_none() {
        let all = ExportOptions { squash: Squash::All, anonuid: 7, anongid: 8, ..Default::default() };
        assert_eq!(squash(&all, &sys(1000, 100, vec![1])), Cred { uid: 7, gid: 8, groups: vec![] });
        let none = ExportOptions { squash: Squash::None, ..Default::default() };
        assert_eq!(squash(&none, &sys(0, 0, vec![])), Cred::root());
        assert_eq!(squash(&none, &Credential::None).uid, 65534);
    }
}
