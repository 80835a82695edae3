// attach_loop: the target of `bpftime attach PID` into a CUDA process. Started without
// bpftime, it loads its module and launches vectorAdd before anything of bpftime is in
// it, then makes a known number of launches when told to, so that what a probe attached
// in between counts can be checked exactly.
//
//   attach_loop N LAUNCHES DIR [BLOCK]     BLOCK defaults to 256 threads
//
// 1. Launches vectorAdd over N floats, each launch waited for, 1 ms apart, until DIR/stop
//    exists; after the first it prints `attach_loop ready pid=P`.
// 2. Prints `attach_loop paused launches=K` (K launches so far) and waits for DIR/go,
//    making no CUDA call meanwhile.
// 3. Makes LAUNCHES launches into a cleared output, checks c = a + b, and prints
//    `attach_loop after_go launches=L n=N block=B grid=G threads=T check=ok` (T: the
//    threads of those L launches), exiting 1 if an element is wrong or a CUDA call fails.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>
#include "check.h"

__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

static bool exists(const std::string &path) { return access(path.c_str(), F_OK) == 0; }

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: attach_loop N LAUNCHES DIR [BLOCK]\n");
        return 2;
    }
    long n = strtol(argv[1], 0, 0);
    int launches = atoi(argv[2]);
    std::string dir = argv[3];
    int block = argc > 4 ? atoi(argv[4]) : 256;
    int grid = (int)((n + block - 1) / block);
    std::vector<float> a(n), b(n), c(n);
    srand(42);
    for (long i = 0; i < n; i++) {
        a[i] = (float)(rand() % 1024);
        b[i] = (float)(rand() % 1024);
    }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, n * sizeof(float)));
    CHECK(cudaMalloc(&db, n * sizeof(float)));
    CHECK(cudaMalloc(&dc, n * sizeof(float)));
    CHECK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));

    long before = 0;
    do {
        vectorAdd<<<grid, block>>>(da, db, dc, (int)n);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        if (before++ == 0) {
            printf("attach_loop ready pid=%d\n", (int)getpid());
            fflush(stdout);
        }
        usleep(1000);
    } while (!exists(dir + "/stop"));
    printf("attach_loop paused launches=%ld\n", before);
    fflush(stdout);
    while (!exists(dir + "/go"))
        usleep(10000);

    CHECK(cudaMemset(dc, 0xff, n * sizeof(float)));
    for (int it = 0; it < launches; it++) {
        vectorAdd<<<grid, block>>>(da, db, dc, (int)n);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
    long wrong = 0;
    for (long i = 0; i < n; i++)
        if (c[i] != a[i] + b[i]) wrong++;
    printf("attach_loop after_go launches=%d n=%ld block=%d grid=%d threads=%ld check=%s\n",
           launches, n, block, grid, (long)launches * grid * block, wrong ? "FAIL" : "ok");
    fflush(stdout);
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    return wrong ? 1 : 0;
}
