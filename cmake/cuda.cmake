# The optional GPU path: CUDA codecs (compression/cuda), the NCCL Comm
# (transport/nccl) and the NCCL interposer (plugin/nccl_interposer).
#
# Included by the top-level CMakeLists.txt after the global compile options
# and before the layers. Sets:
#   COMPCOLL_HAVE_CUDA  nvcc works: the kernels (compcoll_cuda) and tests/gpu
#                       are built.
#   COMPCOLL_HAVE_NCCL  the CUDA headers and nccl.h were found: the NCCL Comm,
#                       the interposer and tests/interposer are built. These
#                       need headers only: NCCL and the CUDA driver are loaded
#                       at run time with dlopen, so they build (and their CPU
#                       tests run) on machines without a GPU.
#
# COMPCOLL_WITH_CUDA: AUTO (default) builds whatever the toolkit found allows;
# ON fails the configure when nvcc or nccl.h is missing; OFF skips the lot.
set(COMPCOLL_WITH_CUDA AUTO CACHE STRING
  "Build the CUDA kernels, the NCCL transport and the NCCL interposer (AUTO, ON or OFF)")
set_property(CACHE COMPCOLL_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)

set(COMPCOLL_HAVE_CUDA OFF)
set(COMPCOLL_HAVE_NCCL OFF)

if(NOT COMPCOLL_WITH_CUDA STREQUAL "OFF")
  # One architecture keeps the build short on small machines: sm_90 SASS plus
  # compute_90 PTX (which the driver JIT-compiles for newer GPUs). Override
  # with -DCMAKE_CUDA_ARCHITECTURES=... for other GPUs.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  # The toolkit's usual home when nvcc is not on PATH.
  if(NOT DEFINED ENV{CUDACXX} AND NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # C++20 for .cu files too (compression's headers use std::span). CMake
    # 3.25 does not know nvcc's C++20 flag; tell it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(COMPCOLL_HAVE_CUDA ON)
    # The global options above (-Wall, -Wno-restrict, ...) are GCC options
    # that nvcc rejects: keep them to C and C++ sources.
    get_directory_property(_compcoll_opts COMPILE_OPTIONS)
    set(_compcoll_wrapped "")
    foreach(_o IN LISTS _compcoll_opts)
      list(APPEND _compcoll_wrapped "$<$<COMPILE_LANGUAGE:C,CXX>:${_o}>")
    endforeach()
    set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_compcoll_wrapped}")
  endif()

  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(COMPCOLL_NCCL_INCLUDE_DIR nccl.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
    if(COMPCOLL_NCCL_INCLUDE_DIR)
      set(COMPCOLL_HAVE_NCCL ON)
    endif()
  endif()

  if(COMPCOLL_WITH_CUDA STREQUAL "ON" AND NOT (COMPCOLL_HAVE_CUDA AND COMPCOLL_HAVE_NCCL))
    message(FATAL_ERROR "COMPCOLL_WITH_CUDA=ON but nvcc (${CMAKE_CUDA_COMPILER}) or nccl.h "
      "(${COMPCOLL_NCCL_INCLUDE_DIR}) was not found; set CUDACXX or CUDAToolkit_ROOT")
  endif()
endif()

message(STATUS "compcoll GPU path: CUDA kernels ${COMPCOLL_HAVE_CUDA} "
  "(architectures ${CMAKE_CUDA_ARCHITECTURES}), NCCL transport and interposer ${COMPCOLL_HAVE_NCCL}")

# Headers the NCCL transport and the interposer compile against (no library:
# both are dlopen'ed at run time).
if(COMPCOLL_HAVE_NCCL AND NOT TARGET compcoll_nccl_headers)
  add_library(compcoll_nccl_headers INTERFACE)
  target_include_directories(compcoll_nccl_headers SYSTEM INTERFACE
    ${COMPCOLL_NCCL_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
endif()
