# Packaging tests (included from tests/CMakeLists.txt), label `packaging`:
#   packaging.exports         exported symbols, version node, SONAME, NEEDED libraries
#   packaging.consumer.find_package / .pkg_config
#                             install into a fresh prefix, build and run C and C++ consumers
#   packaging.abi             abidiff against abi/libflashattn.abi (when abidiff is found)
#   packaging.docs            the Doxygen `docs` target, warnings as errors (when Doxygen is found)
#   packaging.deb             CPack .debs: contents and lintian (when dpkg-deb is found)
#   packaging.wheel           the libflashattn wheel (CPU kernels): built, manylinux-tagged,
#                             installed into a fresh venv and run (needs PyPI and python3-venv)
# A test whose tool is missing is registered anyway and reported as skipped, never as passed.

set(FA_PKG_WORK ${CMAKE_CURRENT_BINARY_DIR}/packaging-work)

# A test that needs a missing tool: registered anyway so ctest reports it as skipped.
function(fa_skipped_test name why)
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -E echo "SKIPPED: ${why}")
  set_tests_properties(${name} PROPERTIES LABELS packaging SKIP_REGULAR_EXPRESSION "SKIPPED:")
endfunction()

find_program(FA_NM NAMES ${CMAKE_NM} nm)
find_program(FA_READELF NAMES ${CMAKE_READELF} readelf)
if(FA_NM AND FA_READELF)
  add_test(NAME packaging.exports
    COMMAND ${CMAKE_COMMAND} -DLIB=$<TARGET_FILE:flashattn> -DHEADER=${PROJECT_SOURCE_DIR}/include/flashattn.h
            -DSONAME=libflashattn.so.${PROJECT_VERSION_MAJOR} -DNM=${FA_NM} -DREADELF=${FA_READELF}
            -DSANITIZE=${FLASHATTN_SANITIZE} -DSYMBOLS=${PROJECT_SOURCE_DIR}/packaging/debian/symbols
            -P ${PROJECT_SOURCE_DIR}/cmake/CheckExports.cmake)
else()
  fa_skipped_test(packaging.exports "nm or readelf not found")
endif()

foreach(mode find_package pkg_config)
  add_test(NAME packaging.consumer.${mode}
    COMMAND ${CMAKE_COMMAND} -DMODE=${mode} -DBUILD_DIR=${PROJECT_BINARY_DIR} -DWORK_DIR=${FA_PKG_WORK}/${mode}
            "-DGENERATOR=${CMAKE_GENERATOR}" -DC_COMPILER=${CMAKE_C_COMPILER} -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
            -DSANITIZE=${FLASHATTN_SANITIZE} -P ${PROJECT_SOURCE_DIR}/tests/consumers/run.cmake)
endforeach()
find_program(FA_PKG_CONFIG NAMES pkg-config pkgconf)
if(NOT FA_PKG_CONFIG)
  set_tests_properties(packaging.consumer.pkg_config PROPERTIES DISABLED TRUE)
endif()

find_program(FA_ABIDIFF abidiff)
set(FA_ABI_BASELINE ${PROJECT_SOURCE_DIR}/abi/libflashattn.abi)
if(FA_ABIDIFF AND EXISTS ${FA_ABI_BASELINE})
  add_test(NAME packaging.abi
    COMMAND ${CMAKE_COMMAND} -DABIDIFF=${FA_ABIDIFF} -DBASELINE=${FA_ABI_BASELINE} -DLIB=$<TARGET_FILE:flashattn>
            -DHEADERS=${PROJECT_SOURCE_DIR}/include -P ${PROJECT_SOURCE_DIR}/cmake/CheckAbi.cmake)
elseif(NOT FA_ABIDIFF)
  fa_skipped_test(packaging.abi "abidiff not found (Debian: abigail-tools)")
else()
  fa_skipped_test(packaging.abi "no baseline ${FA_ABI_BASELINE}")
endif()

if(TARGET docs)
  add_test(NAME packaging.docs COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target docs)
else()
  fa_skipped_test(packaging.docs "Doxygen not found or FLASHATTN_BUILD_DOCS=OFF")
endif()

find_program(FA_DPKG_DEB dpkg-deb)
find_program(FA_LINTIAN lintian)
if(FA_DPKG_DEB AND NOT FLASHATTN_SANITIZE AND CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  add_test(NAME packaging.deb
    COMMAND ${CMAKE_COMMAND} -DCPACK=${CMAKE_CPACK_COMMAND} -DCONFIG=${PROJECT_BINARY_DIR}/CPackConfig.cmake
            -DWORK_DIR=${FA_PKG_WORK}/deb -DDPKG_DEB=${FA_DPKG_DEB} -DRUNTIME=${FA_DEB_RUNTIME} -DDEV=${FA_DEB_DEV}
            -DTOOLS=${FA_DEB_TOOLS}
            -DLINTIAN=${FA_LINTIAN} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -P ${PROJECT_SOURCE_DIR}/cmake/CheckDeb.cmake)
  set_tests_properties(packaging.deb PROPERTIES TIMEOUT 600)
elseif(FLASHATTN_SANITIZE)
  fa_skipped_test(packaging.deb "sanitizer build (packages are made from release builds)")
elseif(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  fa_skipped_test(packaging.deb "CMAKE_INSTALL_PREFIX=${CMAKE_INSTALL_PREFIX}: Debian packages are built from a /usr build (presets ci, ci-cpu)")
else()
  fa_skipped_test(packaging.deb "dpkg-deb not found")
endif()

set(_fa_pkg_tests packaging.exports packaging.consumer.find_package packaging.consumer.pkg_config packaging.abi
    packaging.docs packaging.deb)
foreach(t IN LISTS _fa_pkg_tests)
  set_property(TEST ${t} APPEND PROPERTY LABELS packaging)
endforeach()
# Installing the build tree twice at once is harmless (distinct prefixes), but cpack and
# the consumer builds are the heaviest tests: keep them from running side by side.
set_tests_properties(packaging.consumer.find_package packaging.consumer.pkg_config PROPERTIES
  RESOURCE_LOCK flashattn_install)
if(TEST packaging.deb)
  set_property(TEST packaging.deb APPEND PROPERTY RESOURCE_LOCK flashattn_install)
endif()

# Builds the library once more (CPU kernels, about 2 minutes on 2 cores), so it runs alone.
add_test(NAME packaging.wheel
  COMMAND sh ${PROJECT_SOURCE_DIR}/packaging/wheel/check_wheel.sh ${FA_PKG_WORK}/wheel)
set_tests_properties(packaging.wheel PROPERTIES
  LABELS "packaging;python" SKIP_RETURN_CODE 77 TIMEOUT 1800 RUN_SERIAL TRUE)
