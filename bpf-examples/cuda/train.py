# A small PyTorch training loop (a two-layer MLP on random data), the stock wheel's
# kernels, none of which carry PTX. torch.profiler (CUPTI) records every kernel of the
# whole run, so a tool's launch events can be checked against it.
#
#   python3 train.py [STEPS]
#
# Prints `train steps=S kernels=K kernel_us=T span_us=W loss=L check=ok`: the kernels the
# profiler saw, the sum of their GPU times in microseconds, the GPU time from before the
# first kernel to after the last (CUDA events: every kernel's time lies inside it, as they
# run one after the other on one stream), and the final loss (the same with and without a
# tool attached: seeded, and cuBLAS is deterministic for one configuration).
import sys

import torch
from torch.profiler import ProfilerActivity, profile

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
torch.manual_seed(0)
torch.cuda.init()
began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    began.record()
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(1024, 256, device="cuda")
    y = torch.randint(0, 10, (1024,), device="cuda")
    first = None
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if first is None:
            first = loss.item()
    final = loss.item()
    ended.record()
    torch.cuda.synchronize()
span_us = began.elapsed_time(ended) * 1e3

kernels = [
    e
    for e in prof.events()
    if e.device_type == torch.autograd.DeviceType.CUDA
    and not e.name.startswith(("Memcpy", "Memset"))
]
kernel_us = sum(e.time_range.elapsed_us() for e in kernels)
ok = final == final and final < first
print(
    f"train steps={steps} kernels={len(kernels)} kernel_us={kernel_us:.1f} "
    f"span_us={span_us:.1f} loss={final:.6f} check={'ok' if ok else 'FAIL'}"
)
sys.exit(0 if ok else 1)
