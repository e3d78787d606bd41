# Finds NCCL: in NCCL_ROOT, then the CUDA toolkit, then the system folders.
# Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the target NCCL::nccl.
set(_kiln_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _kiln_nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_kiln_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl
  HINTS ${_kiln_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
if(NCCL_INCLUDE_DIR)
  file(READ "${NCCL_INCLUDE_DIR}/nccl.h" _kiln_nccl_header)
  string(REGEX MATCH "define NCCL_MAJOR ([0-9]+)" _ "${_kiln_nccl_header}")
  set(_major ${CMAKE_MATCH_1})
  string(REGEX MATCH "define NCCL_MINOR ([0-9]+)" _ "${_kiln_nccl_header}")
  set(_minor ${CMAKE_MATCH_1})
  set(NCCL_VERSION "${_major}.${_minor}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
