# install() rules and the exported CMake package: find_package(Kiln) then link Kiln::kiln.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(kiln_framework INTERFACE)
target_link_libraries(kiln_framework INTERFACE ${KILN_ALL_LIBRARIES})
set_target_properties(kiln_framework PROPERTIES EXPORT_NAME kiln)
add_library(Kiln::kiln ALIAS kiln_framework)

install(TARGETS ${KILN_ALL_LIBRARIES} kiln_framework EXPORT KilnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln)
if(TARGET kiln_cli)
  install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
foreach(dir core layers optim comm data train infer launch)
  install(DIRECTORY ${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/${dir}
          FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/configs/kiln.pb.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/configs OPTIONAL)
install(FILES ${PROJECT_BINARY_DIR}/third_party/onnx/onnx.pb.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/third_party/onnx OPTIONAL)
install(FILES configs/kiln.proto DESTINATION ${CMAKE_INSTALL_DATADIR}/kiln)
install(DIRECTORY configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/kiln/configs
        FILES_MATCHING PATTERN "*.pbtxt")
install(EXPORT KilnTargets NAMESPACE Kiln:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/KilnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/KilnConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/KilnConfig.cmake ${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake
              cmake/FindCUDNN.cmake cmake/FindNCCL.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)
