# ctest driver (cmake -P): install the build tree into a fresh prefix, then build and
# run one consumer project against that prefix.
#   -DMODE=find_package|pkg_config -DBUILD_DIR=... -DWORK_DIR=... -DGENERATOR=...
#   -DC_COMPILER=... -DCXX_COMPILER=... [-DSANITIZE=address,undefined]
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/RequireVars.cmake)
fa_require_vars(run.cmake MODE BUILD_DIR WORK_DIR GENERATOR C_COMPILER CXX_COMPILER)
set(here ${CMAKE_CURRENT_LIST_DIR})
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

set(flags "")
if(SANITIZE)
  # A library built with sanitizers needs their runtimes loaded first: build the
  # consumers with the same flags.
  set(flags "-fsanitize=${SANITIZE}")
endif()

if(MODE STREQUAL "find_package")
  step(${CMAKE_COMMAND} -S ${here}/find_package -B ${WORK_DIR}/build -G ${GENERATOR}
       -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
       -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
       "-DCMAKE_C_FLAGS=${flags}" "-DCMAKE_CXX_FLAGS=${flags}" "-DCMAKE_EXE_LINKER_FLAGS=${flags}")
  step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  step(${WORK_DIR}/build/consumer_c)
  step(${WORK_DIR}/build/consumer_cxx)
elseif(MODE STREQUAL "pkg_config")
  set(ENV{CC} ${C_COMPILER})
  set(ENV{CXX} ${CXX_COMPILER})
  set(ENV{CONSUMER_FLAGS} "${flags}")
  step(sh ${here}/pkg_config/build_and_run.sh ${prefix} ${WORK_DIR}/build)
else()
  message(FATAL_ERROR "run.cmake: unknown MODE=${MODE}")
endif()
