# cmake -P script behind the `abi-baseline` target: writes abi/libflashattn.abi from
# the built library with abidw. Only the flashattn_* functions (abi/public.suppr) and
# types reachable from the public header are kept (--headers-dir, --drop-private-types);
# type ids are content hashes, locations are file names only (--short-locs; they must
# stay: abidiff treats a type without a location as private and ignores its changes)
# and source paths are made relative, so regenerating an unchanged ABI on another
# machine gives a small or empty diff.
#   -DABIDW=<abidw> -DLIB=<libflashattn.so> -DSOURCE_DIR=<source tree> -DOUT=<abi file>
include(${CMAKE_CURRENT_LIST_DIR}/RequireVars.cmake)
fa_require_vars(WriteAbiBaseline.cmake ABIDW LIB SOURCE_DIR OUT)
execute_process(
  COMMAND ${ABIDW} --headers-dir ${SOURCE_DIR}/include --drop-private-types
          --suppressions ${SOURCE_DIR}/abi/public.suppr --no-corpus-path
          --no-comp-dir-path --short-locs --type-id-style hash --out-file ${OUT}.tmp ${LIB}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "abidw failed (${rc})")
endif()
file(READ ${OUT}.tmp abi)
string(REPLACE "path='${SOURCE_DIR}/" "path='" abi "${abi}")
file(WRITE ${OUT} "${abi}")
file(REMOVE ${OUT}.tmp)
message(STATUS "wrote ${OUT} from ${LIB}")
