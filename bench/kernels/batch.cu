// Kernels the benches launch on batches that reached the GPU. Compiled to PTX on the GPU
// machine by the bundle's run.sh (`nvcc -ptx`); loaded by `pinnable_harness::kernels`.

// Reads every element of `x` once and adds them all into `*out`: the consumer of a batch.
extern "C" __global__ void read_sum(const float* __restrict__ x, unsigned long long n, float* out) {
    float acc = 0.0f;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        acc += x[i];
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        acc += __shfl_down_sync(0xffffffffu, acc, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(out, acc);
    }
}

// Keeps one thread busy for `ns` nanoseconds of the GPU's global timer: a stand-in for a
// training step's compute, of a length the bench chooses.
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

// Keeps the SMs busy with arithmetic, `iters` rounds of four dependent chains a thread: a
// stand-in for a training step's compute-bound kernel (launched with a few blocks per SM, it
// leaves room on each SM as real kernels do; see `Kernels::busy`).
extern "C" __global__ void busy(unsigned long long iters, float* out) {
    float a = threadIdx.x * 1e-3f, b = blockIdx.x * 1e-3f, c = 0.5f, d = 0.25f;
    for (unsigned long long i = 0; i < iters; ++i) {
        a = fmaf(a, 0.9999f, 1e-4f);
        b = fmaf(b, 0.9998f, 2e-4f);
        c = fmaf(c, 0.9997f, 3e-4f);
        d = fmaf(d, 0.9996f, 4e-4f);
    }
    if (a + b + c + d == -1.0f) {
        *out = a;
    }
}
