// Tensor copies: a 2D float tensor doubled tile by tile through the tensor memory
// accelerator (`cp.async.bulk.tensor.2d`, Hopper and newer). Each block loads its 32 x 16
// tile of `in` into shared memory with a tensor copy completing on an mbarrier, doubles it,
// and stores it into `out` with a tensor copy. The tensor is W = 1000 floats wide and H =
// 500 rows, so the last column and row of tiles hang over its edges: the accelerator
// fills what lies outside with zeros on a load and leaves it unwritten on a store.
//
//   tma_copy [ITERS]     default 1
//
// The kernel is tma_double(in_map, out_map, in, out, bytes, tiles_x): the tensor maps as
// __grid_constant__ parameters, then the buffers and their size, which the kernel does
// not touch itself (they are there for a probe to check addresses against).
// Prints `tma_copy width=W height=H tiles=T iters=I` and `check=ok` when `out` is twice
// `in` (exit 1 otherwise, or if a CUDA call fails).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include "check.h"

const int W = 1000, H = 500, BOX_W = 32, BOX_H = 16;

__global__ void tma_double(const __grid_constant__ CUtensorMap in_map,
                           const __grid_constant__ CUtensorMap out_map, const float *in,
                           float *out, unsigned long long bytes, int tiles_x) {
    __shared__ alignas(128) float tile[BOX_H][BOX_W];
    __shared__ alignas(8) unsigned long long bar;
    int x = (blockIdx.x % tiles_x) * BOX_W, y = (blockIdx.x / tiles_x) * BOX_H;
    unsigned at_tile = (unsigned)__cvta_generic_to_shared(tile);
    unsigned at_bar = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(at_bar) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(at_bar),
                     "r"((unsigned)sizeof(tile))
                     : "memory");
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3}], [%4];" ::"r"(at_tile),
                     "l"(&in_map), "r"(x), "r"(y), "r"(at_bar)
                     : "memory");
    }
    asm volatile("{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
                 "@!p bra WAIT_%=;\n}" ::"r"(at_bar)
                 : "memory");
    for (int i = threadIdx.x; i < BOX_W * BOX_H; i += blockDim.x) tile[i / BOX_W][i % BOX_W] *= 2.0f;
    // The tensor store reads shared memory through the async proxy.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];"
                     ::"l"(&out_map), "r"(x), "r"(y), "r"(at_tile)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
}

static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                           &found));
    if (found != cudaDriverEntryPointSuccess || !fn) {
        fprintf(stderr, "the driver has no cuTensorMapEncodeTiled\n");
        exit(1);
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

static CUtensorMap tensor_map(PFN_cuTensorMapEncodeTiled_v12000 encode, float *at) {
    CUtensorMap map;
    cuuint64_t dims[2] = {W, H};
    cuuint64_t strides[1] = {W * sizeof(float)};
    cuuint32_t box[2] = {BOX_W, BOX_H};
    cuuint32_t element_strides[2] = {1, 1};
    CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, at, dims, strides, box,
                        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                        CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", (int)r);
        exit(1);
    }
    return map;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 1;
    size_t n = (size_t)W * H;
    std::vector<float> host(n), back(n);
    for (size_t i = 0; i < n; i++) host[i] = (float)(i % 1000) * 0.5f;
    float *in, *out;
    CHECK(cudaMalloc(&in, n * sizeof(float)));
    CHECK(cudaMalloc(&out, n * sizeof(float)));
    CHECK(cudaMemcpy(in, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    auto encode = encode_tiled();
    CUtensorMap in_map = tensor_map(encode, in), out_map = tensor_map(encode, out);
    int tiles_x = (W + BOX_W - 1) / BOX_W, tiles_y = (H + BOX_H - 1) / BOX_H;
    for (int i = 0; i < iters; i++) {
        CHECK(cudaMemset(out, 0, n * sizeof(float)));
        tma_double<<<tiles_x * tiles_y, 128>>>(in_map, out_map, in, out, n * sizeof(float), tiles_x);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
    }
    CHECK(cudaMemcpy(back.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
    printf("tma_copy width=%d height=%d tiles=%d iters=%d\n", W, H, tiles_x * tiles_y, iters);
    for (size_t i = 0; i < n; i++) {
        if (back[i] != 2.0f * host[i]) {
            printf("out[%zu] = %f, expected %f\n", i, back[i], 2.0f * host[i]);
            return 1;
        }
    }
    printf("check=ok\n");
    return 0;
}
