// CommOptions::from_env(timeout) (chorus/communicator.h): a front end's timeout against
// the operator's CHORUS_TIMEOUT. The rest of the options are from_env()'s (options.cc).
#include "chorus/communicator.h"
#include "comm/common/logging.h"
#include "comm/common/settings.h"

namespace chorus {

CommOptions CommOptions::from_env(std::chrono::milliseconds timeout) {
  CommOptions o = from_env();
  const std::optional<settings::TimeoutOverride> set = settings::op_timeout_override();
  o.timeout = set ? set->timeout : timeout;
  if (set && set->timeout != timeout) {
    // Said, since the program's own timeout does not apply: a job that times out sooner
    // (or later) than its code asks must show why.
    CHORUS_LOG(kWarn, set->variable << "=" << set->value << " (" << set->timeout.count()
                                    << " ms) applies to every operation, not the timeout the "
                                       "program asked for ("
                                    << timeout.count() << " ms)");
  }
  return o;
}

}  // namespace chorus
