#include "args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "cli.hpp"

namespace facli {

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  const char* begin = s.c_str();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(begin, &end, 10);
  if (errno != 0 || end == begin || *end != '\0') return false;
  // strtoll skips leading spaces; a value with spaces is still malformed.
  if (s[0] == ' ' || s[0] == '\t') return false;
  *out = static_cast<int64_t>(v);
  return true;
}

bool parse_double(const std::string& s, double* out) {
  if (s.empty() || s[0] == ' ' || s[0] == '\t') return false;
  const char* begin = s.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(begin, &end);
  if (errno != 0 || end == begin || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

Args::Args(std::string command, std::vector<OptSpec> specs) : command_(std::move(command)), specs_(std::move(specs)) {}

const OptSpec* Args::find(const std::string& name) const {
  for (const OptSpec& s : specs_)
    if (name == s.name) return &s;
  return nullptr;
}

void Args::parse(int argc, char** argv, int first) {
  const std::string see = " (see 'flashattn " + command_ + " --help')";
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      throw UsageError("unexpected argument '" + arg + "' for 'flashattn " + command_ + "'" + see);
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const OptSpec* spec = find(name);
    if (spec == nullptr) throw UsageError("unknown option '" + name + "' for 'flashattn " + command_ + "'" + see);
    if (values_.count(name)) throw UsageError("option " + name + " given more than once");
    std::string value;
    switch (spec->kind) {
      case OptSpec::kFlag:
        if (eq != std::string::npos) throw UsageError("option " + name + " takes no value (got '" + arg + "')");
        break;
      case OptSpec::kOptionalValue:
        if (eq != std::string::npos) {
          value = arg.substr(eq + 1);
          if (value.empty()) throw UsageError("option " + name + "= has an empty value");
        }
        break;
      case OptSpec::kValue:
        if (eq != std::string::npos) {
          value = arg.substr(eq + 1);
        } else {
          if (i + 1 >= argc) throw UsageError("option " + name + " needs a value (" + spec->metavar + ")");
          value = argv[++i];
        }
        if (value.empty()) throw UsageError("option " + name + " has an empty value (expected " + spec->metavar + ")");
        break;
    }
    values_[name] = value;
  }
}

bool Args::has(const std::string& name) const { return values_.count(name) != 0; }

std::string Args::raw(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second;
}

int64_t Args::get_int(const std::string& name, int64_t def, int64_t lo, int64_t hi) const {
  if (!has(name)) return def;
  const std::string s = raw(name);
  int64_t v = 0;
  if (!parse_int(s, &v)) throw UsageError(strf("%s: '%s' is not an integer", name.c_str(), s.c_str()));
  if (v < lo) throw UsageError(strf("%s=%lld must be >= %lld", name.c_str(), (long long)v, (long long)lo));
  if (v > hi) throw UsageError(strf("%s=%lld must be <= %lld", name.c_str(), (long long)v, (long long)hi));
  return v;
}

uint64_t Args::get_u64(const std::string& name, uint64_t def) const {
  if (!has(name)) return def;
  const std::string s = raw(name);
  if (s.empty() || s[0] == '-' || s[0] == '+' || s[0] == ' ')
    throw UsageError(strf("%s: '%s' is not a non-negative integer", name.c_str(), s.c_str()));
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (errno != 0 || *end != '\0')
    throw UsageError(strf("%s: '%s' is not a non-negative integer below 2^64", name.c_str(), s.c_str()));
  return static_cast<uint64_t>(v);
}

double Args::get_double(const std::string& name, double def, double lo, double hi, bool lo_open, bool hi_open) const {
  if (!has(name)) return def;
  const std::string s = raw(name);
  double v = 0;
  if (!parse_double(s, &v)) throw UsageError(strf("%s: '%s' is not a finite number", name.c_str(), s.c_str()));
  if (lo_open ? !(v > lo) : !(v >= lo))
    throw UsageError(strf("%s=%s must be %s %g", name.c_str(), s.c_str(), lo_open ? ">" : ">=", lo));
  if (hi_open ? !(v < hi) : !(v <= hi))
    throw UsageError(strf("%s=%s must be %s %g", name.c_str(), s.c_str(), hi_open ? "<" : "<=", hi));
  return v;
}

std::string Args::get_choice(const std::string& name, const std::string& def,
                             const std::vector<std::string>& choices) const {
  if (!has(name)) return def;
  const std::string s = raw(name);
  for (const std::string& c : choices)
    if (s == c) return s;
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) list += (i ? "|" : "") + choices[i];
  throw UsageError(name + ": '" + s + "' is not one of " + list);
}

std::vector<int64_t> Args::get_int_list(const std::string& name, const std::vector<int64_t>& def, int64_t lo,
                                        int64_t hi) const {
  if (!has(name)) return def;
  const std::string s = raw(name);
  std::vector<int64_t> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int64_t v = 0;
    if (!parse_int(item, &v))
      throw UsageError(strf("%s: '%s' in '%s' is not an integer", name.c_str(), item.c_str(), s.c_str()));
    if (v < lo || v > hi)
      throw UsageError(
          strf("%s: %lld is outside [%lld, %lld]", name.c_str(), (long long)v, (long long)lo, (long long)hi));
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string Args::options_help() const {
  std::ostringstream os;
  for (const OptSpec& s : specs_) {
    std::string left = std::string("  ") + s.name;
    if (s.kind == OptSpec::kValue) left += std::string(" ") + s.metavar;
    if (s.kind == OptSpec::kOptionalValue) left += std::string("[=") + s.metavar + "]";
    if (left.size() < 30) left.resize(30, ' ');
    else left += "\n" + std::string(30, ' ');
    os << left << s.help << "\n";
  }
  return os.str();
}

}  // namespace facli
