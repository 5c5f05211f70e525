//! NFSv3 procedures (RFC 1813 section 3.3), one function each.

// A `Failure` carries the post-op attributes its reply needs, so it is large; it is
// returned straight to the encoder, never stored, and boxing it would allocate on every
// failing call.
#![allow(clippy::result_large_err)]

use super::xdr::*;
use crate::rpc::{CallContext, ProcError, Transport};
use crate::server::state::{Admitted, ServerState};
use crate::vfs::{Attr, Blocking, DirEntry, Made, ObjectId, VfsError, Wcc};
use crate::xdr::{pad4, XdrWriter};

/// A failed procedure: its status and the shape of its failure arm (how many optional
/// results, post_op_attr or pre_op_attr, follow the status: [`ATTR`], [`WCC`], ...).
struct Failure {
    status: Status,
    shape: usize,
    /// The attributes after the call of the objects the arm's post_op_attrs describe, in
    /// their order, where known. Pre-op attributes stay empty, as knfsd leaves them when
    /// it fails before a change; the client then revalidates nothing it need not.
    post_op: [Option<Attr>; 2],
    /// Nothing was done: the call must run again on a thread that may wait for the disk.
    would_block: bool,
}

type ProcResult = Result<(), Failure>;

/// Largest READ payload / READDIR reply over UDP: a reply must fit one datagram (at most
/// 65507 bytes over IPv4), so a 1 MiB READ over UDP would never be answered at all.
pub const MAX_UDP_IO: u32 = 32 * 1024;

/// The READ/WRITE/READDIR size limit for the call's transport.
fn max_io(ctx: &CallContext) -> u32 {
    match ctx.transport {
        Transport::Udp => MAX_UDP_IO,
        Transport::Tcp => MAX_IO,
    }
}

fn fail(n: usize) -> impl Fn(VfsError) -> Failure {
    move |e| Failure { status: e.into(), shape: n, post_op: [None, None], would_block: e == VfsError::WouldBlock }
}

/// [`fail`] for a call on admitted objects (one, or the two of RENAME and LINK, in the
/// order of the arm's post_op_attrs): the failure carries their attributes, as knfsd's
/// failure replies do.
fn fail_on<'a>(objects: &'a [&'a Admitted], n: usize) -> impl Fn(VfsError) -> Failure + 'a {
    move |e| {
        let mut f = fail(n)(e);
        if reports_attributes(e) {
            for (slot, adm) in f.post_op.iter_mut().zip(objects) {
                *slot = adm.rt.vfs.getattr(&adm.cred, &adm.obj).ok();
            }
        }
        f
    }
}

/// Whether a failure reply carries its objects' attributes. Not for a call that would
/// block (it runs again on a worker thread), nor where a handle names nothing: there is
/// nothing to report, and looking again would only repeat the search that failed.
fn reports_attributes(e: VfsError) -> bool {
    !matches!(e, VfsError::WouldBlock | VfsError::Stale | VfsError::BadHandle)
}

/// Failure shapes: GETATTR has no results; most have one post_op_attr; modifying
/// procedures one wcc_data (two optionals); LINK a post_op_attr and a wcc_data; RENAME two
/// wcc_data.
const NO_RESULTS: usize = 0;
const ATTR: usize = 1;
const WCC: usize = 2;
const ATTR_WCC: usize = 3;
const TWO_WCC: usize = 4;

/// Runs one procedure, appending its results to `out`. Fails only with
/// `ProcError::WouldBlock`, when `ctx.may_block` is false and the call would wait.
pub fn run(state: &ServerState, ctx: &CallContext, args: Args<'_>, out: &mut XdrWriter) -> Result<(), ProcError> {
    let start = out.len();
    out.u32(Status::Ok as u32);
    let res = match args {
        Args::Null => {
            out.truncate(start);
            return Ok(());
        }
        Args::Getattr { fh } => getattr(state, ctx, fh, out),
        Args::Setattr { fh, attrs, guard } => setattr(state, ctx, fh, &attrs, guard, out),
        Args::Lookup(at) => lookup(state, ctx, &at, out),
        Args::Access { fh, mask } => access(state, ctx, fh, mask, out),
        Args::Readlink { fh } => readlink(state, ctx, fh, out),
        Args::Read { fh, offset, count } => read(state, ctx, fh, offset, count, out),
        Args::Write { fh, offset, stable, data } => write(state, ctx, fh, offset, stable, data, out),
        Args::Create { at, how } => create_like(state, ctx, &at, out, |adm, name| adm.rt.vfs.create(&adm.cred, &adm.obj, name, &how)),
        Args::Mkdir { at, attrs } => create_like(state, ctx, &at, out, |adm, name| adm.rt.vfs.mkdir(&adm.cred, &adm.obj, name, &attrs)),
        Args::Symlink { at, attrs, target } => {
            create_like(state, ctx, &at, out, |adm, name| adm.rt.vfs.symlink(&adm.cred, &adm.obj, name, target, &attrs))
        }
        Args::Mknod { at, node, attrs } => match node {
            Ok(node) => create_like(state, ctx, &at, out, |adm, name| adm.rt.vfs.mknod(&adm.cred, &adm.obj, name, node, &attrs)),
            Err(_) => Err(fail(WCC)(VfsError::BadType)),
        },
        Args::Remove(at) => remove_like(state, ctx, &at, out, false),
        Args::Rmdir(at) => remove_like(state, ctx, &at, out, true),
        Args::Rename { from, to } => rename(state, ctx, &from, &to, out),
        Args::Link { fh, to } => link(state, ctx, fh, &to, out),
        Args::Readdir { fh, cookie, count, .. } => readdir(state, ctx, fh, cookie, count, false, out),
        Args::Readdirplus { fh, cookie, maxcount, .. } => readdir(state, ctx, fh, cookie, maxcount, true, out),
        Args::Fsstat { fh } => fsstat(state, ctx, fh, out),
        Args::Fsinfo { fh } => fsinfo(state, ctx, fh, out),
        Args::Pathconf { fh } => pathconf(state, ctx, fh, out),
        Args::Commit { fh, offset, count } => commit(state, ctx, fh, offset, count, out),
    };
    if let Err(f) = res {
        out.truncate(start);
        if f.would_block {
            return Err(ProcError::WouldBlock);
        }
        out.u32(f.status as u32);
        let [first, second] = &f.post_op;
        match f.shape {
            ATTR => put_post_op_attr(out, first.as_ref()),
            WCC => put_wcc(out, &Wcc { before: None, after: first.clone() }),
            ATTR_WCC => {
                put_post_op_attr(out, first.as_ref());
                put_wcc(out, &Wcc { before: None, after: second.clone() });
            }
            TWO_WCC => {
                put_wcc(out, &Wcc { before: None, after: first.clone() });
                put_wcc(out, &Wcc { before: None, after: second.clone() });
            }
            n => (0..n).for_each(|_| out.bool(false)),
        }
    }
    Ok(())
}

fn blocking(ctx: &CallContext) -> Blocking {
    if ctx.may_block {
        Blocking::Allowed
    } else {
        Blocking::Forbidden
    }
}

fn admit(state: &ServerState, ctx: &CallContext, fh: &[u8], shape: usize) -> Result<Admitted, Failure> {
    state.admit(ctx, fh).map_err(fail(shape))
}

/// Admits a modifying call: refuses it with ROFS on a read-only export.
fn admit_write(state: &ServerState, ctx: &CallContext, fh: &[u8], shape: usize) -> Result<Admitted, Failure> {
    let adm = admit(state, ctx, fh, shape)?;
    if adm.options.read_only {
        return Err(fail(shape)(VfsError::RoFs));
    }
    Ok(adm)
}

fn check_name(name: &[u8], shape: usize) -> Result<(), Failure> {
    if name.len() > NAME_MAX {
        return Err(fail(shape)(VfsError::NameTooLong));
    }
    Ok(())
}

fn getattr(state: &ServerState, ctx: &CallContext, fh: &[u8], out: &mut XdrWriter) -> ProcResult {
    let adm = admit(state, ctx, fh, NO_RESULTS)?;
    let attr = adm.rt.vfs.getattr(&adm.cred, &adm.obj).map_err(fail(NO_RESULTS))?;
    put_fattr(out, &attr);
    Ok(())
}

fn setattr(
    state: &ServerState,
    ctx: &CallContext,
    fh: &[u8],
    attrs: &crate::vfs::SetAttrs,
    guard: Option<crate::vfs::Timespec>,
    out: &mut XdrWriter,
) -> ProcResult {
    let adm = admit_write(state, ctx, fh, WCC)?;
    let objects = [&adm];
    let failed = fail_on(&objects, WCC);
    let made = adm.rt.vfs.setattr(&adm.cred, &adm.obj, attrs, guard).map_err(&failed)?;
    put_wcc(out, &made.result);
    settle(ctx, out, made).map_err(failed)?;
    Ok(())
}

fn lookup(state: &ServerState, ctx: &CallContext, at: &DirOp<'_>, out: &mut XdrWriter) -> ProcResult {
    let adm = admit(state, ctx, at.dir, ATTR)?;
    check_name(at.name, ATTR)?;
    let looked = adm.rt.vfs.lookup_in(&adm.cred, &adm.obj, at.name).map_err(fail_on(&[&adm], ATTR))?;
    match looked.found {
        Ok((obj, attr)) => {
            out.opaque(&state.file_handle(&adm.rt, &obj));
            put_post_op_attr(out, Some(&attr));
            put_post_op_attr(out, Some(&looked.dir_attr));
            Ok(())
        }
        Err(e) => {
            // Directory attributes let the client cache the negative result.
            let mut f = fail(ATTR)(e);
            if reports_attributes(e) {
                f.post_op[0] = Some(looked.dir_attr);
            }
            Err(f)
        }
    }
}

fn access(state: &ServerState, ctx: &CallContext, fh: &[u8], mask: u32, out: &mut XdrWriter) -> ProcResult {
    use crate::vfs::access::*;
    let adm = admit(state, ctx, fh, ATTR)?;
    let (mut granted, attr) = adm.rt.vfs.access(&adm.cred, &adm.obj, mask).map_err(fail_on(&[&adm], ATTR))?;
    // As knfsd: writing a FIFO or device node never reaches the server, so a read-only
    // export leaves their MODIFY and EXTEND to the mode bits (the Linux client asks ACCESS
    // before it opens one for writing).
    if adm.options.read_only && matches!(attr.kind, crate::vfs::FileKind::Regular | crate::vfs::FileKind::Directory) {
        granted &= !(MODIFY | EXTEND | DELETE);
    }
    put_post_op_attr(out, Some(&attr));
    out.u32(granted);
    Ok(())
}

fn readlink(state: &ServerState, ctx: &CallContext, fh: &[u8], out: &mut XdrWriter) -> ProcResult {
    let adm = admit(state, ctx, fh, ATTR)?;
    let (target, attr) = adm.rt.vfs.readlink(&adm.cred, &adm.obj).map_err(fail_on(&[&adm], ATTR))?;
    put_post_op_attr(out, Some(&attr));
    out.opaque(&target);
    Ok(())
}

/// READs at least this large are sent from the page cache without a copy (TCP only); below
/// it a copy costs less than giving up on batching the reply with others.
const IN_PLACE_READ_MIN: usize = 64 * 1024;

fn read(state: &ServerState, ctx: &CallContext, fh: &[u8], offset: u64, count: u32, out: &mut XdrWriter) -> ProcResult {
    let adm = admit(state, ctx, fh, ATTR)?;
    let count = count.min(max_io(ctx)) as usize;
    if count >= IN_PLACE_READ_MIN && ctx.transport == Transport::Tcp && !ctx.may_block {
        if let Some((r, data)) = adm.rt.vfs.read_in_place(&adm.cred, &adm.obj, offset, count).map_err(fail_on(&[&adm], ATTR))? {
            put_post_op_attr(out, Some(&r.attr));
            out.u32(r.count as u32);
            out.bool(r.eof);
            out.opaque_from_file(data);
            state.metrics.add_read_bytes(r.count as u64);
            return Ok(());
        }
    }
    // Attributes precede the data on the wire but are known only after the read: reserve
    // their place, read straight into the reply buffer, then fill them in.
    let attr_at = out.len();
    out.bool(true);
    out.fixed(&[0u8; FATTR3_SIZE]);
    let count_at = out.len();
    out.u32(0);
    out.bool(false);
    let mut result = None;
    out.opaque_with(count, |buf| {
        result = Some(adm.rt.vfs.read(&adm.cred, &adm.obj, offset, count, buf, blocking(ctx))?);
        Ok(())
    })
    .map_err(fail_on(&[&adm], ATTR))?;
    let r = result.expect("set on success");
    let mut attr = XdrWriter::with_capacity(FATTR3_SIZE);
    put_fattr(&mut attr, &r.attr);
    out.patch_bytes(attr_at + 4, attr.as_slice());
    out.patch_u32(count_at, r.count as u32);
    out.patch_u32(count_at + 4, r.eof as u32);
    state.metrics.add_read_bytes(r.count as u64);
    Ok(())
}

fn write(
    state: &ServerState,
    ctx: &CallContext,
    fh: &[u8],
    offset: u64,
    stable: crate::vfs::Stability,
    data: &[u8],
    out: &mut XdrWriter,
) -> ProcResult {
    let adm = admit_write(state, ctx, fh, WCC)?;
    // The verifier from before the write: if a sync fails meanwhile and renews it, the
    // client must see the change, since its data may be among what was lost.
    let verifier = adm.rt.vfs.write_verifier();
    let r = adm.rt.vfs.write(&adm.cred, &adm.obj, offset, data, stable, blocking(ctx)).map_err(fail_on(&[&adm], WCC))?;
    put_wcc(out, &r.wcc);
    out.u32(r.count as u32);
    out.u32(stable_code(r.committed));
    out.fixed(&verifier);
    state.metrics.add_write_bytes(r.count as u64);
    state.metrics.count_write(stable);
    Ok(())
}

/// Waits for a change whose successful reply is in `out` to be durable, having first put
/// that reply aside for a retransmission to a server restarted meanwhile
/// ([`CallContext::reply_before_durable`]). On failure the caller's error reply replaces it.
fn settle<T>(ctx: &CallContext, out: &XdrWriter, made: Made<'_, T>) -> crate::vfs::VfsResult<T> {
    if made.is_pending() {
        ctx.reply_before_durable(out);
    }
    made.durable()
}

fn create_like(
    state: &ServerState,
    ctx: &CallContext,
    at: &DirOp<'_>,
    out: &mut XdrWriter,
    op: impl for<'a> FnOnce(&'a Admitted, &[u8]) -> crate::vfs::VfsResult<Made<'a, crate::vfs::Created>>,
) -> ProcResult {
    let adm = admit_write(state, ctx, at.dir, WCC)?;
    check_name(at.name, WCC)?;
    let objects = [&adm];
    let failed = fail_on(&objects, WCC);
    let made = op(&adm, at.name).map_err(&failed)?;
    let c = &made.result;
    put_post_op_fh(out, Some(&state.file_handle(&adm.rt, &c.obj)));
    put_post_op_attr(out, Some(&c.attr));
    put_wcc(out, &c.dir_wcc);
    settle(ctx, out, made).map_err(failed)?;
    Ok(())
}

fn remove_like(state: &ServerState, ctx: &CallContext, at: &DirOp<'_>, out: &mut XdrWriter, dir: bool) -> ProcResult {
    let adm = admit_write(state, ctx, at.dir, WCC)?;
    check_name(at.name, WCC)?;
    let made = if dir { adm.rt.vfs.rmdir(&adm.cred, &adm.obj, at.name) } else { adm.rt.vfs.remove(&adm.cred, &adm.obj, at.name) };
    let objects = [&adm];
    let failed = fail_on(&objects, WCC);
    let made = made.map_err(&failed)?;
    put_wcc(out, &made.result);
    settle(ctx, out, made).map_err(failed)?;
    Ok(())
}

fn rename(state: &ServerState, ctx: &CallContext, from: &DirOp<'_>, to: &DirOp<'_>, out: &mut XdrWriter) -> ProcResult {
    let src = admit_write(state, ctx, from.dir, TWO_WCC)?;
    let dst = admit_write(state, ctx, to.dir, TWO_WCC)?;
    check_name(from.name, TWO_WCC)?;
    check_name(to.name, TWO_WCC)?;
    if src.rt.export.id != dst.rt.export.id {
        return Err(fail(TWO_WCC)(VfsError::XDev));
    }
    let objects = [&src, &dst];
    let failed = fail_on(&objects, TWO_WCC);
    let made = src.rt.vfs.rename(&src.cred, &src.obj, from.name, &dst.obj, to.name).map_err(&failed)?;
    let (a, b) = &made.result;
    put_wcc(out, a);
    put_wcc(out, b);
    settle(ctx, out, made).map_err(failed)?;
    Ok(())
}

fn link(state: &ServerState, ctx: &CallContext, fh: &[u8], to: &DirOp<'_>, out: &mut XdrWriter) -> ProcResult {
    let file = admit_write(state, ctx, fh, ATTR_WCC)?;
    let dir = admit_write(state, ctx, to.dir, ATTR_WCC)?;
    check_name(to.name, ATTR_WCC)?;
    if file.rt.export.id != dir.rt.export.id {
        return Err(fail(ATTR_WCC)(VfsError::XDev));
    }
    let objects = [&file, &dir];
    let failed = fail_on(&objects, ATTR_WCC);
    let made = file.rt.vfs.link(&file.cred, &file.obj, &dir.obj, to.name).map_err(&failed)?;
    let (attr, wcc) = &made.result;
    put_post_op_attr(out, Some(attr));
    put_wcc(out, wcc);
    settle(ctx, out, made).map_err(failed)?;
    Ok(())
}

/// Cookie verifier: cookies are stable filesystem offsets, so one constant verifier is
/// right, and it never invalidates a client's cached listing.
const COOKIE_VERIFIER: [u8; 8] = [0; 8];

/// READDIR and READDIRPLUS, whose reply `maxcount` bounds. READDIRPLUS's `dircount` (the
/// directory part alone) is a hint that knfsd ignores too: older Linux clients send
/// an eighth of maxcount, which honoured would nearly halve the entries per reply.
fn readdir(state: &ServerState, ctx: &CallContext, fh: &[u8], cookie: u64, maxcount: u32, plus: bool, out: &mut XdrWriter) -> ProcResult {
    let adm = admit(state, ctx, fh, ATTR)?;
    let maxcount = (maxcount as usize).min(max_io(ctx) as usize);
    let attr_at = out.len();
    out.bool(true);
    out.fixed(&[0u8; FATTR3_SIZE]);
    out.fixed(&COOKIE_VERIFIER);
    // Fixed overhead: RPC reply header (24) + status, attributes, verifier, list end and eof.
    let mut reply_used = 24 + 4 + 4 + FATTR3_SIZE + 8 + 8;
    // At most this many entries fit: each takes at least a one-byte name and, with
    // READDIRPLUS, a handle as long as the directory's (this server's handles of one export
    // are all one length). One more is offered than fits.
    let smallest_dir_part = 4 + 8 + 4 + 4 + 8;
    let smallest_entry = smallest_dir_part + if plus { 4 + FATTR3_SIZE + 4 + 4 + pad4(fh.len()) } else { 0 };
    let max_entries = maxcount.saturating_sub(reply_used) / smallest_entry;
    let mut entries = 0usize;
    let mut too_small = false;
    let end = adm
        .rt
        .vfs
        .readdir(&adm.cred, &adm.obj, cookie, plus, max_entries + 1, &mut |e: DirEntry<'_>| {
            let dir_part = 4 + 8 + 4 + pad4(e.name.len()) + 8;
            let fh = e.plus.as_ref().map(|(o, _): &(ObjectId, Attr)| state.file_handle(&adm.rt, o));
            let plus_part = if plus { 4 + FATTR3_SIZE + 4 + 4 + fh.as_ref().map_or(0, |f| pad4(f.len())) } else { 0 };
            if reply_used + dir_part + plus_part > maxcount {
                too_small = entries == 0;
                return false;
            }
            reply_used += dir_part + plus_part;
            entries += 1;
            out.bool(true);
            out.u64(e.fileid);
            out.opaque(e.name);
            out.u64(e.cookie);
            if plus {
                put_post_op_attr(out, e.plus.as_ref().map(|(_, a)| a));
                put_post_op_fh(out, fh.as_deref());
            }
            true
        })
        .map_err(fail_on(&[&adm], ATTR))?;
    if too_small {
        return Err(Failure { status: Status::TooSmall, shape: ATTR, post_op: [Some(end.dir_attr), None], would_block: false });
    }
    out.bool(false);
    out.bool(end.eof);
    let mut attr = XdrWriter::with_capacity(FATTR3_SIZE);
    put_fattr(&mut attr, &end.dir_attr);
    out.patch_bytes(attr_at + 4, attr.as_slice());
    Ok(())
}

fn fsstat(state: &ServerState, ctx: &CallContext, fh: &[u8], out: &mut XdrWriter) -> ProcResult {
    let adm = admit(state, ctx, fh, ATTR)?;
    let (s, attr) = adm.rt.vfs.fsstat(&adm.cred, &adm.obj).map_err(fail_on(&[&adm], ATTR))?;
    put_post_op_attr(out, Some(&attr));
    for v in [s.total_bytes, s.free_bytes, s.avail_bytes, s.total_files, s.free_files, s.avail_files] {
        out.u64(v);
    }
    out.u32(0); // invarsec: the figures may change at any time
    Ok(())
}

fn fsinfo(state: &ServerState, ctx: &CallContext, fh: &[u8], out: &mut XdrWriter) -> ProcResult {
    const FSF_LINK: u32 = 0x1;
    const FSF_SYMLINK: u32 = 0x2;
    const FSF_HOMOGENEOUS: u32 = 0x8;
    const FSF_CANSETTIME: u32 = 0x10;
    let adm = admit(state, ctx, fh, ATTR)?;
    let attr = adm.rt.vfs.getattr(&adm.cred, &adm.obj).map_err(fail(ATTR))?;
    put_post_op_attr(out, Some(&attr));
    let max_file_size = adm.rt.vfs.pathconf().max_file_size;
    let io = max_io(ctx);
    out.u32(io); // rtmax
    out.u32(io); // rtpref
    out.u32(4096); // rtmult
    out.u32(io); // wtmax
    out.u32(io); // wtpref
    out.u32(4096); // wtmult
    out.u32(io.min(64 * 1024)); // dtpref
    out.u64(max_file_size);
    out.u32(0); // time_delta: nanosecond timestamps
    out.u32(1);
    out.u32(FSF_LINK | FSF_SYMLINK | FSF_HOMOGENEOUS | FSF_CANSETTIME);
    Ok(())
}

fn pathconf(state: &ServerState, ctx: &CallContext, fh: &[u8], out: &mut XdrWriter) -> ProcResult {
    let adm = admit(state, ctx, fh, ATTR)?;
    let attr = adm.rt.vfs.getattr(&adm.cred, &adm.obj).map_err(fail(ATTR))?;
    let pc = adm.rt.vfs.pathconf();
    put_post_op_attr(out, Some(&attr));
    out.u32(pc.link_max);
    // Longer names than the protocol layer takes are refused before the file system sees them.
    out.u32(pc.name_max.min(NAME_MAX as u32));
    out.bool(pc.no_trunc);
    out.bool(pc.chown_restricted);
    out.bool(pc.case_insensitive);
    out.bool(pc.case_preserving);
    Ok(())
}

fn commit(state: &ServerState, ctx: &CallContext, fh: &[u8], offset: u64, count: u32, out: &mut XdrWriter) -> ProcResult {
    let adm = admit_write(state, ctx, fh, WCC)?;
    let wcc: Wcc = adm.rt.vfs.commit(&adm.cred, &adm.obj, offset, count as u64).map_err(fail_on(&[&adm], WCC))?;
    put_wcc(out, &wcc);
    out.fixed(&adm.rt.vfs.write_verifier());
    Ok(())
}
