# For the cmake -P scripts run by the tests: stop with a usage message unless every
# named variable was given with -D<name>=...
macro(fa_require_vars script)
  foreach(_fa_var ${ARGN})
    if(NOT DEFINED ${_fa_var})
      message(FATAL_ERROR "${script}: -D${_fa_var}=... is required")
    endif()
  endforeach()
endmacro()
