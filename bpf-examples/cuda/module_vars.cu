// A kernel that uses its module's own variables: `__constant__` coefficients the host
// sets before each launch, a `__device__` table the host writes once, and a `__device__`
// counter the kernel adds to and the host reads back and resets. An instrumented copy of
// the kernel must see what the host wrote and leave what it writes where the host reads.
//
//   module_vars [N] [ITERS]     defaults: 1<<20 elements, 5 launches
//
// Prints `module_vars n=N iters=I threads=T counted=C check=ok` (C: the counter's sum
// over the launches, which must be T) and exits 1 on a wrong element or count.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "check.h"

__constant__ float scale[4];
__device__ int offsets[256] = {1, 2, 3};
__device__ unsigned long long counted;

__global__ void scaledAdd(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = in[i] * scale[i % 4] + (float)offsets[i % 256];
        atomicAdd(&counted, 1ull);
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], 0, 0) : 1 << 20;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    int block = 256, grid = (int)((n + block - 1) / block);
    std::vector<float> in(n), out(n);
    for (long i = 0; i < n; i++)
        in[i] = (float)(i % 1000);
    std::vector<int> table(256);
    for (int i = 0; i < 256; i++)
        table[i] = 3 * i + 7;
    float *din, *dout;
    CHECK(cudaMalloc(&din, n * sizeof(float)));
    CHECK(cudaMalloc(&dout, n * sizeof(float)));
    CHECK(cudaMemcpy(din, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyToSymbol(offsets, table.data(), sizeof(int) * 256));
    long wrong = 0;
    unsigned long long total = 0;
    for (int it = 0; it < iters; it++) {
        float s[4] = {1.0f + it, 2.0f + it, 0.5f * it, -1.0f};
        unsigned long long zero = 0, c = 0;
        CHECK(cudaMemcpyToSymbol(scale, s, sizeof(s)));
        CHECK(cudaMemcpyToSymbol(counted, &zero, sizeof(zero)));
        scaledAdd<<<grid, block>>>(din, dout, (int)n);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyFromSymbol(&c, counted, sizeof(c)));
        CHECK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
        total += c;
        if (c != (unsigned long long)n)
            wrong++;
        for (long i = 0; i < n; i++)
            if (out[i] != in[i] * s[i % 4] + (float)table[i % 256])
                wrong++;
    }
    printf("module_vars n=%ld iters=%d threads=%ld counted=%llu check=%s\n", n, iters,
           (long)grid * block, total, wrong ? "FAIL" : "ok");
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
    return wrong ? 1 : 0;
}
