// Node-shared buffers themselves (include/chorus/shared_memory.h, src/comm/shared/):
// allocation, release, and which spans lie in them. The collectives on them are
// tested in tests/comm/transport/shared_memory_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
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

// Exactly the spans inside one buffer's size() are in shared memory: not the page's
// rounded-up tail beyond it, not a byte before it.
TEST(SharedBuffer, InSharedMemoryIsExactlyTheBuffersBytes) {
  auto a = allocate_shared(10000);
  const auto* p = static_cast<const uint8_t*>(a->data());
  EXPECT_TRUE(in_shared_memory(p, 10000));
  EXPECT_TRUE(in_shared_memory(p + 9999, 1));
  EXPECT_TRUE(in_shared_memory(p + 5000, 0)) << "a span of 0 bytes asks about the byte at data";
  EXPECT_FALSE(in_shared_memory(p, 10001)) << "past size(), in the mapping's last page";
  EXPECT_FALSE(in_shared_memory(p + 10000, 0)) << "the byte after the last";
  EXPECT_FALSE(in_shared_memory(p - 1, 2)) << "the byte before the first";
}

// A span in two buffers is in neither, whichever lies lower in memory.
TEST(SharedBuffer, ASpanAcrossTwoBuffersIsNotInSharedMemory) {
  auto a = allocate_shared(4096), b = allocate_shared(4096);
  const auto* low = static_cast<const uint8_t*>(std::min(a->data(), b->data()));
  const auto* high = static_cast<const uint8_t*>(std::max(a->data(), b->data()));
  EXPECT_TRUE(in_shared_memory(low, 4096));
  EXPECT_TRUE(in_shared_memory(high, 4096));
  EXPECT_FALSE(in_shared_memory(low, static_cast<size_t>(high - low) + 1));
}

TEST(SharedBuffer, OrdinaryAndFreedMemoryIsNotInSharedMemory) {
  std::vector<uint8_t> ordinary(10000);
  EXPECT_FALSE(in_shared_memory(ordinary.data(), ordinary.size()));
  EXPECT_FALSE(in_shared_memory(nullptr, 0));
  auto a = allocate_shared(10000);
  const void* p = a->data();
  EXPECT_FALSE(in_shared_memory(ordinary.data(), ordinary.size())) << "with a buffer alive";
  a.reset();
  EXPECT_FALSE(in_shared_memory(p, 1)) << "a freed buffer's bytes";
}

// The registry is the process's: a buffer allocated on one thread is found from any.
TEST(SharedBuffer, InSharedMemoryAnswersOnEveryThread) {
  auto a = allocate_shared(10000);
  bool found = false;
  std::thread([&] { found = in_shared_memory(a->data(), a->size()); }).join();
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace chorus
