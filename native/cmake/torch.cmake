# Which libtorch the addon builds against. LIBTORCH (a cmake -D variable, or the environment
# variable of that name) names it:
#   unset           Debian's libtorch-dev 1.13 (the CPU default and CI's build)
#   <folder>        a libtorch prefix or a PyTorch package folder (.../site-packages/torch): both
#                   hold include/, lib/ and share/cmake/Torch. scripts/setup.sh fills it from
#                   `python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'` on GPU machines.
# A PyTorch built with CUDA asks for the CUDA toolkit when its CMake config is read. With a toolkit
# (a GPU machine) that config is used as is; without one (checking the PyTorch 2.x build on a CPU
# machine) its CPU libraries are imported directly, and the addon then reports `cuda: false`.
# Sets TORCH_LINK (what to link), PRIME_TORCH_DESC (one line for the build log), and, where
# PyTorch's CUDA libraries are linked, PRIME_TORCH_CUDA with PRIME_CUDA_INCLUDE (the CUDA runtime's
# headers, which ATen's CUDA headers include: CUDA graphs of the decode step, src/decode_graph.cc)
# and PRIME_NCCL_INCLUDE (nccl.h, for c10d's NCCL process group; empty where none is found).

if(NOT DEFINED LIBTORCH AND DEFINED ENV{LIBTORCH})
  set(LIBTORCH "$ENV{LIBTORCH}")
endif()

if(NOT LIBTORCH)
  find_package(Torch REQUIRED)
  set(TORCH_LINK ${TORCH_LIBRARIES})
  set(PRIME_TORCH_DESC "system libtorch (${Torch_DIR})")
  return()
endif()

# A path from torch.utils.cmake_prefix_path (<torch>/share/cmake) names the same installation.
get_filename_component(LIBTORCH "${LIBTORCH}" ABSOLUTE)
if(EXISTS "${LIBTORCH}/Torch/TorchConfig.cmake")
  get_filename_component(LIBTORCH "${LIBTORCH}/../.." ABSOLUTE)
endif()
if(NOT EXISTS "${LIBTORCH}/share/cmake/Torch/TorchConfig.cmake")
  message(FATAL_ERROR "LIBTORCH=${LIBTORCH}: no share/cmake/Torch/TorchConfig.cmake there; give a libtorch "
                      "prefix or a PyTorch package folder (python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')")
endif()

# PRIME_TORCH_DIRECT=ON skips PyTorch's CMake config and links its libraries directly, CUDA's too
# (torch_cuda, c10_cuda: what registers the CUDA kernels; the addon calls no CUDA API itself, so
# no toolkit is needed). scripts/gpu/run.sh falls back to it when the config does not configure.
option(PRIME_TORCH_DIRECT "link PyTorch's libraries directly, CUDA's included, without its CMake config" OFF)
set(_torch_lib "${LIBTORCH}/lib")
if(EXISTS "${_torch_lib}/libtorch_cuda.so" AND NOT PRIME_TORCH_DIRECT)
  find_package(CUDAToolkit QUIET)
endif()
if((NOT EXISTS "${_torch_lib}/libtorch_cuda.so" OR CUDAToolkit_FOUND) AND NOT PRIME_TORCH_DIRECT)
  find_package(Torch REQUIRED PATHS "${LIBTORCH}/share/cmake/Torch" NO_DEFAULT_PATH)
  set(TORCH_LINK ${TORCH_LIBRARIES})
  if(CUDAToolkit_FOUND)
    set(PRIME_TORCH_DESC "libtorch in ${LIBTORCH} with CUDA ${CUDAToolkit_VERSION}")
    set(PRIME_TORCH_CUDA ON)
    set(PRIME_CUDA_INCLUDE ${CUDAToolkit_INCLUDE_DIRS})
  else()
    set(PRIME_TORCH_DESC "libtorch in ${LIBTORCH} (CPU build)")
  endif()
else()
  # The CPU half of a CUDA build: torch_cpu and c10 need only the CUDA runtime and CUPTI shared
  # libraries at load time (pip's nvidia-cuda-runtime / nvidia-cuda-cupti), not the toolkit.
  set(_libs c10 torch_cpu)
  if(PRIME_TORCH_DIRECT AND EXISTS "${_torch_lib}/libtorch_cuda.so")
    list(APPEND _libs c10_cuda torch_cuda)
  endif()
  foreach(_lib ${_libs})
    find_library(_path_${_lib} ${_lib} PATHS "${_torch_lib}" NO_DEFAULT_PATH REQUIRED)
    list(APPEND TORCH_LINK "${_path_${_lib}}")
  endforeach()
  if(PRIME_TORCH_DIRECT)
    # Nothing of torch_cuda is referenced by name: keep it linked so loading the addon loads it.
    list(PREPEND TORCH_LINK "-Wl,--no-as-needed")
    list(APPEND TORCH_LINK "-Wl,--as-needed")
  endif()
  set(_torch_include "${LIBTORCH}/include" "${LIBTORCH}/include/torch/csrc/api/include")
  add_library(prime_torch_cpu INTERFACE)
  target_include_directories(prime_torch_cpu SYSTEM INTERFACE ${_torch_include})
  target_compile_definitions(prime_torch_cpu INTERFACE USE_DISTRIBUTED USE_C10D_GLOO)
  set(TORCH_LINK prime_torch_cpu ${TORCH_LINK})
  if(PRIME_TORCH_DIRECT)
    set(PRIME_TORCH_DESC "libraries of the libtorch in ${LIBTORCH}, linked directly (${_libs})")
    if(EXISTS "${_torch_lib}/libtorch_cuda.so")
      # The CUDA runtime's headers: a toolkit's, or those of pip's nvidia-cuda-runtime beside a
      # PyTorch package (site-packages/nvidia/cu13 or, CUDA 12, nvidia/cuda_runtime).
      set(PRIME_TORCH_CUDA ON)
      find_package(CUDAToolkit QUIET)
      find_path(PRIME_CUDA_INCLUDE cuda_runtime_api.h
        HINTS ${CUDAToolkit_INCLUDE_DIRS} "${LIBTORCH}/../nvidia/cu13/include" "${LIBTORCH}/../nvidia/cuda_runtime/include"
        NO_DEFAULT_PATH)
    endif()
  else()
    set(PRIME_TORCH_DESC "CPU libraries of the CUDA libtorch in ${LIBTORCH} (no CUDA toolkit found)")
  endif()
endif()
# nccl.h, which c10d's ProcessGroupNCCL.hpp includes (src/dist.cc): a toolkit's, or that of pip's
# nvidia-nccl beside a PyTorch package.
if(PRIME_TORCH_CUDA)
  find_path(PRIME_NCCL_INCLUDE nccl.h
    HINTS ${PRIME_CUDA_INCLUDE} "${LIBTORCH}/../nvidia/nccl/include" "${LIBTORCH}/../nvidia/cu13/include"
    NO_DEFAULT_PATH)
  if(NOT PRIME_NCCL_INCLUDE)
    set(PRIME_NCCL_INCLUDE "")
  endif()
endif()
# The addon finds libtorch where it was built against, wherever node loads it from.
set(CMAKE_BUILD_RPATH "${_torch_lib}")
