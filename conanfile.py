import os
import re

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load, replace_in_file
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


class ReplayConan(ConanFile):
    name = "replay"
    license = "MIT"
    description = "CUDA Graphs and multi-stream pipelines made easy, safe and fast (header-only C++20)"
    # No homepage or url: replay has no public repository or release yet.
    topics = ("cuda", "cuda-graphs", "streams", "inference", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # CMakeLists.txt holds the one version (set_version reads it) and the
    # minimum CUDA version (package() writes it into the build module).
    exports_sources = "CMakeLists.txt", "include/*", "cmake/replay-conan-targets.cmake", "LICENSE*"
    no_copy_source = True

    def set_version(self):
        cmakelists_path = os.path.join(self.recipe_folder, "CMakeLists.txt")
        if self.version and not os.path.exists(cmakelists_path):
            return
        version = self._cmake_setting(load(self, cmakelists_path),
                                      r"project\(\s*replay\b[^)]*?\bVERSION\s+([0-9]+\.[0-9]+\.[0-9]+)")
        if self.version and str(self.version) != version:
            raise ConanException(f"--version {self.version} disagrees with CMakeLists.txt's project(VERSION {version})")
        self.version = version

    @staticmethod
    def _cmake_setting(cmakelists, pattern):
        match = re.search(pattern, cmakelists)
        if not match:
            raise ConanException(f"conanfile.py: CMakeLists.txt has no match for {pattern}")
        return match.group(1)

    def layout(self):
        basic_layout(self, src_folder=".")

    def package_id(self):
        self.info.clear()

    def validate(self):
        check_min_cppstd(self, 20)
        if self.settings.os not in ("Linux", "Windows"):
            raise ConanInvalidConfiguration(f"{self.ref} needs the CUDA toolkit, which exists for Linux and Windows only")

    def build(self):
        pass

    def package(self):
        copy(self, "LICENSE*", self.source_folder, os.path.join(self.package_folder, "licenses"))
        # Every header, the libtorch adapter's too: package_id() is cleared, so
        # the package cannot vary by option; replay::torch is made at
        # find_package time, and only when COMPONENTS torch finds Torch.
        copy(self, "*.hpp", os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))
        build_module_dir = os.path.join(self.package_folder, self._build_module_dir)
        copy(self, "replay-conan-targets.cmake", os.path.join(self.source_folder, "cmake"), build_module_dir)
        cuda_min = self._cmake_setting(load(self, os.path.join(self.source_folder, "CMakeLists.txt")),
                                       r"set\(REPLAY_CUDATOOLKIT_MIN_VERSION\s+([0-9.]+)\)")
        replace_in_file(self, os.path.join(build_module_dir, "replay-conan-targets.cmake"),
                        "@REPLAY_CUDATOOLKIT_MIN_VERSION@", cuda_min)

    @property
    def _build_module_dir(self):
        return os.path.join("share", "conan", "replay")

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "replay")
        self.cpp_info.set_property("cmake_target_name", "replay::replay")
        major = int(str(self.version).split(".")[0])
        self.cpp_info.set_property("cmake_config_version_compat",
                                   "SameMinorVersion" if major == 0 else "SameMajorVersion")
        # CUDA comes from the system, not from Conan: the build module finds the
        # CUDA toolkit, links the one CUDA runtime the consuming target asks for
        # (CUDA_RUNTIME_LIBRARY), asks for C++20 for .cu files and defines
        # replay::decode for COMPONENTS decode, replay::torch for COMPONENTS torch.
        self.cpp_info.set_property("cmake_build_modules",
                                   [os.path.join(self._build_module_dir, "replay-conan-targets.cmake")])
