# vectorAdd as a CuPy RawKernel (compiled by NVRTC at run time, loaded with
# cuModuleLoadData): c = a + b over N floats, launched ITERS times, checked on the host.
#
#   python3 cupy_add.py [N] [ITERS]
#
# Prints `cupy_add n=N iters=I block=256 check=ok`.
import sys

import cupy as cp

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
kernel = cp.RawKernel(
    r"""
extern "C" __global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
""",
    "vectorAdd",
)
a = cp.random.random(n, dtype=cp.float32)
b = cp.random.random(n, dtype=cp.float32)
c = cp.zeros(n, dtype=cp.float32)
block = 256
grid = (n + block - 1) // block
for _ in range(iters):
    kernel((grid,), (block,), (a, b, c, cp.int32(n)))
cp.cuda.Device().synchronize()
ok = bool(cp.allclose(c, a + b))
print(f"cupy_add n={n} iters={iters} block={block} check={'ok' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
