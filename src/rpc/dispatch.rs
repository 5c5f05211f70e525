//! Turns one RPC record into one reply: header checks, program and version selection, the
//! duplicate request cache, and metrics. Transport-independent.

use super::drc::{DrcKey, DuplicateRequestCache, JournalPlace, Lookup};
use super::held_up::HeldUp;
use super::message::{self, AcceptError, HeaderError};
use super::record::{begin_record, finish_record};
use super::{CallContext, ProcError, Reply, RpcProgram, Transport};
use crate::metrics::Metrics;
use crate::xdr::XdrReader;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// What [`Dispatcher::try_handle_inline`] did with a call.
#[derive(Debug)]
pub enum Handled {
    /// Finished: the framed reply to send, if any.
    Done(Option<Arc<Reply>>),
    /// Nothing was done: the call may wait for the disk and belongs on a thread that may.
    NeedsThread,
}

struct NeedsThread;

pub struct Dispatcher {
    programs: Vec<Arc<dyn RpcProgram>>,
    /// Per program, in the same order: which procedures' calls were lately held up on a
    /// runtime thread, and so go to threads that may wait.
    held_up: Vec<HeldUp>,
    drc: DuplicateRequestCache,
    metrics: Arc<Metrics>,
}

/// Offset of the first result word in a framed accepted reply: record mark, then xid,
/// message type, reply status, verifier flavor and length, accept status.
const RESULTS_OFFSET: usize = 4 + 24;

impl Dispatcher {
    pub fn new(programs: Vec<Arc<dyn RpcProgram>>, drc_entries: usize, metrics: Arc<Metrics>) -> Self {
        let held_up = programs.iter().map(|_| HeldUp::default()).collect();
        Self { programs, held_up, drc: DuplicateRequestCache::new(drc_entries), metrics }
    }

    /// Keeps the replies the programs name across restarts, in the journal at `place`
    /// (replacing the cache, so before any call is served). `make_all_durable` makes every
    /// change durable, for replies an earlier process wrote before their change was
    /// ([`DuplicateRequestCache::with_journal`]).
    pub fn with_drc_journal(mut self, place: JournalPlace, make_all_durable: impl FnOnce() -> bool) -> std::io::Result<Self> {
        self.drc = DuplicateRequestCache::with_journal_at(self.drc.capacity(), place, make_all_durable)?;
        Ok(self)
    }

    pub fn drc(&self) -> &DuplicateRequestCache {
        &self.drc
    }

    /// Handles one call on a thread that may wait for the disk. Returns the framed reply
    /// (record mark first; datagram transports skip those 4 bytes), or `None` when nothing
    /// must be sent.
    pub fn handle(&self, record: &[u8], peer: SocketAddr, local: SocketAddr, transport: Transport) -> Option<Arc<Reply>> {
        // With `may_block` no procedure asks for another thread.
        self.run_call(record, peer, local, transport, true).unwrap_or_default()
    }

    /// Handles one call on a network thread if it can finish without waiting for the disk;
    /// otherwise does nothing and says so, and the caller passes the record to
    /// [`Dispatcher::handle`] on a thread that may wait.
    pub fn try_handle_inline(&self, record: &[u8], peer: SocketAddr, local: SocketAddr, transport: Transport) -> Handled {
        match self.run_call(record, peer, local, transport, false) {
            Ok(reply) => Handled::Done(reply),
            Err(NeedsThread) => Handled::NeedsThread,
        }
    }

    fn run_call(
        &self,
        record: &[u8],
        peer: SocketAddr,
        local: SocketAddr,
        transport: Transport,
        may_block: bool,
    ) -> Result<Option<Arc<Reply>>, NeedsThread> {
        let started = Instant::now();
        let mut r = XdrReader::new(record);
        let header = match message::decode_call(&mut r) {
            Ok(h) => h,
            Err(HeaderError::Unparseable) | Err(HeaderError::NotACall) => {
                self.metrics.record_rpc_error("unparseable");
                return Ok(None);
            }
            Err(HeaderError::RpcMismatch { xid }) => {
                self.metrics.record_rpc_error("rpc_mismatch");
                let mut w = begin_record(32);
                message::encode_rpc_mismatch(&mut w, xid);
                return Ok(Some(Arc::new(finish_record(w))));
            }
            Err(HeaderError::Auth { xid, stat }) => {
                self.metrics.record_rpc_error("auth_error");
                let mut w = begin_record(32);
                message::encode_auth_error(&mut w, xid, stat);
                return Ok(Some(Arc::new(finish_record(w))));
            }
        };
        let xid = header.xid;
        let Some((program_index, program)) = self.programs.iter().enumerate().find(|(_, p)| p.program() == header.program) else {
            self.metrics.record_rpc_error("prog_unavail");
            return Ok(Some(Self::accept_error(xid, AcceptError::ProgUnavail, (0, 0))));
        };
        let versions = program.versions();
        if header.version < versions.0 || header.version > versions.1 {
            self.metrics.record_rpc_error("prog_mismatch");
            return Ok(Some(Self::accept_error(xid, AcceptError::ProgMismatch, versions)));
        }
        let held_up = &self.held_up[program_index];
        if !may_block && (!program.is_quick(header.version, header.procedure, r.rest()) || held_up.held_up(header.procedure, started)) {
            return Err(NeedsThread);
        }
        let peer = SocketAddr::new(crate::exports::canonical_ip(peer.ip()), peer.port());
        let drc_key = program
            .is_non_idempotent(header.version, header.procedure)
            .then(|| DrcKey::new(peer.ip(), xid, header.program, header.version, header.procedure, r.rest()));
        let keep = program.is_kept_across_restarts(header.version, header.procedure);
        let ctx = CallContext {
            xid,
            program: header.program,
            version: header.version,
            procedure: header.procedure,
            credential: header.credential,
            peer,
            local,
            transport,
            may_block,
            early_reply: drc_key.as_ref().filter(|_| keep).and_then(|key| self.drc.early_reply(key)),
        };
        if let Some(key) = &drc_key {
            match self.drc.begin(key) {
                Lookup::New => {}
                Lookup::InProgress => {
                    self.metrics.drc_hit();
                    tracing::debug!(client = %ctx.peer, xid, "retransmit of a call still in progress dropped");
                    return Ok(None);
                }
                Lookup::Replay(reply) => {
                    self.metrics.drc_hit();
                    tracing::debug!(client = %ctx.peer, xid, "retransmit answered from the duplicate request cache");
                    return Ok(Some(reply));
                }
            }
        }
        let mut w = begin_record(512);
        let header_at = w.len();
        message::encode_success(&mut w, xid);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| program.call(&ctx, &mut r, &mut w)))
            .unwrap_or_else(|_| {
                // A bug of ours, not the client's: answer it, rather than leave the call
                // in the duplicate request cache as running (its retransmits dropped) and
                // its connection's task gone.
                tracing::error!(client = %ctx.peer, xid, program = ctx.program, procedure = ctx.procedure, "the procedure panicked: answered SYSTEM_ERR");
                Err(ProcError::SystemErr)
            });
        let status_word = |w: &crate::xdr::XdrWriter| {
            let b = w.as_slice();
            (program.results_start_with_status(ctx.procedure) && b.len() >= RESULTS_OFFSET + 4)
                .then(|| u32::from_be_bytes(b[RESULTS_OFFSET..RESULTS_OFFSET + 4].try_into().expect("4 bytes")))
        };
        if !may_block {
            let ended = Instant::now();
            let took = ended - started;
            if held_up.took(ctx.procedure, took, ended) {
                self.metrics.inline_call_held_up(ctx.program, ctx.procedure);
                tracing::debug!(
                    procedure = program.procedure_name(ctx.version, ctx.procedure),
                    ?took,
                    "a call was held up on a runtime thread: this procedure's calls go to blocking threads for a while"
                );
            }
        }
        let ran = outcome.is_ok();
        let status = if ran { status_word(&w) } else { None };
        match outcome {
            Ok(()) => {}
            Err(e @ (ProcError::Drop | ProcError::WouldBlock)) => {
                if let Some(key) = &drc_key {
                    self.drc.abandon(key);
                }
                return if e == ProcError::WouldBlock { Err(NeedsThread) } else { Ok(None) };
            }
            Err(e) => {
                w.truncate(header_at);
                let (kind, err) = match e {
                    ProcError::ProcUnavail => ("proc_unavail", AcceptError::ProcUnavail),
                    ProcError::GarbageArgs => ("garbage_args", AcceptError::GarbageArgs),
                    _ => ("system_err", AcceptError::SystemErr),
                };
                self.metrics.record_rpc_error(kind);
                if let ProcError::Auth(stat) = e {
                    message::encode_auth_error(&mut w, xid, stat);
                } else {
                    message::encode_accept_error(&mut w, xid, err, versions);
                }
            }
        }
        let reply = Arc::new(finish_record(w));
        if let Some(key) = &drc_key {
            // Only a call that ran is remembered, and not one refused before it changed
            // anything (a bad or stale handle, an address or identity not admitted, a
            // read-only export) or not decoded: anyone can send such calls, and
            // remembering them would push the replies of real calls out of the cache;
            // run again, they are refused again. (A call that failed after a change, a
            // REMOVE whose directory sync failed, is remembered: run again it would
            // answer NOENT.) One that panicked is better tried again than answered
            // SYSTEM_ERR for good.
            if ran && !status.is_some_and(|s| program.refused_unchanged(ctx.procedure, s)) {
                self.drc.complete(key, reply.clone(), keep);
            } else {
                self.drc.abandon(key);
            }
        }
        self.metrics.record_call(ctx.program, ctx.procedure, started.elapsed(), status);
        Ok(Some(reply))
    }

    fn accept_error(xid: u32, err: AcceptError, versions: (u32, u32)) -> Arc<Reply> {
        let mut w = begin_record(40);
        message::encode_accept_error(&mut w, xid, err, versions);
        Arc::new(finish_record(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{message::encode_call, Credential};
    use crate::xdr::XdrWriter;

    /// Program 400000, version 1: procedure 1 panics, procedure 2 answers one word,
    /// procedure 4 waits the milliseconds its word says and answers. All are
    /// non-idempotent, so all go through the duplicate request cache; 2 and 4 are quick.
    struct Flaky;

    impl RpcProgram for Flaky {
        fn program(&self) -> u32 {
            400_000
        }
        fn versions(&self) -> (u32, u32) {
            (1, 1)
        }
        fn call(&self, ctx: &CallContext, args: &mut XdrReader<'_>, out: &mut XdrWriter) -> Result<(), ProcError> {
            match ctx.procedure {
                1 => panic!("injected"),
                2 => {
                    out.u32(args.u32()?);
                    Ok(())
                }
                4 => {
                    std::thread::sleep(std::time::Duration::from_millis(args.u32()?.into()));
                    Ok(())
                }
                _ => Err(ProcError::ProcUnavail),
            }
        }
        fn is_non_idempotent(&self, _version: u32, _procedure: u32) -> bool {
            true
        }
        fn is_quick(&self, _version: u32, procedure: u32, _args: &[u8]) -> bool {
            procedure == 2 || procedure == 4
        }
    }

    fn call(xid: u32, procedure: u32, args: &[u32]) -> Vec<u8> {
        let mut w = XdrWriter::new();
        encode_call(&mut w, xid, 400_000, 1, procedure, &Credential::None);
        for a in args {
            w.u32(*a);
        }
        w.into_inner()
    }

    /// The accept status of a framed accepted reply (after the record mark).
    fn accept_status(reply: &Reply) -> u32 {
        u32::from_be_bytes(reply.bytes[4 + 20..4 + 24].try_into().unwrap())
    }

    fn dispatcher() -> Dispatcher {
        Dispatcher::new(vec![Arc::new(Flaky)], 16, Arc::new(Metrics::new()))
    }

    const PEER: &str = "127.0.0.1:700";

    #[test]
    fn a_panicking_procedure_is_answered_system_err_and_its_retransmit_runs_again() {
        let d = dispatcher();
        let (peer, local) = (PEER.parse().unwrap(), "127.0.0.1:2049".parse().unwrap());
        for _ in 0..2 {
            let reply = d.handle(&call(7, 1, &[]), peer, local, Transport::Tcp).expect("answered");
            assert_eq!(accept_status(&reply), AcceptError::SystemErr as u32);
        }
        assert!(d.drc().is_empty(), "no entry left as running");
        assert_eq!(d.drc().hits(), 0, "the retransmit ran again instead of being dropped");
    }

    #[test]
    fn calls_refused_before_running_are_not_remembered() {
        let d = dispatcher();
        let (peer, local) = (PEER.parse().unwrap(), "127.0.0.1:2049".parse().unwrap());
        let answered = d.handle(&call(1, 2, &[42]), peer, local, Transport::Tcp).expect("answered");
        assert_eq!(accept_status(&answered), 0);
        // Undecodable arguments and unknown procedures: answered, not cached.
        for xid in 2..40 {
            let reply = d.handle(&call(xid, 2 + xid % 2, &[]), peer, local, Transport::Tcp).expect("answered");
            let status = accept_status(&reply);
            assert!(status == AcceptError::GarbageArgs as u32 || status == AcceptError::ProcUnavail as u32, "{status}");
        }
        assert_eq!(d.drc().len(), 1, "only the call that ran is kept");
        let again = d.handle(&call(1, 2, &[42]), peer, local, Transport::Tcp).expect("replayed");
        assert!(Arc::ptr_eq(&answered, &again), "the reply of the call that ran is still there");
    }

    #[test]
    fn a_call_held_up_on_a_runtime_thread_sends_its_procedures_calls_to_threads_for_a_while() {
        let mut metrics = Metrics::new();
        metrics.register(400_000, "flaky", &["NULL", "PANIC", "ECHO", "UNUSED", "WAIT"]);
        let mut d = Dispatcher::new(vec![Arc::new(Flaky)], 16, Arc::new(metrics));
        // Far above HELD_UP, so that a quick call kept off the CPU of a loaded machine for
        // a while is not taken for a held-up one.
        const THRESHOLD: std::time::Duration = std::time::Duration::from_millis(400);
        d.held_up = vec![super::super::held_up::HeldUp::with_threshold(THRESHOLD)];
        let (peer, local) = (PEER.parse().unwrap(), "127.0.0.1:2049".parse().unwrap());
        let inline = |xid, procedure, arg| d.try_handle_inline(&call(xid, procedure, &[arg]), peer, local, Transport::Tcp);
        assert!(matches!(inline(1, 4, 0), Handled::Done(Some(_))), "a quick call runs on the runtime thread");
        assert!(matches!(inline(2, 4, 0), Handled::Done(Some(_))), "and so does the next");
        let held_up = THRESHOLD.as_millis() as u32 + 5;
        assert!(matches!(inline(3, 4, held_up), Handled::Done(Some(_))), "the held-up call itself is answered");
        assert!(matches!(inline(4, 4, 0), Handled::NeedsThread), "the next call of that procedure goes to a thread");
        assert!(matches!(inline(5, 2, 1), Handled::Done(Some(_))), "other procedures stay on the runtime thread");
        let reply = d.handle(&call(4, 4, &[0]), peer, local, Transport::Tcp).expect("answered");
        assert_eq!(accept_status(&reply), 0, "on a thread that may wait it runs");
        assert!(
            d.metrics.render().contains("nasd_rpc_held_up_inline_total{program=\"flaky\",procedure=\"WAIT\"} 1"),
            "counted once, under its procedure"
        );
    }
}
