# CPack post-build script (CPACK_POST_BUILD_SCRIPTS): CPack 3.25 always adds
# postinst/postrm scripts calling ldconfig to a package that ships a library under
# /usr/lib, and there is no setting to stop it. Our runtime package runs ldconfig
# through its dpkg trigger instead (packaging/debian/triggers), so this rebuilds that
# .deb without the two scripts; everything else (control, md5sums, shlibs, triggers,
# data) is kept as CPack made it.
find_program(_dpkg_deb dpkg-deb REQUIRED)
foreach(_deb IN LISTS CPACK_PACKAGE_FILES)
  get_filename_component(_name "${_deb}" NAME)
  if(NOT _name MATCHES "^libflashattn[0-9]+_.*\\.deb$")
    continue()
  endif()
  set(_tree "${_deb}.tree")
  file(REMOVE_RECURSE "${_tree}")
  execute_process(COMMAND ${_dpkg_deb} -R "${_deb}" "${_tree}" COMMAND_ERROR_IS_FATAL ANY)
  file(REMOVE "${_tree}/DEBIAN/postinst" "${_tree}/DEBIAN/postrm")
  execute_process(COMMAND ${_dpkg_deb} --root-owner-group -Zxz -b "${_tree}" "${_deb}"
                  OUTPUT_QUIET COMMAND_ERROR_IS_FATAL ANY)
  file(REMOVE_RECURSE "${_tree}")
  message(STATUS "${_name}: dropped CPack's ldconfig postinst/postrm (the dpkg trigger runs ldconfig)")
endforeach()
