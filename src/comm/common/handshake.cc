#include "comm/common/handshake.h"

namespace chorus::handshake {

std::string server_unproven(const std::string& who, const std::string& whose_token,
                            const std::string& hint) {
  return who + " could not prove it holds " + whose_token + ": " + auth::kTokenMismatch + " (" +
         hint + ")";
}

}  // namespace chorus::handshake
