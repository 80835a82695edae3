// Tiled matrix product C = A * B of N x N floats (16 x 16 tiles in shared memory),
// launched ITERS times; checked against a float64 product on a sample of entries and
// timed with CUDA events. The compute-bound target of the GPU benchmarks.
//
//   matmul [N] [ITERS]      defaults: 1024, 5 (N a multiple of 16)
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "check.h"

#define TILE 16

__global__ void matmul(const float *a, const float *b, float *c, int n) {
    __shared__ float as[TILE][TILE], bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0;
    for (int t = 0; t < n; t += TILE) {
        as[threadIdx.y][threadIdx.x] = a[row * n + t + threadIdx.x];
        bs[threadIdx.y][threadIdx.x] = b[(t + threadIdx.y) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
        __syncthreads();
    }
    c[row * n + col] = acc;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1024;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    if (n % TILE) {
        fprintf(stderr, "N must be a multiple of %d\n", TILE);
        return 2;
    }
    size_t bytes = (size_t)n * n * sizeof(float);
    std::vector<float> a((size_t)n * n), b((size_t)n * n), c((size_t)n * n);
    srand(7);
    for (auto &x : a) x = (float)rand() / RAND_MAX - 0.5f;
    for (auto &x : b) x = (float)rand() / RAND_MAX - 0.5f;
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes));
    CHECK(cudaMalloc(&db, bytes));
    CHECK(cudaMalloc(&dc, bytes));
    CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    dim3 block(TILE, TILE), grid(n / TILE, n / TILE);
    std::vector<float> ms(iters);
    for (int it = 0; it < iters; it++) {
        CHECK(cudaMemset(dc, 0xff, bytes));
        CHECK(cudaEventRecord(start));
        matmul<<<grid, block>>>(da, db, dc, n);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaEventElapsedTime(&ms[it], start, stop));
    }
    CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int s = 0; s < 64; s++) {
        int i = (s * 7919) % n, j = (s * 104729) % n;
        double ref = 0;
        for (int k = 0; k < n; k++) ref += (double)a[(size_t)i * n + k] * b[(size_t)k * n + j];
        worst = std::max(worst, std::fabs(ref - c[(size_t)i * n + j]) / (std::fabs(ref) + 1e-3));
    }
    std::sort(ms.begin(), ms.end());
    bool ok = worst < 1e-3;
    printf("matmul n=%d iters=%d threads=%ld ms_per_launch=%.4f check=%s\n", n, iters,
           (long)n * n, iters ? ms[iters / 2] : 0.0f, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
