# Installation: headers, libcompcoll, the tools, a CMake package
# (find_package(compcoll) -> compcoll::compcoll) and a pkg-config file.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS compcoll EXPORT compcollTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES include/compcoll/compcoll.h include/compcoll/compcoll.hpp
  include/compcoll/nccl_interposer.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/compcoll)
install(TARGETS compcoll-info compcoll-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT compcollTargets NAMESPACE compcoll::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/compcoll)
configure_package_config_file(cmake/compcollConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/compcollConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/compcoll)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/compcollConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/compcollConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/compcollConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/compcoll)
configure_file(cmake/compcoll.pc.in ${CMAKE_CURRENT_BINARY_DIR}/compcoll.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/compcoll.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
