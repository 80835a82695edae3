// vectorAdd on every GPU of the machine, one after the other from one host thread: a
// context per device (cudart's primary ones), the same kernel loaded into each. Each
// device adds its own vectors of N floats ITERS times and is checked.
//
//   multi_gpu [N] [ITERS]      defaults: 1 << 20, 10
//
// Prints `multi_gpu devices=D n=N iters=I threads=T check=ok|FAIL`, T the threads
// launched on all devices together (D x ITERS x N rounded up to whole blocks).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "check.h"

__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], 0, 0) : 1 << 20;
    int iters = argc > 2 ? atoi(argv[2]) : 10;
    int devices = 0;
    CHECK(cudaGetDeviceCount(&devices));
    const int block = 256;
    int grid = (int)((n + block - 1) / block);
    std::vector<float> a(n), b(n), c(n);
    for (long i = 0; i < n; i++) {
        a[i] = (float)i;
        b[i] = (float)(2 * i);
    }
    bool ok = true;
    for (int d = 0; d < devices; d++) {
        CHECK(cudaSetDevice(d));
        float *da, *db, *dc;
        size_t bytes = n * sizeof(float);
        CHECK(cudaMalloc(&da, bytes));
        CHECK(cudaMalloc(&db, bytes));
        CHECK(cudaMalloc(&dc, bytes));
        CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
        for (int it = 0; it < iters; it++) {
            vectorAdd<<<grid, block>>>(da, db, dc, (int)n);
            CHECK(cudaGetLastError());
        }
        CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
        for (long i = 0; i < n; i++)
            if (c[i] != 3.0f * i) {
                fprintf(stderr, "device %d: c[%ld] = %f\n", d, i, c[i]);
                ok = false;
                break;
            }
        CHECK(cudaFree(da));
        CHECK(cudaFree(db));
        CHECK(cudaFree(dc));
    }
    printf("multi_gpu devices=%d n=%ld iters=%d threads=%ld check=%s\n", devices, n, iters,
           (long)devices * iters * grid * block, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
