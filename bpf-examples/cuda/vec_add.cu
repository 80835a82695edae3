// vectorAdd: c = a + b over N floats, launched ITERS times; the result is checked and
// each launch is timed with CUDA events. The target of the GPU examples.
//
//   vec_add [N] [ITERS] [BLOCK]     defaults: 1<<20 elements, 10 launches, 256 threads
//
// Prints one line per run: `vec_add n=N iters=I block=B grid=G threads=T ms_per_launch=X
// ms_max=Y ms_min=Z check=ok` (the median, the longest and the shortest launch), and
// exits 1 if any element is
// wrong or a CUDA call fails.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "check.h"

#ifdef ASYNC_COPY
// Built with -DASYNC_COPY for sm_80 or newer (vec_add_async): a and b reach shared memory
// through asynchronous copies (`cp.async`, as `__pipeline_memcpy_async` and CUTLASS's
// pipelines issue them), one 4-byte copy of each per thread, then c is stored.
__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    __shared__ float sa[1024], sb[1024];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned to_a = (unsigned)__cvta_generic_to_shared(&sa[threadIdx.x]);
        unsigned to_b = (unsigned)__cvta_generic_to_shared(&sb[threadIdx.x]);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(to_a), "l"(a + i));
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(to_b), "l"(b + i));
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        c[i] = sa[threadIdx.x] + sb[threadIdx.x];
    }
}
#elif defined(BULK_COPY)
// Built with -DBULK_COPY for sm_90 or newer (vec_add_bulk): each block's tiles of a and b
// reach shared memory through the tensor memory accelerator's one-dimensional bulk copies
// (`cp.async.bulk`, as `cuda::memcpy_async` issues them on Hopper), completing on an
// mbarrier, and its tile of c goes back the same way from shared memory: a bulk store in
// even blocks, a bulk reduction (`cp.reduce.async.bulk ... .and.b32`) in odd ones, which
// leaves a + b in a c that holds all ones bits (as main sets it) or a + b already. One
// thread issues each copy. A whole block's tile is sized by a number in the statement, a
// short last one by a register. Blocks of at most 1024 threads, a multiple of 4.
__device__ __forceinline__ void bulk_to_global(bool reduce, float *to, unsigned from, unsigned bytes,
                                               bool whole) {
    if (whole && !reduce)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 1024;"
                     ::"l"(to), "r"(from) : "memory");
    else if (whole)
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.and.b32 [%0], [%1], 1024;"
                     ::"l"(to), "r"(from) : "memory");
    else if (!reduce)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     ::"l"(to), "r"(from), "r"(bytes) : "memory");
    else
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.and.b32 [%0], [%1], %2;"
                     ::"l"(to), "r"(from), "r"(bytes) : "memory");
}

__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    __shared__ alignas(128) float sa[1024], sb[1024];
    __shared__ alignas(8) unsigned long long bar;
    int first = blockIdx.x * blockDim.x;
    int count = min((int)blockDim.x, n - first);
    // A copy's size is a multiple of 16 bytes: the last block's odd elements are added
    // by their threads directly.
    int bulk = count & ~3;
    unsigned bytes = bulk * 4;
    unsigned at_bar = (unsigned)__cvta_generic_to_shared(&bar);
    unsigned at_a = (unsigned)__cvta_generic_to_shared(sa);
    unsigned at_b = (unsigned)__cvta_generic_to_shared(sb);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(at_bar) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0 && bytes > 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     ::"r"(at_bar), "r"(2 * bytes) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(at_a), "l"(a + first), "r"(bytes), "r"(at_bar) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(at_b), "l"(b + first), "r"(bytes), "r"(at_bar) : "memory");
    }
    if (bytes > 0) {
        unsigned done = 0;
        while (!done)
            asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
                         "selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(at_bar) : "memory");
    }
    int t = threadIdx.x;
    if (t < bulk)
        sa[t] += sb[t];
    else if (t < count)
        c[first + t] = a[first + t] + b[first + t];
    // The copies out read shared memory through the async proxy: the threads' writes are
    // made visible to it first.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0 && bytes > 0) {
        bulk_to_global(blockIdx.x % 2 == 1, c + first, at_a, bytes, count == 256 && bulk == 256);
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
}
#else
__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
#endif

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], 0, 0) : 1 << 20;
    int iters = argc > 2 ? atoi(argv[2]) : 10;
    int block = argc > 3 ? atoi(argv[3]) : 256;
    int grid = (int)((n + block - 1) / block);
    std::vector<float> a(n), b(n), c(n, -1.0f);
    srand(42);
    for (long i = 0; i < n; i++) {
        a[i] = (float)rand() / RAND_MAX;
        b[i] = (float)rand() / RAND_MAX;
    }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, n * sizeof(float)));
    CHECK(cudaMalloc(&db, n * sizeof(float)));
    CHECK(cudaMalloc(&dc, n * sizeof(float)));
    CHECK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dc, 0xff, n * sizeof(float)));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    std::vector<float> ms(iters);
    for (int it = 0; it < iters; it++) {
        CHECK(cudaEventRecord(start));
        vectorAdd<<<grid, block>>>(da, db, dc, (int)n);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaEventElapsedTime(&ms[it], start, stop));
    }
    CHECK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
    long wrong = 0;
    for (long i = 0; i < n; i++)
        if (c[i] != a[i] + b[i]) wrong++;
    std::sort(ms.begin(), ms.end());
    printf("vec_add n=%ld iters=%d block=%d grid=%d threads=%ld ms_per_launch=%.4f "
           "ms_max=%.4f ms_min=%.4f check=%s\n",
           n, iters, block, grid, (long)grid * block, iters ? ms[iters / 2] : 0.0f,
           iters ? ms[iters - 1] : 0.0f, iters ? ms[0] : 0.0f, wrong ? "FAIL" : "ok");
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    return wrong ? 1 : 0;
}
