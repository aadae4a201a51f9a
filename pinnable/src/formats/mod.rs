//! The file formats the loader reads, one module each: [`npy`] arrays; [`tokens`] shards
//! (llm.c, nanoGPT, `.npy`) as windows or as documents packed for varlen attention; [`tar`]
//! WebDataset shards; and, with the `image` feature, [`image`]: JPEG and PNG files decoded on
//! the host or on the GPU.
//!
//! Every format reads its bytes through [`storage`](crate::storage), so each opener takes a
//! path or (the `remote` feature) an `s3://` or `http(s)://` URL as one parameter:
//! `open(location)` with the default settings, `open_with(&storage, location)` with a
//! [`Storage`](crate::storage::Storage) of the reads' settings. `open` is safe everywhere;
//! where a format can view a mapped file without a copy (token shards, `.npy`, tar), that is
//! `unsafe fn open_mapped`, its contract in `# Safety`.
//!
//! Each format implements the loader's traits ([`Dataset`](crate::loader::Dataset),
//! [`Batcher`](crate::loader::Batcher)) from outside the loader: the loader is generic and
//! names no format. Every file a format reads is hostile input until checked: headers are
//! parsed into typed values first, every length is checked against the file's size before
//! anything is read, and every error names the file.
//!
//! # Adding a format
//!
//! A format reads through a [`ByteSource`](crate::storage::ByteSource) (`len`, `read_at`,
//! `read_into`; `in_memory` where the bytes are mapped and can be viewed), which
//! [`Storage::open`](crate::storage::Storage::open) gives for a path or a URL, so the format
//! never knows whether its bytes came from a disk or a bucket. Its opener takes the location
//! and, in `open_with`, a [`Storage`](crate::storage::Storage); it parses headers from ranged
//! reads, checks every length against `len()`, and implements [`Dataset`](crate::loader::Dataset)
//! (and a [`Batcher`](crate::loader::Batcher) where its samples write themselves into the
//! batch). A test reads it from the local HTTP server of `tests/support/http.rs` as from a path
//! (`tests/storage_remote.rs`).

#[cfg(feature = "image")]
pub mod image;
pub mod npy;
pub mod tar;
pub mod tokens;
