# Debian packages with CPack: libflashattn0 (the shared library, component `runtime`),
# libflashattn-dev (header, .so link, CMake package, .pc; component `dev`) and
# flashattn-tools (the `flashattn` command-line tool, cli/, and its man page; component `tools`).
#   cmake --preset ci && cmake --build --preset ci && (cd build/ci && cpack -G DEB)
# Configure with CMAKE_INSTALL_PREFIX=/usr (the `ci` preset does) so GNUInstallDirs
# picks the multiarch libdir (lib/x86_64-linux-gnu).
#
# ldconfig runs through a dpkg trigger (packaging/debian/triggers), not through
# maintainer scripts: CPack's generated postinst/postrm are removed after the build
# (cmake/DebDropLdconfigScripts.cmake). The shlibs and symbols files are ours
# (packaging/debian); packaging.exports checks that `symbols` lists exactly the exported
# functions, each with the version that added it.

set(FA_DEB_RUNTIME libflashattn${PROJECT_VERSION_MAJOR})
set(FA_DEB_DEV libflashattn-dev)
set(FA_DEB_TOOLS flashattn-tools)
set(FA_DEB_DIR ${CMAKE_CURRENT_SOURCE_DIR}/packaging/debian)
set(FA_DEB_GEN ${CMAKE_CURRENT_BINARY_DIR}/packaging)

# Files every Debian package carries in /usr/share/doc/<package>: copyright and a
# gzip -9n changelog. Only component installs (CPack) put them there.
configure_file(${FA_DEB_DIR}/shlibs.in ${FA_DEB_GEN}/runtime/shlibs @ONLY)
configure_file(${FA_DEB_DIR}/changelog.in ${FA_DEB_GEN}/changelog.Debian @ONLY)
configure_file(${FA_DEB_DIR}/flashattn.1 ${FA_DEB_GEN}/flashattn.1 @ONLY)
find_program(FA_GZIP gzip)
if(FA_GZIP)
  execute_process(COMMAND ${FA_GZIP} -9nc ${FA_DEB_GEN}/changelog.Debian
                  OUTPUT_FILE ${FA_DEB_GEN}/changelog.Debian.gz)
  execute_process(COMMAND ${FA_GZIP} -9nc ${FA_DEB_GEN}/flashattn.1 OUTPUT_FILE ${FA_DEB_GEN}/flashattn.1.gz)
  install(FILES ${FA_DEB_GEN}/flashattn.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT tools)
  foreach(_comp_pkg runtime:${FA_DEB_RUNTIME} dev:${FA_DEB_DEV} tools:${FA_DEB_TOOLS})
    string(REPLACE ":" ";" _cp ${_comp_pkg})
    list(GET _cp 0 _comp)
    list(GET _cp 1 _pkg)
    install(FILES ${FA_DEB_DIR}/copyright ${FA_DEB_GEN}/changelog.Debian.gz
            DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${_pkg} COMPONENT ${_comp} EXCLUDE_FROM_ALL)
  endforeach()
endif()

set(CPACK_PACKAGE_NAME libflashattn)
set(CPACK_PACKAGE_VENDOR "libflashattn developers")
set(CPACK_PACKAGE_CONTACT "libflashattn developers <libflashattn@lists.example.org>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_HOMEPAGE_URL ${PROJECT_HOMEPAGE_URL})
set(CPACK_GENERATOR DEB)
set(CPACK_SET_DESTDIR ON)  # install scripts see CMAKE_INSTALL_PREFIX=/usr (flashattn.pc)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  # GNUInstallDirs chose paths for another prefix (e.g. lib instead of the multiarch
  # lib/x86_64-linux-gnu): packages from this build tree would not follow Debian policy.
  message(STATUS "Debian packages (cpack -G DEB) need CMAKE_INSTALL_PREFIX=/usr (presets ci, ci-cpu)")
endif()
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL runtime dev tools)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CPACK_PACKAGE_CONTACT}")
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ${FA_DEB_RUNTIME})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA "${FA_DEB_GEN}/runtime/shlibs;${FA_DEB_DIR}/symbols;${FA_DEB_DIR}/triggers")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
set(CPACK_POST_BUILD_SCRIPTS ${CMAKE_CURRENT_SOURCE_DIR}/cmake/DebDropLdconfigScripts.cmake)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
  "exact IO-aware attention (FlashAttention) library\nlibflashattn computes exact softmax attention (forward and backward) with the\ntiled FlashAttention algorithm on the CPU and, when built with CUDA, on NVIDIA\nGPUs (sm_80 or later), behind a stable C ABI.\n\nThis package contains the shared library.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME ${FA_DEB_DEV})
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${FA_DEB_RUNTIME} (= ${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE})")
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "exact IO-aware attention (FlashAttention) library - development files\nlibflashattn computes exact softmax attention (forward and backward) with the\ntiled FlashAttention algorithm on the CPU and, when built with CUDA, on NVIDIA\nGPUs (sm_80 or later), behind a stable C ABI.\n\nThis package contains the C header, the CMake package and the pkg-config file.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME ${FA_DEB_TOOLS})
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION science)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SHLIBDEPS ON)
# dpkg-shlibdeps must find the not-yet-installed libflashattn.so.0 in the build tree; it
# has no package information for it, hence the explicit dependency.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_CURRENT_BINARY_DIR})
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "${FA_DEB_RUNTIME} (= ${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE})")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
  "command-line tool of libflashattn (exact FlashAttention)\nflashattn runs exact softmax attention with libflashattn on random data:\nit prints the library's backends and devices (info), checks a\nconfiguration against a double-precision reference (check) and times\nforward and backward passes (bench).")

include(CPack)
