//! Storage backends implementing [`crate::vfs::Vfs`].

pub mod local;
