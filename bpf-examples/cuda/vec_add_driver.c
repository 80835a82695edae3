/*
 * vectorAdd through the CUDA driver API: the module is loaded from a file with
 * cuModuleLoadData (PTX text) or cuModuleLoadFatBinary (a fatbin), the kernel found
 * with cuModuleGetFunction and launched with cuLaunchKernel. No CUDA runtime.
 *
 *   vec_add_driver MODULE [N] [ITERS] [BLOCK]
 *
 * MODULE is nvcc's --ptx or --fatbin output of vec_add.cu (the kernel is
 * `_Z9vectorAddPKfS0_Pfi`). Prints the same line as vec_add.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        CUresult r_ = (call);                                                          \
        if (r_ != CUDA_SUCCESS) {                                                      \
            const char *s_ = "?";                                                      \
            cuGetErrorName(r_, &s_);                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_);         \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    if (fread(buf, 1, *len, f) != *len) {
        perror(path);
        exit(1);
    }
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static int cmp(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODULE [N] [ITERS] [BLOCK]\n", argv[0]);
        return 2;
    }
    long n = argc > 2 ? strtol(argv[2], 0, 0) : 1 << 20;
    int iters = argc > 3 ? atoi(argv[3]) : 10;
    unsigned block = argc > 4 ? (unsigned)atoi(argv[4]) : 256;
    unsigned grid = (unsigned)((n + block - 1) / block);
    size_t len;
    char *image = read_file(argv[1], &len);
    CHECK(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule module;
    int is_ptx = memcmp(image, "//", 2) == 0 || strstr(image, ".version") != NULL;
    if (is_ptx)
        CHECK(cuModuleLoadData(&module, image));
    else
        CHECK(cuModuleLoadFatBinary(&module, image));
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, module, "_Z9vectorAddPKfS0_Pfi"));
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
    srand(42);
    for (long i = 0; i < n; i++) {
        a[i] = (float)rand() / RAND_MAX;
        b[i] = (float)rand() / RAND_MAX;
    }
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc(&da, n * sizeof(float)));
    CHECK(cuMemAlloc(&db, n * sizeof(float)));
    CHECK(cuMemAlloc(&dc, n * sizeof(float)));
    CHECK(cuMemcpyHtoD(da, a, n * sizeof(float)));
    CHECK(cuMemcpyHtoD(db, b, n * sizeof(float)));
    CHECK(cuMemsetD8(dc, 0xff, n * sizeof(float)));
    CUevent start, stop;
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    float *ms = calloc(iters > 0 ? iters : 1, sizeof(float));
    int ni = (int)n;
    void *params[] = {&da, &db, &dc, &ni};
    for (int it = 0; it < iters; it++) {
        CHECK(cuEventRecord(start, 0));
        CHECK(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, 0, params, NULL));
        CHECK(cuEventRecord(stop, 0));
        CHECK(cuEventSynchronize(stop));
        CHECK(cuEventElapsedTime(&ms[it], start, stop));
    }
    CHECK(cuMemcpyDtoH(c, dc, n * sizeof(float)));
    long wrong = 0;
    for (long i = 0; i < n; i++)
        if (c[i] != a[i] + b[i]) wrong++;
    qsort(ms, iters, sizeof(float), cmp);
    printf("vec_add n=%ld iters=%d block=%u grid=%u threads=%ld ms_per_launch=%.4f "
           "ms_max=%.4f ms_min=%.4f check=%s\n",
           n, iters, block, grid, (long)grid * block, iters ? ms[iters / 2] : 0.0f,
           iters ? ms[iters - 1] : 0.0f, iters ? ms[0] : 0.0f, wrong ? "FAIL" : "ok");
    CHECK(cuModuleUnload(module));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return wrong ? 1 : 0;
}
