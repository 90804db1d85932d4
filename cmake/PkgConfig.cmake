# flashattn.pc from cmake/flashattn.pc.in.
#
# The prefix is filled in at install time, not configure time, so that
# `cmake --install build --prefix /some/where` (and CPack's staging) writes a .pc file
# whose paths point where the files really went. The build tree also gets a
# flashattn-uninstalled.pc (build/pkgconfig/), which pkg-config prefers when that
# folder is on PKG_CONFIG_PATH: in-tree consumers (bindings) link the fresh build.

function(_fa_pc_dir out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "\${prefix}/${dir}" PARENT_SCOPE)
  endif()
endfunction()

# Stage 1 (configure time): everything but the prefix.
set(FA_PC_PREFIX "@FA_PC_PREFIX@")
_fa_pc_dir(FA_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
_fa_pc_dir(FA_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
configure_file(cmake/flashattn.pc.in ${CMAKE_CURRENT_BINARY_DIR}/flashattn.pc.stage @ONLY)

# Stage 2 (install time): the prefix the files are installed under.
install(CODE "
  set(FA_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${CMAKE_CURRENT_BINARY_DIR}/flashattn.pc.stage\"
                 \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/flashattn.pc\" @ONLY)
  message(STATUS \"Installing: \$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/flashattn.pc\")
" COMPONENT dev)

# Build tree.
set(FA_PC_PREFIX "${CMAKE_CURRENT_BINARY_DIR}")
set(FA_PC_LIBDIR "${CMAKE_CURRENT_BINARY_DIR}")
set(FA_PC_INCLUDEDIR "${CMAKE_CURRENT_SOURCE_DIR}/include")
configure_file(cmake/flashattn.pc.in ${CMAKE_CURRENT_BINARY_DIR}/pkgconfig/flashattn-uninstalled.pc @ONLY)
unset(FA_PC_PREFIX)
unset(FA_PC_LIBDIR)
unset(FA_PC_INCLUDEDIR)
