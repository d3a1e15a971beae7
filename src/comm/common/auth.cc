#include "comm/common/auth.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <limits>
#include <vector>

#include "chorus/error.h"
#include "comm/common/wire.h"

namespace chorus::auth {
namespace {

constexpr std::string_view kDomain = "chorus-auth-v1";

std::string openssl_error() {
  unsigned long code = ERR_get_error();
  if (code == 0) return "no reason given";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

}  // namespace

Nonce make_nonce() {
  Nonce nonce;
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw SystemError("authentication: no random bytes for a nonce (OpenSSL RAND_bytes: " +
                      openssl_error() + ")");
  }
  return nonce;
}

Proof hmac_sha256(std::string_view key, const uint8_t* message, size_t length) {
  // HMAC() wants a non-null key pointer even for an empty key.
  static const uint8_t kEmpty = 0;
  const void* key_bytes = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  if (key.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw InvalidArgumentError("authentication: the job token is too long (" +
                               std::to_string(key.size()) + " bytes)");
  }
  Proof out{};
  unsigned int out_length = 0;
  if (HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()), message, length, out.data(),
           &out_length) == nullptr ||
      out_length != out.size()) {
    throw SystemError("authentication: HMAC-SHA256 failed (OpenSSL: " + openssl_error() + ")");
  }
  return out;
}

Proof prove(std::string_view token, std::string_view context, Role role,
            const Nonce& client_nonce, const Nonce& server_nonce) {
  // Length-prefixed fields, so that no two (context, role) pairs encode alike.
  wire::Writer w;
  w.text(kDomain);
  w.text(context);
  w.u8(static_cast<uint8_t>(role));
  w.array(client_nonce);
  w.array(server_nonce);
  std::vector<uint8_t> message = w.take();
  return hmac_sha256(token, message.data(), message.size());
}

bool same_proof(const Proof& a, const Proof& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace chorus::auth
