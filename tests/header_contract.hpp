// The statuses each public function documents, read from include/flashattn.h: the
// `@return` paragraph of the doc comment before every FLASHATTN_API function that returns
// a flashattn_status_t, its status names matched against the header's own enum
// (FLASHATTN_STATUS_X is written X there). "As ::flashattn_f" takes f's list. The
// conventions at the top of the header add INTERNAL_ERROR (a library bug) to every list.
#pragma once
#include <map>
#include <set>
#include <string>

namespace fat {

struct HeaderContract {
  std::map<std::string, int> status_values;         // "INVALID_SHAPE" -> 102
  std::map<std::string, std::set<int>> documented;  // function -> statuses in its @return
  std::set<std::string> non_status_functions;       // FLASHATTN_API functions returning something else
};

// Parses the text of a header; throws std::runtime_error naming what it cannot read (a
// function without a doc comment, a status-returning one without @return, "As ::f"
// naming a function that has no list).
HeaderContract parse_header_contract(const std::string& header_text);

// The contents of a file (std::runtime_error if it cannot be read).
std::string read_text_file(const std::string& path);

}  // namespace fat
