#include "chorus/version.h"

namespace chorus {

const char* library_version() noexcept { return CHORUS_VERSION; }

}  // namespace chorus
