# ggml's Vulkan backend as one more run-time module, libggml-vulkan.so, beside the
# CPU ones (ELELEM_VULKAN=ON; setup.py turns it on for ELELEM_VULKAN=1 or
# CMAKE_ARGS="-DGGML_VULKAN=ON").
#
# Built with the build machine's glslc, Vulkan loader and SPIR-V headers (Debian 12:
# glslc libvulkan-dev spirv-headers), but with the Vulkan headers vendored under
# third_party/vulkan-headers (1.4.309, one tarball unpacked into the build folder):
# ggml-vulkan.cpp uses vk::LayerSettingEXT unguarded, which Debian 12's 1.3.239
# headers lack.  Shader extensions the local
# glslc does not know (cooperative matrices, integer dot products, bfloat16, fp8/fp4
# on Debian 12's glslc 2023.2) are probed and left out by ggml's own CMake.
#
# The module links libvulkan.so.1, the system's loader: where it is missing the
# module fails to load and elelem logs that and runs on the CPU.
option(ELELEM_VULKAN "build ggml's Vulkan backend module libggml-vulkan.so" OFF)

macro(elelem_configure_vulkan)
    if (ELELEM_VULKAN)
        set(GGML_VULKAN ON CACHE BOOL "" FORCE)
        set(_elelem_vk_tarball ${CMAKE_CURRENT_SOURCE_DIR}/../third_party/vulkan-headers/include.tar.xz)
        if (NOT EXISTS ${_elelem_vk_tarball})
            message(FATAL_ERROR "third_party/vulkan-headers is missing; restore it with: "
                                "python scripts/vendor_vulkan_headers.py")
        endif()
        set(_elelem_vk_headers ${CMAKE_BINARY_DIR}/vulkan-headers/include)
        file(SHA256 ${_elelem_vk_tarball} _elelem_vk_sha)
        set(_elelem_vk_stamp ${CMAKE_BINARY_DIR}/vulkan-headers/unpacked-${_elelem_vk_sha})
        if (NOT EXISTS ${_elelem_vk_stamp})   # unpacked once per tarball
            file(REMOVE_RECURSE ${CMAKE_BINARY_DIR}/vulkan-headers)
            file(ARCHIVE_EXTRACT INPUT ${_elelem_vk_tarball} DESTINATION ${CMAKE_BINARY_DIR}/vulkan-headers)
            file(TOUCH ${_elelem_vk_stamp})
        endif()
        # FindVulkan takes a cached include dir as given: the loader is still the system's.
        set(Vulkan_INCLUDE_DIR ${_elelem_vk_headers} CACHE PATH "" FORCE)
    endif()
endmacro()
