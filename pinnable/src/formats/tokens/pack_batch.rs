//! [`PackedBatch`]: one packed batch of documents, its fields as varlen attention takes them,
//! pinned and moved field by field.

use std::sync::Arc;

use crate::error::Result;
use crate::gather::Gather;
use crate::loader::Piece;
use crate::path::Walk;
use crate::pin::{PinContext, Pinnable};
use crate::tensor::Tensor;
use crate::transfer::{MoveContext, ToDevice};

/// A packed batch: its documents (or pieces of them) one after another, as varlen attention
/// takes them — Hugging Face's `DataCollatorWithFlattening(return_flash_attn_kwargs=True,
/// return_seq_idx=True)`, value for value.
///
/// **Labels** follow Hugging Face's convention: `labels[t] == input_ids[t]`, except the first
/// token of every document (and padding), which is [`IGNORE_INDEX`](super::IGNORE_INDEX); the
/// model shifts them (its target at `t` is `labels[t + 1]`), so no target crosses a document
/// boundary.
///
/// **Fixed shape** ([`PackedBatcher::fixed_shape`](super::PackedBatcher::fixed_shape)): the
/// tokens are followed by padding up to the plan's most tokens
/// ([`BudgetPlan::max_tokens`](crate::loader::BudgetPlan::max_tokens)) — `input_ids` the pad
/// id, `labels` [`IGNORE_INDEX`](super::IGNORE_INDEX), `position_ids` 0, `seq_idx` -1,
/// `padding_mask` 0 — and `cu_seqlens` is padded to
/// [`BudgetPlan::max_pieces`](crate::loader::BudgetPlan::max_pieces)` + 1` entries by repeating
/// its last value (varlen kernels read no token past it), so every batch has the same shapes.
#[derive(Clone, Debug)]
pub struct PackedBatch {
    /// The tokens, `[1, total]`, i64 or i32 (widened on the GPU for a CUDA device).
    pub input_ids: Gather,
    /// The targets, `[1, total]`, of `input_ids`' dtype (see above).
    pub labels: Tensor,
    /// Each token's position in its document, from 0, `[1, total]`, of `input_ids`' dtype.
    pub position_ids: Tensor,
    /// Where each document starts, and the total: int32 `[n + 1]` (`[max_pieces + 1]` in
    /// fixed shape).
    pub cu_seqlens: Tensor,
    /// `cu_seqlens` on the host, so nobody reads it back from the device.
    pub cu_seqlens_host: Arc<[i32]>,
    /// The longest document's tokens: a host integer, as varlen kernels take it.
    pub max_seqlen: usize,
    /// Each token's document within the batch, int32 `[1, total]`, when asked.
    pub seq_idx: Option<Tensor>,
    /// 1 for a real token, 0 for padding, u8 `[1, total]`: fixed shape only.
    pub padding_mask: Option<Tensor>,
    /// The tokens that are not padding.
    pub real_tokens: usize,
    /// The documents (pieces of documents) the batch holds, in order.
    pub pieces: Arc<[Piece]>,
}

impl ToDevice for PackedBatch {
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        Ok(PackedBatch {
            input_ids: cx.field("input_ids", |cx| self.input_ids.to_device_with(cx))?,
            labels: cx.field("labels", |cx| self.labels.to_device_with(cx))?,
            position_ids: cx.field("position_ids", |cx| self.position_ids.to_device_with(cx))?,
            cu_seqlens: cx.field("cu_seqlens", |cx| self.cu_seqlens.to_device_with(cx))?,
            seq_idx: cx.field("seq_idx", |cx| self.seq_idx.to_device_with(cx))?,
            padding_mask: cx.field("padding_mask", |cx| self.padding_mask.to_device_with(cx))?,
            ..self.clone()
        })
    }
}

impl Pinnable for PackedBatch {
    fn pin_with(&self, cx: &mut PinContext<'_>) -> Result<Self> {
        Ok(PackedBatch {
            input_ids: cx.field("input_ids", |cx| self.input_ids.pin_with(cx))?,
            labels: cx.field("labels", |cx| self.labels.pin_with(cx))?,
            position_ids: cx.field("position_ids", |cx| self.position_ids.pin_with(cx))?,
            cu_seqlens: cx.field("cu_seqlens", |cx| self.cu_seqlens.pin_with(cx))?,
            seq_idx: cx.field("seq_idx", |cx| self.seq_idx.pin_with(cx))?,
            padding_mask: cx.field("padding_mask", |cx| self.padding_mask.pin_with(cx))?,
            ..self.clone()
        })
    }
}
