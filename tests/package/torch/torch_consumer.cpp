// Compiles the adapter header against the installed package and libtorch.
#include <cstdio>

#include <replay/torch.hpp>
#include <replay/version.hpp>

int main() {
  std::printf("replay %s with its torch adapter\n", REPLAY_VERSION_STRING);
  return 0;
}
