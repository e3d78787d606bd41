# Finds cuDNN 9: in CUDNN_ROOT, then the CUDA toolkit, then the system folders.
# Defines CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION and the target CUDNN::cudnn.
set(_kiln_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _kiln_cudnn_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
find_path(CUDNN_INCLUDE_DIR cudnn_version.h
  HINTS ${_kiln_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include include/x86_64-linux-gnu)
find_library(CUDNN_LIBRARY NAMES cudnn
  HINTS ${_kiln_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
if(CUDNN_INCLUDE_DIR)
  file(READ "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _kiln_cudnn_header)
  string(REGEX MATCH "define CUDNN_MAJOR ([0-9]+)" _ "${_kiln_cudnn_header}")
  set(_major ${CMAKE_MATCH_1})
  string(REGEX MATCH "define CUDNN_MINOR ([0-9]+)" _ "${_kiln_cudnn_header}")
  set(_minor ${CMAKE_MATCH_1})
  set(CUDNN_VERSION "${_major}.${_minor}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
                                  VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
