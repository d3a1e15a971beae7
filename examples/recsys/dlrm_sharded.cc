// dlrm_sharded: a DLRM trained without TorchRec, sharded by hand as the reference DLRM's
// distributed mode does, on chorus_torch: the C++ twin of dlrm_sharded.py (same model,
// same synthetic data, same sharding; examples/recsys/README.md).
//
//   * Embedding tables, model parallel: table t lives on rank t % W only.
//   * Every rank generates the same synthetic global batch each step (from --seed, the
//     step and the table), looks its own tables up for the whole global batch, and one
//     all-to-all (the "butterfly") hands each rank every table's bags for its slice of
//     the batch: rank r keeps b_r = floor(B / W) samples, one more for r < B mod W.
//   * The bottom MLP, the dot interaction and the top MLP run on that slice under
//     chorus_torch's DistributedDataParallel.
//   * Backward: loss.backward() averages the MLPs' gradients (DDP) and leaves the
//     gradient of the received bags; the reverse all-to-all sends each bag's gradient
//     back to its table's owner, which backpropagates it into its tables. Each rank
//     updates its own tables and its MLP replica with SGD.
//
// Started by chorusrun (env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or alone as
// one rank:
//   chorusrun --standalone --nproc-per-node 2 build/bin/dlrm_sharded --steps 10
// Rank 0 prints "loss step=S value=V global=G" per step (V: the mean loss of its slice,
// G: of the global batch), "samples/s ...", "checksum value=C" (every parameter summed
// in float64 over the ranks, the replicated MLPs counted once) and "moved tables=T
// mlp=M" (how far training moved them: the L1 distance from their initial values); every
// rank prints its tables, slice and split sizes, and at the end a hash of its MLPs, on
// stderr.
#include <CLI/CLI.hpp>
#include <chorus/torch/checksum.h>
#include <chorus/torch/ddp.h>
#include <chorus/torch/process_group.h>
#include <chorus/version.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

namespace {

using chorus::torch_ext::DistributedDataParallel;
using chorus::torch_ext::ProcessGroup;

constexpr int64_t kDenseFeatures = 13;

struct Args {
  int64_t tables = 8, rows = 100'000, dim = 64, batch_size = 1024, steps = 10, pooling = 10;
  std::string bot_mlp = "512-256", top_mlp = "512-256";
  int64_t seed = 0;
  double lr = 0.1;
  int threads = 1;
};

// "512-256" -> {512, 256}; empty when the text is not positive sizes joined by '-'.
std::vector<int64_t> layer_sizes(const std::string& spec) {
  std::vector<int64_t> sizes;
  std::stringstream in(spec);
  for (std::string part; std::getline(in, part, '-');) {
    size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(part, &used);
    } catch (const std::exception&) {
      return {};
    }
    if (used != part.size() || n <= 0) return {};
    sizes.push_back(n);
  }
  return sizes;
}

// A check that an option's number is at least `min` (above it when `strict`): CLI11's
// PositiveNumber would name the largest double as the range's end.
CLI::Validator bounded(double min, bool strict) {
  std::string bound = (strict ? "above " : "at least ") + std::to_string(static_cast<long long>(min));
  return CLI::Validator(
      [min, strict, bound](std::string& text) -> std::string {
        double value = 0;
        size_t used = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
        }
        if (used == text.size() && (strict ? value > min : value >= min)) return "";
        return "must be " + bound + ", got " + text;
      },
      bound);
}

// 0: go on; -1: done (--help, --version); otherwise the exit status (usage on stderr).
int parse(int argc, char** argv, Args& a) {
  CLI::App app{
      "dlrm_sharded: a DLRM with table-wise sharded embeddings (all-to-all) and "
      "data-parallel MLPs on chorus"};
  const CLI::Validator positive = bounded(1, false);
  auto sizes = [](const std::string& s) {
    return layer_sizes(s).empty() ? "expected positive layer sizes joined by '-', e.g. 512-256" : "";
  };
  app.add_option("--tables", a.tables, "embedding tables (table t lives on rank t % W)")->check(positive);
  app.add_option("--rows", a.rows, "rows of every table")->check(positive);
  app.add_option("--dim", a.dim, "embedding dimension (the bottom MLP's output too)")->check(positive);
  app.add_option("--batch-size", a.batch_size, "global batch size, split across ranks")->check(positive);
  app.add_option("--steps", a.steps, "training steps")->check(bounded(0, false));
  app.add_option("--pooling", a.pooling, "each bag holds 1..POOLING indices (uniformly drawn)")
      ->check(positive);
  app.add_option("--bot-mlp", a.bot_mlp, "hidden sizes of the bottom MLP (13 -> ... -> dim)")->check(sizes);
  app.add_option("--top-mlp", a.top_mlp, "hidden sizes of the top MLP (interaction -> ... -> 1)")
      ->check(sizes);
  app.add_option("--seed", a.seed, "model initialisation and synthetic data")->check(bounded(0, false));
  app.add_option("--lr", a.lr, "SGD learning rate")->check(bounded(0, true));
  app.add_option("--threads", a.threads, "intra-op threads")->check(positive);
  app.set_version_flag("--version", std::string("dlrm_sharded ") + CHORUS_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? -1 : 2;
  }
  return 0;
}

// A generator seeded by a tuple of small integers, the same on every rank (and the same
// seed as dlrm_sharded.py's generator(*key)).
at::Generator generator(std::initializer_list<int64_t> key) {
  unsigned __int128 seed = 0;
  for (int64_t k : key) seed = (seed * 1'000'003 + static_cast<uint64_t>(k) + 1) % (uint64_t{1} << 62);
  return at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
}

struct DenseBatch {
  at::Tensor features;  // [B, 13]
  at::Tensor labels;    // [B], 0 or 1
};

// The global batch's dense features and click labels.
DenseBatch dense_batch(const Args& a, int64_t step) {
  at::Generator g = generator({a.seed, step, 1});
  at::Tensor features = torch::rand({a.batch_size, kDenseFeatures}, g);
  at::Tensor noise = torch::rand({a.batch_size}, g);
  // A click rate the model can learn: from the dense features and a little noise.
  at::Tensor labels = ((features.narrow(1, 0, 4).sum(1) + noise) > 2.5).to(torch::kFloat);
  return {features, labels};
}

struct Bags {
  at::Tensor indices;  // every bag's row indices, one bag after the other
  at::Tensor offsets;  // [B]: where each bag starts in `indices`
};

// Table `table`'s bags for the global batch.
Bags sparse_batch(const Args& a, int64_t step, int64_t table) {
  at::Generator g = generator({a.seed, step, 2, table});
  at::Tensor lengths = torch::randint(1, a.pooling + 1, {a.batch_size}, g, torch::kLong);
  at::Tensor offsets =
      torch::cat({torch::zeros({1}, torch::kLong), lengths.cumsum(0).narrow(0, 0, a.batch_size - 1)});
  at::Tensor indices = torch::randint(0, a.rows, {lengths.sum().item<int64_t>()}, g, torch::kLong);
  return {indices, offsets};
}

torch::nn::Sequential mlp(const std::vector<int64_t>& sizes, bool last_relu) {
  torch::nn::Sequential layers;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers->push_back(torch::nn::Linear(sizes[i], sizes[i + 1]));
    if (i + 2 < sizes.size() || last_relu) layers->push_back(torch::nn::ReLU());
  }
  return layers;
}

// Bottom MLP, dot interaction (the pairwise dots of the bottom MLP's output and the K
// pooled embeddings, strictly lower triangle, beside the bottom MLP's output), top MLP
// to one logit.
struct DenseArchImpl : torch::nn::Module {
  explicit DenseArchImpl(const Args& a) {
    std::vector<int64_t> bottom = {kDenseFeatures}, top_sizes;
    for (int64_t n : layer_sizes(a.bot_mlp)) bottom.push_back(n);
    bottom.push_back(a.dim);
    bot = register_module("bot", mlp(bottom, true));
    const int64_t vectors = a.tables + 1;
    top_sizes.push_back(a.dim + vectors * (vectors - 1) / 2);
    for (int64_t n : layer_sizes(a.top_mlp)) top_sizes.push_back(n);
    top_sizes.push_back(1);
    top = register_module("top", mlp(top_sizes, false));
    at::Tensor lower = torch::tril_indices(vectors, vectors, -1);
    // Plain members, not buffers: constants that DDP need not broadcast.
    li = lower[0];
    lj = lower[1];
  }

  // dense [b, 13], bags [b, K, dim] -> logits [b].
  at::Tensor forward(const at::Tensor& dense, const at::Tensor& bags) {
    at::Tensor x = bot->forward(dense);                                 // [b, dim]
    at::Tensor vectors = torch::cat({x.unsqueeze(1), bags}, 1);         // [b, K+1, dim]
    at::Tensor dots = torch::bmm(vectors, vectors.transpose(1, 2));     // [b, K+1, K+1]
    at::Tensor pairs = dots.index({torch::indexing::Slice(), li, lj});  // [b, K(K+1)/2]
    return top->forward(torch::cat({x, pairs}, 1)).squeeze(1);
  }

  torch::nn::Sequential bot{nullptr}, top{nullptr};
  at::Tensor li, lj;
};
TORCH_MODULE(DenseArch);

// Who owns which table, which slice of the global batch is whose, and the split sizes
// of the butterfly all-to-all, in rows of `dim` floats (one row: one table's bag of one
// sample).
struct Layout {
  Layout(const Args& a, int rank, int world) : owned(world), local(world), start(world) {
    for (int64_t t = 0; t < a.tables; ++t) owned[t % world].push_back(t);
    for (int r = 0; r < world; ++r) {
      local[r] = a.batch_size / world + (r < a.batch_size % world ? 1 : 0);
      if (r > 0) start[r] = start[r - 1] + local[r - 1];
    }
    const auto mine = static_cast<int64_t>(owned[rank].size());
    // Rank j gets its slice of the batch for my tables; I get my slice for j's tables.
    std::vector<int64_t> order;  // the received blocks' tables: owned[0], owned[1], ...
    for (int j = 0; j < world; ++j) {
      send_rows.push_back(local[j] * mine);
      recv_rows.push_back(local[rank] * static_cast<int64_t>(owned[j].size()));
      order.insert(order.end(), owned[j].begin(), owned[j].end());
    }
    std::vector<int64_t> position(order.size());
    for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int64_t>(i);
    to_table_order = torch::tensor(position, torch::kLong);
    batch = local[rank];
  }

  // The received rows, block j holding [batch, owned[j].size(), dim], as every table's
  // bags for this rank's slice in table order: [batch, K, dim].
  at::Tensor bags_by_table(const at::Tensor& received, int64_t dim) const {
    std::vector<at::Tensor> blocks;
    int64_t at = 0;
    for (size_t j = 0; j < owned.size(); ++j) {
      blocks.push_back(
          received.narrow(0, at, recv_rows[j]).view({batch, static_cast<int64_t>(owned[j].size()), dim}));
      at += recv_rows[j];
    }
    return torch::cat(blocks, 1).index_select(1, to_table_order);
  }

  std::vector<std::vector<int64_t>> owned;  // the tables of each rank
  std::vector<int64_t> local, start;        // each rank's slice of the global batch
  std::vector<int64_t> send_rows, recv_rows;
  at::Tensor to_table_order;
  int64_t batch = 0;  // this rank's slice
};

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Table `table` as initialised: the same whichever rank holds it.
torch::nn::EmbeddingBag build_table(const Args& a, int64_t table) {
  torch::nn::EmbeddingBag bag(torch::nn::EmbeddingBagOptions(a.rows, a.dim).mode(torch::kSum));
  torch::NoGradGuard no_grad;
  const double bound = std::sqrt(1.0 / static_cast<double>(a.rows));
  bag->weight.uniform_(-bound, bound, generator({a.seed, 1'000'000 + table}));
  return bag;
}

// The MLPs as initialised: the same on every rank (DDP's broadcast changes nothing).
DenseArch build_dense_arch(const Args& a) {
  torch::manual_seed(static_cast<uint64_t>(a.seed));
  return DenseArch(a);
}

// One all-to-all of rows of `dim` floats: send_rows[j] rows of `rows` to rank j,
// recv_rows[j] rows from rank j into the result.
at::Tensor exchange(ProcessGroup& group, const at::Tensor& rows, const std::vector<int64_t>& send_rows,
                    const std::vector<int64_t>& recv_rows, int64_t dim) {
  const int64_t total = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  at::Tensor received = torch::empty({total, dim}, rows.options());
  group.alltoall(received, rows.contiguous(), recv_rows, send_rows).wait();
  return received;
}

// Every parameter summed in float64 over the ranks, the replicated MLPs counted once.
double checksum(ProcessGroup& group, const std::vector<torch::nn::EmbeddingBag>& tables, DenseArch& dense) {
  at::Tensor total = torch::zeros({1}, torch::kDouble);
  for (const auto& table : tables) total += table->weight.detach().to(torch::kDouble).sum();
  if (group.rank() == 0) {
    for (const auto& p : dense->parameters()) total += p.detach().to(torch::kDouble).sum();
  }
  group.allreduce(total).wait();
  return total.item<double>();
}

// The L1 distance of `now` from `initial`, in float64.
double distance(const at::Tensor& now, const at::Tensor& initial) {
  return (now.detach().to(torch::kDouble) - initial.to(torch::kDouble)).abs().sum().item<double>();
}

// How far training moved the tables and the MLPs: the L1 distance of their parameters
// from their initial values (made again from --seed, one table at a time), in float64
// over the ranks. Unlike the checksum, whose terms cancel, these add up positive terms
// and scale with the updates: two runs whose parameters differ by rounding agree to
// many digits, and an update off by a factor shows as that factor.
std::pair<double, double> moved(const Args& a, ProcessGroup& group, const std::vector<int64_t>& owned,
                                const std::vector<torch::nn::EmbeddingBag>& tables, DenseArch& dense) {
  at::Tensor total = torch::zeros({2}, torch::kDouble);
  for (size_t i = 0; i < tables.size(); ++i) {
    total[0] += distance(tables[i]->weight, build_table(a, owned[i])->weight);
  }
  if (group.rank() == 0) {
    const std::vector<at::Tensor> now = dense->parameters(), initial = build_dense_arch(a)->parameters();
    for (size_t k = 0; k < now.size(); ++k) total[1] += distance(now[k], initial[k]);
  }
  group.allreduce(total).wait();
  return {total[0].item<double>(), total[1].item<double>()};
}

// One rank's part of the job: its tables, its MLP replica under DDP, their optimizers.
class Job {
 public:
  Job(const Args& a, std::shared_ptr<ProcessGroup> group)
      : a_(a),
        group_(std::move(group)),
        rank_(group_->rank()),
        world_(group_->size()),
        layout_(a, rank_, world_),
        dense_(build_dense_arch(a)),
        ddp_(dense_.ptr(), group_),
        opt_dense_(dense_->parameters(), torch::optim::SGDOptions(a.lr)) {
    std::vector<at::Tensor> weights;
    for (int64_t t : layout_.owned[rank_]) {
      tables_.push_back(build_table(a, t));
      weights.push_back(tables_.back()->weight);
    }
    if (!tables_.empty())
      opt_tables_ = std::make_unique<torch::optim::SGD>(weights, torch::optim::SGDOptions(a.lr));
    std::fprintf(stderr, "rank %d: tables %s batch %lld all_to_all send %s recv %s rows of %lld floats\n",
                 rank_, list(layout_.owned[rank_]).c_str(), static_cast<long long>(layout_.batch),
                 list(layout_.send_rows).c_str(), list(layout_.recv_rows).c_str(),
                 static_cast<long long>(a.dim));
  }

  // One training step; prints the loss line on rank 0.
  void step(int64_t step) {
    const DenseBatch batch = dense_batch(a_, step);
    const at::Tensor sent = pooled_rows(step);
    // The butterfly: the received rows are a leaf of the MLPs' graph, whose gradient
    // the reverse exchange sends back to the tables' owners.
    at::Tensor received = exchange(*group_, sent.detach(), layout_.send_rows, layout_.recv_rows, a_.dim);
    received.requires_grad_(true);
    const int64_t lo = layout_.start[rank_], b = layout_.batch;
    at::Tensor logits =
        ddp_.forward(dense_, batch.features.narrow(0, lo, b), layout_.bags_by_table(received, a_.dim));
    at::Tensor loss_sum = torch::binary_cross_entropy_with_logits(logits, batch.labels.narrow(0, lo, b), {},
                                                                  {}, at::Reduction::Sum);
    // W/B times the slice's sum: DDP averages over the W ranks, so the MLPs get the
    // gradients of the global batch's mean loss.
    (loss_sum * (static_cast<double>(world_) / static_cast<double>(a_.batch_size))).backward();
    // The bags' gradients of that mean are 1/W of what comes back.
    at::Tensor back =
        exchange(*group_, received.grad(), layout_.recv_rows, layout_.send_rows, a_.dim).mul_(1.0 / world_);
    if (sent.requires_grad()) sent.backward(back);
    opt_dense_.step();
    opt_dense_.zero_grad();
    if (opt_tables_) {
      opt_tables_->step();
      opt_tables_->zero_grad();
    }
    report_loss(step, loss_sum.item<double>());
  }

  // The end: the checksum and how far training moved the parameters (rank 0), every
  // rank's MLP hash (stderr). `seconds`: steps 1 on, for samples/s.
  void finish(double seconds) {
    const double sum = checksum(*group_, tables_, dense_);
    const auto [tables_moved, mlp_moved] = moved(a_, *group_, layout_.owned[rank_], tables_, dense_);
    std::fprintf(stderr, "rank %d mlp %s\n", rank_, chorus::torch_ext::state_checksum(*dense_).c_str());
    if (rank_ == 0) {
      if (a_.steps > 1) {
        std::printf("samples/s %.1f (steps 1..%lld, %d ranks, chorus)\n",
                    static_cast<double>(a_.batch_size * (a_.steps - 1)) / seconds,
                    static_cast<long long>(a_.steps - 1), world_);
      }
      std::printf("checksum value=%.17g\n", sum);
      std::printf("moved tables=%.17g mlp=%.17g\n", tables_moved, mlp_moved);
    }
    group_->barrier().wait();
  }

 private:
  // This rank's tables' bags for the whole global batch, [B * tables, dim], batch-major:
  // each rank's slice of the batch is one run of rows.
  at::Tensor pooled_rows(int64_t step) {
    if (tables_.empty()) return torch::zeros({0, a_.dim});
    std::vector<at::Tensor> pooled;
    for (size_t i = 0; i < tables_.size(); ++i) {
      const Bags bags = sparse_batch(a_, step, layout_.owned[rank_][i]);
      pooled.push_back(tables_[i]->forward(bags.indices, bags.offsets));  // [B, dim]
    }
    return torch::stack(pooled, 1).view({-1, a_.dim});
  }

  // One float64 allreduce of the ranks' loss sums; rank 0 prints its slice's mean loss
  // and the global batch's.
  void report_loss(int64_t step, double loss_sum) {
    at::Tensor total = torch::full({1}, loss_sum, torch::kDouble);
    group_->allreduce(total).wait();
    if (rank_ != 0) return;
    std::printf("loss step=%lld value=%.17g global=%.17g\n", static_cast<long long>(step),
                loss_sum / static_cast<double>(layout_.batch),
                total.item<double>() / static_cast<double>(a_.batch_size));
    std::fflush(stdout);
  }

  const Args& a_;
  std::shared_ptr<ProcessGroup> group_;
  const int rank_, world_;
  const Layout layout_;
  DenseArch dense_;
  DistributedDataParallel ddp_;
  std::vector<torch::nn::EmbeddingBag> tables_;
  torch::optim::SGD opt_dense_;
  std::unique_ptr<torch::optim::SGD> opt_tables_;  // none on a rank without tables
};

int train(const Args& a, const std::shared_ptr<ProcessGroup>& group) {
  if (a.batch_size < group->size()) {
    std::fprintf(stderr,
                 "dlrm_sharded: --batch-size %lld is below the world size %d: every rank needs a sample\n",
                 static_cast<long long>(a.batch_size), group->size());
    return 2;
  }
  Job job(a, group);
  std::chrono::steady_clock::time_point began;
  for (int64_t step = 0; step < a.steps; ++step) {
    if (step == 1) began = std::chrono::steady_clock::now();
    job.step(step);
  }
  job.finish(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (int rc = parse(argc, argv, a)) return rc < 0 ? 0 : rc;
  try {
    torch::set_num_threads(a.threads);
    auto group = ProcessGroup::from_env();
    return train(a, group);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlrm_sharded: %s\n", e.what());
    return 1;
  }
}
