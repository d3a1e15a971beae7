# What `cmake --install build --prefix P` puts under P, the CMake package that
# find_package(chorus) reads, the pkg-config file, and the Debian packages that
# `cpack -G DEB` makes from the same rules (docs/install.md says how each is used).
#
# Three install components, one Debian package each:
#   runtime  chorus        the programs (chorusrun, chorus-bench, chorus-trace,
#                          chorus-mnist) and the shared libraries libchorus_comm.so.0.3
#                          and libchorus_torch.so.0.3
#   dev      chorus-dev    include/chorus/, the linker names (.so), libchorus_comm.a,
#                          lib/cmake/chorus/ and lib/pkgconfig/chorus.pc
#   python   python3-chorus  the torch.distributed backend, torch_chorus, into
#                          CHORUS_PYTHON_INSTALL_DIR
#
# The programs link chorus statically (as in the build tree), so each runs without
# LD_LIBRARY_PATH from any prefix; the shared libraries are for other programs. Before
# 1.0 the SONAME carries the minor version: 0.2 and 0.3 need not be compatible.
include(CMakePackageConfigHelpers)

set(CHORUS_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/chorus)
set(CHORUS_PYTHON_INSTALL_DIR lib/python3/dist-packages CACHE STRING
    "Where torch_chorus goes, relative to the prefix (Debian's directory for Python 3 modules; for another prefix add PREFIX/<this> to PYTHONPATH)")
set(CHORUS_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})

set_target_properties(chorus_comm_shared PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${CHORUS_SOVERSION} EXPORT_NAME comm)
set_target_properties(chorus_comm PROPERTIES EXPORT_NAME comm_static)

install(TARGETS chorus_comm_shared EXPORT chorusCommTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(TARGETS chorus_comm EXPORT chorusCommTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(EXPORT chorusCommTargets NAMESPACE chorus:: DESTINATION ${CHORUS_CMAKE_INSTALL_DIR}
  COMPONENT dev)

# The headers: chorus/*.h, chorus/torch/*.h and the generated chorus/version.h.
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/chorus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT dev FILES_MATCHING PATTERN "*.h")
install(FILES ${CHORUS_GENERATED_INCLUDE}/chorus/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/chorus COMPONENT dev)

install(TARGETS chorusrun chorus-bench chorus-trace RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  COMPONENT runtime)

set(CHORUS_HAS_TORCH OFF)
if(TARGET chorus_torch)
  set(CHORUS_HAS_TORCH ON)
  # Both halves of chorus_torch (DDP, process group, checkpoints; datasets, sampler,
  # loader) in one shared library.
  add_library(chorus_torch_shared SHARED $<TARGET_OBJECTS:chorus_torch_objects>
                                         $<TARGET_OBJECTS:chorus_torch_data_objects>)
  chorus_public_interface(chorus_torch_shared)
  target_link_libraries(chorus_torch_shared PUBLIC chorus_comm_shared ${TORCH_LIBRARIES}
                        PRIVATE ZLIB::ZLIB)
  set_target_properties(chorus_torch_shared PROPERTIES OUTPUT_NAME chorus_torch
    VERSION ${PROJECT_VERSION} SOVERSION ${CHORUS_SOVERSION} EXPORT_NAME torch)
  install(TARGETS chorus_torch_shared EXPORT chorusTorchTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
  install(EXPORT chorusTorchTargets NAMESPACE chorus:: DESTINATION ${CHORUS_CMAKE_INSTALL_DIR}
    COMPONENT dev)
  install(TARGETS chorus-mnist RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
endif()

if(SKBUILD)  # pip install . (pyproject.toml): the package sits at the wheel's root
  set(CHORUS_PYTHON_INSTALL_DIR .)
endif()
if(TARGET torch_chorus_ext)
  install(TARGETS torch_chorus_ext LIBRARY DESTINATION ${CHORUS_PYTHON_INSTALL_DIR}/torch_chorus
    COMPONENT python)
  install(FILES ${CMAKE_SOURCE_DIR}/python/torch_chorus/__init__.py
    DESTINATION ${CHORUS_PYTHON_INSTALL_DIR}/torch_chorus COMPONENT python)
endif()

configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/chorusConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cmake/chorusConfig.cmake INSTALL_DESTINATION ${CHORUS_CMAKE_INSTALL_DIR})
# 0.x: a minor version may break what the one before it offered.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/chorusConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/chorusConfig.cmake
              ${CMAKE_BINARY_DIR}/cmake/chorusConfigVersion.cmake
  DESTINATION ${CHORUS_CMAKE_INSTALL_DIR} COMPONENT dev)

# pkg-config, chorus_comm only (chorus_torch needs Torch's CMake package).
file(RELATIVE_PATH CHORUS_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" CHORUS_PC_TO_PREFIX "${CHORUS_PC_TO_PREFIX}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/chorus.pc.in ${CMAKE_BINARY_DIR}/chorus.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/chorus.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT dev)

# ---- Debian packages: cpack -G DEB in the build directory ----
set(CPACK_PACKAGE_NAME chorus)
set(CPACK_PACKAGE_VENDOR "chorus developers")
set(CPACK_PACKAGE_CONTACT "chorus developers <chorus@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "data-parallel training with its own collective library")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_COMPONENTS_ALL runtime dev)
if(TARGET torch_chorus_ext)
  list(APPEND CPACK_COMPONENTS_ALL python)
endif()
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# Depends from the ELF files (dpkg-shlibdeps): libc6, libstdc++6, libssl3, zlib1g,
# libtorch1.13, ... and, for the Python module, libtorch1.13's libtorch_python.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME chorus)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION science)
# A shlibs file for packages built against these libraries, and the ldconfig trigger.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_GENERATE_SHLIBS ON)
# Debian's libtorch computes on the system's libblas.so.3: without OpenBLAS that is
# the reference BLAS, about 10x slower for the seed job (scripts/install-deps.sh).
# Fashion-MNIST is what chorus-mnist trains on by default.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "libopenblas0-pthread")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "dataset-fashion-mnist")
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
  "data-parallel training with its own collective library\n chorusrun (the launcher), chorus-mnist (the seed job), chorus-bench, chorus-trace\n and the shared libraries libchorus_comm and libchorus_torch.")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME chorus-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "chorus (= ${PROJECT_VERSION}), libssl-dev, cmake | pkg-config")
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "libtorch-dev")
set(CPACK_DEBIAN_DEV_DESCRIPTION
  "chorus headers, CMake package and pkg-config file\n find_package(chorus CONFIG) gives chorus::comm, chorus::comm_static and, with\n libtorch-dev, chorus::torch; pkg-config chorus gives chorus_comm.")
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-chorus)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3-torch")
set(CPACK_DEBIAN_PYTHON_DESCRIPTION
  "chorus as a torch.distributed backend\n import torch_chorus; torch.distributed.init_process_group(backend=\"chorus\").")
include(CPack)
