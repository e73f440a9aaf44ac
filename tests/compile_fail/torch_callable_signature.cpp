// GraphedCallable with a callable that does not take tensors is refused with
// a message that says what it accepts.
// expect-error: GraphedCallable needs a TensorCallable
#include <replay/torch.hpp>

void make(std::vector<at::Tensor> examples) {
  replay::GraphedCallable graphed([](int x) { return x; }, std::move(examples));
}
