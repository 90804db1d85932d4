// The cuBLAS loader's search order (src/cuda/cublas_search.hpp), a pure function tested
// here on any build: FLASHATTN_CUBLAS_PATH must be absolute and is then the only
// candidate; otherwise the build's CUDA major comes first (the nvidia-cublas wheel beside
// libflashattn, the soname, the toolkit), then the other majors, and no candidate is ever
// a relative path.
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "cuda/cublas_search.hpp"
#include "error.hpp"

using flashattn::cublas::search_list;
using flashattn::cublas::SearchInputs;
using flashattn::cublas::SearchList;

namespace {

struct Result {
  flashattn_status_t status;
  std::string message;
  std::vector<std::string> paths;
};

Result search(const char* env, const char* self, int major) {
  std::unique_ptr<SearchList> list(new SearchList());
  Result r;
  flashattn::clear_error();
  r.status = search_list(SearchInputs{env, self, major}, list.get());
  r.message = flashattn::last_error_message();
  for (int i = 0; i < list->count; ++i) r.paths.push_back(list->path[i]);
  return r;
}

// Absolute, or a bare soname the system loader looks up: never relative to the current directory.
bool loader_safe(const std::string& p) { return p[0] == '/' || p.find('/') == std::string::npos; }

std::vector<std::string> expected(const char* dir, std::vector<int> majors) {
  std::vector<std::string> v;
  for (int m : majors) {
    const std::string so = "libcublas.so." + std::to_string(m);
    if (dir != nullptr) {
      v.push_back(std::string(dir) + "/nvidia/cublas/lib/" + so);
      v.push_back(std::string(dir) + "/../nvidia/cublas/lib/" + so);
      v.push_back(std::string(dir) + "/../../nvidia/cublas/lib/" + so);
    }
    v.push_back(so);
    v.push_back("/usr/local/cuda-" + std::to_string(m) + "/lib64/" + so);
    v.push_back("/usr/local/cuda/lib64/" + so);
  }
  v.push_back("libcublas.so");
  return v;
}

}  // namespace

TEST_CASE("FLASHATTN_CUBLAS_PATH: an absolute path is the only candidate", "[cublas_search]") {
  const Result r = search("/opt/cublas/libcublas.so.12", "/usr/lib/libflashattn.so.0", 13);
  REQUIRE(r.status == FLASHATTN_STATUS_SUCCESS);
  CHECK(r.paths == std::vector<std::string>{"/opt/cublas/libcublas.so.12"});
}

TEST_CASE("FLASHATTN_CUBLAS_PATH: a relative path is refused, naming the variable and value", "[cublas_search]") {
  for (const char* value :
       {"libcublas.so.12", "./libcublas.so.12", "lib/libcublas.so", "../x/libcublas.so", "~/x.so"}) {
    INFO("FLASHATTN_CUBLAS_PATH=" << value);
    const Result r = search(value, "/usr/lib/libflashattn.so.0", 13);
    CHECK(r.status == FLASHATTN_STATUS_LIBRARY_UNAVAILABLE);
    CHECK(r.message.find(std::string("FLASHATTN_CUBLAS_PATH=") + value) != std::string::npos);
    CHECK(r.paths.empty());
  }
}

TEST_CASE("FLASHATTN_CUBLAS_PATH: unset or empty gives the default order", "[cublas_search]") {
  for (const char* env : {static_cast<const char*>(nullptr), ""}) {
    const Result r = search(env, "/usr/lib/x86_64-linux-gnu/libflashattn.so.0", 13);
    REQUIRE(r.status == FLASHATTN_STATUS_SUCCESS);
    CHECK(r.paths == expected("/usr/lib/x86_64-linux-gnu", {13, 12}));
  }
}

TEST_CASE("the build's CUDA major comes first: libcublas.so.12 for a CUDA 12 build", "[cublas_search]") {
  const Result r = search(nullptr, "/site-packages/flashattn/libflashattn.so.0", 12);
  REQUIRE(r.status == FLASHATTN_STATUS_SUCCESS);
  CHECK(r.paths == expected("/site-packages/flashattn", {12, 13}));
  // The nvidia-cublas-cu12 wheel installs site-packages/nvidia/cublas/lib/libcublas.so.12,
  // reached from a package directory beside it.
  CHECK(r.paths[1] == "/site-packages/flashattn/../nvidia/cublas/lib/libcublas.so.12");
  CHECK(r.paths[3] == "libcublas.so.12");
}

TEST_CASE("an unknown build major is tried first, then the majors with the same ABI", "[cublas_search]") {
  const Result r = search(nullptr, "/lib/libflashattn.so.0", 14);
  REQUIRE(r.status == FLASHATTN_STATUS_SUCCESS);
  CHECK(r.paths == expected("/lib", {14, 13, 12}));
}

TEST_CASE("a library loaded by a relative path gives no wheel candidates", "[cublas_search]") {
  for (const char* self : {"libflashattn.so.0", "./build/libflashattn.so.0", static_cast<const char*>(nullptr)}) {
    INFO("self path: " << (self ? self : "(null)"));
    const Result r = search(nullptr, self, 13);
    REQUIRE(r.status == FLASHATTN_STATUS_SUCCESS);
    CHECK(r.paths == expected(nullptr, {13, 12}));
  }
}

TEST_CASE("a library in the root directory searches /nvidia/cublas/lib", "[cublas_search]") {
  const Result r = search(nullptr, "/libflashattn.so.0", 13);
  REQUIRE(r.status == FLASHATTN_STATUS_SUCCESS);
  CHECK(r.paths.front() == "/nvidia/cublas/lib/libcublas.so.13");
  CHECK(r.paths == expected("", {13, 12}));
}

TEST_CASE("no candidate is ever a relative path, and overlong paths are refused", "[cublas_search]") {
  for (const char* self : {"/a/b/libflashattn.so.0", "rel/libflashattn.so.0", "/libflashattn.so.0"}) {
    const Result r = search(nullptr, self, 12);
    REQUIRE(r.status == FLASHATTN_STATUS_SUCCESS);
    for (const std::string& p : r.paths) {
      INFO("candidate " << p);
      CHECK(loader_safe(p));
    }
  }
  const std::string deep = "/" + std::string(5000, 'd') + "/libflashattn.so.0";
  const Result r = search(nullptr, deep.c_str(), 12);
  CHECK(r.status == FLASHATTN_STATUS_LIBRARY_UNAVAILABLE);
  CHECK(r.message.find("longer than") != std::string::npos);
  const std::string near = "/" + std::string(4060, 'd') + "/libflashattn.so.0";  // fits; its wheel paths do not
  const Result r2 = search(nullptr, near.c_str(), 12);
  CHECK(r2.status == FLASHATTN_STATUS_LIBRARY_UNAVAILABLE);
  const std::string env = "/" + std::string(5000, 'e');
  const Result r3 = search(env.c_str(), nullptr, 12);
  CHECK(r3.status == FLASHATTN_STATUS_LIBRARY_UNAVAILABLE);
}
