// vectorAdd from several host threads at once, each on a stream of its own: T threads x
// ITERS launches of c = a + b over N floats (per-thread buffers), every result checked.
// The target of the GPU stress runs' concurrent-launch checks.
//
//   vec_add_threads [N] [ITERS] [THREADS]     defaults: 1<<16 elements, 100, 8
//
// Prints `vec_add_threads n=N iters=I threads=T launches=L check=ok`; exits 1 if an
// element is wrong or a CUDA call fails.
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <atomic>
#include <cuda_runtime.h>

__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

static std::atomic<long> wrong{0};
static std::atomic<int> failed{0};

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        failed = 1;
    }
}

static void worker(long n, int iters, int seed) {
    std::vector<float> a(n), b(n), c(n);
    for (long i = 0; i < n; i++) {
        a[i] = (float)((i * 7 + seed) % 1000);
        b[i] = (float)((i * 13 + seed) % 1000);
    }
    cudaStream_t s;
    float *da, *db, *dc;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMalloc(&da, n * sizeof(float)), "cudaMalloc");
    check(cudaMalloc(&db, n * sizeof(float)), "cudaMalloc");
    check(cudaMalloc(&dc, n * sizeof(float)), "cudaMalloc");
    check(cudaMemcpyAsync(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice, s), "copy");
    check(cudaMemcpyAsync(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice, s), "copy");
    int block = 256, grid = (int)((n + block - 1) / block);
    for (int it = 0; it < iters; it++) {
        vectorAdd<<<grid, block, 0, s>>>(da, db, dc, (int)n);
        check(cudaGetLastError(), "launch");
    }
    check(cudaMemcpyAsync(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost, s), "copy");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    for (long i = 0; i < n; i++)
        if (c[i] != a[i] + b[i]) wrong++;
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaStreamDestroy(s);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], 0, 0) : 1 << 16;
    int iters = argc > 2 ? atoi(argv[2]) : 100;
    int threads = argc > 3 ? atoi(argv[3]) : 8;
    check(cudaFree(0), "cudaFree(0)");
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++) pool.emplace_back(worker, n, iters, t);
    for (auto &t : pool) t.join();
    bool ok = !wrong && !failed;
    printf("vec_add_threads n=%ld iters=%d threads=%d launches=%ld check=%s\n", n, iters,
           threads, (long)iters * threads, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
