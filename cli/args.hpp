// Command-line parsing for the subcommands: a declared set of options, strict typed
// getters, and a UsageError naming the flag for every bad value.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace facli {

struct OptSpec {
  enum Kind { kFlag, kValue, kOptionalValue };
  const char* name;     // "--batch"
  Kind kind;            // kFlag: no value; kValue: "--x V" or "--x=V"; kOptionalValue: "--x" or "--x=V"
  const char* metavar;  // shown in help ("N", "fp16|bf16|fp32"); nullptr for flags
  const char* help;     // one line
};

class Args {
 public:
  Args(std::string command, std::vector<OptSpec> specs);

  // Parses argv[first..argc). Throws UsageError for unknown options, missing or
  // superfluous values, repeated options and positional arguments.
  void parse(int argc, char** argv, int first);

  bool has(const std::string& name) const;
  // The raw value ("" for a flag or an optional value given without "=V").
  std::string raw(const std::string& name) const;

  // Typed getters: the default when the option is absent; UsageError naming the flag
  // when the value is malformed or out of [lo, hi].
  int64_t get_int(const std::string& name, int64_t def, int64_t lo, int64_t hi) const;
  double get_double(const std::string& name, double def, double lo, double hi, bool lo_open = false,
                    bool hi_open = false) const;
  uint64_t get_u64(const std::string& name, uint64_t def) const;
  std::string get_choice(const std::string& name, const std::string& def,
                         const std::vector<std::string>& choices) const;
  // Comma-separated integers, each in [lo, hi], at least one.
  std::vector<int64_t> get_int_list(const std::string& name, const std::vector<int64_t>& def, int64_t lo,
                                    int64_t hi) const;

  // The options block of the help text.
  std::string options_help() const;
  const std::string& command() const { return command_; }

 private:
  const OptSpec* find(const std::string& name) const;
  std::string command_;
  std::vector<OptSpec> specs_;
  std::map<std::string, std::string> values_;
};

// Parses a whole string as an integer / finite double; false if malformed.
bool parse_int(const std::string& s, int64_t* out);
bool parse_double(const std::string& s, double* out);

}  // namespace facli
