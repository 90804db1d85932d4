#include "header_contract.hpp"

#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fat {
namespace {

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The identifier starting at `at` (empty if none).
std::string ident_at(const std::string& s, size_t at) {
  size_t end = at;
  while (end < s.size() && is_ident(s[end])) ++end;
  return s.substr(at, end - at);
}

// The @return paragraph of a doc comment: from "@return" to the next "@" tag or the end.
std::string return_paragraph(const std::string& comment) {
  const size_t at = comment.find("@return");
  if (at == std::string::npos) return "";
  const size_t end = comment.find("\n * @", at + 1);
  return comment.substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7);
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

HeaderContract parse_header_contract(const std::string& text) {
  HeaderContract c;
  // "FLASHATTN_STATUS_<NAME> = <value>" in the enum (other mentions have no "=").
  const std::string prefix = "FLASHATTN_STATUS_";
  for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) {
    const std::string name = ident_at(text, at + prefix.size());
    const size_t eq = text.find_first_not_of(" \t", at + prefix.size() + name.size());
    if (name.empty() || name == "MAX_ENUM" || eq == std::string::npos || text[eq] != '=') continue;
    c.status_values[name] = static_cast<int>(std::stol(text.substr(eq + 1), nullptr, 0));
  }
  if (c.status_values.count("INTERNAL_ERROR") == 0)
    throw std::runtime_error("no FLASHATTN_STATUS_INTERNAL_ERROR in the header");
  // Every "<doc comment> FLASHATTN_API <return type> flashattn_<name>(".
  std::map<std::string, std::string> as_of;  // function -> function its list refers to
  const std::string api = "FLASHATTN_API";
  for (size_t at = text.find(api); at != std::string::npos; at = text.find(api, at + api.size())) {
    const size_t paren = text.find('(', at);
    const size_t semi = text.find_first_of(";\n", at);
    if (paren == std::string::npos || semi < paren) continue;  // the macro itself, not a declaration
    // "<return type> <name>": the name is the last identifier.
    const std::string decl = text.substr(at + api.size(), paren - at - api.size());
    const size_t name_end = decl.find_last_not_of(" \t\n") + 1;
    const size_t name_at = decl.find_last_of(" \t\n*", name_end - 1) + 1;
    const std::string name = decl.substr(name_at, name_end - name_at);
    if (name.compare(0, 10, "flashattn_") != 0) continue;
    std::string ret;
    for (char ch : decl.substr(0, name_at))
      if (!std::isspace(static_cast<unsigned char>(ch))) ret += ch;
    const size_t close = text.rfind("*/", at);
    const size_t open = text.rfind("/**", close);
    if (close == std::string::npos || open == std::string::npos || text.find_first_not_of(" \t\n", close + 2) != at)
      throw std::runtime_error(name + " has no doc comment right before it");
    if (ret != "flashattn_status_t") {
      c.non_status_functions.insert(name);
      continue;
    }
    const std::string para = return_paragraph(text.substr(open, close - open));
    if (para.empty()) throw std::runtime_error(name + " returns flashattn_status_t but documents no @return");
    const size_t first = para.find_first_not_of(" \t\n*");
    if (first != std::string::npos && para.compare(first, 5, "As ::") == 0) {
      as_of[name] = ident_at(para, first + 5);
      continue;
    }
    std::set<int>& s = c.documented[name];
    for (size_t i = 0; i < para.size(); ++i) {  // every whole word that names a status
      if (!is_ident(para[i]) || (i > 0 && is_ident(para[i - 1]))) continue;
      const auto v = c.status_values.find(ident_at(para, i));
      if (v != c.status_values.end()) s.insert(v->second);
    }
    s.insert(c.status_values["INTERNAL_ERROR"]);
  }
  for (const auto& a : as_of) {
    const auto src = c.documented.find(a.second);
    if (src == c.documented.end())
      throw std::runtime_error(a.first + ": \"As ::" + a.second + "\" names no documented list");
    c.documented[a.first] = src->second;
  }
  return c;
}

}  // namespace fat
