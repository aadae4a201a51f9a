// The packing kernel: a packed batch of documents (`formats::tokens::PackedBatcher::on_device`)
// laid out on the device from its compact tokens and `cu_seqlens`, as the host path writes it.
//
// One thread per output token `t` (a grid-stride loop). A real token (`t < real`) finds its
// document `d` by binary search in `cu_seqlens` (the last `d` with `cu[d] <= t`) and writes
//   input_ids[t] = tokens[t], labels[t] = -100 at its document's first token else tokens[t],
//   position_ids[t] = t - cu[d], seq_idx[t] = d, padding_mask[t] = 1;
// a padding token writes the pad id, -100, 0, -1 and 0. `seq_idx` and `padding_mask` are
// skipped when their pointer is 0. Four entry points: u16 or u32 tokens, i32 or i64 output.
//
// Regenerate `pack.ptx` with `scripts/ptx.sh` after any change here (CI checks that the two
// match). No header is included.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;

template <typename S, typename T>
__device__ __forceinline__ void pack(T* ids, T* labels, T* pos, int* seq, u8* mask,
                                     const S* tokens, const int* cu, u32 docs, u32 real,
                                     u32 total, u32 pad_id) {
    for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        if (t < real) {
            u32 lo = 0, hi = docs;  // cu[lo] <= t < cu[hi]
            while (hi - lo > 1) {
                const u32 mid = (lo + hi) / 2;
                if ((u32)cu[mid] <= t) lo = mid; else hi = mid;
            }
            const u32 start = (u32)cu[lo];
            const T tok = (T)tokens[t];
            ids[t] = tok;
            labels[t] = t == start ? (T)-100 : tok;
            pos[t] = (T)(t - start);
            if (seq) seq[t] = (int)lo;
            if (mask) mask[t] = 1;
        } else {
            ids[t] = (T)pad_id;
            labels[t] = (T)-100;
            pos[t] = 0;
            if (seq) seq[t] = -1;
            if (mask) mask[t] = 0;
        }
    }
}

#define PACK(NAME, S, T)                                                                    \
    extern "C" __global__ void NAME(T* ids, T* labels, T* pos, int* seq, u8* mask,          \
                                    const S* tokens, const int* cu, u32 docs, u32 real,     \
                                    u32 total, u32 pad_id) {                                \
        pack<S, T>(ids, labels, pos, seq, mask, tokens, cu, docs, real, total, pad_id);     \
    }

PACK(pack_u16_i32, u16, int)
PACK(pack_u16_i64, u16, i64)
PACK(pack_u32_i32, u32, int)
PACK(pack_u32_i64, u32, i64)
