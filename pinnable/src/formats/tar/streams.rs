//! How a source that streams its epochs (remote shards) hears of each epoch's run and hands
//! each sample's bytes over as a worker takes it.

use std::sync::Arc;

use super::{Entry, Group, TarSample, TarShards};
use crate::error::{Error, Result};
use crate::storage::remote::{Planned, Streams};

impl TarShards {
    /// These shards, their epochs streamed by `streams` (just built: the index is not shared
    /// yet; were it, samples would be read one by one, as outside an epoch).
    pub(crate) fn with_streams(mut self, streams: Arc<dyn Streams>) -> TarShards {
        if let Some(index) = Arc::get_mut(&mut self.index) {
            index.streams = Some(streams);
        }
        self
    }

    /// Tells a streaming source rank `shard.0` of `shard.1`'s run for the epoch (`run`, in
    /// stream order; `out`, the output as positions in it): each sample, where its bytes lie,
    /// where the output has it. Each rank's stream runs beside the others'.
    pub(super) fn stream(&self, shard: (usize, usize), run: &[usize], out: &[usize]) {
        let index = &self.index;
        let Some(streams) = &index.streams else {
            return;
        };
        let mut place = vec![0; run.len()];
        for (o, &p) in out.iter().enumerate() {
            place[p] = o;
        }
        let compressed = |s: usize| index.gzip.as_ref().is_some_and(|z| z.has(s));
        let planned = run
            .iter()
            .zip(place)
            .filter_map(|(&i, out)| match &index.entries[i] {
                // Compressed shards stream through their decoders.
                Entry::Sample(g) if !compressed(index.shard_of[i] as usize) => Some(Planned {
                    index: i,
                    shard: index.shard_of[i] as usize,
                    span: g.span(),
                    out,
                }),
                _ => None,
            })
            .collect();
        streams.plan(shard, planned, index.entries.len());
    }

    /// Sample `index` (grouped as `g`), holding its bytes when a source streams them.
    pub(super) fn streamed(&self, index: usize, g: &Group) -> Result<TarSample> {
        let sample = TarSample::new(self.index.clone(), index);
        let Some(streams) = &self.index.streams else {
            return Ok(sample);
        };
        let shard = self.index.shard_of[index] as usize;
        let bytes = streams
            .take(index, shard, g.span())
            .map_err(|e| Error::Tar {
                shard: self.index.shards[shard].name.clone(),
                offset: g.offset,
                problem: format!("reading sample `{}`: {e}", super::group::show_key(&g.key)),
            })?;
        Ok(sample.holding(bytes, g.offset))
    }
}
