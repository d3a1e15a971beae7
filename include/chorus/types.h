// Element types and reduction operators understood by every chorus collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace chorus {

enum class DataType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,   // IEEE 754 binary16
  kBFloat16,  // bfloat16 (upper half of a float32)
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
};

// Reductions. kAvg is a sum divided by the communicator size (integer types divide
// with truncation toward zero). For kFloat16 and kBFloat16 every pairwise step is
// computed in float32 and rounded once to the element type.
enum class ReduceOp : uint8_t {
  kSum,
  kProd,
  kMin,
  kMax,
  kAvg,
};

// The operations of a communicator, one spelling used everywhere: the issuing calls,
// algorithm_for(), frame headers and shared-memory descriptors (as the byte value, send
// and recv both as kSend since a recv must match its send), the flight recorder and
// chorus-bench. The values are part of the wire format of one build, nothing more.
enum class Collective : uint8_t {
  kAllreduce = 1,
  kBroadcast,
  kReduce,
  kAllgather,
  kAllgatherv,
  kReduceScatter,
  kGather,
  kScatter,
  kAlltoall,
  kAlltoallv,
  kBarrier,
  kSend,
  kRecv,
};

inline constexpr DataType kAllDataTypes[] = {
    DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
    DataType::kInt8,    DataType::kUInt8,   DataType::kInt32,   DataType::kInt64};
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kAvg};
inline constexpr Collective kAllCollectives[] = {
    Collective::kAllreduce, Collective::kBroadcast,     Collective::kReduce,
    Collective::kAllgather, Collective::kAllgatherv,    Collective::kReduceScatter,
    Collective::kGather,    Collective::kScatter,       Collective::kAlltoall,
    Collective::kAlltoallv, Collective::kBarrier,       Collective::kSend,
    Collective::kRecv};

// Size of one element in bytes.
size_t dtype_size(DataType dtype);

// Names used in messages, benchmarks and on the command line: "f32", "f64", "f16",
// "bf16", "i8", "u8", "i32", "i64"; "sum", "prod", "min", "max", "avg".
const char* dtype_name(DataType dtype);
const char* op_name(ReduceOp op);
// "allreduce", "broadcast", "reduce", "allgather", "allgatherv", "reduce_scatter",
// "gather", "scatter", "alltoall", "alltoallv", "barrier", "send", "recv"; "?" for a
// value outside the enum (a byte off the wire).
const char* collective_name(Collective collective);
// Whether `collective` is point-to-point (send, recv): numbered per stream, not per
// communicator.
constexpr bool is_p2p(Collective collective) {
  return collective == Collective::kSend || collective == Collective::kRecv;
}

// Parse the names above (also "float", "double", "half", "int", ...). Empty on failure.
std::optional<DataType> parse_dtype(std::string_view name);
std::optional<ReduceOp> parse_op(std::string_view name);
// The names of collective_name(), exactly.
std::optional<Collective> parse_collective(std::string_view name);

// IEEE binary16 and bfloat16 from and to float32 (round to nearest even, NaN kept a
// NaN). The conversions chorus uses inside its reductions.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace chorus
