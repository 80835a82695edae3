// vectorAdd on every GPU of the machine: a context per device (cudart's primary ones), the
// same kernel loaded into each. Each device adds its own vectors of N floats ITERS times
// and is checked. HOST_THREADS 0: the devices one after the other from one host thread;
// 1: a host thread per device, all at once.
//
//   multi_gpu [N] [ITERS] [HOST_THREADS]      defaults: 1 << 20, 10, 0
//
// Prints `multi_gpu devices=D n=N iters=I host_threads=H threads=T check=ok|FAIL`, T the
// threads launched on all devices together (D x ITERS x N rounded up to whole blocks).
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <cuda_runtime.h>
#include "check.h"

__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

// Adds a and b into c on device d ITERS times; whether c is right.
static bool run_device(int d, long n, int iters, const std::vector<float> &a,
                       const std::vector<float> &b) {
    const int block = 256;
    int grid = (int)((n + block - 1) / block);
    std::vector<float> c(n);
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
    bool ok = true;
    for (long i = 0; i < n; i++)
        if (c[i] != 3.0f * i) {
            fprintf(stderr, "device %d: c[%ld] = %f\n", d, i, c[i]);
            ok = false;
            break;
        }
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    return ok;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], 0, 0) : 1 << 20;
    int iters = argc > 2 ? atoi(argv[2]) : 10;
    int host_threads = argc > 3 ? atoi(argv[3]) : 0;
    int devices = 0;
    CHECK(cudaGetDeviceCount(&devices));
    const int block = 256;
    int grid = (int)((n + block - 1) / block);
    std::vector<float> a(n), b(n);
    for (long i = 0; i < n; i++) {
        a[i] = (float)i;
        b[i] = (float)(2 * i);
    }
    std::vector<char> ok(devices, 0);
    if (host_threads) {
        std::vector<std::thread> threads;
        for (int d = 0; d < devices; d++)
            threads.emplace_back([&, d] { ok[d] = run_device(d, n, iters, a, b); });
        for (auto &t : threads)
            t.join();
    } else {
        for (int d = 0; d < devices; d++)
            ok[d] = run_device(d, n, iters, a, b);
    }
    bool all = true;
    for (int d = 0; d < devices; d++)
        all = all && ok[d];
    printf("multi_gpu devices=%d n=%ld iters=%d host_threads=%d threads=%ld check=%s\n", devices,
           n, iters, host_threads, (long)devices * iters * grid * block, all ? "ok" : "FAIL");
    return all ? 0 : 1;
}
