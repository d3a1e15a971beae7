// The names derived from each option of the table, and the messages that name a given
// value (option_table.h).
#include <algorithm>
#include <cctype>

#include "run/option_table.h"

namespace chorus::run {

std::string member_name(const OptionSpec& spec) {
  std::string name(spec.name);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::string dashed_flag(const OptionSpec& spec) { return "--" + std::string(spec.name); }

// "CHORUS_RUN_NPROC_PER_NODE" for prefix "CHORUS_RUN_", "PET_NPROC_PER_NODE" for "PET_".
std::string environment_name(const OptionSpec& spec, std::string_view prefix) {
  std::string name = std::string(prefix) + member_name(spec);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::toupper(c); });
  return name;
}

// "--nproc-per-node", "--nproc_per_node" or a short flag ("-m") -> its spec.
const OptionSpec* find_spec(std::string_view flag) {
  for (const OptionSpec& spec : kOptions) {
    if (flag == dashed_flag(spec) || flag == "--" + member_name(spec)) return &spec;
    if (!spec.short_flag.empty() && flag == spec.short_flag) return &spec;
  }
  return nullptr;
}

// `source text` for the command line, `source=text` for a variable: what the user wrote.
std::string describe(const Given& given) {
  bool quote = given.text.empty() || given.text.find(' ') != std::string::npos;
  std::string text = quote ? "\"" + given.text + "\"" : given.text;
  bool from_command_line = given.source.rfind("--", 0) == 0;
  if (from_command_line && given.text == "true") return given.source;  // a bare flag
  return given.source + (from_command_line ? " " : "=") + text;
}

// How a message names a value another is checked against: "--nnodes (2)".
std::string reference(const Given& given, std::string_view option) {
  if (given.source == kDefault) return std::string(option) + " (" + given.text + ", the default)";
  return given.source + " (" + given.text + ")";
}

[[noreturn]] void reject(const Given& given, std::string_view allowed) {
  throw UsageError(describe(given) + ": " + std::string(allowed));
}

}  // namespace chorus::run
