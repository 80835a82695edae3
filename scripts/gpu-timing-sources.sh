#!/usr/bin/env bash
# The cost of timing every launch, by timing source (scripts/gpu-timing-sources.cu), on
# the GPU machine: five rounds of the four modes in turn, 200 launches each.
#
#   bash scripts/gpu-timing-sources.sh CUPTI_DIR
#
# CUPTI_DIR holds CUPTI's include/ and lib/ (libcupti.so.13): the machine's toolkit
# (/usr/local/cuda/extras/CUPTI) or the wheel, unpacked and carried there:
#   pip download --no-deps 'nvidia-cuda-cupti==13.0.*' && unzip nvidia_cuda_cupti-*.whl
#   (then CUPTI_DIR=nvidia/cu13). Its version must not be newer than the driver's CUDA.
set -euo pipefail
cupti=$(realpath "$1")
export PATH=/usr/local/cuda/bin:$PATH
bin=$(mktemp -d)
nvcc -O2 -arch=sm_90 -I"$cupti/include" "$(dirname "$0")/gpu-timing-sources.cu" -o "$bin/timing" \
    -L"$cupti/lib" -l:libcupti.so.13 -Xlinker -rpath -Xlinker "$cupti/lib"
echo "timing sources, $(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
for round in 1 2 3 4 5; do
    for mode in native events cupti cupti-serial; do
        "$bin/timing" "$mode" 200
    done
done
rm -rf "$bin"
