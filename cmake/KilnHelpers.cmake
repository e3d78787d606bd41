# kiln_add_library(NAME SOURCES ... [CUDA_SOURCES ...] [DEPS ...] [PRIVATE_DEPS ...])
#   One static library per folder. CUDA_SOURCES are compiled only when the CUDA backend is on.
# kiln_add_test(NAME SOURCES ... LABELS ... [DEPS ...] [MPI_NP n] [TIMEOUT s] [CUDA_SOURCES ...])
#   One GoogleTest binary registered with CTest; MPI_NP runs it under mpirun with n ranks.

set(KILN_ALL_LIBRARIES "" CACHE INTERNAL "")

function(kiln_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --Werror=all-warnings>)
  if(KILN_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
                                             $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>)
  endif()
  if(KILN_FUZZ)
    # Coverage feedback for libFuzzer in every library the fuzz targets reach.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
  endif()
  if(KILN_SANITIZE)
    string(REPLACE ";" "," _san "${KILN_SANITIZE}")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_san} -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=${_san})
  endif()
endfunction()

function(kiln_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;CUDA_SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  set(_sources ${ARG_SOURCES})
  if(KILN_WITH_CUDA)
    list(APPEND _sources ${ARG_CUDA_SOURCES})
  endif()
  add_library(${name} STATIC ${_sources})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>
    $<INSTALL_INTERFACE:include/kiln>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  if(KILN_WITH_CUDA)
    set_target_properties(${name} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
  endif()
  kiln_warnings(${name})
  set(KILN_ALL_LIBRARIES ${KILN_ALL_LIBRARIES} ${name} CACHE INTERNAL "")
endfunction()

function(kiln_add_test name)
  cmake_parse_arguments(ARG "" "MPI_NP;TIMEOUT" "SOURCES;CUDA_SOURCES;LABELS;DEPS" ${ARGN})
  set(_sources ${ARG_SOURCES})
  if(KILN_WITH_CUDA)
    list(APPEND _sources ${ARG_CUDA_SOURCES})
  endif()
  add_executable(${name} ${_sources})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  kiln_warnings(${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  if(ARG_MPI_NP)
    add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
             --timeout ${ARG_TIMEOUT} -np ${ARG_MPI_NP} $<TARGET_FILE:${name}>)
  else()
    add_test(NAME ${name} COMMAND ${name})
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR};KILN_BINARY_DIR=${PROJECT_BINARY_DIR};NCCL_NVLS_ENABLE=0;OMPI_MCA_rmaps_base_oversubscribe=1")
endfunction()

# kiln_add_script_test(NAME SCRIPT LABELS ... [TIMEOUT s]): a process-level test (real `kiln`
# runs, real mpirun, signals) written as a bash script; it gets the kiln binary as $1.
function(kiln_add_script_test name)
  cmake_parse_arguments(ARG "" "SCRIPT;TIMEOUT" "LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_test(NAME ${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/${ARG_SCRIPT} $<TARGET_FILE:kiln_cli>)
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR};MPIEXEC=${MPIEXEC_EXECUTABLE};NCCL_NVLS_ENABLE=0;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endfunction()
