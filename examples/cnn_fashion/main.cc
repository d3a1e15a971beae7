// A small convolutional network with BatchNorm on Fashion-MNIST, data-parallel with
// chorus's DistributedDataParallel. It shows what the seed's MLP does not:
//   - buffers: BatchNorm's running mean and variance are broadcast from rank 0 before
//     every forward (DdpOptions::broadcast_buffers), so all replicas evaluate alike;
//   - a module with convolutions, pooling and normalization in it, not only Linear.
// Run it under chorusrun (RANK, WORLD_SIZE and the store come from there) or alone:
//   chorusrun --standalone --nproc-per-node 2 ./cnn_fashion [--epochs 2] [--max-steps N]
//       [--batch-size 128] [--lr 0.05] [--data-dir /usr/share/datasets/fashion-mnist]
// Each epoch rank 0 prints the test accuracy and the samples per second of the whole
// job; at the end every rank prints a checksum of its parameters and buffers (equal on
// every rank: the replicas stayed identical; chorus/torch/checksum.h) and rank 0 one
// JSON line.
#include <chorus/torch/checksum.h>
#include <chorus/torch/data.h>
#include <chorus/torch/ddp.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(8));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(16));
    fc = register_module("fc", torch::nn::Linear(16 * 7 * 7, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);  // 8 x 14 x 14
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), 2);  // 16 x 7 x 7
    return fc(x.flatten(1));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

struct Args {
  int64_t epochs = 2, max_steps = 0, batch_size = 128;
  double lr = 0.05;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
};

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char* name) -> const char* {
      if (std::strcmp(argv[i], name) != 0) return nullptr;
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cnn_fashion: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (const char* v = value("--epochs")) a.epochs = std::atoll(v);
    else if (const char* v = value("--max-steps")) a.max_steps = std::atoll(v);
    else if (const char* v = value("--batch-size")) a.batch_size = std::atoll(v);
    else if (const char* v = value("--lr")) a.lr = std::atof(v);
    else if (const char* v = value("--data-dir")) a.data_dir = v;
    else {
      std::fprintf(stderr, "cnn_fashion: unknown argument %s\n", argv[i]);
      return false;
    }
  }
  if (a.epochs < 1 || a.batch_size < 1 || a.max_steps < 0 || a.lr <= 0) {
    std::fprintf(stderr, "cnn_fashion: --epochs, --batch-size and --lr must be positive\n");
    return false;
  }
  return true;
}

std::shared_ptr<const chorus::data::MnistDataset> load(const Args& a, chorus::data::Split split) {
  chorus::data::MnistOptions o;
  o.directory = a.data_dir;
  o.split = split;
  o.layout = chorus::data::ImageLayout::kImage;  // 1 x 28 x 28
  o.normalize = chorus::data::Normalize{0.2860, 0.3530};  // Fashion-MNIST's mean and std
  return chorus::data::MnistDataset::load(o);
}

double test_accuracy(Net& model, const std::shared_ptr<const chorus::data::MnistDataset>& test) {
  torch::NoGradGuard no_grad;
  model->eval();  // BatchNorm uses its running statistics
  chorus::data::DataLoaderOptions lo;
  lo.batch_size = 1000;
  chorus::data::DataLoader loader(test, lo);
  int64_t correct = 0;
  while (auto b = loader.next()) correct += model->forward(b->data).argmax(1).eq(b->target).sum().item<int64_t>();
  model->train();
  return static_cast<double>(correct) / static_cast<double>(test->size());
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) return 2;
  try {
    auto group = chorus::torch_ext::ProcessGroup::from_env();
    const int rank = group->rank(), world = group->size();
    if (a.batch_size % world != 0) {
      std::fprintf(stderr, "cnn_fashion: --batch-size %lld does not divide among %d ranks\n",
                   static_cast<long long>(a.batch_size), world);
      return 2;
    }
    torch::manual_seed(0);  // the same start everywhere (DDP broadcasts rank 0's anyway)
    Net model;
    chorus::torch_ext::DistributedDataParallel ddp(model.ptr(), group);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(a.lr).momentum(0.9));
    auto train = load(a, chorus::data::Split::kTrain), test = load(a, chorus::data::Split::kTest);
    chorus::data::DistributedSamplerOptions so;
    so.num_replicas = world;
    so.rank = rank;
    chorus::data::DistributedSampler sampler(train->size(), so);
    int64_t step = 0, samples = 0;
    double seconds = 0, accuracy = 0;
    for (int64_t epoch = 0; epoch < a.epochs; ++epoch) {
      sampler.set_epoch(epoch);
      chorus::data::DataLoaderOptions lo;
      lo.batch_size = a.batch_size / world;
      lo.drop_last = true;
      lo.workers = 1;
      chorus::data::DataLoader loader(train, sampler.epoch_indices(), lo);
      const auto start = std::chrono::steady_clock::now();
      bool stop = false;
      while (auto b = loader.next()) {
        torch::Tensor loss = torch::nn::functional::cross_entropy(ddp.forward(model, b->data), b->target);
        optimizer.zero_grad();
        loss.backward();
        optimizer.step();
        samples += b->size() * world;
        if (++step == a.max_steps) {
          stop = true;
          break;
        }
      }
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ddp.prepare_forward();  // rank 0's BatchNorm statistics on every rank before testing
      accuracy = test_accuracy(model, test);
      if (rank == 0) {
        std::printf("epoch %lld: test accuracy %.2f%%, %.0f samples/s on %d ranks\n",
                    static_cast<long long>(epoch), 100 * accuracy, samples / seconds, world);
        std::fflush(stdout);
      }
      if (stop) break;
    }
    std::printf("rank %d checksum %s\n", rank, chorus::torch_ext::state_checksum(*model).c_str());
    if (rank == 0) {
      std::printf("{\"ranks\": %d, \"steps\": %lld, \"test_accuracy\": %.4f, \"samples_per_second\": %.1f}\n",
                  world, static_cast<long long>(step), accuracy, samples / seconds);
    }
    group->barrier().wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cnn_fashion: %s\n", e.what());
    return 1;
  }
}
