# Finds every library Kiln builds on. A dependency asked for and not found is a configure error,
# never a silent downgrade.

find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
# Kiln uses the C API only; the deprecated C++ bindings would need libmpi_cxx.
add_compile_definitions(OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
find_package(Protobuf 3.12 REQUIRED)
find_package(ZLIB REQUIRED)

set(Boost_USE_STATIC_LIBS ON)  # the GPU machine has Boost headers but no compiled library
find_package(Boost 1.71 REQUIRED COMPONENTS program_options)

set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(KILN_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread
          REQUIRED)

find_path(KILN_TURBOJPEG_INCLUDE_DIR turbojpeg.h REQUIRED)
# Static: libturbojpeg.so.0 is absent on the GPU machine. It holds libjpeg's API as well, which
# the crop decoder calls (data/jpeg_region_decoder.cc): jpeglib.h comes with libjpeg62-turbo-dev.
find_library(KILN_TURBOJPEG_LIBRARY NAMES libturbojpeg.a turbojpeg REQUIRED)
find_path(KILN_JPEGLIB_INCLUDE_DIR jpeglib.h REQUIRED)

set(KILN_WITH_CUDA OFF)
if(NOT KILN_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit 12.0 REQUIRED)
    find_package(CUDNN)
    find_package(NCCL)
    if(NOT CUDNN_FOUND OR NOT NCCL_FOUND)
      message(FATAL_ERROR
        "A CUDA toolkit was found but cuDNN (found: ${CUDNN_FOUND}) or NCCL (found: ${NCCL_FOUND}) "
        "was not. Give their locations with -DCUDNN_ROOT=... / -DNCCL_ROOT=..., or build the CPU "
        "backend alone with -DKILN_CUDA=OFF.")
    endif()
    set(KILN_WITH_CUDA ON)
    # nvJPEG's header for data.decode GPU (the library is opened at run time): the toolkit's, or
    # the nvidia-nvjpeg wheel's that scripts/install-deps.sh installs. Without it Kiln decodes on
    # the host only.
    execute_process(COMMAND python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
                    OUTPUT_VARIABLE _kiln_purelib OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    find_path(KILN_NVJPEG_INCLUDE_DIR nvjpeg.h
      HINTS ${NVJPEG_ROOT} $ENV{NVJPEG_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            ${_kiln_purelib}/nvidia/cu13 ${_kiln_purelib}/nvidia/nvjpeg
      PATH_SUFFIXES include)
    if(NOT KILN_NVJPEG_INCLUDE_DIR)
      message(WARNING "nvjpeg.h not found: data.decode GPU will be unavailable "
                      "(pip install nvidia-nvjpeg, or -DNVJPEG_ROOT=...)")
    endif()
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  elseif(KILN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KILN_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER "
                        "or put nvcc on PATH), or use -DKILN_CUDA=OFF.")
  endif()
endif()
