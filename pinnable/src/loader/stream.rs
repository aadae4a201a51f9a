//! Sources that cannot be indexed: a stream of samples, read front to back once per epoch
//! (lines of a file, records from a socket, a generator).

use crate::error::Result;

/// A source of samples read in order, like PyTorch's `IterableDataset`: a closure that opens
/// the stream of epoch `e` (so a stream can reshuffle its own files per epoch).
///
/// Streams have no length and no random access, so a loader over one does not shuffle, and
/// its epoch's length is not known until it ends ([`Epoch::remaining`](super::Epoch::remaining)
/// is `None`). Samples are read by the
/// worker threads in turn, one batch's worth at a time, and collated in parallel. Sharded
/// `(rank, world)`, rank `r` takes items `r, r + world, r + 2·world, …` of the stream; the
/// ranks' parts then differ in length by at most one sample (so by at most one batch), since the
/// stream's length is not known in advance.
///
/// A stream item that is an error is delivered, with its position in the stream, in place of
/// the batch it belongs to, and the epoch ends.
///
/// A loader over a stream resumes mid-epoch ([`LoaderBuilder::resume`](super::LoaderBuilder::resume))
/// only if the source can open a stream part-way through: give it that with
/// [`seekable`](Self::seekable).
///
/// # Examples
///
/// ```
/// use pinnable::loader::IterSource;
///
/// let numbers = IterSource::new(|epoch| (0..5u64).map(move |i| Ok(i + 10 * epoch)));
/// assert_eq!(numbers.open(1).map(|s| s.unwrap()).collect::<Vec<_>>(), vec![10, 11, 12, 13, 14]);
/// ```
pub struct IterSource<F, G = NotSeekable> {
    open: F,
    seek: G,
}

impl<F> IterSource<F> {
    /// A source whose epoch `e` is the stream `open(e)`.
    pub fn new<I, S>(open: F) -> Self
    where
        F: Fn(u64) -> I + Send + Sync,
        I: Iterator<Item = Result<S>> + Send,
        S: Send,
    {
        IterSource {
            open,
            seek: NotSeekable,
        }
    }

    /// The same source, able to start an epoch's stream part-way through: `seek(e, item)` is
    /// the stream of epoch `e` from its item number `item` on (counting from 0 over the whole
    /// stream, before it is cut into ranks' parts) — the items `open(e).skip(item)` yields,
    /// found without reading the ones before where the source can (a line offset, a record
    /// index, a file and an offset in it). A loader over it can then resume mid-epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use pinnable::loader::IterSource;
    ///
    /// let source = IterSource::new(|epoch| (0..10u64).map(move |i| Ok(i + 100 * epoch)))
    ///     .seekable(|epoch, item| (item..10).map(move |i| Ok(i + 100 * epoch)));
    /// let rest: Vec<u64> = source.open(1).skip(7).map(|s| s.unwrap()).collect();
    /// assert_eq!(rest, vec![107, 108, 109]);
    /// # use pinnable::loader::Seekable;
    /// let sought: Vec<u64> = source.seek(1, 7).unwrap().map(|s| s.unwrap()).collect();
    /// assert_eq!(sought, rest);
    /// ```
    pub fn seekable<G, J, S>(self, seek: G) -> IterSource<F, G>
    where
        G: Fn(u64, u64) -> J + Send + Sync,
        J: Iterator<Item = Result<S>> + Send + 'static,
        S: Send + 'static,
    {
        IterSource {
            open: self.open,
            seek,
        }
    }
}

impl<F> IterSource<F> {
    /// The same source, seeking with `seek` (a [`Seekable`] of the crate's own).
    pub(crate) fn seekable_by<G>(self, seek: G) -> IterSource<F, G> {
        IterSource {
            open: self.open,
            seek,
        }
    }
}

impl<F, G> IterSource<F, G> {
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

impl<F, G> IterSource<F, G> {
    /// The stream of epoch `epoch` from its item `item` on, if the source can seek.
    pub fn seek<S>(&self, epoch: u64, item: u64) -> Option<G::Stream>
    where
        G: Seekable<S>,
    {
        self.seek.seek(epoch, item)
    }

    /// Whether the source can start a stream part-way through.
    pub fn can_seek<S>(&self) -> bool
    where
        G: Seekable<S>,
    {
        self.seek.can_seek()
    }
}

impl<F, G> std::fmt::Debug for IterSource<F, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IterSource")
    }
}

/// How a stream source starts an epoch's stream part-way through, so that a loader over it
/// resumes mid-epoch without reading what came before: implemented by closures
/// `Fn(epoch, item) -> stream` (see [`IterSource::seekable`]) and by [`NotSeekable`], the
/// source that cannot.
pub trait Seekable<S>: Send + Sync {
    /// The stream a seek gives: items of type `S`, or errors.
    type Stream: Iterator<Item = Result<S>> + Send + 'static;

    /// The stream of epoch `epoch` from its item `item` on (counting from 0, before the
    /// stream is cut into ranks' parts), or `None` if this source cannot start mid-stream.
    fn seek(&self, epoch: u64, item: u64) -> Option<Self::Stream>;

    /// Whether [`seek`](Self::seek) gives streams.
    fn can_seek(&self) -> bool;
}

/// What a stream source without [`IterSource::seekable`] has: it cannot start mid-stream, so a
/// loader over it resumes only at the start of an epoch.
#[derive(Clone, Copy, Debug, Default)]
pub struct NotSeekable;

impl<S: 'static> Seekable<S> for NotSeekable {
    type Stream = std::iter::Empty<Result<S>>;

    fn seek(&self, _epoch: u64, _item: u64) -> Option<Self::Stream> {
        None
    }

    fn can_seek(&self) -> bool {
        false
    }
}

impl<S, J, G> Seekable<S> for G
where
    G: Fn(u64, u64) -> J + Send + Sync,
    J: Iterator<Item = Result<S>> + Send + 'static,
{
    type Stream = J;

    fn seek(&self, epoch: u64, item: u64) -> Option<J> {
        Some(self(epoch, item))
    }

    fn can_seek(&self) -> bool {
        true
    }
}

/// The stream's items for one rank: every `world`-th, starting at `rank`, with their positions
/// in the stream, whose first item is item number `first` of the epoch's.
pub(crate) fn shard_stream<I, S>(
    stream: I,
    first: usize,
    rank: usize,
    world: usize,
) -> impl Iterator<Item = (usize, Result<S>)> + Send
where
    I: Iterator<Item = Result<S>> + Send,
    S: Send,
{
    stream
        .enumerate()
        .map(move |(i, s)| (first + i, s))
        .skip(rank)
        .step_by(world.max(1))
}
