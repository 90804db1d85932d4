// Shared definitions of the `flashattn` command-line tool: exit codes, the error types
// the commands throw (main() maps each to its exit code), and small formatting helpers.
//
// The tool is an ordinary consumer of libflashattn: it includes only the public header.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "flashattn.h"

namespace facli {

// Exit codes (also listed in `flashattn --help`).
enum ExitCode : int {
  kExitOk = 0,       // success; `check` passed
  kExitFail = 1,     // `check` ran but an error exceeded its tolerance
  kExitUsage = 2,    // bad command line (the message names the flag)
  kExitLibrary = 3,  // libflashattn returned a status other than SUCCESS
  kExitRuntime = 4,  // anything else: CUDA runtime error in the tool, host out of memory, I/O
};

// A bad command line. The message names the offending flag and value.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A libflashattn call failed: the call, the status and flashattn_last_error().
struct LibraryError : std::runtime_error {
  LibraryError(const std::string& call, flashattn_status_t st, const std::string& msg)
      : std::runtime_error(call + " returned " + flashattn_status_string(st) + (msg.empty() ? "" : ": " + msg)),
        status(st) {}
  flashattn_status_t status;
};

// Any other failure (CUDA runtime in the tool itself, file I/O, host memory).
struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws LibraryError when st is not SUCCESS; `call` names the API function.
inline void lib_check(flashattn_status_t st, const char* call) {
  if (st != FLASHATTN_STATUS_SUCCESS) throw LibraryError(call, st, flashattn_last_error());
}

// printf into a std::string.
std::string strf(const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

// "1.50 GiB", "12.0 MiB", "512 B".
std::string human_bytes(double bytes);

}  // namespace facli
