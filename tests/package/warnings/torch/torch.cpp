#include <replay/torch.hpp>
