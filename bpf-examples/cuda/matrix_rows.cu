// Matrix loads and stores of 8 x 8 16-bit matrices in shared memory (ldmatrix, stmatrix:
// the tensor-core GEMMs' way of moving tiles), the target of the shared-memory access
// probes' check of them (scripts/gpu-ldst-shared.sh). Each warp fills 512 bytes of shared
// memory (its lanes a 16-byte row each, read from `in`), then REPS times loads one, two
// and four matrices (ldmatrix .x1, .x2, .x4: the first 8, 16 and 32 lanes each name a
// 16-byte row) and stores four (stmatrix .x4, sm_90), and each thread stores a sum of
// what it loaded. Per launch of BLOCKS blocks of 4 warps (W = 4 * BLOCKS):
//   global: 32 W loads of 16 bytes (in), 32 W stores of 4 bytes (out)
//   shared: 32 W stores of 16 bytes (the fill), 56 W REPS row loads, 32 W REPS row stores,
//           32 W loads of 2 bytes (each thread's first element of what stmatrix stored)
// Checked against the same sums made on the CPU.
//
//   matrix_rows [BLOCKS] [REPS] [ITERS]      defaults: 64, 5, 2
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "check.h"

#define WARPS 4

__global__ void matrix_rows(const uint4 *in, unsigned *out, int reps) {
    __shared__ __align__(16) unsigned short tile[WARPS][256], stored[WARPS][256];
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned gtid = blockIdx.x * blockDim.x + threadIdx.x;
    reinterpret_cast<uint4 *>(tile[warp])[lane] = in[gtid];
    __syncwarp();
    unsigned row = static_cast<unsigned>(__cvta_generic_to_shared(&tile[warp][lane * 8]));
    unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(&stored[warp][lane * 8]));
    unsigned sum = 0;
    for (int r = 0; r < reps; r++) {
        unsigned a, b0, b1, c0, c1, c2, c3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];"
                     : "=r"(a) : "r"(row) : "memory");
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                     : "=r"(b0), "=r"(b1) : "r"(row) : "memory");
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(c0), "=r"(c1), "=r"(c2), "=r"(c3) : "r"(row) : "memory");
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                     :: "r"(to), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
        sum += a + b0 + b1 + c0 + c1 + c2 + c3;
    }
    __syncwarp();
    out[gtid] = sum + stored[warp][lane * 8];
}

// The 8 16-bit elements of row `r` of a warp's four matrices, as `in` holds them.
static unsigned short element(const std::vector<unsigned short> &in, int warp, int r, int k) {
    return in[(size_t)warp * 256 + r * 8 + k];
}

int main(int argc, char **argv) {
    int blocks = argc > 1 ? atoi(argv[1]) : 64;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    int iters = argc > 3 ? atoi(argv[3]) : 2;
    if (blocks < 1 || reps < 1 || iters < 1) {
        fprintf(stderr, "BLOCKS, REPS and ITERS must be at least 1\n");
        return 2;
    }
    int threads = blocks * WARPS * 32, warps = blocks * WARPS;
    std::vector<unsigned short> in((size_t)threads * 8);
    for (size_t i = 0; i < in.size(); i++) in[i] = (unsigned short)(i * 2654435761u >> 7);
    uint4 *din;
    unsigned *dout;
    CHECK(cudaMalloc(&din, in.size() * 2));
    CHECK(cudaMalloc(&dout, threads * 4));
    CHECK(cudaMemcpy(din, in.data(), in.size() * 2, cudaMemcpyHostToDevice));
    for (int it = 0; it < iters; it++) {
        matrix_rows<<<blocks, WARPS * 32>>>(din, dout, reps);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned> out(threads);
    CHECK(cudaMemcpy(out.data(), dout, threads * 4, cudaMemcpyDeviceToHost));
    // A lane's register j of matrix m holds elements 2(lane%4) and +1 of row lane/4 of m,
    // low half first; stmatrix writes them back where ldmatrix read them.
    int bad = 0;
    for (int w = 0; w < warps; w++) {
        for (int lane = 0; lane < 32; lane++) {
            auto reg = [&](int m) {
                int r = m * 8 + lane / 4, k = 2 * (lane % 4);
                return (unsigned)element(in, w, r, k) | (unsigned)element(in, w, r, k + 1) << 16;
            };
            unsigned once = reg(0) + reg(0) + reg(1) + reg(0) + reg(1) + reg(2) + reg(3);
            unsigned want = once * (unsigned)reps + element(in, w, lane, 0);
            if (out[(size_t)w * 32 + lane] != want) bad++;
        }
    }
    printf("matrix_rows blocks=%d reps=%d iters=%d warps=%d check=%s (%d of %d sums off)\n",
           blocks, reps, iters, warps, bad ? "FAILED" : "ok", bad, threads);
    return bad ? 1 : 0;
}
