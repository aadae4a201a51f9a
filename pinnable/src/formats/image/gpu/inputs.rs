//! A batch's compressed pictures in one pinned block: read from files, or copied from a
//! shard's members.

use std::fs;
use std::io::Read;
use std::path::PathBuf;

use crate::alloc::PinnedBlock;
use crate::error::{Error, Result};
use crate::formats::image::folder::{ImageFile, read_error};
use crate::loader::Collator;

fn sample_error(file: &ImageFile, e: Error) -> Error {
    Error::Sample {
        index: file.index(),
        during: "writing in place",
        source: Box::new(e),
    }
}

/// A batch's compressed pictures, read into one pinned block, and what names them.
pub(crate) struct Inputs {
    /// The bytes of every picture, one after another.
    pub(crate) block: PinnedBlock,
    /// Each picture's bytes in the block: (start, length).
    pub(crate) ranges: Vec<(usize, usize)>,
    /// What errors name: the file, or a shard's member.
    pub(crate) names: Vec<PathBuf>,
    /// Each sample's index in its dataset (for `Error::Sample`).
    pub(crate) indices: Vec<usize>,
    pub(crate) labels: Vec<i64>,
    /// Pictures over this many pixels are refused (the host decoder's message).
    pub(crate) max_pixels: usize,
}

impl Inputs {
    /// `e` as the failure of the sample at batch position `pos`.
    pub(super) fn error(&self, pos: usize, e: Error) -> Error {
        Error::Sample {
            index: self.indices[pos],
            during: "writing in place",
            source: Box::new(e),
        }
    }

    /// Copies `pictures` (their bytes and what names them) into one pinned block from `c`'s pool.
    ///
    /// # Errors
    ///
    /// The pool's, when the block cannot be had.
    pub(crate) fn copied(
        pictures: &[(&[u8], PathBuf, usize, i64)],
        max_pixels: usize,
        c: &Collator,
    ) -> Result<Inputs> {
        let total: usize = pictures.iter().map(|p| p.0.len()).sum();
        let block = c.pool().alloc(total.max(1))?;
        let mut ranges = Vec::with_capacity(pictures.len());
        let mut at = 0;
        for (bytes, ..) in pictures {
            // SAFETY: the block is ours alone and holds `total` bytes; the ranges are
            // disjoint and inside it.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), block.as_ptr().add(at), bytes.len())
            };
            ranges.push((at, bytes.len()));
            at += bytes.len();
        }
        Ok(Inputs {
            block,
            ranges,
            names: pictures.iter().map(|p| p.1.clone()).collect(),
            indices: pictures.iter().map(|p| p.2).collect(),
            labels: pictures.iter().map(|p| p.3).collect(),
            max_pixels,
        })
    }
}

/// Files a batch holds open at once while it is read (well under the usual limit of 1024
/// descriptors); the files past it are sized by their paths and opened when read.
const HELD_OPEN: usize = 256;

/// Reads every file into one pinned block: the block and each file's range in it. A file is
/// opened once and sized from its handle: one path lookup a file, which is most of the cost.
pub(crate) fn read_files(
    samples: &[ImageFile],
    c: &Collator,
) -> Result<(PinnedBlock, Vec<(usize, usize)>)> {
    let mut files = Vec::with_capacity(samples.len());
    for s in samples {
        let fail = |e: std::io::Error| sample_error(s, read_error(s.path(), &e));
        let (f, len) = if files.len() < HELD_OPEN {
            let f = fs::File::open(s.path()).map_err(fail)?;
            let len = f.metadata().map_err(fail)?.len();
            (Some(f), len)
        } else {
            (None, fs::metadata(s.path()).map_err(fail)?.len())
        };
        files.push((f, usize::try_from(len).unwrap_or(usize::MAX)));
    }
    let total = files
        .iter()
        .try_fold(0usize, |a, f| a.checked_add(f.1))
        .ok_or_else(|| {
            Error::Shape("the batch's files add up to more bytes than fit in memory".into())
        })?;
    let block = c.pool().alloc(total.max(1))?;
    let mut ranges = Vec::with_capacity(samples.len());
    let mut at = 0;
    for (s, (f, len)) in samples.iter().zip(files) {
        let fail = |e: std::io::Error| sample_error(s, read_error(s.path(), &e));
        let mut f = match f {
            Some(f) => f,
            None => fs::File::open(s.path()).map_err(fail)?,
        };
        // SAFETY: the block is ours alone and `at + len <= total <= block.len()`; the ranges
        // of different files do not overlap.
        let dst = unsafe { std::slice::from_raw_parts_mut(block.as_ptr().add(at), len) };
        f.read_exact(dst).map_err(fail)?;
        let mut extra = [0u8; 1];
        if f.read(&mut extra).map_err(fail)? != 0 {
            return Err(sample_error(
                s,
                Error::Image {
                    path: s.path().display().to_string(),
                    problem: "the file grew while it was read; read it again once it is written"
                        .into(),
                },
            ));
        }
        ranges.push((at, len));
        at += len;
    }
    Ok((block, ranges))
}
