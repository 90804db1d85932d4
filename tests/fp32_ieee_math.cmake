# The fp32 kernels are compiled without --use_fast_math (docs/internals/kernels-fp32.md,
# "Accuracy", point 3): the SASS of every fp32 object must hold kernels and no MUFU.TANH,
# the tanh.approx instruction that fast math makes of tanhf (CTest kernels.fp32_ieee_math).
# Usage: cmake -DCUOBJDUMP=<cuobjdump> -DOBJS=<object|object|...> -P fp32_ieee_math.cmake
string(REPLACE "|" ";" objs "${OBJS}")
list(LENGTH objs n)
if(n EQUAL 0)
  message(FATAL_ERROR "no fp32 objects given")
endif()
foreach(o IN LISTS objs)
  execute_process(COMMAND ${CUOBJDUMP} -sass ${o} RESULT_VARIABLE rc OUTPUT_VARIABLE sass ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT sass MATCHES "Function : [^\n]*fp32")
    message(FATAL_ERROR "${o}: cuobjdump -sass found no fp32 kernel (exit ${rc}): ${err}")
  endif()
  string(REGEX MATCHALL "MUFU\\.TANH" approx "${sass}")
  list(LENGTH approx k)
  if(k GREATER 0)
    message(FATAL_ERROR "${o}: ${k} MUFU.TANH instructions (tanh.approx): compiled with --use_fast_math")
  endif()
endforeach()
message(STATUS "${n} fp32 objects, no MUFU.TANH")
