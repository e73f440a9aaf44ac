#!/usr/bin/env bash
# Builds and runs the optional torch_aoti example: torchvision's ResNet-50
# (random weights, fp16) compiled by AOTInductor with a dynamic batch
# (scripts/aoti_probe.py's compile step, a few minutes), then loaded in C++ and
# graphed per batch bucket. Run scripts/aoti_probe.py first: when packages do
# not load on this machine, neither does this. Needs PyTorch with CUDA and
# torchvision in python3, and a CUDA GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/setup-deps.sh
prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake --preset default -DREPLAY_WITH_TORCH=ON -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build --preset default --target torch_aoti
package=$PWD/build/default/aoti/resnet50-dynamic.pt2
mkdir -p "$(dirname "$package")"
[ -f "$package" ] || python3 -X faulthandler scripts/aoti_probe.py --child compile --model resnet50 --dynamic 1 \
  --package "$package"
./build/default/examples/torch_aoti/torch_aoti --package "$package" "$@"
