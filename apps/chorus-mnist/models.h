// The seed jobs' models, shared by chorus-mnist and bench/plain_libtorch_mnist.cc so
// that both train exactly the same network (how they tune the process they train in:
// process_tuning.h).
#pragma once

#include <torch/torch.h>

namespace chorus::mnist {

// NeuralNetwork of seed 000: Flatten, then Linear/ReLU/Linear/ReLU/Linear. Layers are
// created in the same order as in PyTorch, so torch::manual_seed gives the same weights.
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    // One statement per layer: the order of function arguments' evaluation is
    // unspecified in C++ (GCC goes right to left), and the layers must draw their
    // initial weights in PyTorch's order.
    torch::nn::Linear fc1(784, 512);
    torch::nn::Linear fc2(512, 512);
    torch::nn::Linear fc3(512, 10);
    stack = register_module("linear_relu_stack",
                            torch::nn::Sequential(fc1, torch::nn::ReLU(), fc2, torch::nn::ReLU(), fc3));
  }
  torch::Tensor forward(torch::Tensor x) { return stack->forward(x.flatten(1)); }
  torch::nn::Sequential stack{nullptr};
};
TORCH_MODULE(Mlp);

// SimpleModel of seed 001.
struct LinearImpl : torch::nn::Module {
  LinearImpl() { fc = register_module("fc", torch::nn::Linear(784, 10)); }
  torch::Tensor forward(torch::Tensor x) { return fc->forward(x.flatten(1)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Linear);

}  // namespace chorus::mnist
