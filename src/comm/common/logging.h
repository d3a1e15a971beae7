// Minimal leveled logging to stderr. One line per call, written atomically.
#pragma once

#include <sstream>
#include <string>

namespace chorus::log {

enum Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool enabled(Level level);
void write(Level level, const std::string& message);

}  // namespace chorus::log

#define CHORUS_LOG(level, expr)                                        \
  do {                                                                 \
    if (::chorus::log::enabled(::chorus::log::level)) {                \
      std::ostringstream chorus_log_stream_;                           \
      chorus_log_stream_ << expr;                                      \
      ::chorus::log::write(::chorus::log::level, chorus_log_stream_.str()); \
    }                                                                  \
  } while (0)
