# The `docs` target: HTML reference and user guide with Doxygen. Every undocumented
# public entity or parameter is an error (WARN_AS_ERROR=FAIL_ON_WARNINGS), so the
# header cannot grow an undocumented function unnoticed. Not part of `all`.
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  message(STATUS "Doxygen not found: no 'docs' target")
  return()
endif()
set(FA_DOCS_OUT ${CMAKE_CURRENT_BINARY_DIR}/docs)
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/docs/Doxyfile.in ${FA_DOCS_OUT}/Doxyfile @ONLY)
file(GLOB FA_DOC_PAGES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/docs/*.md)
add_custom_command(
  OUTPUT ${FA_DOCS_OUT}/html/index.html
  COMMAND ${DOXYGEN_EXECUTABLE} ${FA_DOCS_OUT}/Doxyfile
  DEPENDS ${FA_DOCS_OUT}/Doxyfile ${CMAKE_CURRENT_SOURCE_DIR}/include/flashattn.h ${FA_DOC_PAGES}
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
  COMMENT "Doxygen: HTML reference and user guide in ${FA_DOCS_OUT}/html"
  VERBATIM)
add_custom_target(docs DEPENDS ${FA_DOCS_OUT}/html/index.html)
set(FLASHATTN_DOXYGEN_EXECUTABLE ${DOXYGEN_EXECUTABLE} CACHE INTERNAL "")
