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
