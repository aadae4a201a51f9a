// The gather kernels: pieces of memory the device can address (pinned host memory read through
// its device mapping, or device memory) written into a batch's device allocation, with the
// elements converted on the way where asked.
//
// One launch moves either a table of tasks (`Task`, laid out as `transfer::engine::sm::Task`),
// or pieces of one size at the offsets a table of starts gives (`Indexed`: the rows or windows
// of a gather, 4 or 8 bytes of table a piece), each cut into `splits` tasks. Groups of
// `1 << lane_shift` threads (one to 32) take the tasks in turn. A group reads its task's
// source in 16-byte chunks aligned in memory, four in flight per thread, and writes every
// element that lies in the task to its place: small pieces get a few threads each, large ones a
// warp, so every thread keeps reads in flight whatever the piece size. A chunk reaches at most
// 15 bytes past either end of its task and never leaves the 16-byte-aligned span of a byte the
// task names, so it never touches a page the task does not.
//
// Regenerate `gather.ptx` with `scripts/ptx.sh` after any change here (CI checks that the two
// match). It is built by NVRTC 12.0 for `compute_50` (PTX ISA 8.0): every driver of CUDA 12.0 or
// later loads it, on every GPU those drivers support (Maxwell and newer). No header is included,
// so the output depends on this file alone.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// One piece of work. `src` is element-aligned; `count` counts elements of the source type (bytes
// for a plain copy); `first` is the index, in the gathered tensor, of the task's first element.
struct Task {
    u64 src;
    u64 dst;
    u64 count;
    u64 first;
};

// Pieces of `piece` elements each, piece `p` read from byte `src + starts[p] * stride` on and
// written as elements `p * piece ...` from `dst`; task `i` is part `i % splits` of piece
// `i / splits`. The starts are u64s when `wide`, else u32s.
struct Indexed {
    u64 src;
    u64 dst;
    const void* starts;
    u64 piece;
    u64 splits;
    u64 stride;
    u64 wide;
};

// Task `i` of a launch: from the table, or made from the indexed pieces.
__device__ __forceinline__ Task task(const Task* tasks, const Indexed& ix, u64 i, u32 in_size,
                                     u32 out_size) {
    if (tasks != 0) {
        return tasks[i];
    }
    const u64 p = i / ix.splits;
    const u64 k = i - p * ix.splits;
    const u64 per = (ix.piece + ix.splits - 1) / ix.splits;
    const u64 off = k * per;
    const u64 first = p * ix.piece + off;
    Task t;
    const u64 start = ix.wide ? reinterpret_cast<const u64*>(ix.starts)[p]
                              : reinterpret_cast<const u32*>(ix.starts)[p];
    t.src = ix.src + start * ix.stride + off * in_size;
    t.dst = ix.dst + first * out_size;
    t.count = off < ix.piece ? (ix.piece - off < per ? ix.piece - off : per) : 0;
    t.first = first;
    return t;
}

// Sixteen bytes, loaded whole.
struct Chunk {
    u32 w[4];
};

// Chunks each thread has in flight.
#define UNROLL 4

__device__ __forceinline__ Chunk load(u64 at) {
    Chunk c;
    asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(c.w[0]), "=r"(c.w[1]), "=r"(c.w[2]), "=r"(c.w[3])
        : "l"(at));
    return c;
}

__device__ __forceinline__ void store(u64 at, const Chunk& c) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(at), "r"(c.w[0]), "r"(c.w[1]), "r"(c.w[2]), "r"(c.w[3])
                 : "memory");
}

// Element `j` of a chunk read as `In`s (`j` is a constant once loops are unrolled, so the chunk
// stays in registers).
template <typename In>
__device__ __forceinline__ In element(const Chunk& c, int j) {
    const int byte = j * (int)sizeof(In);
    return (In)(c.w[byte / 4] >> (8 * (byte % 4)));
}

// Runs `emit(chunk, chunk_address, begin, end)` for every 16-byte-aligned chunk of `t`'s source
// bytes [begin, end), the group's `lanes` threads taking chunks in turn.
template <typename Emit>
__device__ __forceinline__ void for_chunks(const Task& t, u32 in_size, u32 lane, u32 lanes,
                                           const Emit& emit) {
    if (t.count == 0) {
        return;
    }
    const u64 begin = t.src;
    const u64 end = t.src + t.count * in_size;
    const u64 a0 = begin & ~15ull;
    const u64 chunks = (end - a0 + 15) >> 4;
    for (u64 k0 = lane; k0 < chunks; k0 += (u64)lanes * UNROLL) {
        Chunk v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const u64 k = k0 + (u64)u * lanes;
            if (k < chunks) {
                v[u] = load(a0 + (k << 4));
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const u64 k = k0 + (u64)u * lanes;
            if (k < chunks) {
                emit(v[u], a0 + (k << 4), begin, end);
            }
        }
    }
}

// Bytes as they are. Where source and destination share their alignment, whole chunks are
// written as one 16-byte store; elsewhere byte by byte.
struct CopyBytes {
    u64 dst;
    bool aligned;
    __device__ __forceinline__ void operator()(const Chunk& v, u64 a, u64 begin, u64 end) const {
        if (aligned && a >= begin && a + 16 <= end) {
            store(dst + (a - begin), v);
            return;
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const u64 p = a + j;
            if (p >= begin && p < end) {
                *reinterpret_cast<u8*>(dst + (p - begin)) = element<u8>(v, j);
            }
        }
    }
};

// Integers widened (or narrowed) as a C cast does: `(Out)x`.
template <typename In, typename Out>
struct Cast {
    u64 dst;
    __device__ __forceinline__ void operator()(const Chunk& v, u64 a, u64 begin, u64 end) const {
#pragma unroll
        for (int j = 0; j < (int)(16 / sizeof(In)); ++j) {
            const u64 p = a + j * sizeof(In);
            if (p >= begin && p < end) {
                *reinterpret_cast<Out*>(dst + (p - begin) / sizeof(In) * sizeof(Out)) =
                    (Out)element<In>(v, j);
            }
        }
    }
};

// f32 to f16, rounded to nearest even.
__device__ __forceinline__ u16 to_f16(float y) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(y));
    return h;
}

// f32 to bf16, rounded to nearest even; a NaN stays a (quiet) NaN.
__device__ __forceinline__ u16 to_bf16(float y) {
    const u32 b = __float_as_uint(y);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((b >> 16) | 0x40u);
    }
    return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

struct StoreF32 {
    __device__ __forceinline__ void operator()(u64 at, float y) const {
        *reinterpret_cast<float*>(at) = y;
    }
    enum { size = 4 };
};
struct StoreF16 {
    __device__ __forceinline__ void operator()(u64 at, float y) const {
        *reinterpret_cast<u16*>(at) = to_f16(y);
    }
    enum { size = 2 };
};
struct StoreBF16 {
    __device__ __forceinline__ void operator()(u64 at, float y) const {
        *reinterpret_cast<u16*>(at) = to_bf16(y);
    }
    enum { size = 2 };
};

// u8 mapped per channel: `fmaf((float)x, scale[c], offset[c])`, stored as `Store` does. The
// channel of the element at index `i` of the gathered tensor is `(i / inner) % channels`.
template <typename Store>
struct Affine {
    u64 dst;
    u64 first;
    const float* scale;
    const float* offset;
    u32 channels;
    u64 inner;
    __device__ __forceinline__ void operator()(const Chunk& v, u64 a, u64 begin, u64 end) const {
        const u64 lo = a < begin ? begin : a;
        if (lo >= end) {
            return;
        }
        const u64 i = first + (lo - begin);
        const u64 plane = i / inner;
        u64 r = i - plane * inner;
        u32 c = (u32)(plane % channels);
        float s = scale[c];
        float o = offset[c];
        const Store put;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const u64 p = a + j;
            if (p >= begin && p < end) {
                put(dst + (p - begin) * Store::size, fmaf((float)element<u8>(v, j), s, o));
                if (++r == inner) {
                    r = 0;
                    c = c + 1 == channels ? 0 : c + 1;
                    s = scale[c];
                    o = offset[c];
                }
            }
        }
    }
};

// Every task of this thread's group, each handed to the emitter `make(task)` builds.
template <typename Make>
__device__ __forceinline__ void run_tasks(const Task* tasks, const Indexed& ix, u64 n_tasks,
                                          u32 lane_shift, u32 in_size, u32 out_size,
                                          const Make& make) {
    const u32 lanes = 1u << lane_shift;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 lane = (u32)tid & (lanes - 1);
    const u64 groups = ((u64)gridDim.x * blockDim.x) >> lane_shift;
    for (u64 i = tid >> lane_shift; i < n_tasks; i += groups) {
        const Task t = task(tasks, ix, i, in_size, out_size);
        for_chunks(t, in_size, lane, lanes, make(t));
    }
}

struct MakeCopy {
    __device__ __forceinline__ CopyBytes operator()(const Task& t) const {
        CopyBytes e;
        e.dst = t.dst;
        e.aligned = ((t.src ^ t.dst) & 15) == 0;
        return e;
    }
};

template <typename In, typename Out>
struct MakeCast {
    __device__ __forceinline__ Cast<In, Out> operator()(const Task& t) const {
        Cast<In, Out> e;
        e.dst = t.dst;
        return e;
    }
};

template <typename Store>
struct MakeAffine {
    const float* scale;
    const float* offset;
    u32 channels;
    u64 inner;
    __device__ __forceinline__ Affine<Store> operator()(const Task& t) const {
        Affine<Store> e;
        e.dst = t.dst;
        e.first = t.first;
        e.scale = scale;
        e.offset = offset;
        e.channels = channels;
        e.inner = inner;
        return e;
    }
};

// Every kernel takes the tasks (or null), the indexed pieces (used when the tasks are null),
// the number of tasks and the group size as a shift.
extern "C" __global__ void gather_copy(const Task* tasks, Indexed ix, u64 n_tasks,
                                       u32 lane_shift) {
    run_tasks(tasks, ix, n_tasks, lane_shift, 1, 1, MakeCopy());
}

#define CAST_KERNEL(name, In, Out)                                                          \
    extern "C" __global__ void name(const Task* tasks, Indexed ix, u64 n_tasks,           \
                                    u32 lane_shift) {                                       \
        run_tasks(tasks, ix, n_tasks, lane_shift, sizeof(In), sizeof(Out),                  \
                  MakeCast<In, Out>());                                                     \
    }

CAST_KERNEL(gather_cast_u8_i32, u8, int)
CAST_KERNEL(gather_cast_u8_i64, u8, long long)
CAST_KERNEL(gather_cast_u16_i32, u16, int)
CAST_KERNEL(gather_cast_u16_i64, u16, long long)
CAST_KERNEL(gather_cast_u32_i32, u32, int)
CAST_KERNEL(gather_cast_u32_i64, u32, long long)

// `scale` and `offset` hold `channels` floats each, in device memory.
#define AFFINE_KERNEL(name, Store)                                                          \
    extern "C" __global__ void name(const Task* tasks, Indexed ix, u64 n_tasks,           \
                                    u32 lane_shift, const float* scale,                     \
                                    const float* offset, u32 channels, u64 inner) {         \
        MakeAffine<Store> make;                                                             \
        make.scale = scale;                                                                 \
        make.offset = offset;                                                               \
        make.channels = channels;                                                           \
        make.inner = inner;                                                                 \
        run_tasks(tasks, ix, n_tasks, lane_shift, 1, Store::size, make);                    \
    }

AFFINE_KERNEL(gather_affine_u8_f32, StoreF32)
AFFINE_KERNEL(gather_affine_u8_f16, StoreF16)
AFFINE_KERNEL(gather_affine_u8_bf16, StoreBF16)

// ---------------------------------------------------------------------------------------------
// Resampling: decoded RGB images of any sizes, lying one after another in a pinned block read
// through its device mapping, each cropped, resized, maybe flipped into `[3, size, size]` of a
// `[count, 3, size, size]` batch, `u8` or normalised floats.
//
// The filter is PIL's antialiased bilinear (`transform`'s CPU resampler, `image/resample.rs`): a
// triangle widened by the downscale factor, its taps' bounds as PIL computes them. Here in f32,
// in one pass (no rounding between the horizontal and the vertical pass), rounded half up to
// u8 at the end: each value within 1 of the CPU's (whose only other difference is the 8-bit
// rounding of its first pass, at most half a unit, with weights that are never negative).
// Normalised outputs are `fmaf(u8, scale[c], offset[c])` of that rounded value, as the CPU's.
//
// A block makes one tile of `TILE_W × TILE_H` output pixels of one image at a time. It reads the
// source rows the tile needs `TILE_ROWS` at a time into shared memory, with 16-byte loads
// aligned in memory that never leave the 16-byte-aligned span of a byte of the row segment
// (images start at any byte), sums each row across for its 32 columns, then down into each
// thread's two output rows. A tile whose rows are too wide for shared memory (a downscale of
// more than ~40×) reads its taps straight from the mapping instead.

// One image of a launch, as `transfer::engine::sm::resample::Entry` writes it: 64 bytes.
struct ResampleImage {
    u64 offset;  // bytes from the launch's `src` to the image's first pixel
    u32 width;
    u32 height;
    u32 crop_x;  // the crop, in source pixels
    u32 crop_y;
    u32 crop_w;
    u32 crop_h;
    u32 resized_w;  // the size the crop is resized to
    u32 resized_h;
    int at_x;  // the output's top-left corner in resized coordinates (negative: padding)
    int at_y;
    u32 flip;
    u32 unused[3];
};

// A launch, by value (`transfer::engine::sm::resample::Params`).
struct Resample {
    u64 src;     // device address the images' offsets count from
    u64 images;  // device address of `count` `ResampleImage`s
    u64 dst;     // device address of the `[count, 3, size, size]` output
    u32 count;
    u32 size;
    u32 tiles_x;
    u32 tiles_y;
    float scale[3];  // per channel: the output is `fmaf(u8, scale, offset)` (floats only)
    float offset[3];
};

#define TILE_W 32
#define TILE_H 16
#define TILE_ROWS 8
#define ROW_BYTES 4096

// The taps of resized index `r` of an axis of `len` crop pixels resized to `out`, as PIL's
// `precompute_coeffs`: the first crop index `lo`, the count `n`, and what weighs tap `t`:
// `tri((t + lo - center + 0.5) * ss) * inv`.
struct Taps {
    int lo;
    int n;
    float center;
    float ss;
    float inv;
};

__device__ __forceinline__ float tri(float x) {
    const float a = 1.0f - fabsf(x);
    return a > 0.0f ? a : 0.0f;
}

__device__ __forceinline__ Taps taps_of(long long r, u32 len, u32 out) {
    Taps k;
    const float scale = (float)len / (float)out;
    const float support = scale > 1.0f ? scale : 1.0f;
    k.ss = 1.0f / support;
    k.center = ((float)r + 0.5f) * scale;
    // As C's `(int)` casts: truncation toward zero, then clamping to the axis.
    int lo = (int)(k.center - support + 0.5f);
    int hi = (int)(k.center + support + 0.5f);
    lo = lo < 0 ? 0 : lo;
    hi = hi > (int)len ? (int)len : hi;
    const int most = (int)ceilf(support) * 2 + 1;
    int n = hi - lo;
    n = n < 0 ? 0 : (n > most ? most : n);
    k.lo = lo;
    k.n = n;
    float total = 0.0f;
    for (int t = 0; t < n; ++t) {
        total += tri(((float)(t + lo) - k.center + 0.5f) * k.ss);
    }
    k.inv = total > 0.0f ? 1.0f / total : 0.0f;
    return k;
}

__device__ __forceinline__ float weight(const Taps& k, int t) {
    return tri(((float)(t + k.lo) - k.center + 0.5f) * k.ss) * k.inv;
}

// The resized indices `[lo, hi]` that output indices `[o0, o1)` of an axis land on, clipped to
// `[0, len)`; `lo > hi` when none does.
__device__ __forceinline__ void inside(long long at, u32 size, bool flip, long long o0,
                                       long long o1, u32 len, long long& lo, long long& hi) {
    lo = flip ? at + size - o1 : at + o0;
    hi = flip ? at + size - 1 - o0 : at + o1 - 1;
    lo = lo < 0 ? 0 : lo;
    hi = hi > (long long)len - 1 ? (long long)len - 1 : hi;
}

struct PutU8 {
    enum { size = 1 };
    __device__ __forceinline__ void operator()(u64 at, u32 v, float, float) const {
        *reinterpret_cast<u8*>(at) = (u8)v;
    }
};
template <typename Store>
struct PutNormalised {
    enum { size = Store::size };
    __device__ __forceinline__ void operator()(u64 at, u32 v, float scale, float offset) const {
        Store()(at, fmaf((float)v, scale, offset));
    }
};

template <typename Put>
__device__ __forceinline__ void resample(const Resample& p) {
    __shared__ u8 rows[TILE_ROWS][ROW_BYTES];
    __shared__ float across[TILE_ROWS][TILE_W][3];
    const u32 tx = threadIdx.x % TILE_W;
    const u32 ty = threadIdx.x / TILE_W;  // 0 .. TILE_ROWS - 1; rows ty and ty + 8 are its own
    const u64 per_image = (u64)p.tiles_x * p.tiles_y;
    const u64 tiles = per_image * p.count;
    const ResampleImage* images = reinterpret_cast<const ResampleImage*>(p.images);
    for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const u64 b = tile / per_image;
        const u32 in_image = (u32)(tile - b * per_image);
        const u32 x0 = (in_image % p.tiles_x) * TILE_W;
        const u32 y0 = (in_image / p.tiles_x) * TILE_H;
        const ResampleImage im = images[b];
        const u64 base = p.src + im.offset;
        const bool flip = im.flip != 0;
        const u32 x1 = x0 + TILE_W < p.size ? x0 + TILE_W : p.size;
        const u32 y1 = y0 + TILE_H < p.size ? y0 + TILE_H : p.size;

        // The tile's source span: from the taps of its first and last resized column (row).
        long long cx0, cx1, cy0, cy1;
        inside(im.at_x, p.size, flip, x0, x1, im.resized_w, cx0, cx1);
        inside(im.at_y, p.size, false, y0, y1, im.resized_h, cy0, cy1);
        const bool any = cx0 <= cx1 && cy0 <= cy1;
        long long sx0 = 0, sx1 = 0, sy0 = 0, sy1 = 0;
        if (any) {
            const Taps a = taps_of(cx0, im.crop_w, im.resized_w);
            const Taps z = taps_of(cx1, im.crop_w, im.resized_w);
            sx0 = (long long)im.crop_x + a.lo;
            sx1 = (long long)im.crop_x + z.lo + z.n;
            const Taps c = taps_of(cy0, im.crop_h, im.resized_h);
            const Taps d = taps_of(cy1, im.crop_h, im.resized_h);
            sy0 = (long long)im.crop_y + c.lo;
            sy1 = (long long)im.crop_y + d.lo + d.n;
        }
        const u64 row_bytes = sx1 > sx0 ? (u64)(sx1 - sx0) * 3 : 0;
        const bool staged = row_bytes <= ROW_BYTES;

        // This thread's column and rows.
        const u32 ox = x0 + tx;
        const long long rx = flip ? (long long)im.at_x + p.size - 1 - ox : (long long)im.at_x + ox;
        const bool col_in = ox < x1 && rx >= 0 && rx < (long long)im.resized_w;
        Taps kx;
        kx.lo = 0;
        kx.n = 0;
        if (col_in) {
            kx = taps_of(rx, im.crop_w, im.resized_w);
        }
        Taps ky[2];
        bool row_in[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const u32 oy = y0 + ty + k * TILE_ROWS;
            const long long ry = (long long)im.at_y + oy;
            row_in[k] = oy < y1 && ry >= 0 && ry < (long long)im.resized_h;
            ky[k].lo = 0;
            ky[k].n = 0;
            if (row_in[k]) {
                ky[k] = taps_of(ry, im.crop_h, im.resized_h);
            }
        }
        float acc[2][3] = {{0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f}};

        // `any`, `staged` and the spans are the same for every thread of the block, so every
        // thread meets every barrier.
        for (long long r0 = any ? sy0 : 0; r0 < (any ? sy1 : 0); r0 += TILE_ROWS) {
            const u32 nrows = sy1 - r0 < TILE_ROWS ? (u32)(sy1 - r0) : TILE_ROWS;
            if (staged) {
                const u64 per_row = (row_bytes + 15) / 16 + 1;
                for (u64 i = threadIdx.x; i < per_row * nrows; i += blockDim.x) {
                    const u32 r = (u32)(i / per_row);
                    const u64 a = base + ((u64)(r0 + r) * im.width + (u64)sx0) * 3;
                    const u64 at = (a & ~15ull) + ((i - (u64)r * per_row) << 4);
                    if (at < a + row_bytes) {
                        const Chunk v = load(at);
#pragma unroll
                        for (int j = 0; j < 16; ++j) {
                            const u64 q = at + j;
                            if (q >= a && q < a + row_bytes) {
                                rows[r][q - a] = element<u8>(v, j);
                            }
                        }
                    }
                }
                __syncthreads();
            }
            // Across: source row r0 + ty, this thread's column.
            if (ty < nrows && col_in) {
                float h[3] = {0.0f, 0.0f, 0.0f};
                const u64 line = base + (u64)(r0 + ty) * im.width * 3;
                for (int t = 0; t < kx.n; ++t) {
                    const float w = weight(kx, t);
                    const long long x = (long long)im.crop_x + kx.lo + t;
                    const bool here = staged && x >= sx0 && x < sx1;
#pragma unroll
                    for (int c = 0; c < 3; ++c) {
                        const u8 v = here ? rows[ty][(x - sx0) * 3 + c]
                                          : *reinterpret_cast<const u8*>(line + x * 3 + c);
                        h[c] = fmaf(w, (float)v, h[c]);
                    }
                }
#pragma unroll
                for (int c = 0; c < 3; ++c) {
                    across[ty][tx][c] = h[c];
                }
            }
            __syncthreads();
            // Down: into this thread's rows.
            if (col_in) {
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    if (!row_in[k]) {
                        continue;
                    }
                    const long long first = (long long)im.crop_y + ky[k].lo;
                    for (u32 r = 0; r < nrows; ++r) {
                        const long long t = r0 + r - first;
                        if (t >= 0 && t < ky[k].n) {
                            const float w = weight(ky[k], (int)t);
#pragma unroll
                            for (int c = 0; c < 3; ++c) {
                                acc[k][c] = fmaf(w, across[r][tx][c], acc[k][c]);
                            }
                        }
                    }
                }
            }
            __syncthreads();
        }

        const Put put;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const u32 oy = y0 + ty + k * TILE_ROWS;
            if (ox >= x1 || oy >= y1) {
                continue;
            }
            const bool pixel = col_in && row_in[k];
#pragma unroll
            for (int c = 0; c < 3; ++c) {
                u32 v = 0;
                if (pixel) {
                    const float y = acc[k][c] + 0.5f;
                    v = y <= 0.0f ? 0u : (y >= 255.0f ? 255u : (u32)y);
                }
                const u64 i = (((u64)b * 3 + c) * p.size + oy) * p.size + ox;
                put(p.dst + i * Put::size, v, p.scale[c], p.offset[c]);
            }
        }
    }
}

// Every resample kernel takes the launch by value; blocks of `TILE_W * TILE_ROWS` threads take
// tiles in turn.
extern "C" __global__ void resample_u8(Resample p) { resample<PutU8>(p); }
extern "C" __global__ void resample_f32(Resample p) { resample<PutNormalised<StoreF32> >(p); }
extern "C" __global__ void resample_f16(Resample p) { resample<PutNormalised<StoreF16> >(p); }
extern "C" __global__ void resample_bf16(Resample p) { resample<PutNormalised<StoreBF16> >(p); }
