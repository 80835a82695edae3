// vectorAdd through a CUDA graph: two vectorAdd launches (c = a + b, then d = c + b)
// captured from a stream into one graph, instantiated once and launched ITERS times, as
// frameworks replay captured work. Checks d = a + 2b and times each graph launch.
//
//   graph_add [N] [ITERS] [BLOCK] [WARM]   defaults: 1<<20 elements, 10 graph launches,
//                                          256 threads, WARM 1: one launch of vectorAdd on
//                                          the stream before the capture (the warm-up CUDA
//                                          graph users do), 0: none (the capture launches it
//                                          first)
//
// Prints `graph_add n=N iters=I block=B grid=G threads=T warm=W nodes=2 ms_per_launch=X
// ms_max=Y check=ok` (threads per node), and exits 1 if any element is wrong or a CUDA call
// fails.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "check.h"

__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], 0, 0) : 1 << 20;
    int iters = argc > 2 ? atoi(argv[2]) : 10;
    int block = argc > 3 ? atoi(argv[3]) : 256;
    int warm = argc > 4 ? atoi(argv[4]) : 1;
    int grid = (int)((n + block - 1) / block);
    std::vector<float> a(n), b(n), d(n, -1.0f);
    srand(42);
    for (long i = 0; i < n; i++) {
        a[i] = (float)(rand() % 1024);
        b[i] = (float)(rand() % 1024);
    }
    float *da, *db, *dc, *dd;
    CHECK(cudaMalloc(&da, n * sizeof(float)));
    CHECK(cudaMalloc(&db, n * sizeof(float)));
    CHECK(cudaMalloc(&dc, n * sizeof(float)));
    CHECK(cudaMalloc(&dd, n * sizeof(float)));
    CHECK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (warm) {
        vectorAdd<<<grid, block, 0, s>>>(da, db, dc, (int)n);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(s));
    }
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    vectorAdd<<<grid, block, 0, s>>>(da, db, dc, (int)n);
    vectorAdd<<<grid, block, 0, s>>>(dc, db, dd, (int)n);
    CHECK(cudaStreamEndCapture(s, &graph));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    std::vector<float> ms(iters);
    for (int it = 0; it < iters; it++) {
        CHECK(cudaEventRecord(start, s));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaEventRecord(stop, s));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaEventElapsedTime(&ms[it], start, stop));
    }
    CHECK(cudaMemcpy(d.data(), dd, n * sizeof(float), cudaMemcpyDeviceToHost));
    long wrong = 0;
    for (long i = 0; i < n; i++)
        if (d[i] != a[i] + 2 * b[i]) wrong++;
    std::sort(ms.begin(), ms.end());
    printf("graph_add n=%ld iters=%d block=%d grid=%d threads=%ld warm=%d nodes=%zu "
           "ms_per_launch=%.4f ms_max=%.4f check=%s\n",
           n, iters, block, grid, (long)grid * block, warm, nodes, iters ? ms[iters / 2] : 0.0f,
           iters ? ms[iters - 1] : 0.0f, wrong ? "FAIL" : "ok");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    CHECK(cudaFree(dd));
    return wrong ? 1 : 0;
}
