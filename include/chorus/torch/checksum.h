// A checksum of a model's state, to show that the replicas of a data-parallel job are
// bitwise equal: print it on every rank at the end, and compare.
#pragma once

#include <torch/torch.h>

#include <string>

namespace chorus::torch_ext {

// FNV-1a (64 bit) over the bytes of every parameter, in registration order, and then,
// with `with_buffers`, of every buffer (BatchNorm's running statistics, say), as 16 hex
// digits. Equal on two ranks means every byte of those tensors is equal; the value
// depends on the byte layout of the machine (both ranks must share it, as chorus's
// ranks do).
std::string state_checksum(const torch::nn::Module& module, bool with_buffers = true);

}  // namespace chorus::torch_ext
