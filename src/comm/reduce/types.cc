// Element types and reduction operators: sizes, names, parsing.
#include "chorus/types.h"

namespace chorus {

size_t dtype_size(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  return 0;
}

const char* dtype_name(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return "f32";
    case DataType::kFloat64: return "f64";
    case DataType::kFloat16: return "f16";
    case DataType::kBFloat16: return "bf16";
    case DataType::kInt8: return "i8";
    case DataType::kUInt8: return "u8";
    case DataType::kInt32: return "i32";
    case DataType::kInt64: return "i64";
  }
  return "?";
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  return "?";
}

std::optional<DataType> parse_dtype(std::string_view n) {
  if (n == "f32" || n == "float" || n == "float32") return DataType::kFloat32;
  if (n == "f64" || n == "double" || n == "float64") return DataType::kFloat64;
  if (n == "f16" || n == "half" || n == "float16") return DataType::kFloat16;
  if (n == "bf16" || n == "bfloat16") return DataType::kBFloat16;
  if (n == "i8" || n == "int8") return DataType::kInt8;
  if (n == "u8" || n == "uint8") return DataType::kUInt8;
  if (n == "i32" || n == "int" || n == "int32") return DataType::kInt32;
  if (n == "i64" || n == "long" || n == "int64") return DataType::kInt64;
  return std::nullopt;
}

std::optional<ReduceOp> parse_op(std::string_view n) {
  if (n == "sum") return ReduceOp::kSum;
  if (n == "prod") return ReduceOp::kProd;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "avg") return ReduceOp::kAvg;
  return std::nullopt;
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kAllgather: return "allgather";
    case Collective::kAllgatherv: return "allgatherv";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kGather: return "gather";
    case Collective::kScatter: return "scatter";
    case Collective::kAlltoall: return "alltoall";
    case Collective::kAlltoallv: return "alltoallv";
    case Collective::kBarrier: return "barrier";
    case Collective::kSend: return "send";
    case Collective::kRecv: return "recv";
  }
  return "?";
}

std::optional<Collective> parse_collective(std::string_view n) {
  for (Collective c : kAllCollectives) {
    if (n == collective_name(c)) return c;
  }
  return std::nullopt;
}

}  // namespace chorus
