// tensor_parallel_mlp: one tensor-parallel MLP step, y = relu(x W1) W2, over
// N GPUs with replay::nccl. W1 is split by columns (column-parallel linear),
// W2 by rows (row-parallel linear): each rank computes relu(x W1_r) W2_r, a
// partial y, and an all-reduce (sum) of the partials gives y on every rank.
// Each rank's step (two GEMMs and the all-reduce) is captured per batch
// bucket by a ShapeRouter; a MultiRankRouter makes the ranks agree on the
// bucket every step and a ReplayWatchdog reports a replay that does not finish.
//
// It checks every rank's result against an eager single-GPU reference (the
// whole W1 and W2 on the rank's own device), prints graphed against eager step
// latency, and with --steps N runs N steps with random, different batch sizes
// on every rank, checking that all ranks chose the same bucket every step.
//
//   tensor_parallel_mlp [--ranks N] [--steps S] [--hidden H] [--ffn F] [--max-batch B]
//       one process, one thread per GPU (ncclCommInitAll); N defaults to every GPU
//   tensor_parallel_mlp --rank R --nranks N --id-file PATH [...]
//       one process per GPU (run N of them): rank 0 writes the NCCL unique id to PATH
//
// NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless set): see docs/nccl.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <replay/nccl.hpp>
#include <replay/replay.hpp>

namespace {

using namespace std::chrono_literals;

struct Config {
  int ranks = 0;       // threads mode: 0 = every GPU
  int rank = -1;       // process mode when >= 0
  int nranks = 0;
  std::string id_file;
  long long steps = 0;
  int hidden = 512;
  int ffn = 2048;
  int max_batch = 64;
};

constexpr int kTile = 16;

// C[M, N] = A[M, K] B[K, N] (row-major), then ReLU if asked: one 16x16 tile
// of C per block, K walked in 16-wide slabs through shared memory.
template <bool Relu>
__global__ void gemm_kernel(const float* a, const float* b, float* c, int m, int n, int k) {
  __shared__ float as[kTile][kTile];
  __shared__ float bs[kTile][kTile + 1];
  const int row = static_cast<int>(blockIdx.y) * kTile + static_cast<int>(threadIdx.y);
  const int col = static_cast<int>(blockIdx.x) * kTile + static_cast<int>(threadIdx.x);
  float acc = 0.0F;
  for (int t = 0; t < k; t += kTile) {
    const int ak = t + static_cast<int>(threadIdx.x);
    const int bk = t + static_cast<int>(threadIdx.y);
    as[threadIdx.y][threadIdx.x] = (row < m && ak < k) ? a[static_cast<long long>(row) * k + ak] : 0.0F;
    bs[threadIdx.y][threadIdx.x] = (bk < k && col < n) ? b[static_cast<long long>(bk) * n + col] : 0.0F;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      acc = fmaf(as[threadIdx.y][i], bs[i][threadIdx.x], acc);
    }
    __syncthreads();
  }
  if (row < m && col < n) {
    c[static_cast<long long>(row) * n + col] = Relu ? fmaxf(acc, 0.0F) : acc;
  }
}

template <bool Relu>
void gemm(const float* a, const float* b, float* c, int m, int n, int k, replay::StreamRef s) {
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile), static_cast<unsigned>((m + kTile - 1) / kTile));
  gemm_kernel<Relu><<<grid, block, 0, s.get()>>>(a, b, c, m, n, k);
  replay::check_last_launch("gemm_kernel");
}

// Deterministic data: every rank makes the same full matrices (weights scaled
// by 1/sqrt(rows), inputs not) and keeps its slice.
std::vector<float> random_matrix(std::size_t rows, std::size_t cols, unsigned seed, bool weights = true) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
  const float scale = weights ? 1.0F / std::sqrt(static_cast<float>(rows)) : 1.0F;
  std::vector<float> out(rows * cols);
  for (float& v : out) {
    v = dist(engine) * scale;
  }
  return out;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// FNV-1a over the agreed buckets, so that ranks in separate processes can compare their sequences.
std::uint64_t hash_step(std::uint64_t h, int bucket) {
  h ^= static_cast<std::uint64_t>(bucket);
  return h * 1099511628211ULL;
}

struct RankResult {
  bool ok = true;
  std::vector<int> agreed;  // --steps: the bucket of every step
  double graphed_us = 0, eager_us = 0, agreed_step_us = 0;
  double max_error = 0;
  std::string failure;
};

// Everything one rank does, on its own device and stream.
RankResult run_rank(const Config& cfg, replay::Communicator& comm) {
  RankResult result;
  replay::ScopedDevice on(comm.device());
  const int ranks = comm.size();
  const int rank = comm.rank();
  const int hidden = cfg.hidden;
  const int ffn = cfg.ffn;
  const int local = ffn / ranks;
  // Buffers hold the largest bucket (the first power of two >= --max-batch).
  const std::vector<std::int64_t> buckets = replay::power_of_two_buckets(cfg.max_batch);
  const int max_batch = static_cast<int>(buckets.back());
  auto elems = [](long long a, long long b) { return static_cast<std::size_t>(a * b); };

  // Weights: the full ones (for the reference) and this rank's slices.
  const std::vector<float> w1_full = random_matrix(static_cast<std::size_t>(hidden), static_cast<std::size_t>(ffn), 1);
  const std::vector<float> w2_full = random_matrix(static_cast<std::size_t>(ffn), static_cast<std::size_t>(hidden), 2);
  std::vector<float> w1_slice(elems(hidden, local));
  for (int r = 0; r < hidden; ++r) {
    std::copy_n(w1_full.begin() + static_cast<std::ptrdiff_t>(elems(r, ffn) + elems(rank, local)), local,
                w1_slice.begin() + static_cast<std::ptrdiff_t>(elems(r, local)));
  }
  const std::vector<float> w2_slice(w2_full.begin() + static_cast<std::ptrdiff_t>(elems(rank, local) * hidden),
                                    w2_full.begin() + static_cast<std::ptrdiff_t>(elems(rank + 1, local) * hidden));

  replay::Stream stream;
  replay::DeviceBuffer<float> w1(w1_slice.size());
  replay::DeviceBuffer<float> w2(w2_slice.size());
  replay::DeviceBuffer<float> x(elems(max_batch, hidden));
  replay::DeviceBuffer<float> h(elems(max_batch, local));
  replay::DeviceBuffer<float> y(elems(max_batch, hidden));
  w1.copy_from(w1_slice, stream);
  w2.copy_from(w2_slice, stream);
  x.zero(stream);

  // One tensor-parallel step for `batch` rows (the padded batch under the router).
  auto step = [&](int batch, replay::StreamRef s) {
    gemm<true>(x.data(), w1.data(), h.data(), batch, local, hidden, s);   // column-parallel + ReLU
    gemm<false>(h.data(), w2.data(), y.data(), batch, hidden, local, s);  // row-parallel: partial y
    replay::all_reduce(comm, y.first(elems(batch, hidden)), replay::ReduceOp::sum, s);
  };

  auto options = replay::ShapeRouterOptions<int>::bucketed(buckets);
  options.warmup_runs = 1;  // NCCL connects on a collective's first, eager, run
  replay::ShapeRouter<int> router(step, options);
  replay::NcclAgreement agreement(comm, 60s);
  std::atomic<bool> stuck{false};
  replay::ReplayWatchdog watchdog({.timeout = 10s,
                                   .poll_interval = 5ms,
                                   .on_stuck = [&](const replay::StuckWork& s) {
                                     std::fprintf(stderr, "tensor_parallel_mlp: %s\n", s.describe().c_str());
                                     stuck = true;
                                   }});
  replay::MultiRankRouter<int> multi(router, agreement, &watchdog);
  const std::size_t captured = multi.capture_all(stream);
  if (captured != router.bucket_shapes().size()) {
    result.ok = false;
    result.failure = "only " + std::to_string(captured) + " buckets were captured";
  }

  // 1. Results against the eager single-GPU reference, for a few batch sizes
  //    (the same inputs on every rank: tensor parallelism replicates x).
  {
    replay::DeviceBuffer<float> w1_all(w1_full.size());
    replay::DeviceBuffer<float> w2_all(w2_full.size());
    replay::DeviceBuffer<float> h_all(elems(max_batch, ffn));
    replay::DeviceBuffer<float> y_ref(elems(max_batch, hidden));
    w1_all.copy_from(w1_full, stream);
    w2_all.copy_from(w2_full, stream);
    for (int batch : {1, 3, cfg.max_batch / 2 + 1, cfg.max_batch}) {
      const std::vector<float> input =
          random_matrix(static_cast<std::size_t>(batch), static_cast<std::size_t>(hidden),
                        100 + static_cast<unsigned>(batch), false);
      const int agreed = multi.agree(batch, stream);
      x.zero(stream);  // padding rows
      x.first(input.size()).copy_from(input, stream);
      (void)multi.run_agreed(agreed, stream);
      std::vector<float> got(elems(batch, hidden));
      y.first(got.size()).copy_to(got, stream);
      gemm<true>(x.data(), w1_all.data(), h_all.data(), batch, ffn, hidden, stream);
      gemm<false>(h_all.data(), w2_all.data(), y_ref.data(), batch, hidden, ffn, stream);
      std::vector<float> want(got.size());
      y_ref.first(want.size()).copy_to(want, stream);
      stream.synchronize();
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i]));
        result.max_error = std::max(result.max_error, err);
      }
    }
    if (result.max_error > 1e-4) {
      result.ok = false;
      result.failure = "results differ from the single-GPU reference (max relative error " +
                       std::to_string(result.max_error) + ")";
    }
  }

  // 2. Latency of one step at a mid-size bucket: graphed, eager, and graphed
  //    with the bucket agreement every step.
  {
    const int batch = std::max(1, cfg.max_batch / 2);
    const int iters = 200;
    auto time = [&](auto&& one) {
      for (int i = 0; i < 10; ++i) {
        one();
      }
      stream.synchronize();
      const double start = now_us();
      for (int i = 0; i < iters; ++i) {
        one();
      }
      stream.synchronize();
      return (now_us() - start) / iters;
    };
    result.graphed_us = time([&] { (void)multi.run_agreed(batch, stream); });
    result.eager_us = time([&] { step(batch, stream); });
    result.agreed_step_us = time([&] { (void)multi.run(batch, stream); });
  }

  // 3. --steps: random, different batch sizes on every rank; every rank must
  //    choose the same bucket every step, and no step may hang.
  if (cfg.steps > 0) {
    std::mt19937 engine(static_cast<unsigned>(std::random_device{}()) * 31U + static_cast<unsigned>(rank));
    std::uniform_int_distribution<int> batch_dist(1, cfg.max_batch);
    std::uint64_t hash = 1469598103934665603ULL;
    result.agreed.reserve(static_cast<std::size_t>(cfg.steps));
    for (long long s = 0; s < cfg.steps && !stuck; ++s) {
      const int batch = batch_dist(engine);
      const replay::MultiRankRoute<int> route = multi.run(batch, stream);
      if (route.agreed < batch || route.agreed != router.padded_shape(route.agreed) || !route.route.graph()) {
        result.ok = false;
        result.failure = "step " + std::to_string(s) + ": bucket " + std::to_string(route.agreed) +
                         " does not serve batch " + std::to_string(batch) + " as a graph";
        break;
      }
      result.agreed.push_back(route.agreed);
      hash = hash_step(hash, route.agreed);
    }
    stream.synchronize();
    // Every rank compares its sequence with the others': max and min of the hashes agree.
    replay::DeviceBuffer<std::int64_t> hashes(2);
    const auto signed_hash = static_cast<std::int64_t>(hash >> 1U);
    const std::vector<std::int64_t> mine{signed_hash, signed_hash};
    hashes.copy_from(mine, stream);
    replay::all_reduce(comm, hashes.first(1), replay::ReduceOp::max, stream);
    replay::all_reduce(comm, hashes.subview(1, 1), replay::ReduceOp::min, stream);
    std::vector<std::int64_t> both(2);
    hashes.copy_to(both, stream);
    stream.synchronize();
    if (both[0] != both[1]) {
      result.ok = false;
      result.failure = "the ranks chose different buckets in some step (bucket sequences differ)";
    }
    if (stuck) {
      result.ok = false;
      result.failure = "a replay did not finish in time (see above)";
    }
  }
  return result;
}

void print(const Config& cfg, int ranks, const RankResult& r0) {
  std::printf("tensor_parallel_mlp: %d rank(s), hidden %d, ffn %d, max batch %d\n", ranks, cfg.hidden, cfg.ffn,
              cfg.max_batch);
  std::printf("  max relative error against the single-GPU reference: %.2e\n", r0.max_error);
  std::printf("  step at batch %d: graphed %.1f us, eager %.1f us (%.2fx), graphed with agreement %.1f us\n",
              std::max(1, cfg.max_batch / 2), r0.graphed_us, r0.eager_us,
              r0.graphed_us > 0 ? r0.eager_us / r0.graphed_us : 0.0, r0.agreed_step_us);
  if (cfg.steps > 0) {
    std::printf("  %lld steps with random per-rank batch sizes: the same bucket on every rank every step\n",
                cfg.steps);
  }
}

bool parse(int argc, char** argv, Config& cfg) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (arg == "--ranks" && (v = value())) cfg.ranks = std::atoi(v);
    else if (arg == "--rank" && (v = value())) cfg.rank = std::atoi(v);
    else if (arg == "--nranks" && (v = value())) cfg.nranks = std::atoi(v);
    else if (arg == "--id-file" && (v = value())) cfg.id_file = v;
    else if (arg == "--steps" && (v = value())) cfg.steps = std::atoll(v);
    else if (arg == "--hidden" && (v = value())) cfg.hidden = std::atoi(v);
    else if (arg == "--ffn" && (v = value())) cfg.ffn = std::atoi(v);
    else if (arg == "--max-batch" && (v = value())) cfg.max_batch = std::atoi(v);
    else {
      std::fprintf(stderr, "tensor_parallel_mlp: unknown or incomplete argument '%s'\n", argv[i]);
      return false;
    }
  }
  return cfg.hidden > 0 && cfg.ffn > 0 && cfg.max_batch > 0 && cfg.steps >= 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!replay::keep_nvlink_multicast_off()) {
    std::fprintf(stderr, "tensor_parallel_mlp: NCCL_NVLS_ENABLE=%s was set by you; NVLink multicast may be used\n",
                 std::getenv("NCCL_NVLS_ENABLE"));
  }
  Config cfg;
  if (!parse(argc, argv, cfg)) {
    return 2;
  }
  const int devices = replay::device_count();
  if (devices == 0) {
    std::fprintf(stderr, "tensor_parallel_mlp: no CUDA device\n");
    return 1;
  }
  try {
    if (cfg.rank >= 0) {  // one process per GPU
      if (cfg.nranks < 1 || cfg.rank >= cfg.nranks || cfg.id_file.empty() || cfg.ffn % cfg.nranks != 0) {
        std::fprintf(stderr, "tensor_parallel_mlp: --rank R --nranks N --id-file PATH, R < N, ffn divisible by N\n");
        return 2;
      }
      const ncclUniqueId id = replay::exchange_unique_id(cfg.id_file, cfg.rank, cfg.nranks, 120s);
      replay::Communicator comm(id, cfg.nranks, cfg.rank, cfg.rank % devices);
      const RankResult r = run_rank(cfg, comm);
      if (cfg.rank == 0) {
        print(cfg, cfg.nranks, r);
      }
      if (!r.ok) {
        std::fprintf(stderr, "tensor_parallel_mlp: rank %d FAILED: %s\n", cfg.rank, r.failure.c_str());
        return 1;
      }
      std::printf("rank %d: ok\n", cfg.rank);
      return 0;
    }
    const int ranks = cfg.ranks > 0 ? cfg.ranks : devices;
    if (ranks > devices || cfg.ffn % ranks != 0) {
      std::fprintf(stderr, "tensor_parallel_mlp: %d ranks need %d GPUs (found %d) and ffn divisible by it\n", ranks,
                   ranks, devices);
      return 2;
    }
    replay::CommunicatorGroup group = replay::CommunicatorGroup::first_devices(ranks);
    std::vector<RankResult> results(static_cast<std::size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        auto& out = results[static_cast<std::size_t>(r)];
        try {
          out = run_rank(cfg, group[static_cast<std::size_t>(r)]);
        } catch (const std::exception& e) {
          out.ok = false;
          out.failure = e.what();
          // Its communicator may be in error: abort it rather than wait in ncclCommDestroy. Ranks
          // still waiting for this one give up when their agreement times out.
          group[static_cast<std::size_t>(r)].abort();
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    bool ok = true;
    for (int r = 0; r < ranks; ++r) {
      const RankResult& res = results[static_cast<std::size_t>(r)];
      if (res.agreed != results[0].agreed) {
        ok = false;
        std::fprintf(stderr, "tensor_parallel_mlp: rank %d chose other buckets than rank 0\n", r);
      }
      if (!res.ok) {
        ok = false;
        std::fprintf(stderr, "tensor_parallel_mlp: rank %d FAILED: %s\n", r, res.failure.c_str());
      }
    }
    print(cfg, ranks, results[0]);
    std::printf("%s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensor_parallel_mlp: %s\n", e.what());
    return 1;
  }
}
