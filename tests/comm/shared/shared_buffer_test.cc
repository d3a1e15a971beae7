// Node-shared buffers themselves (include/chorus/shared_memory.h, src/comm/shared/):
// allocation and release. The collectives on them are tested in
// tests/comm/transport/shared_memory_test.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace chorus {
namespace {

int memory_files_open() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().find("memfd:chorus-shared") != std::string::npos) ++n;
  }
  return n;
}

// This process's mappings of files in /dev/shm (named shared memory), unlinked ones
// included. Not a listing of /dev/shm itself: other tests running at the same time
// create and remove their segments there.
std::vector<std::string> dev_shm_mappings() {
  std::vector<std::string> names;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t at = line.find(" /dev/shm/");
    if (at != std::string::npos) names.push_back(line.substr(at + 1));
  }
  return names;
}

TEST(SharedBuffer, AllocatesZeroedPageAlignedMemoryWithoutAName) {
  const auto before = dev_shm_mappings();
  const int files = memory_files_open();
  {
    auto a = allocate_shared(10000);
    ASSERT_NE(a->data(), nullptr);
    EXPECT_EQ(a->size(), 10000u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u);
    const auto* bytes = static_cast<const uint8_t*>(a->data());
    for (size_t i = 0; i < a->size(); ++i) ASSERT_EQ(bytes[i], 0) << i;
    std::memset(a->data(), 7, a->size());  // writable
    EXPECT_EQ(memory_files_open(), files + 1);
    EXPECT_EQ(dev_shm_mappings(), before) << "allocate_shared mapped a name in /dev/shm";
    EXPECT_EQ(Communicator::allocate_shared(1)->size(), 1u);
  }
  EXPECT_EQ(memory_files_open(), files) << "a freed buffer's memory file is still open";
}

TEST(SharedBuffer, ZeroBytesIsAnArgumentError) {
  EXPECT_THROW(allocate_shared(0), InvalidArgumentError);
}

}  // namespace
}  // namespace chorus
