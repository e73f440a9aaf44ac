# REPLAY_SANITIZE: replay's own tests and examples built under the compiler's
# sanitizers (scripts/test.sh --sanitize address|thread; the sanitize-*
# presets). Every target of this project gets them, the host code of its CUDA
# sources too, so that what the host tests run (the policies, the schedulers,
# the server with its threads) is checked as a whole. The device code is
# compute-sanitizer's (scripts/gpu-check.sh), and the gpu cases are not run
# under these: the CUDA driver is not built for them.
set(REPLAY_SANITIZE "" CACHE STRING
    "Build replay's tests and examples under these sanitizers: address,undefined or thread (empty: none)")
set_property(CACHE REPLAY_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")
if(REPLAY_SANITIZE)
  if(NOT REPLAY_SANITIZE MATCHES "^(address,undefined|thread)$")
    message(FATAL_ERROR "replay: REPLAY_SANITIZE=${REPLAY_SANITIZE}: use address,undefined or thread "
                        "(ThreadSanitizer cannot be combined with AddressSanitizer)")
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$")
    message(FATAL_ERROR "replay: REPLAY_SANITIZE needs GCC or Clang as the C++ and CUDA host compiler; "
                        "this is ${CMAKE_CXX_COMPILER_ID}")
  endif()
  # nvcc splits -Xcompiler's value at commas: one -fsanitize= per sanitizer.
  string(REPLACE "," ";" _replay_sanitizers "${REPLAY_SANITIZE}")
  set(_replay_sanitize_flags "")
  foreach(sanitizer IN LISTS _replay_sanitizers)
    list(APPEND _replay_sanitize_flags -fsanitize=${sanitizer})
  endforeach()
  # A report ends the program with a failing status, undefined behaviour included.
  list(APPEND _replay_sanitize_flags -fno-sanitize-recover=all -fno-omit-frame-pointer)
  list(JOIN _replay_sanitize_flags "," _replay_sanitize_cuda)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_replay_sanitize_flags}>"
                      "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_replay_sanitize_cuda}>")
  add_link_options(-fsanitize=${REPLAY_SANITIZE})
  message(STATUS "replay: tests and examples built with -fsanitize=${REPLAY_SANITIZE}")
  unset(_replay_sanitizers)
  unset(_replay_sanitize_flags)
  unset(_replay_sanitize_cuda)
endif()
