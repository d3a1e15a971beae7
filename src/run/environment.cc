#include "run/environment.h"

#include <unistd.h>  // environ

#include <string_view>

namespace chorus::run {

Environment current_environment() {
  Environment env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string_view text(*entry);
    size_t equals = text.find('=');
    // emplace keeps the first of duplicate names, as getenv() does.
    if (equals != text.npos) env.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return env;
}

}  // namespace chorus::run
