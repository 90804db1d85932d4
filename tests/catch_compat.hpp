// One test source for Catch2 v2 (Debian 12: <catch2/catch.hpp>) and Catch2 v3 (Ubuntu 24.04:
// split headers). tests/CMakeLists.txt defines FA_CATCH_MAJOR to the version it linked, so
// the header always matches the library; __has_include is only the fallback.
#pragma once

#if !defined(FA_CATCH_MAJOR)
#if __has_include(<catch2/catch_test_macros.hpp>)
#define FA_CATCH_MAJOR 3
#else
#define FA_CATCH_MAJOR 2
#endif
#endif

#if FA_CATCH_MAJOR >= 3
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif

#include <iostream>

// Printed by tests that cannot run here (e.g. [gpu] tests without a device). ctest maps it
// to "skipped" through SKIP_REGULAR_EXPRESSION, so a missing GPU never reads as a pass.
#define FA_SKIP_MARKER "FLASHATTN_TEST_SKIPPED"

// Ends the current test case as skipped (v2 has no SKIP(); the marker works for both).
#define FA_SKIP_TEST(reason)                                      \
  do {                                                            \
    std::cout << FA_SKIP_MARKER << ": " << (reason) << std::endl; \
    return;                                                       \
  } while (0)
