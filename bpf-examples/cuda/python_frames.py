# A PyTorch program whose call path is known, for the GPU flame graph's Python frames
# (scripts/gpu-examples.sh): inner's multiply and sum run on the GPU, launched from
# <module> -> main -> outer -> middle -> inner at the lines marked `# at: NAME`; the
# backward pass's kernels are launched by autograd's own C++ thread, which runs no
# Python.
#
#   python3 python_frames.py [STEPS]
#
# Prints `python_frames steps=S check=ok`.
import sys

import torch


def inner(x):
    return (x * 2.0).sum()  # at: inner


def middle(x):
    return inner(x)  # at: middle


def outer(x):
    return middle(x)  # at: outer


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    n = 1 << 20
    x = torch.ones(n, device="cuda", requires_grad=True)
    total = 0.0
    for _ in range(steps):
        y = outer(x)  # at: main
        y.backward()
        total += y.item()
    torch.cuda.synchronize()
    ok = total == steps * 2.0 * n and bool((x.grad == 2.0 * steps).all())
    print(f"python_frames steps={steps} check={'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())  # at: <module>
