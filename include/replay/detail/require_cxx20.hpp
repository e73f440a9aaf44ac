#pragma once
// Included first by every public header: replay needs C++20 (concepts,
// std::source_location, std::span). Without it a consumer would see a wall of
// unrelated errors; this gives one that names the fix.
#if (defined(_MSVC_LANG) && _MSVC_LANG < 202002L) || (!defined(_MSVC_LANG) && __cplusplus < 202002L)
#error "replay needs C++20. Compile with -std=c++20 (nvcc too); in CMake: target_compile_features(<target> PUBLIC cxx_std_20 cuda_std_20), with CMake 3.25.2 or newer for CUDA sources."
// Stop here: the rest of replay would only add errors that hide this one.
#include <replay-needs-cxx20-see-the-error-above>
#endif
