//! Sharded sample archives: WebDataset tar shards, read as a [`Dataset`] whose epochs the
//! shards themselves plan, so that reads stay sequential within a shard.
//!
//! ```text
//!  shard list ──expand──► shards (read) ───index pass at open──► every sample: (shard, fields)
//!   braces, globs           ByteSource          headers only           fields = byte ranges
//!                                                                           │
//!   epoch plan (seed, epoch, rank, world, buffer) ◄─────────────────────────┘
//!     shard order: a permutation of (seed, epoch)
//!     their samples in that order, cut into `world` equal runs (rank r takes run r)
//!     a shuffle buffer of N samples over the run
//!                │  the loader's workers only read: get(i) is a handle, the batcher copies
//!                ▼  or decodes each field straight into its row of the pinned batch
//! ```
//!
//! - **Reader**: ustar, pax (`path`, `size`; per-member and global headers), GNU
//!   long names; checksums checked; every length checked against the shard's size; errors
//!   ([`Error::Tar`]) name the shard and the byte offset. Our own reader rather than the `tar`
//!   crate: members must stay byte ranges of the shard (read where they lie, or viewed in a
//!   mapping; the `tar` crate reads through `io::Read` into buffers), and the index pass reads
//!   headers only.
//! - **Gzip-compressed shards** (`.tar.gz`, as webdataset reads them) are told by their first
//!   bytes (`1f 8b`), whatever their names, local or remote, and decompressed as a stream
//!   (flate2, pure Rust): the index pass decompresses each once; each epoch decompresses the
//!   compressed shards of its run once, in order, holding the samples passed on the way until
//!   their workers take them (about the shuffle buffer's worth). One worker at a time
//!   decompresses a shard, so plain shards serve a fast GPU better. Their members are copies,
//!   never views of a mapping (also under [`TarShards::open_mapped`]); offsets in their errors
//!   count decompressed bytes. bzip2, xz and zstd shards are refused with a message naming the
//!   compression.
//! - **Grouping** as webdataset 1.0 does it: key and extension
//!   from the member path, consecutive members with one key form a sample, a repeated extension
//!   is an error naming the shard and the key, `__*__` members skipped. Keys are bytes, as the
//!   shard stores them ([`TarSample::key_bytes`]; [`TarSample::key`] is the `&str` view where
//!   they are UTF-8): names that differ only in bytes that are not UTF-8 are two samples, as
//!   they are to Python's `tarfile`.
//! - **Equal batches on every rank**: the index pass counts every shard's samples, so each rank
//!   gets the same number per epoch: `ceil(total / world)` samples, repeating from the start of
//!   the epoch's order (the loader's default), or `floor(total / world)` with `drop_last`,
//!   dropping the tail — even with fewer shards than ranks, where ranks share a shard.
//! - **Order**: a pure function of the seed, the epoch, the rank, the world size and the
//!   buffer size; never of the number of worker threads. Resuming through the loader's
//!   [`Position`](crate::loader::Position) starts at the next batch without reading the ones
//!   before it.
//! - **A damaged shard**: every sample before the damage is read, then the damage is one entry
//!   of the epoch at the place it was found, delivered as the error of the batch holding it.
//!   The sample being assembled when a bad header is found comes first, with the members read
//!   before it, as webdataset gives it (Python's `tarfile` ends the archive at a bad header);
//!   a sample whose own member is cut short by the shard's end is dropped.
//! - **Remote shards** (feature `remote`): [`TarShards::open`] and
//!   [`open_with`](TarShards::open_with) take `s3://` and `http(s)://` shard lists, read
//!   through [`storage`](crate::storage) (the reads' settings in a
//!   [`Storage`]); each epoch streams every rank's run in ranged
//!   chunks with a bounded read-ahead, several ranks of one process at once. The guide's
//!   [`tar`](crate::guide::tar) chapter tells what the index pass and the reads cost. Other
//!   sources of ranged bytes implement [`ByteSource`] and go to [`TarShards::from_shards`].
//! - **A resume over other shards** is refused: positions carry a hash of the shards' file
//!   names in list order (with the shuffle buffer), so the same number of samples from another
//!   list does not pass for the run that was saved.
//!
//! # Examples
//!
//! ```
//! use pinnable::formats::tar::{TarSample, TarShards};
//! use pinnable::loader::Loader;
//!
//! // A shard of two samples, each a `.txt` and a `.cls`, written on the spot.
//! fn member(out: &mut Vec<u8>, name: &str, data: &[u8]) {
//!     let mut h = [0u8; 512];
//!     h[..name.len()].copy_from_slice(name.as_bytes());
//!     h[100..108].copy_from_slice(b"0000644\0");
//!     h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
//!     h[156] = b'0';
//!     h[257..263].copy_from_slice(b"ustar\0");
//!     h[148..156].copy_from_slice(b"        ");
//!     let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
//!     h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
//!     out.extend_from_slice(&h);
//!     out.extend_from_slice(data);
//!     out.resize(out.len().next_multiple_of(512), 0);
//! }
//! let mut tar = Vec::new();
//! member(&mut tar, "a.txt", b"hello");
//! member(&mut tar, "a.cls", b"3");
//! member(&mut tar, "b.txt", b"world");
//! member(&mut tar, "b.cls", b"5");
//! let dir = std::env::temp_dir().join(format!("pinnable-tar-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! std::fs::write(dir.join("shard-0.tar"), &tar)?;
//!
//! let shards = TarShards::open([format!("{}/shard-{{0..0}}.tar", dir.display())])?;
//! assert_eq!(shards.len(), 2);
//! let loader = Loader::builder(shards).batch_size(2).shuffle(7).workers(1).build_with(
//!     |samples: Vec<TarSample>, c| {
//!         let labels = c.stack_scalars("labels", samples.iter().map(|s| s.class("cls")).collect::<pinnable::Result<Vec<_>>>()?)?;
//!         Ok(c.finish()?.take(labels)?)
//!     },
//! )?;
//! for batch in &loader {
//!     let mut labels = batch?.to_vec::<i64>()?;
//!     labels.sort();
//!     assert_eq!(labels, vec![3, 5]);
//! }
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(test)]
mod fuzz_tests;
mod group;
mod gzip;
#[cfg(test)]
mod gzip_tests;
#[cfg(feature = "image")]
mod images;
mod index;
mod list;
mod reader;
#[cfg(feature = "remote")]
mod remote;
mod sample;
#[cfg(feature = "remote")]
mod streams;

use std::sync::Arc;

pub use group::Field;
pub(crate) use group::Group;
#[cfg(feature = "image")]
pub use images::TarImageBatcher;
pub(crate) use list::expand;
pub use sample::{TarNpyBatcher, TarSample};

use crate::error::{Error, Result};
use crate::hash::Fingerprint;
use crate::loader::{Dataset, Plan, PlanRequest, SplitMix64, permutation};
use crate::storage::{ByteSource, Session, Storage, is_url};
use gzip::GzStreams;

/// The default shuffle buffer: samples held and drawn from at random when the loader shuffles.
pub(crate) const DEFAULT_BUFFER: usize = 1024;

/// One shard: its name (path or URL) and its bytes.
pub(crate) struct Shard {
    pub(crate) name: String,
    pub(crate) bytes: Arc<dyn ByteSource>,
}

/// One entry of the index: a sample, or the damage that ended its shard's index pass.
pub(crate) enum Entry {
    Sample(Group),
    Broken { offset: u64, problem: String },
}

pub(crate) struct Index {
    pub(crate) shards: Vec<Shard>,
    pub(crate) entries: Vec<Entry>,
    /// `entries[starts[s]..starts[s + 1]]` are shard `s`'s.
    pub(crate) shard_of: Vec<u32>,
    starts: Vec<usize>,
    /// A source that streams each epoch's samples ahead of the workers (remote shards).
    #[cfg(feature = "remote")]
    streams: Option<Arc<dyn crate::storage::remote::Streams>>,
    /// The decoders of the gzip-compressed shards, which stream each epoch's samples in order.
    gzip: Option<Arc<GzStreams>>,
}

/// Sharded WebDataset archives as a [`Dataset`] of [`TarSample`]s, whose epochs the shards
/// plan (see the [module docs](self)): shard order from the seed and the epoch, equal runs per
/// rank, a shuffle buffer.
#[derive(Clone)]
pub struct TarShards {
    index: Arc<Index>,
    buffer: usize,
    /// A hash of the shards' file names in list order, carried by positions.
    names: u32,
}

impl std::fmt::Debug for TarShards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TarShards({} shards, {} samples, buffer {})",
            self.index.shards.len(),
            self.index.entries.len(),
            self.buffer
        )
    }
}

impl TarShards {
    /// Opens the shards named by `patterns` with the default [`Storage`] settings, and runs
    /// the index pass (headers only; a gzip-compressed shard is decompressed once): see
    /// [`open_with`](Self::open_with).
    ///
    /// # Errors
    ///
    /// As [`open_with`](Self::open_with).
    pub fn open<S: AsRef<str>>(patterns: impl IntoIterator<Item = S>) -> Result<TarShards> {
        TarShards::open_with(&Storage::new(), patterns)
    }

    /// Opens the shards named by `patterns`, read as `storage` says, and runs the index pass.
    ///
    /// Local paths expand brace ranges and globs (see the [module docs](self)); their members
    /// are read with positioned reads (each a copy, whatever happens to the files meanwhile);
    /// [`open_mapped`](Self::open_mapped) maps them instead, for zero-copy `.npy` members.
    /// With the `remote` feature, URLs (`s3://bucket/key`, `http(s)://host/path`) expand
    /// brace ranges, and globs for `s3://`, whose keys can be listed; each epoch streams the
    /// rank's run ahead of the workers (the guide's [`tar`](crate::guide::tar) chapter).
    ///
    /// # Errors
    ///
    /// [`Error::Tar`] naming a pattern that expands to nothing or a shard that cannot be
    /// opened (for a URL: missing (404), refused (401, 403), unreachable after the retries,
    /// an unknown [`option`](Storage::option) key), a URL without the `remote` feature, or
    /// URLs and local paths in one list. Damage inside a shard is not an error here: see the
    /// [module docs](self).
    pub fn open_with<S: AsRef<str>>(
        storage: &Storage,
        patterns: impl IntoIterator<Item = S>,
    ) -> Result<TarShards> {
        let patterns: Vec<S> = patterns.into_iter().collect();
        let url = |p: &S| is_url(p.as_ref());
        if let Some(first) = patterns.iter().find(|p| url(p)) {
            #[cfg(feature = "remote")]
            if patterns.iter().all(url) {
                return remote::open(storage, patterns);
            }
            return Err(Error::Tar {
                shard: first.as_ref().to_owned(),
                offset: 0,
                problem: if cfg!(feature = "remote") {
                    "a URL among local paths: open local and remote shards as two lists".into()
                } else {
                    "a URL: build pinnable with its `remote` feature to read remote shards".into()
                },
            });
        }
        let session = Session::new(storage);
        let shards = expand(patterns)?
            .iter()
            .map(|p| {
                let name = p.display().to_string();
                let bytes = session.open(&name).map_err(as_tar)?;
                if bytes.is_empty() {
                    return Err(Error::Tar {
                        shard: name,
                        offset: 0,
                        problem: "cannot open it: the file is empty".into(),
                    });
                }
                Ok((name, bytes))
            })
            .collect::<Result<Vec<_>>>()?;
        TarShards::from_shards(shards)
    }

    /// Opens local shards as [`open`](Self::open) does, but memory-mapped: `.npy` members
    /// become tensors that view the mapping (no copy) and reads cost no system call. The
    /// members of a gzip-compressed shard are still copies, decompressed from the mapping.
    ///
    /// # Safety
    ///
    /// Nothing (this process or another) writes to or truncates the files while the shards,
    /// or any tensor viewing them, live: the mapped bytes are read as immutable memory, and
    /// a truncated mapping faults when read. Shards written once and then only read (the
    /// usual case for a dataset) meet this; [`open`](Self::open) is the safe choice otherwise.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open) for local paths; a URL in the list is an error.
    pub unsafe fn open_mapped<S: AsRef<str>>(
        patterns: impl IntoIterator<Item = S>,
    ) -> Result<TarShards> {
        let paths = expand(patterns)?;
        let shards = paths
            .iter()
            .map(|p| {
                // SAFETY: the caller upholds `Storage::open_mapped`'s contract, which is ours.
                let bytes = unsafe { Storage::open_mapped(p) }.map_err(as_tar)?;
                Ok((p.display().to_string(), bytes))
            })
            .collect::<Result<Vec<_>>>()?;
        TarShards::from_shards(shards)
    }

    /// Shards read by another [`ByteSource`] (in memory, or ranged reads of a remote object),
    /// each with the name its errors carry.
    ///
    /// # Errors
    ///
    /// [`Error::Tar`] for an empty list.
    pub fn from_shards(
        shards: impl IntoIterator<Item = (String, Arc<dyn ByteSource>)>,
    ) -> Result<TarShards> {
        let shards: Vec<Shard> = shards
            .into_iter()
            .map(|(name, bytes)| Shard { name, bytes })
            .collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        TarShards::build(shards, None, threads.clamp(1, 16), gzip::LOCAL_CHUNK)
    }

    /// The index pass over `shards` (through `index_readers` where given: a remote shard reads
    /// headers through small windows, not its streaming chunks) on up to `threads` threads;
    /// a gzip-compressed shard is read `chunk` compressed bytes at a time.
    pub(crate) fn build(
        mut shards: Vec<Shard>,
        index_readers: Option<Vec<Arc<dyn ByteSource>>>,
        threads: usize,
        chunk: usize,
    ) -> Result<TarShards> {
        if shards.is_empty() {
            return Err(Error::Tar {
                shard: "(no shard)".into(),
                offset: 0,
                problem: "the shard list is empty; name at least one shard".into(),
            });
        }
        let mut entries = Vec::new();
        let mut shard_of = Vec::new();
        let mut starts = vec![0];
        let readers =
            index_readers.unwrap_or_else(|| shards.iter().map(|s| s.bytes.clone()).collect());
        let found = index::index_shards(&shards, &readers, threads, chunk);
        drop(readers);
        let names = names_hash(shards.iter().map(|s| s.name.as_str()));
        let mut gz = Vec::with_capacity(shards.len());
        for (s, found) in found.into_iter().enumerate() {
            entries.extend(found.entries);
            shard_of.resize(entries.len(), s as u32);
            starts.push(entries.len());
            if let Some(g) = &found.gz {
                shards[s].bytes = g.clone();
            }
            gz.push(found.gz);
        }
        Ok(TarShards {
            index: Arc::new(Index {
                shards,
                entries,
                shard_of,
                starts,
                #[cfg(feature = "remote")]
                streams: None,
                gzip: GzStreams::new(gz).map(Arc::new),
            }),
            buffer: DEFAULT_BUFFER,
            names,
        })
    }

    /// Holds `samples` in the shuffle buffer when the loader shuffles (at most 1: no mixing
    /// within the run, shards still in shuffled order). Part of the order: a run resumes
    /// with the buffer size it was saved with.
    pub fn shuffle_buffer(mut self, samples: usize) -> TarShards {
        self.buffer = samples;
        self
    }

    /// The shuffle buffer's size.
    pub fn buffer(&self) -> usize {
        self.buffer
    }

    /// The samples of all shards (damage found by the index pass counts as one).
    pub fn len(&self) -> usize {
        self.index.entries.len()
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.index.entries.is_empty()
    }

    /// The shards' names, in list order.
    pub fn shard_names(&self) -> impl Iterator<Item = &str> {
        self.index.shards.iter().map(|s| s.name.as_str())
    }

    /// How many samples shard `shard` holds.
    pub fn shard_len(&self, shard: usize) -> Option<usize> {
        Some(self.index.starts.as_slice().get(shard + 1)? - self.index.starts[shard])
    }

    /// The plan of [`Dataset::plan`] in two parts: the run in stream order (the shards'
    /// samples in shard order), and the output as positions in the run.
    fn run_and_output(
        &self,
        epoch: u64,
        seed: Option<u64>,
        (rank, world): (usize, usize),
        drop_last: bool,
    ) -> (Vec<usize>, Vec<usize>) {
        let index = &self.index;
        let total = index.entries.len();
        let world = world.max(1);
        let per = if drop_last || total == 0 {
            total / world
        } else {
            total.div_ceil(world)
        };
        let order = match seed {
            Some(seed) => permutation(index.shards.len(), seed, epoch),
            None => (0..index.shards.len()).collect(),
        };
        // The epoch's stream, found by position without building it: shard `order[k]`'s
        // samples follow those of `order[..k]`.
        let mut ends = Vec::with_capacity(order.len());
        let mut sum = 0;
        for &s in &order {
            sum += index.starts[s + 1] - index.starts[s];
            ends.push(sum);
        }
        let at = |i: usize| {
            let i = i % total;
            let k = ends.partition_point(|&e| e <= i);
            let before = if k == 0 { 0 } else { ends[k - 1] };
            index.starts[order[k]] + (i - before)
        };
        let run: Vec<usize> = (rank * per..(rank + 1) * per).map(at).collect();
        // The buffer shuffles positions in the run: the same draws as shuffling the indices.
        let out = match seed {
            Some(seed) if self.buffer > 1 => {
                let mut rng = SplitMix64::for_epoch(
                    SplitMix64::for_epoch(seed, epoch).next_u64(),
                    rank as u64 ^ 0x7A12_5EED,
                );
                shuffle_buffer(0..run.len(), self.buffer, &mut rng)
            }
            _ => (0..run.len()).collect(),
        };
        (run, out)
    }
}

/// A storage error as a tar error naming the shard.
pub(crate) fn as_tar(e: Error) -> Error {
    match e {
        Error::Storage { name, problem } => Error::Tar {
            shard: name,
            offset: 0,
            problem,
        },
        e => e,
    }
}

/// webdataset's shuffle: fill a buffer of `size`, then for each new sample yield a random one
/// of the buffer and put the new one in its place; at the end, drain it at random.
pub(crate) fn shuffle_buffer(
    items: impl Iterator<Item = usize>,
    size: usize,
    rng: &mut SplitMix64,
) -> Vec<usize> {
    let mut buffer = Vec::with_capacity(size.min(1 << 20));
    let mut out = Vec::new();
    for item in items {
        if buffer.len() < size {
            buffer.push(item);
            continue;
        }
        let j = rng.below(buffer.len() as u64) as usize;
        out.push(std::mem::replace(&mut buffer[j], item));
    }
    while !buffer.is_empty() {
        let j = rng.below(buffer.len() as u64) as usize;
        out.push(buffer.swap_remove(j));
    }
    out
}

/// A hash (FNV-1a, [`Fingerprint`], folded to 32 bits) of the shards' file names — the last
/// component of each path or URL — in list order: a resume with another shard list of the same
/// length is refused, while the same files moved to another folder or a bucket still resume.
/// Each name is ended by a zero byte, which no file name holds, rather than preceded by its
/// length: positions saved before [`Fingerprint`] hashed names so, and still resume.
pub(crate) fn names_hash<'a>(names: impl Iterator<Item = &'a str>) -> u32 {
    let mut h = Fingerprint::new();
    for name in names {
        let file = name.rsplit(['/', '\\']).next().unwrap_or(name);
        h.raw(file.as_bytes()).u8(0);
    }
    let h = h.finish();
    (h ^ (h >> 32)) as u32
}

impl TarShards {
    /// Sample `index` (grouped as `g`): holding its bytes where they are decompressed or
    /// streamed, a handle on the shard otherwise.
    fn sample(&self, index: usize, g: &Group) -> Result<TarSample> {
        let shard = self.index.shard_of[index] as usize;
        if let Some(gzip) = self.index.gzip.as_ref().filter(|z| z.has(shard)) {
            let bytes = gzip.take(index, shard, g.span()).map_err(|e| Error::Tar {
                shard: self.index.shards[shard].name.clone(),
                offset: g.offset,
                problem: format!("reading sample `{}`: {e}", group::show_key(&g.key)),
            })?;
            return Ok(TarSample::new(self.index.clone(), index).holding(bytes, g.offset));
        }
        #[cfg(feature = "remote")]
        return self.streamed(index, g);
        #[cfg(not(feature = "remote"))]
        Ok(TarSample::new(self.index.clone(), index))
    }
}

impl Dataset for TarShards {
    type Sample = TarSample;

    fn len(&self) -> usize {
        self.index.entries.len()
    }

    fn get(&self, index: usize) -> Result<TarSample> {
        match self.index.entries.get(index) {
            None => Err(Error::IndexOutOfRange {
                index,
                len: self.len(),
            }),
            Some(Entry::Broken { offset, problem }) => Err(Error::Tar {
                shard: self.index.shards[self.index.shard_of[index] as usize]
                    .name
                    .clone(),
                offset: *offset,
                problem: problem.clone(),
            }),
            Some(Entry::Sample(g)) => self.sample(index, g),
        }
    }

    /// The shards in order (shuffled by the loader's seed and the epoch), this rank's run of
    /// their samples, and that run put through the shuffle buffer. The fingerprint: the
    /// shuffle buffer (low 32 bits) and a hash of the shards' file names in list order (high
    /// 32 bits): a position saved over other shards, or with another buffer, is refused.
    fn plan(&self, r: &PlanRequest) -> Option<Plan> {
        let (run, out) = self.run_and_output(r.epoch, r.seed, (r.rank, r.world), r.drop_last);
        Some(
            Plan::order(out.into_iter().map(|p| run[p]).collect()).with_fingerprint(
                "shuffle buffer (low 32 bits) and shard-list hash (high 32 bits)",
                (u64::from(self.names) << 32) | self.buffer.min(u32::MAX as usize) as u64,
            ),
        )
    }

    /// Starts this rank's reads for the epoch: a remote source's streams, and the order in
    /// which gzip-compressed shards are decompressed.
    fn prefetch(&self, r: &PlanRequest, _plan: &Plan) {
        let (run, out) = self.run_and_output(r.epoch, r.seed, (r.rank, r.world), r.drop_last);
        #[cfg(feature = "remote")]
        self.stream((r.rank, r.world), &run, &out);
        if let Some(gzip) = &self.index.gzip {
            let index = &self.index;
            let mut place = vec![0; run.len()];
            for (o, &p) in out.iter().enumerate() {
                place[p] = o;
            }
            gzip.plan(
                (r.rank, r.world),
                run.iter()
                    .zip(place)
                    .filter_map(|(&i, o)| match &index.entries[i] {
                        Entry::Sample(g) => Some((i, index.shard_of[i] as usize, g.span(), o)),
                        Entry::Broken { .. } => None,
                    }),
            );
        }
    }
}
