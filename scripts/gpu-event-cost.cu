// What timing a launch with CUDA events costs, on the host and on an idle GPU: the host
// time of the driver calls a launch-events hook makes before the launch, and vectorAdd
// over 2^26 (the benchmark of the 1.01x goal) timed by the application's own events with
// nothing around it, with two timed events around it, with a 1 us host delay before it,
// and with ten capture-state checks before it.
//
//   nvcc -O2 -o /tmp/event-cost scripts/gpu-event-cost.cu -lcuda && /tmp/event-cost
//   (on the GPU machine: GPU_EXEC='nvcc -O2 -o /tmp/ec scripts/gpu-event-cost.cu -lcuda && /tmp/ec'
//    bash scripts/gpu.sh --on-device exec)
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
#include <algorithm>
#include <vector>

static double now_ns() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

__global__ void add(const float *a, const float *b, float *c, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

enum { N = 2000 };
static CUevent events[N];

// ns per cuEventRecord on `s` for events made with `flags`: back to back, then one at a
// time on an idle stream.
static void record_cost(const char *what, CUstream s, unsigned flags) {
    for (int i = 0; i < N; i++) cuEventCreate(&events[i], flags);
    cudaDeviceSynchronize();
    double t0 = now_ns();
    for (int i = 0; i < N; i++) cuEventRecord(events[i], s);
    double burst = (now_ns() - t0) / N;
    cudaDeviceSynchronize();
    double idle = 0;
    for (int i = 0; i < 200; i++) {
        double a = now_ns();
        cuEventRecord(events[i], s);
        idle += now_ns() - a;
        cuEventSynchronize(events[i]);
    }
    printf("cuEventRecord, %-32s back to back %7.1f ns, on an idle stream %7.1f ns\n", what, burst, idle / 200);
    for (int i = 0; i < N; i++) cuEventDestroy(events[i]);
}

int main() {
    cudaFree(0);
    CUstream nonblocking;
    cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING);
    double t0 = now_ns();
    for (int i = 0; i < N; i++) { CUcontext c; cuCtxGetCurrent(&c); }
    printf("cuCtxGetCurrent %.1f ns\n", (now_ns() - t0) / N);
    t0 = now_ns();
    for (int i = 0; i < N; i++) { CUstreamCaptureStatus st; cuStreamIsCapturing(0, &st); }
    printf("cuStreamIsCapturing (legacy stream) %.1f ns\n", (now_ns() - t0) / N);
    record_cost("timed, legacy stream", 0, 0);
    record_cost("untimed, legacy stream", 0, CU_EVENT_DISABLE_TIMING);
    record_cost("timed, per-thread stream", CU_STREAM_PER_THREAD, 0);
    record_cost("timed, non-blocking stream", nonblocking, 0);
    record_cost("untimed, non-blocking stream", nonblocking, CU_EVENT_DISABLE_TIMING);

    long n = 1L << 26;
    float *a, *b, *c;
    cudaMalloc(&a, n * 4); cudaMalloc(&b, n * 4); cudaMalloc(&c, n * 4);
    CUevent ours[2];
    cuEventCreate(&ours[0], 0); cuEventCreate(&ours[1], 0);
    cudaEvent_t start, stop;
    cudaEventCreate(&start); cudaEventCreate(&stop);
    const char *modes[] = {"nothing around it", "two timed events around it", "1 us of host work before it", "ten capture checks before it"};
    for (int round = 0; round < 4; round++) {
        for (int m = 0; m < 4; m++) {
            std::vector<float> ms;
            for (int it = 0; it < 60; it++) {
                cudaEventRecord(start);
                if (m == 1) cuEventRecord(ours[0], 0);
                if (m == 2) { double z = now_ns(); while (now_ns() - z < 1000) {} }
                if (m == 3) for (int k = 0; k < 10; k++) { CUstreamCaptureStatus st; cuStreamIsCapturing(0, &st); }
                add<<<(n + 255) / 256, 256>>>(a, b, c, n);
                if (m == 1) cuEventRecord(ours[1], 0);
                cudaEventRecord(stop);
                cudaEventSynchronize(stop);
                float x;
                cudaEventElapsedTime(&x, start, stop);
                if (it >= 10) ms.push_back(x);
            }
            std::sort(ms.begin(), ms.end());
            printf("round %d, vectorAdd 2^26 with %-30s median %.4f ms\n", round, modes[m], ms[ms.size() / 2]);
        }
    }
    return 0;
}
