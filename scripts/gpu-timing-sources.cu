// What timing every launch costs, by the way the GPU times are taken: two CUDA events
// around the launch (what launch events use), CUPTI's concurrent-kernel activity records,
// or CUPTI's serialized kernel records. vectorAdd over 2^26 floats, the application
// waiting for each launch and timing it with its own events (as the benchmarks do).
//
//   gpu-timing-sources MODE [LAUNCHES]    MODE: native | events | cupti | cupti-serial
//
// Prints the median of the application's ms per launch, and the kernel's own time as the
// mode measured it. Built and run by scripts/gpu-timing-sources.sh.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

static size_t kernels = 0;
static std::vector<double> cupti_ms;
static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max) {
  *size = 1 << 20;
  *buf = (uint8_t *)aligned_alloc(8, *size);
  *max = 0;
}
static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid) {
  CUpti_Activity *rec = nullptr;
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      auto *k = (CUpti_ActivityKernel10 *)rec;
      kernels++;
      cupti_ms.push_back((k->end - k->start) / 1e6);
    }
  }
  free(buf);
}

#define CK(x) do { auto r = (x); if (r != 0) { fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)r); exit(1); } } while (0)

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "native";
  int launches = argc > 2 ? atoi(argv[2]) : 200;
  int n = 1 << 26;
  bool cupti = !strcmp(mode, "cupti") || !strcmp(mode, "cupti-serial");
  if (cupti) {
    CK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CK(cuptiActivityEnable(!strcmp(mode, "cupti") ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL : CUPTI_ACTIVITY_KIND_KERNEL));
  }
  float *a, *b, *c;
  CK(cudaMalloc(&a, n * 4)); CK(cudaMalloc(&b, n * 4)); CK(cudaMalloc(&c, n * 4));
  CK(cudaMemset(a, 0, n * 4)); CK(cudaMemset(b, 0, n * 4));
  cudaEvent_t s, e, ts, te;
  CK(cudaEventCreate(&s)); CK(cudaEventCreate(&e)); CK(cudaEventCreate(&ts)); CK(cudaEventCreate(&te));
  bool events = !strcmp(mode, "events");
  std::vector<double> app, ours;
  for (int i = 0; i < launches + 10; i++) {
    CK(cudaEventRecord(s, 0));
    if (events) CK(cudaEventRecord(ts, 0));
    vectorAdd<<<(n + 255) / 256, 256>>>(a, b, c, n);
    if (events) CK(cudaEventRecord(te, 0));
    CK(cudaEventRecord(e, 0));
    CK(cudaEventSynchronize(e));
    float ms;
    CK(cudaEventElapsedTime(&ms, s, e));
    if (i >= 10) app.push_back(ms);
    if (events && i >= 10) { CK(cudaEventElapsedTime(&ms, ts, te)); ours.push_back(ms); }
  }
  if (cupti) CK(cuptiActivityFlushAll(1));
  std::sort(app.begin(), app.end());
  std::sort(ours.begin(), ours.end());
  std::sort(cupti_ms.begin(), cupti_ms.end());
  printf("mode=%s app_median_ms=%.4f", mode, app[app.size() / 2]);
  if (events) printf(" event_kernel_ms=%.4f", ours[ours.size() / 2]);
  if (cupti) printf(" cupti_records=%zu cupti_kernel_ms=%.4f", kernels, cupti_ms.empty() ? 0 : cupti_ms[cupti_ms.size() / 2]);
  printf("\n");
  return 0;
}
