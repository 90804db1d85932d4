# kernels/generate.py --check on a copy of its inputs and outputs in which one generated
# file is edited must fail and name that file (CTest kernels.generated_stale_detected).
# Usage: cmake -DPYTHON=python3 -DSRC=<repo> -DWORK=<scratch dir> -P generated_stale.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/kernels/fa2)
file(COPY ${SRC}/CMakeLists.txt ${SRC}/CMakePresets.json ${SRC}/README.md DESTINATION ${WORK})
file(COPY ${SRC}/kernels/generate.py ${SRC}/kernels/instances.json DESTINATION ${WORK}/kernels)
file(COPY ${SRC}/kernels/fa2/instances ${SRC}/kernels/fa2/instances.h ${SRC}/kernels/fa2/launchers.h
     DESTINATION ${WORK}/kernels/fa2)
execute_process(COMMAND ${PYTHON} ${WORK}/kernels/generate.py --check RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the unedited copy is already stale:\n${err}")
endif()
file(APPEND ${WORK}/kernels/fa2/instances.h "// edited\n")
execute_process(COMMAND ${PYTHON} ${WORK}/kernels/generate.py --check RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "kernels/fa2/instances.h: out of date")
  message(FATAL_ERROR "an edited generated file went unnoticed (exit ${rc}):\n${err}")
endif()
file(REMOVE_RECURSE ${WORK})
