#!/usr/bin/env bash
# Builds and runs the torch_resnet example: ResNet-50 with random weights,
# eager vs CUDA graphs through replay::GraphedCallable, batch 1/8/32, fp32 and
# fp16, as a torch::nn model and (when torchvision is installed) as a
# TorchScript file written by scripts/make_torchscript_resnet.py.
# Needs PyTorch with CUDA in python3 (its libtorch is what the example links)
# and a CUDA GPU. Extra arguments go to the example (--iterations N, --batches 1,8,32).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/setup-deps.sh
if ! prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
  echo "torch_resnet: needs PyTorch in python3 (pip install torch): its libtorch is what the example links" >&2
  exit 1
fi
cmake --preset default -DREPLAY_WITH_TORCH=ON -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build --preset default --target torch_resnet
args=()
torchscript=build/default/resnet50_torchscript.pt
if python3 -c 'import torchvision' 2>/dev/null; then
  [ -f "$torchscript" ] || python3 scripts/make_torchscript_resnet.py "$torchscript"
  args=(--torchscript "$torchscript")
else
  echo "(torchvision is not installed: the TorchScript model is skipped)"
fi
./build/default/examples/torch_resnet/torch_resnet "${args[@]}" "$@"
