//! nasd: a network-attached storage server.
//!
//! Request path, top to bottom: [`server`] accepts connections and reads RPC records
//! ([`rpc::record`]); [`rpc::dispatch`] checks the call header and picks the program;
//! the protocol module ([`nfs3`], [`mount3`], [`portmap`]) decodes the arguments, admits
//! the caller to an export ([`exports`], [`fh`]) and calls the [`vfs::Vfs`] of that export,
//! implemented by a [`backend`].

pub mod backend;
pub mod bench;
pub mod cli;
pub mod cpu;
pub mod exports;
pub mod fh;
pub mod metrics;
pub mod mount3;
pub mod nfs3;
pub mod portmap;
pub mod rpc;
pub mod server;
pub mod sockaddr;
#[cfg(test)]
pub mod testing;
pub mod throttle;
pub mod vfs;
pub mod xdr;
