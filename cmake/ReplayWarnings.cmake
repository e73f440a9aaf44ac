# Warnings for replay's own targets (never pushed onto consumers).
function(replay_target_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --extended-lambda>)
  # Under the sanitizers (cmake/ReplaySanitize.cmake) GCC's flow warnings
  # read the instrumentation and report what is not there, in the standard
  # library's std::function and char_traits: off in those builds only.
  if(REPLAY_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized -Wno-restrict>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wno-maybe-uninitialized,-Wno-restrict>)
  endif()
endfunction()
