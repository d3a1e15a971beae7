#include "comm/common/logging.h"

#include <unistd.h>

#include <exception>
#include <string>

#include "comm/common/settings.h"

namespace chorus::log {
namespace {
// Decided at the first log line. A bad CHORUS_LOG_LEVEL or CHORUS_DEBUG fails
// CommOptions::from_env() and Communicator::create() (ConfigError); a line logged
// before either (or on a thread that cannot throw) says once what was wrong and uses
// the default level.
int threshold() {
  static const int level = [] {
    try {
      return settings::log_level();
    } catch (const std::exception& e) {
      write(kError, std::string(e.what()) + "; logging at the default level, warn");
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
