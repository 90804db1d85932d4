# Reliability tests: concurrency (run under TSan by the `tsan` preset) and the
# bounded libFuzzer run. Included from tests/CMakeLists.txt.
add_executable(test_concurrency ${CMAKE_CURRENT_LIST_DIR}/concurrency.cpp)
target_link_libraries(test_concurrency PRIVATE flashattn::flashattn Threads::Threads)
add_test(NAME reliability.concurrency_8_threads COMMAND test_concurrency 8)
set_tests_properties(reliability.concurrency_8_threads PROPERTIES LABELS "reliability")
add_executable(test_unload ${CMAKE_CURRENT_LIST_DIR}/unload.cpp)
target_include_directories(test_unload PRIVATE ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(test_unload PRIVATE ${CMAKE_DL_LIBS})
add_dependencies(test_unload flashattn)
add_test(NAME reliability.unload COMMAND test_unload $<TARGET_FILE:flashattn>)
set_tests_properties(reliability.unload PROPERTIES LABELS "reliability" TIMEOUT 60)

set(FLASHATTN_FUZZ_SECONDS 60 CACHE STRING "Duration of the ctest libFuzzer run (0 disables the test)")
if(FLASHATTN_FUZZ_SECONDS GREATER 0 AND NOT FLASHATTN_SANITIZE)
  add_test(NAME reliability.fuzz_plan
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run_fuzz.sh ${CMAKE_BINARY_DIR}/fuzz ${FLASHATTN_FUZZ_SECONDS})
  set_tests_properties(reliability.fuzz_plan PROPERTIES
    LABELS "reliability;fuzz" SKIP_RETURN_CODE 77 TIMEOUT 900 RUN_SERIAL TRUE)
endif()
