# ctest script (cmake -P): compare the built library's ABI with the committed baseline.
#   -DABIDIFF=<abidiff> -DBASELINE=<abi/libflashattn.abi> -DLIB=<libflashattn.so>
#   -DHEADERS=<include dir>
# Only types reachable from the public header count (--headers-dir2; the baseline was
# written with --headers-dir too), so CPU-only and CUDA builds compare alike.
# abidiff's status is a bit field (4: changes to review, 8: incompatible); any nonzero
# status fails. --harmless makes changes that abidiff filters out by default (a new
# enumerator, a struct grown at its end) count too: every ABI change is a reviewed one. To accept an intended change, regenerate the baseline: abi/README.md.
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/RequireVars.cmake)
fa_require_vars(CheckAbi.cmake ABIDIFF BASELINE LIB HEADERS)
execute_process(COMMAND ${ABIDIFF} --harmless --headers-dir2 ${HEADERS} ${BASELINE} ${LIB}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "abidiff exit status ${rc}: the ABI differs from ${BASELINE} (see abi/README.md)")
endif()
message(STATUS "ABI of ${LIB} matches ${BASELINE}")
