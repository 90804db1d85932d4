# Tests of the language bindings and the examples (owned by the bindings work).
# Included from tests/CMakeLists.txt. Every test uses this build tree's library.
#   bindings.python         pytest suite (CPU backend, numpy; the Python fp64 reference against
#                           the C++ one); skips (77) without numpy/pytest
#   bindings.rust           cargo test --offline --features half; skips (77) without cargo
#   bindings.rust_prefix    cargo run --example forward against a `cmake --install` prefix,
#                           found through pkg-config and the run path; skips (77) without cargo
#   bindings.julia          the package's tests (test/runtests.jl, CPU backend); skips (77) without julia
#   bindings.julia_header   FlashAttn.jl checked against include/flashattn.h
#   bindings.julia_checker  the checker detects deliberately broken copies
#   bindings.julia_syntax   tree-sitter parse of the Julia files (skips without tree-sitter-julia)
#   bindings.rust_sys_*     flashattn-sys's extern block against the header (+ self-test)
#   bindings.hpp_*          include/flashattn.hpp compiles alone under strict flags
#   examples.c / .cpp       the CPU examples run and check their results
#   examples.cuda           the CUDA example (label gpu; skipped without a device)

set(_fa_bindings ${PROJECT_SOURCE_DIR}/bindings)

if(FLASHATTN_SANITIZE)
  # A sanitized libflashattn cannot be dlopen'ed by an uninstrumented python3, cargo test
  # binary or julia (the sanitizer runtime must come first); these tests run in the plain builds.
  foreach(_t python rust rust_prefix julia)
    add_test(NAME bindings.${_t}
             COMMAND ${CMAKE_COMMAND} -E echo "SKIPPED: FLASHATTN_SANITIZE=${FLASHATTN_SANITIZE} build")
    set_tests_properties(bindings.${_t} PROPERTIES LABELS "bindings;${_t}" SKIP_REGULAR_EXPRESSION "SKIPPED:")
  endforeach()
else()
  add_test(NAME bindings.python
           COMMAND sh ${_fa_bindings}/python/run_tests.sh $<TARGET_FILE:flashattn>)
  # FLASHATTN_REFERENCE_DUMP: the C++ fp64 reference that test_reference_sync.py compares
  # the Python one with.
  set_tests_properties(bindings.python PROPERTIES
    LABELS "bindings;python" SKIP_RETURN_CODE 77 TIMEOUT 900
    ENVIRONMENT "FLASHATTN_REFERENCE_DUMP=$<TARGET_FILE:fa_reference_dump>")

  add_test(NAME bindings.rust
           COMMAND sh ${_fa_bindings}/rust/run_tests.sh $<TARGET_FILE_DIR:flashattn>
                   ${CMAKE_CURRENT_BINARY_DIR}/cargo-target)
  set_tests_properties(bindings.rust PROPERTIES
    LABELS "bindings;rust" SKIP_RETURN_CODE 77 TIMEOUT 1200)
  add_test(NAME bindings.rust_prefix
           COMMAND sh ${_fa_bindings}/rust/run_prefix_example.sh ${CMAKE_COMMAND} ${PROJECT_BINARY_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/rust-prefix)
  set_tests_properties(bindings.rust_prefix PROPERTIES
    LABELS "bindings;rust" SKIP_RETURN_CODE 77 TIMEOUT 600)

  add_test(NAME bindings.julia COMMAND sh ${_fa_bindings}/julia/run_tests.sh $<TARGET_FILE:flashattn>)
  set_tests_properties(bindings.julia PROPERTIES LABELS "bindings;julia" SKIP_RETURN_CODE 77 TIMEOUT 900)
endif()

find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME bindings.julia_header
           COMMAND ${Python3_EXECUTABLE} ${_fa_bindings}/julia/check_against_header.py
                   --header ${PROJECT_SOURCE_DIR}/include/flashattn.h
                   --julia ${_fa_bindings}/julia/src/FlashAttn.jl)
  add_test(NAME bindings.julia_checker
           COMMAND ${Python3_EXECUTABLE} ${_fa_bindings}/julia/test_checker.py)
  set_tests_properties(bindings.julia_header bindings.julia_checker PROPERTIES
    LABELS "bindings;julia" ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
  # Julia syntax through the tree-sitter grammar; skipped (77) unless the Python packages
  # tree-sitter and tree-sitter-julia are installed.
  add_test(NAME bindings.julia_syntax COMMAND ${Python3_EXECUTABLE} ${_fa_bindings}/julia/syntax_check.py)
  set_tests_properties(bindings.julia_syntax PROPERTIES LABELS "bindings;julia" SKIP_RETURN_CODE 77)
  # flashattn-sys's hand-written extern block against the header (no Rust toolchain needed),
  # and the same check proving it catches broken copies.
  add_test(NAME bindings.rust_sys_header
           COMMAND ${Python3_EXECUTABLE} ${_fa_bindings}/rust/check_sys_against_header.py
                   --header ${PROJECT_SOURCE_DIR}/include/flashattn.h
                   --sys ${_fa_bindings}/rust/flashattn-sys/src/lib.rs)
  add_test(NAME bindings.rust_sys_checker
           COMMAND ${Python3_EXECUTABLE} ${_fa_bindings}/rust/check_sys_against_header.py --self-test)
  set_tests_properties(bindings.rust_sys_header bindings.rust_sys_checker PROPERTIES
    LABELS "bindings;rust" ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
else()
  foreach(_t julia_header julia_checker julia_syntax rust_sys_header rust_sys_checker)
    add_test(NAME bindings.${_t}
             COMMAND ${CMAKE_COMMAND} -E echo "SKIPPED: no python3 interpreter found")
    set_tests_properties(bindings.${_t} PROPERTIES LABELS "bindings;julia" SKIP_REGULAR_EXPRESSION "SKIPPED:")
  endforeach()
endif()

# The optional C++ wrapper compiles on its own with the strict flags (C++17).
add_test(NAME bindings.hpp_cxx17_alone
         COMMAND ${CMAKE_CXX_COMPILER} -std=c++17 -Wall -Wextra -pedantic -Werror -fsyntax-only
                 -I${PROJECT_SOURCE_DIR}/include -x c++ ${PROJECT_SOURCE_DIR}/include/flashattn.hpp)
set_tests_properties(bindings.hpp_cxx17_alone PROPERTIES LABELS "bindings;header")

if(TARGET flashattn_example_c)
  add_test(NAME examples.c COMMAND flashattn_example_c)
  set_tests_properties(examples.c PROPERTIES LABELS examples)
endif()
if(TARGET flashattn_example_cpp)
  add_test(NAME examples.cpp COMMAND flashattn_example_cpp)
  set_tests_properties(examples.cpp PROPERTIES LABELS examples)
endif()
if(TARGET flashattn_example_cuda)
  add_test(NAME examples.cuda COMMAND flashattn_example_cuda)
  set_tests_properties(examples.cuda PROPERTIES LABELS "examples;gpu" SKIP_REGULAR_EXPRESSION "FLASHATTN_TEST_SKIPPED")
endif()
