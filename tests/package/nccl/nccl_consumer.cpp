// Compiles the NCCL component against the installed package, links NCCL and
// calls into it (no device needed).
#include <cstdio>
#include <string>

#include <replay/nccl.hpp>
#include <replay/version.hpp>

int main() {
  const std::string text = ncclGetErrorString(ncclInvalidArgument);
  if (text.empty() || replay::nccl_result_name(ncclInvalidArgument) != "ncclInvalidArgument") {
    std::puts("consumer: replay nccl component: NCCL did not answer");
    return 1;
  }
  std::printf("consumer: replay %s nccl component (NCCL %d.%d.%d headers): ok\n", REPLAY_VERSION_STRING, NCCL_MAJOR,
              NCCL_MINOR, NCCL_PATCH);
  return 0;
}
