// One kernel on two streams at once: the target of the timeline's check that a GPU line
// lands on the launch that wrote it, not on whichever kernel was running then. Each round
// launches `spin` on stream A, then on stream B; the two run side by side. In even rounds
// the first launch is the shorter, so its blocks finish (and write their lines) while the
// second kernel, started after it, still runs; in odd rounds the other way round. Launch K
// (0-based, in launch order) is given tag K.
//
//   two_streams [ROUNDS]     default 10
//
// Prints `two_streams launches=L` and `check=ok` once every block of every launch ran (exit
// 1 otherwise or if a CUDA call fails).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "check.h"

const int BLOCKS = 8;

__global__ void spin(int tag, long long cycles, unsigned int *ran) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    if (threadIdx.x == 0) atomicAdd(&ran[tag], 1);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    if (rounds < 1) rounds = 1;
    unsigned int *ran;
    CHECK(cudaMalloc(&ran, 2 * rounds * sizeof(unsigned int)));
    CHECK(cudaMemset(ran, 0, 2 * rounds * sizeof(unsigned int)));
    cudaStream_t streams[2];
    for (auto &s : streams) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // About half a millisecond at the H100's and H200's clocks.
    const long long cycles = 1000000;
    for (int r = 0; r < rounds; r++) {
        long long first = r % 2 ? 2 * cycles : cycles;
        long long second = r % 2 ? cycles : 2 * cycles;
        spin<<<BLOCKS, 128, 0, streams[0]>>>(2 * r, first, ran);
        CHECK(cudaGetLastError());
        spin<<<BLOCKS, 128, 0, streams[1]>>>(2 * r + 1, second, ran);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
    }
    unsigned int *host = (unsigned int *)malloc(2 * rounds * sizeof(unsigned int));
    CHECK(cudaMemcpy(host, ran, 2 * rounds * sizeof(unsigned int), cudaMemcpyDeviceToHost));
    int ok = 1;
    for (int t = 0; t < 2 * rounds; t++) {
        if (host[t] != BLOCKS) {
            printf("launch %d: %u blocks ran, %d expected\n", t, host[t], BLOCKS);
            ok = 0;
        }
    }
    printf("two_streams launches=%d\n", 2 * rounds);
    if (!ok) return 1;
    printf("check=ok\n");
    return 0;
}
