//! The `mqfq-sim` command line: file I/O, flags, tables and plots around
//! `scheduler_core::sim`. Kept out of `scheduler-core` so the pure crate has no CLI or plotting
//! dependencies.

pub mod cli;
pub mod plot;
