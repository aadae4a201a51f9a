// The image kernels: decoded pictures (interleaved RGB in device memory, as stored in the file)
// turned into a batch's pixels, as the host's `Transform` makes them: the crop's rows and
// columns resized by antialiased bilinear filtering in PIL's 22-bit fixed point, mirrored when
// the sample is flipped, written as `[N, 3, S, S]` through a 256-entry table per channel (the
// identity for u8, the normalisation for floats).
//
// Two launches a batch. `image_rows` filters each picture across: for every row of the crop
// that an output row reads and every output column, it sums the taps of that column (host-made
// weights, the same code as the host's resampler) over the upright picture's pixels, read
// through its EXIF orientation, and stores the rounded byte. `image_out_b{1,2,4}` filters those
// rows down and writes every output element (padding included) through the table, of 1, 2 or 4
// bytes. Each launch has one row of blocks per picture (`blockIdx.y`).
//
// Regenerate `image.ptx` with `scripts/ptx.sh` after any change here (CI checks that the two
// match). No header is included.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// One picture of the batch, laid out as `formats::image::gpu::plan::Job`.
struct Job {
    u64 src;      // the decoded picture, stored orientation
    u64 mid;      // `span_rows × ncols × 3` bytes: the rows filtered across
    u32 src_w;    // stored width, height and bytes a row (of a plane, when planar)
    u32 src_h;
    u32 pitch;
    u32 orient;   // EXIF orientation, 1 to 8
    u32 crop_x;   // the crop's corner in upright coordinates
    u32 crop_y;
    u32 ncols;    // the output window's size and corner in the output
    u32 nrows;
    u32 x0;
    u32 y0;
    u32 flip;
    u32 span0;    // first crop row any output row reads, and how many
    u32 span_rows;
    u32 ntap_c;   // taps an output column / row
    u32 ntap_r;
    u32 taps_c;   // where the column taps start in `taps`: ncols firsts, then the weights
    u32 taps_r;   // the same for the rows
    u32 plane;    // 0: interleaved RGB; else planar, each channel's plane this many bytes on
};

#define PRECISION 22
#define HALF (1 << (PRECISION - 1))

__device__ __forceinline__ u32 clip8(int v) {
    v >>= PRECISION;
    return v < 0 ? 0u : (v > 255 ? 255u : (u32)v);
}

// The byte offset, in the stored picture, of upright pixel (x, y).
__device__ __forceinline__ u64 stored(const Job& j, u32 x, u32 y) {
    const u32 w = j.src_w, h = j.src_h;
    u32 sx, sy;
    switch (j.orient) {
        case 2: sx = w - 1 - x; sy = y; break;
        case 3: sx = w - 1 - x; sy = h - 1 - y; break;
        case 4: sx = x; sy = h - 1 - y; break;
        case 5: sx = y; sy = x; break;
        case 6: sx = y; sy = h - 1 - x; break;
        case 7: sx = w - 1 - y; sy = h - 1 - x; break;
        case 8: sx = w - 1 - y; sy = x; break;
        default: sx = x; sy = y; break;
    }
    return (u64)sy * j.pitch + (u64)sx * (j.plane ? 1 : 3);
}

extern "C" __global__ void image_rows(const Job* jobs, const int* taps) {
    const Job j = jobs[blockIdx.y];
    const u32 total = j.span_rows * j.ncols;
    const u8* src = reinterpret_cast<const u8*>(j.src);
    u8* mid = reinterpret_cast<u8*>(j.mid);
    const int* firsts = taps + j.taps_c;
    const int* weights = firsts + j.ncols;
    for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        const u32 m = t / j.ncols;
        const u32 o = t - m * j.ncols;
        const u32 y = j.crop_y + j.span0 + m;
        const u32 x = j.crop_x + (u32)firsts[o];
        const int* k = weights + (u64)o * j.ntap_c;
        const u64 step = j.plane ? (u64)j.plane : 1;
        int r = HALF, g = HALF, b = HALF;
        for (u32 i = 0; i < j.ntap_c; ++i) {
            const u8* p = src + stored(j, x + i, y);
            const int w = k[i];
            r += (int)p[0] * w;
            g += (int)p[step] * w;
            b += (int)p[2 * step] * w;
        }
        u8* d = mid + (u64)t * 3;
        d[0] = (u8)clip8(r);
        d[1] = (u8)clip8(g);
        d[2] = (u8)clip8(b);
    }
}

// Output element type of `B` bytes, copied from the table as raw bits.
template <int B> struct Bits;
template <> struct Bits<1> { typedef u8 T; };
template <> struct Bits<2> { typedef u16 T; };
template <> struct Bits<4> { typedef u32 T; };

template <int B>
__device__ __forceinline__ void out_pixels(const Job* jobs, const int* taps, const void* table,
                                           void* out, u32 size) {
    typedef typename Bits<B>::T T;
    const Job j = jobs[blockIdx.y];
    const T* tab = reinterpret_cast<const T*>(table);
    const u64 plane = (u64)size * size;
    T* dst = reinterpret_cast<T*>(out) + (u64)blockIdx.y * 3 * plane;
    const u8* mid = reinterpret_cast<const u8*>(j.mid);
    const int* firsts = taps + j.taps_r;
    const int* weights = firsts + j.nrows;
    for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < plane; t += gridDim.x * blockDim.x) {
        const u32 oy = t / size;
        const u32 ox = t - oy * size;
        u32 v0 = 0, v1 = 0, v2 = 0;
        if (oy >= j.y0 && oy < j.y0 + j.nrows && ox >= j.x0 && ox < j.x0 + j.ncols) {
            const u32 r = oy - j.y0;
            const u32 c = j.flip ? j.x0 + j.ncols - 1 - ox : ox - j.x0;
            const int* k = weights + (u64)r * j.ntap_r;
            const u32 first = (u32)firsts[r] - j.span0;
            int a = HALF, b = HALF, e = HALF;
            for (u32 i = 0; i < j.ntap_r; ++i) {
                const u8* p = mid + ((u64)(first + i) * j.ncols + c) * 3;
                const int w = k[i];
                a += (int)p[0] * w;
                b += (int)p[1] * w;
                e += (int)p[2] * w;
            }
            v0 = clip8(a);
            v1 = clip8(b);
            v2 = clip8(e);
        }
        dst[t] = tab[v0];
        dst[plane + t] = tab[256 + v1];
        dst[2 * plane + t] = tab[512 + v2];
    }
}

extern "C" __global__ void image_out_b1(const Job* jobs, const int* taps, const void* table,
                                        void* out, u32 size) {
    out_pixels<1>(jobs, taps, table, out, size);
}

extern "C" __global__ void image_out_b2(const Job* jobs, const int* taps, const void* table,
                                        void* out, u32 size) {
    out_pixels<2>(jobs, taps, table, out, size);
}

extern "C" __global__ void image_out_b4(const Job* jobs, const int* taps, const void* table,
                                        void* out, u32 size) {
    out_pixels<4>(jobs, taps, table, out, size);
}
