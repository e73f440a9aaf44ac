# Overlay port: builds the replay checkout this port lives in
# (vcpkg install replay --overlay-ports=<checkout>/ports). A port in the vcpkg
# registry would fetch a release instead, once replay has a public
# repository and release tags (it has neither yet), with vcpkg_from_github.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

# header only library
set(VCPKG_BUILD_TYPE release)

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DREPLAY_BUILD_TESTS=OFF
        -DREPLAY_BUILD_BENCHMARKS=OFF
        -DREPLAY_BUILD_EXAMPLES=OFF
        -DREPLAY_INSTALL=ON
        -DREPLAY_WITH_TORCH=OFF
        -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON
        -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON
)

vcpkg_cmake_install()
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/replay)

file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug" "${CURRENT_PACKAGES_DIR}/lib")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
