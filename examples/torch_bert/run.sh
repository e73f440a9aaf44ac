#!/usr/bin/env bash
# Builds and runs the torch_bert example: a BERT-base-sized encoder
# (transformers.BertConfig(), random weights, fp16) traced to TorchScript by
# scripts/make_torchscript_bert.py (into the build directory; about 200 MB),
# prepared by replay::load_prepared and graphed per (batch, sequence) bucket,
# checked against the outputs Python computed, then timed.
# Needs PyTorch with CUDA and transformers in python3, and a CUDA GPU. Extra
# arguments go to the example (--shapes 1x16,8x128, --iterations N, --json FILE).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/setup-deps.sh
if ! prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
  echo "torch_bert: needs PyTorch in python3 (pip install torch): its libtorch is what the example links" >&2
  exit 1
fi
cmake --preset default -DREPLAY_WITH_TORCH=ON -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build --preset default --target torch_bert
out=build/default/bert
[ -f "$out/bert_torchscript.pt" ] || python3 scripts/make_torchscript_bert.py "$out"
./build/default/examples/torch_bert/torch_bert --model "$out/bert_torchscript.pt" \
  --reference "$out/bert_reference.pt" "$@"
