#include "comm/common/logging.h"

#include <unistd.h>

#include "comm/common/settings.h"

namespace chorus::log {
namespace {
int threshold() {
  static const int level = [] {
    try {
      return settings::log_level();
    } catch (...) {
      return static_cast<int>(kWarn);
    }
  }();
  return level;
}
}  // namespace

bool enabled(Level level) { return level <= threshold(); }

void write(Level level, const std::string& message) {
  static const char* names[] = {"error", "warn", "info", "debug"};
  std::string line = std::string("[chorus ") + names[level] + " pid " +
                     std::to_string(getpid()) + "] " + message + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace chorus::log
