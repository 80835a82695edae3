// How long the driver's JIT takes to load a PTX module: the floor under "module load to
// instrumented module ready" on a first run. For each PTX file: the first load in the
// process (it also loads the driver's PTX compiler), then five more, each timed on the
// host and by the JIT's own wall-time report. Run with CUDA_CACHE_DISABLE=1 so that no
// load is served from the driver's compute cache.
//
//   cc -O2 -o /tmp/jit-floor scripts/gpu-jit-floor.c -I/usr/local/cuda/include -lcuda
//   CUDA_CACHE_DISABLE=1 /tmp/jit-floor a.ptx [b.ptx ...]
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n + 1);
    if (fread(buf, 1, n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    fclose(f);
    return buf;
}

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "jit-floor: no CUDA device\n");
        return 2;
    }
    for (int a = 1; a < argc; a++) {
        char *ptx = slurp(argv[a]);
        if (!ptx) {
            fprintf(stderr, "jit-floor: cannot read %s\n", argv[a]);
            return 2;
        }
        printf("%s (%zu bytes of PTX):", argv[a], strlen(ptx));
        for (int i = 0; i < 6; i++) {
            float wall = 0;
            CUjit_option opt[] = {CU_JIT_WALL_TIME};
            void *val[] = {&wall};
            CUmodule m;
            double t0 = now_ms();
            CUresult r = cuModuleLoadDataEx(&m, ptx, 1, opt, val);
            double t1 = now_ms();
            if (r) {
                printf(" load failed (%d)\n", r);
                return 1;
            }
            printf(" %s%.2f ms (JIT %.2f)", i == 0 ? "first " : "", t1 - t0, wall);
            cuModuleUnload(m);
        }
        printf("\n");
        free(ptx);
    }
    return 0;
}
