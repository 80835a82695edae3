// One kernel reached through two CPU call paths, the target of the GPU flame graph check:
// `prepare_batch` launches `scale` over a small buffer, `train_step` over one eight times
// larger, both from `main`'s loop (and `warm_up` once before). Each launch is timed with CUDA events, and the GPU time
// is summed per path.
//
//   two_paths [ROUNDS]     default 20
//
// Prints one line per path: `two_paths path=P launches=L gpu_ms=X`, then `check=ok` once
// the results are right (exit 1 otherwise or if a CUDA call fails).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "check.h"

// Each element is scaled `reps` times, so that a launch is long against its launch cost.
__global__ void scale(float *x, float f, int n, int reps) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int r = 0; r < reps; r++) v = v * f + 0.5f;
        x[i] = v;
    }
}

struct Path {
    const char *name;
    int launches;
    double gpu_ms;
    int calls;
};

static cudaEvent_t start, stop;

static void timed_scale(Path &p, float *x, int n) {
    CHECK(cudaEventRecord(start));
    scale<<<(n + 255) / 256, 256>>>(x, 0.5f, n, 512);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    p.launches++;
    p.gpu_ms += ms;
}

// Each path does something after its launch, so that the compiler cannot make the launch
// a tail call and drop the path's frame from the stack.
__attribute__((noinline)) void prepare_batch(Path &p, float *x, int n) {
    timed_scale(p, x, n / 8);
    p.calls++;
}

__attribute__((noinline)) void train_step(Path &p, float *x, int n) {
    timed_scale(p, x, n);
    p.calls++;
}

// One launch before the timed ones, from a third path: whatever the first launch of a
// process costs (a tool's own set-up included) is not in either path's time.
__attribute__((noinline)) void warm_up(float *x, int n) {
    scale<<<(n + 255) / 256, 256>>>(x, 0.5f, n, 1);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    const int n = 1 << 24;
    std::vector<float> host(n, 1.0f);
    float *x;
    CHECK(cudaMalloc(&x, n * sizeof(float)));
    CHECK(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    // Lazy loading would load the kernel inside the first timed launch.
    cudaFuncAttributes attr;
    CHECK(cudaFuncGetAttributes(&attr, scale));
    warm_up(x, n);
    Path prepare = {"prepare_batch", 0, 0, 0}, train = {"train_step", 0, 0, 0};
    for (int r = 0; r < rounds; r++) {
        prepare_batch(prepare, x, n);
        train_step(train, x, n);
    }
    CHECK(cudaMemcpy(host.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost));
    // v -> v/2 + 1/2 from 1.0 stays 1.0, however many times it is applied.
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && host[i] == 1.0f;
    ok = ok && prepare.calls == rounds && train.calls == rounds;
    for (const Path *p : {&prepare, &train})
        printf("two_paths path=%s launches=%d gpu_ms=%.4f\n", p->name, p->launches, p->gpu_ms);
    printf("%s\n", ok ? "check=ok" : "check=FAIL");
    return ok ? 0 : 1;
}
