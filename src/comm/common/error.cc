#include "chorus/error.h"

namespace chorus {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kConfig: return "configuration";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kPeer: return "peer failure";
    case ErrorKind::kAborted: return "aborted";
    case ErrorKind::kStore: return "store";
    case ErrorKind::kSystem: return "system";
  }
  return "?";
}

}  // namespace chorus
