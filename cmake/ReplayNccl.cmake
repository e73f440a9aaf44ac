# The optional NCCL component: INTERFACE target replay_nccl (alias
# replay::nccl) = replay::replay + NCCL::nccl, for include/replay/nccl.hpp
# (communicators, collectives captured in graphs, the multi-rank router).
#
#   -DREPLAY_WITH_NCCL=ON                   NCCL is required (configure fails without it)
#   (default)                               NCCL is used when found, looked for quietly
#                                           (as a subproject only when asked, or when the
#                                           parent already defined NCCL::nccl)
#   -DNCCL_ROOT=<prefix>                    where to look first (a system NCCL or the
#                                           nvidia-nccl-cu13 wheel's nvidia/nccl folder)
#   -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON    never look for NCCL
#
# Without NCCL nothing else changes: the component's tests and example are
# simply not defined (REPLAY_NCCL_FOUND is FALSE). cmake/ReplayFindNccl.cmake
# says where it looks.
option(REPLAY_WITH_NCCL "Require NCCL and build the replay::nccl component" OFF)
set(REPLAY_NCCL_FOUND FALSE)

if(CMAKE_DISABLE_FIND_PACKAGE_NCCL AND NOT REPLAY_WITH_NCCL)
  return()
endif()
if(NOT PROJECT_IS_TOP_LEVEL AND NOT REPLAY_WITH_NCCL AND NOT TARGET NCCL::nccl)
  return()
endif()

include(${CMAKE_CURRENT_LIST_DIR}/ReplayFindNccl.cmake)
if(NOT NCCL_FOUND)
  if(REPLAY_WITH_NCCL)
    message(FATAL_ERROR "replay: REPLAY_WITH_NCCL is ON but NCCL was not found (nccl.h: ${NCCL_INCLUDE_DIR}, "
                        "library: ${NCCL_LIBRARY}). Set NCCL_ROOT to a folder with include/nccl.h and "
                        "lib/libnccl.so (or the nvidia-nccl-cu13 wheel's nvidia/nccl folder).")
  endif()
  message(STATUS "replay: NCCL not found: the NCCL component (replay::nccl) is not built "
                 "(set NCCL_ROOT, or REPLAY_WITH_NCCL=ON to require it)")
  return()
endif()
set(REPLAY_NCCL_FOUND TRUE)
message(STATUS "replay: NCCL ${NCCL_VERSION} found (${NCCL_LIBRARY}): building the NCCL component")

add_library(replay_nccl INTERFACE)
add_library(replay::nccl ALIAS replay_nccl)
target_link_libraries(replay_nccl INTERFACE replay::replay NCCL::nccl)
