# Install rules, the exported targets and the package config files.
# Included at the end of the top-level CMakeLists.txt. Everything lands under
#   <prefix>/include/replay/...           the headers
#   <prefix>/share/cmake/replay/          replayConfig.cmake, replayConfigVersion.cmake,
#                                         replayTargets.cmake, replayDecodeTargets.cmake[,
#                                         replayTorchTargets.cmake, ...]
# share/ rather than lib/: the package is header-only, so one install serves
# every architecture (the version file is ARCH_INDEPENDENT for the same reason).
if(NOT REPLAY_INSTALL)
  return()
endif()

include(CMakePackageConfigHelpers)

set(REPLAY_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/replay"
    CACHE STRING "Where replay's CMake package files go, relative to the install prefix")
mark_as_advanced(REPLAY_INSTALL_CMAKEDIR)

# Compatibility: while the major version is 0, a minor release may break the
# API (semantic versioning's rule for 0.y.z), so a request for 0.1 accepts
# 0.1.z only. From 1.0 on, any 1.y.z satisfies a request for 1.x.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(REPLAY_VERSION_COMPATIBILITY SameMinorVersion)
else()
  set(REPLAY_VERSION_COMPATIBILITY SameMajorVersion)
endif()

# The adapter headers go with the torch component only.
set(_replay_torch_header_regex "/replay/(torch\\.hpp|torch/.*|detail/torch[^/]*)$")
# The NCCL headers go with the nccl component only.
set(_replay_nccl_header_regex "/replay/(nccl\\.hpp|nccl/.*)$")
# The capture audit's headers go with the audit component only.
set(_replay_audit_header_regex "/replay/(audit\\.hpp|audit/.*)$")
# The decode scheduler's headers go with the decode component.
set(_replay_decode_header_regex "/replay/(decode\\.hpp|decode/.*)$")

install(TARGETS replay EXPORT replayTargets)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        COMPONENT replay_Development
        FILES_MATCHING
          PATTERN "*.hpp"
          PATTERN "*.cuh"
          REGEX "${_replay_torch_header_regex}" EXCLUDE
          REGEX "${_replay_nccl_header_regex}" EXCLUDE
          REGEX "${_replay_audit_header_regex}" EXCLUDE
          REGEX "${_replay_decode_header_regex}" EXCLUDE)
install(EXPORT replayTargets
        NAMESPACE replay::
        DESTINATION "${REPLAY_INSTALL_CMAKEDIR}"
        COMPONENT replay_Development)

# replay_install_component(<name> <Name>): an optional component's target
# replay_<name> as replay::<name>, in an export set of its own
# (replay<Name>Targets, install component replay_<Name>) with its headers
# (_replay_<name>_header_regex), so that replayConfig.cmake loads it, and
# looks for its dependency, only when COMPONENTS <name> is asked for.
function(replay_install_component name Name)
  set_target_properties(replay_${name} PROPERTIES EXPORT_NAME ${name})  # replay::<name>, not replay::replay_<name>
  install(TARGETS replay_${name} EXPORT replay${Name}Targets)
  install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
          COMPONENT replay_${Name}
          FILES_MATCHING
            REGEX "${_replay_${name}_header_regex}")
  install(EXPORT replay${Name}Targets
          NAMESPACE replay::
          DESTINATION "${REPLAY_INSTALL_CMAKEDIR}"
          COMPONENT replay_${Name})
endfunction()

# replay_torch is defined by cmake/ReplayTorch.cmake when Torch was found (or
# REPLAY_WITH_TORCH is ON). Its own export set, so that replayConfig.cmake
# loads it, and looks for Torch, only when the torch component is asked for.
if(TARGET replay_torch)
  replay_install_component(torch Torch)
endif()

# replay_nccl (cmake/ReplayNccl.cmake, when NCCL was found): its own export
# set too; replayConfig.cmake finds NCCL with the installed
# replayFindNccl.cmake (which defines NCCL::nccl) only for the nccl component.
if(TARGET replay_nccl)
  replay_install_component(nccl Nccl)
  install(FILES "${PROJECT_SOURCE_DIR}/cmake/ReplayFindNccl.cmake"
          DESTINATION "${REPLAY_INSTALL_CMAKEDIR}" RENAME replayFindNccl.cmake
          COMPONENT replay_Nccl)
endif()

# replay_audit (cmake/ReplayAudit.cmake, when the toolkit has CUPTI): its own
# export set; replayConfig.cmake loads it for the audit component, where the
# consumer's FindCUDAToolkit defines CUDA::cupti.
if(TARGET replay_audit)
  replay_install_component(audit Audit)
endif()

# replay_decode (cmake/ReplayDecode.cmake, always defined): its own export
# set; replayConfig.cmake loads it, and finds the threads library, for the
# decode component only.
if(TARGET replay_decode)
  replay_install_component(decode Decode)
endif()

configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/replayConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/replayConfig.cmake"
  INSTALL_DESTINATION "${REPLAY_INSTALL_CMAKEDIR}"
  NO_SET_AND_CHECK_MACRO)
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/replayConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY ${REPLAY_VERSION_COMPATIBILITY}
  ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/replayConfig.cmake" "${PROJECT_BINARY_DIR}/replayConfigVersion.cmake"
        DESTINATION "${REPLAY_INSTALL_CMAKEDIR}"
        COMPONENT replay_Development)
