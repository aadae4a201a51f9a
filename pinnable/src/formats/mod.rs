//! The file formats the loader reads, one module each: [`npy`] arrays; [`tokens`] shards
//! (llm.c, nanoGPT, `.npy`) as windows or as documents packed for varlen attention; [`tar`]
//! WebDataset shards, local or (the `remote` feature) in S3 and on HTTP(S) servers; and, with
//! the `image` feature, [`image`]: JPEG and PNG files decoded on the host or on the GPU.
//!
//! Each format implements the loader's traits ([`Dataset`](crate::loader::Dataset),
//! [`Batcher`](crate::loader::Batcher)) from outside the loader: the loader is generic and
//! names no format. Every file a format reads is hostile input until checked: headers are
//! parsed into typed values first, every length is checked against the file's size before
//! anything is read, and every error names the file.

#[cfg(feature = "image")]
pub mod image;
pub mod npy;
pub mod tar;
pub mod tokens;
