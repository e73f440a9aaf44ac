#pragma once
// ResNet-50 in C++ with torch::nn, the same architecture and initialization
// as torchvision.models.resnet50(weights=None) (ResNet v1.5: the stride sits
// on the 3x3 convolution of a bottleneck). Random weights; nothing is
// downloaded. Shared by the torch_resnet example, the adapter's tests and the
// benchmark.
#include <torch/torch.h>

#include <cstdint>

namespace replay_examples {

inline torch::nn::Conv2d resnet_conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                                     std::int64_t padding) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

struct BottleneckImpl : torch::nn::Module {
  static constexpr std::int64_t expansion = 4;

  BottleneckImpl(std::int64_t in_planes, std::int64_t planes, std::int64_t stride)
      : conv1(register_module("conv1", resnet_conv(in_planes, planes, 1, 1, 0))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(planes))),
        conv2(register_module("conv2", resnet_conv(planes, planes, 3, stride, 1))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(planes))),
        conv3(register_module("conv3", resnet_conv(planes, planes * expansion, 1, 1, 0))),
        bn3(register_module("bn3", torch::nn::BatchNorm2d(planes * expansion))) {
    if (stride != 1 || in_planes != planes * expansion) {
      downsample = register_module(
          "downsample", torch::nn::Sequential(resnet_conv(in_planes, planes * expansion, 1, stride, 0),
                                              torch::nn::BatchNorm2d(planes * expansion)));
    }
  }

  // In-place ReLU and residual add, as torchvision's nn.ReLU(inplace=True) and `out += identity`.
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor identity = downsample ? downsample->forward(x) : x;
    torch::Tensor out = bn1(conv1(x)).relu_();
    out = bn2(conv2(out)).relu_();
    out = bn3(conv3(out));
    out += identity;
    return out.relu_();
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Conv2d conv3;
  torch::nn::BatchNorm2d bn3;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ResNetImpl : torch::nn::Module {
  explicit ResNetImpl(std::int64_t num_classes = 1000)
      : conv1(register_module("conv1", resnet_conv(3, 64, 7, 2, 3))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(64))),
        layer1(register_module("layer1", make_layer(64, 3, 1))),
        layer2(register_module("layer2", make_layer(128, 4, 2))),
        layer3(register_module("layer3", make_layer(256, 6, 2))),
        layer4(register_module("layer4", make_layer(512, 3, 2))),
        fc(register_module("fc", torch::nn::Linear(512 * BottleneckImpl::expansion, num_classes))) {
    // torchvision's initialization: He-normal (fan_out) convolutions, BN as identity.
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* conv = module->as<torch::nn::Conv2d>()) {
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
        torch::nn::init::ones_(bn->weight);
        torch::nn::init::zeros_(bn->bias);
      }
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = bn1(conv1(x)).relu_();
    x = torch::max_pool2d(x, /*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
    x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc->forward(x);
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  std::int64_t in_planes = 64;
  torch::nn::Sequential layer1;
  torch::nn::Sequential layer2;
  torch::nn::Sequential layer3;
  torch::nn::Sequential layer4;
  torch::nn::Linear fc;

 private:
  torch::nn::Sequential make_layer(std::int64_t planes, int blocks, std::int64_t stride) {
    torch::nn::Sequential layer;
    layer->push_back(Bottleneck(in_planes, planes, stride));
    in_planes = planes * BottleneckImpl::expansion;
    for (int i = 1; i < blocks; ++i) {
      layer->push_back(Bottleneck(in_planes, planes, 1));
    }
    return layer;
  }
};
TORCH_MODULE(ResNet);

// ResNet-50 in eval mode on `device` in `dtype`.
inline ResNet resnet50(torch::Device device, torch::Dtype dtype, std::int64_t num_classes = 1000) {
  ResNet model(num_classes);
  model->eval();
  model->to(device, dtype);
  return model;
}

}  // namespace replay_examples
