// The defaults of chorus's settings, named once: what CommOptions, the stores and the
// environment variables (CHORUS_TIMEOUT, CHORUS_CONNECT_TIMEOUT, CHORUS_SEGMENT_BYTES,
// CHORUS_TRACE_BUFFER_SIZE) fall back on when nothing sets them.
#pragma once

#include <chrono>
#include <cstddef>

namespace chorus {

// Deadline of each operation.
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(30);
// Deadline to connect a group or reach a store.
inline constexpr std::chrono::milliseconds kDefaultConnectTimeout = std::chrono::seconds(120);
// Pipelining unit of the ring and chain algorithms over tcp, bytes.
inline constexpr size_t kDefaultSegmentBytes = size_t{2} << 20;
// Operations each communicator's flight recorder keeps.
inline constexpr size_t kDefaultTraceBufferSize = 256;

}  // namespace chorus
