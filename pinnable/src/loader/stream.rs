//! Sources that cannot be indexed: a stream of samples, read front to back once per epoch
//! (lines of a file, records from a socket, a generator).

use crate::error::Result;

/// A source of samples read in order, like PyTorch's `IterableDataset`: a closure that opens
/// the stream of epoch `e` (so a stream can reshuffle its own files per epoch).
///
/// Streams have no length and no random access, so a loader over one does not shuffle, and
/// its epoch is a plain [`Iterator`] (not an `ExactSizeIterator`). Samples are read by the
/// worker threads in turn, one batch's worth at a time, and collated in parallel. Sharded
/// `(rank, world)`, rank `r` takes items `r, r + world, r + 2·world, …` of the stream; the
/// ranks' parts then differ in length by at most one sample (so by at most one batch), since the
/// stream's length is not known in advance.
///
/// A stream item that is an error is delivered, with its position in the stream, in place of
/// the batch it belongs to, and the epoch ends.
///
/// # Examples
///
/// ```
/// use pinnable::loader::IterSource;
///
/// let numbers = IterSource::new(|epoch| (0..5u64).map(move |i| Ok(i + 10 * epoch)));
/// assert_eq!(numbers.open(1).map(|s| s.unwrap()).collect::<Vec<_>>(), vec![10, 11, 12, 13, 14]);
/// ```
pub struct IterSource<F> {
    open: F,
}

impl<F> IterSource<F> {
    /// A source whose epoch `e` is the stream `open(e)`.
    pub fn new<I, S>(open: F) -> Self
    where
        F: Fn(u64) -> I + Send + Sync,
        I: Iterator<Item = Result<S>> + Send,
        S: Send,
    {
        IterSource { open }
    }

    /// The stream of epoch `epoch`.
    pub fn open<I, S>(&self, epoch: u64) -> I
    where
        F: Fn(u64) -> I + Send + Sync,
        I: Iterator<Item = Result<S>> + Send,
        S: Send,
    {
        (self.open)(epoch)
    }
}

impl<F> std::fmt::Debug for IterSource<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IterSource")
    }
}

/// The stream's items for one rank: every `world`-th, starting at `rank`, with their positions
/// in the stream.
pub(crate) fn shard_stream<I, S>(
    stream: I,
    rank: usize,
    world: usize,
) -> impl Iterator<Item = (usize, Result<S>)> + Send
where
    I: Iterator<Item = Result<S>> + Send,
    S: Send,
{
    stream.enumerate().skip(rank).step_by(world.max(1))
}
