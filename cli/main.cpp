// `flashattn`: the command-line tool of libflashattn (info, check, bench).
// Dispatches to a subcommand and maps the errors it throws to exit codes.
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "cli.hpp"
#include "commands.hpp"

namespace facli {

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(&s[0], size_t(n) + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

std::string human_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return strf("%.2f GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return strf("%.1f MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return strf("%.1f KiB", b / 1024.0);
  return strf("%.0f B", b);
}

}  // namespace facli

namespace {

void print_version() {
  int ma = 0, mi = 0, pa = 0;
  flashattn_get_version(&ma, &mi, &pa);
  std::printf("flashattn %d.%d.%d (library %d.%d.%d)\n", FLASHATTN_VERSION_MAJOR, FLASHATTN_VERSION_MINOR,
              FLASHATTN_VERSION_PATCH, ma, mi, pa);
}

void print_help() {
  std::printf(
      "usage: flashattn <command> [options]\n"
      "       flashattn --help | --version\n"
      "\n"
      "Command-line tool of libflashattn (exact, IO-aware attention).\n"
      "\n"
      "commands:\n"
      "  info    library version, backends, CUDA devices, supported dtypes and head dims\n"
      "  check   run one configuration and compare it with an fp64 reference (PASS/FAIL)\n"
      "  bench   time forward/backward passes over a sweep of sequence lengths\n"
      "\n"
      "'flashattn <command> --help' describes a command's options.\n"
      "\n"
      "exit status:\n"
      "  0  success (check: PASS)\n"
      "  1  check: an error exceeded its tolerance (FAIL)\n"
      "  2  usage error (the message names the flag)\n"
      "  3  libflashattn returned an error (status name and message printed)\n"
      "  4  other runtime error (CUDA runtime in the tool, host memory, files)\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace facli;
  if (argc < 2) {
    print_help();
    return kExitUsage;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      print_help();
      return kExitOk;
    }
    if (cmd == "--version") {
      print_version();
      return kExitOk;
    }
    if (cmd == "info") return cmd_info(argc, argv);
    if (cmd == "check") return cmd_check(argc, argv);
    if (cmd == "bench") return cmd_bench(argc, argv);
    throw UsageError("unknown command '" + cmd + "' (commands: info, check, bench; see 'flashattn --help')");
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "flashattn: error: %s\n", e.what());
    return kExitUsage;
  } catch (const LibraryError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "flashattn: library error: %s\n", e.what());
    return kExitLibrary;
  } catch (const RuntimeError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "flashattn: error: %s\n", e.what());
    return kExitRuntime;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "flashattn: error: host out of memory\n");
    return kExitRuntime;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "flashattn: error: %s\n", e.what());
    return kExitRuntime;
  }
}
