// DecodeScheduler on the CPU with a deterministic stand-in model: the policy
// as pure functions, then the scheduler with real threads. The stand-in's
// next token is a pure function of the request and the position (an EOS at a
// chosen position), so every request's exact tokens are known in advance,
// whatever batch it ran in, how many steps a launch took, or which slot it
// had. The stand-in also checks every call it gets: buckets the smallest that
// fit, positions and input tokens right, no slot twice in a launch, no
// concurrent calls.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu_suite.hpp"
#include "replay/decode.hpp"

namespace {

using namespace std::chrono_literals;
using replay::DecodeStatus;
using replay::TokenId;

constexpr TokenId kEos = 0;
constexpr std::size_t kNoEos = std::numeric_limits<std::size_t>::max();

// The stand-in model: the token at position q of request `id`.
struct Model {
  std::vector<std::size_t> eos_position;  // by request id; kNoEos: never

  TokenId token_at(std::size_t id, std::size_t position) const {
    if (id < eos_position.size() && eos_position[id] == position) {
      return kEos;
    }
    std::uint64_t h = (id + 1) * 0x9E3779B97F4A7C15ULL ^ (position + 1) * 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 29;
    return static_cast<TokenId>(1 + h % 50'000);
  }

  // What request `id` must get, and how it ends.
  std::pair<std::vector<TokenId>, DecodeStatus> expected(std::size_t id, std::size_t prompt, std::size_t max_new,
                                                         std::size_t max_len) const {
    std::vector<TokenId> out;
    for (std::size_t q = prompt;; ++q) {
      const TokenId t = token_at(id, q);
      out.push_back(t);
      if (t == kEos) {
        return {out, DecodeStatus::eos};
      }
      if (max_new != 0 && out.size() == max_new) {
        return {out, DecodeStatus::token_limit};
      }
      if (prompt + out.size() >= max_len) {
        return {out, DecodeStatus::context_limit};
      }
    }
  }
};

std::int64_t smallest_fitting(const std::vector<std::int64_t>& buckets, std::size_t need) {
  for (const std::int64_t b : buckets) {
    if (static_cast<std::size_t>(b) >= need) {
      return b;
    }
  }
  return -1;
}

// What the stand-in saw and how it behaves; shared by the test and the
// executor inside the scheduler.
struct StandIn {
  explicit StandIn(std::shared_ptr<const Model> m, const replay::DecodeOptions& options)
      : model(std::move(m)),
        batch_buckets(options.batch_buckets),
        context_buckets(options.context_buckets),
        max_slots(options.max_slots),
        max_len(options.max_len),
        steps_per_launch(options.steps_per_launch),
        chunked(options.prefill == replay::DecodePrefill::with_decode),
        max_prefill_tokens(options.max_prefill_tokens),
        slots(options.max_slots) {}

  std::shared_ptr<const Model> model;
  std::vector<std::int64_t> batch_buckets;
  std::vector<std::int64_t> context_buckets;
  std::size_t max_slots;
  std::size_t max_len;
  std::size_t steps_per_launch;
  bool chunked;  // DecodePrefill::with_decode: prompts come in prefill_and_decode() only
  std::size_t max_prefill_tokens;

  // Behaviour.
  bool keep_going_after_eos = false;  // emit every allowed token, EOS or not (as a graph that cannot stop a row)
  bool static_batches = false;        // check that a launch holds only sequences of the last prefill
  std::set<std::size_t> poison_prefill;  // request ids whose prefill throws
  std::set<std::size_t> poison_decode;   // request ids whose launch throws, from position poison_after on
  std::size_t poison_after = 0;
  std::size_t bad_counts_at_launch = 0;  // 1-based launch that reports 0 tokens for its first row; 0: never
  std::chrono::microseconds call_delay{0};
  std::set<std::size_t> block_at;  // 1-based calls (prefill or decode) that wait, each for its own release()

  // Records (guarded by mutex).
  std::mutex mutex;
  std::condition_variable changed;
  std::size_t blocks = 0;    // calls of block_at entered
  std::size_t releases = 0;  // release() calls
  std::size_t calls = 0;
  std::size_t prefill_calls = 0;
  std::size_t decode_calls = 0;
  std::vector<std::string> violations;
  std::vector<std::vector<std::size_t>> prefill_ids;  // per prefill call
  std::vector<std::size_t> prefill_prompt_tokens;     // per prefill call
  std::set<std::size_t> failed_ids;                   // ids in calls that failed
  std::size_t failed_prefill_calls = 0;
  std::size_t failed_decode_calls = 0;
  std::size_t mixed_calls = 0;         // prefill_and_decode() calls
  std::size_t failed_mixed_calls = 0;  // ... that threw (a poisoned prompt)
  // Every decode() and prefill_and_decode() call: the chunks it wrote and the
  // requests it stepped.
  struct Chunk {
    std::size_t id = 0;
    std::size_t start = 0;
    std::size_t size = 0;
    bool operator==(const Chunk&) const = default;
  };
  struct Launch {
    bool mixed = false;
    std::vector<Chunk> chunks;
    std::vector<std::size_t> stepped;
  };
  std::vector<Launch> launch_log;
  std::map<std::pair<std::int64_t, std::int64_t>, std::uint64_t> launches_per_bucket;
  std::size_t most_steps = 0;
  std::size_t mixed_launches = 0;  // launches holding sequences of two admissions or more
  std::size_t executors_destroyed = 0;

  struct Slot {
    std::size_t id = 0;
    std::size_t next_position = 0;
    std::size_t prefill_call = 0;  // the call that wrote its first prompt token
  };
  std::vector<std::optional<Slot>> slots;
  std::atomic<int> in_call{0};

  // Lets the next blocked call (or the next to block) go on.
  void release() {
    {
      std::lock_guard lock(mutex);
      ++releases;
    }
    changed.notify_all();
  }
  void wait_calls(std::size_t n) {
    std::unique_lock lock(mutex);
    REQUIRE(changed.wait_for(lock, 60s, [&] { return calls >= n; }));
  }
  void violation(std::string what) { violations.push_back(std::move(what)); }

  // Entering a call (lock held): counts it, waits at the calls of block_at.
  void enter(std::unique_lock<std::mutex>& lock) {
    if (in_call.fetch_add(1) != 0) {
      violation("two executor calls at once");
    }
    ++calls;
    changed.notify_all();
    if (block_at.count(calls) != 0) {
      const std::size_t block = ++blocks;
      changed.wait(lock, [&] { return releases >= block; });
    }
  }
  void leave() {
    in_call.fetch_sub(1);
    if (call_delay.count() > 0) {
      std::this_thread::sleep_for(call_delay);
    }
  }

  void prefill(replay::PrefillBatch& batch) {
    std::unique_lock lock(mutex);
    enter(lock);
    ++prefill_calls;
    if (chunked) {
      violation("prefill() called with DecodePrefill::with_decode");
    }
    std::vector<std::size_t> ids;
    std::size_t tokens = 0;
    bool poisoned = false;
    if (batch.rows.empty() || batch.first_tokens.size() != batch.rows.size()) {
      violation("a prefill with no rows or a wrong output size");
    }
    std::set<std::size_t> seen;
    for (const replay::PrefillRow& row : batch.rows) {
      if (row.slot >= max_slots || !seen.insert(row.slot).second) {
        violation("prefill slot out of range or twice: " + std::to_string(row.slot));
      }
      if (row.prompt.empty() || row.prompt.size() >= max_len) {
        violation("prefill of a prompt the scheduler should have refused");
      }
      if (row.start != 0) {
        violation("prefill() of a chunk (start " + std::to_string(row.start) + ")");
      }
      ids.push_back(static_cast<std::size_t>(row.prompt[0]));
      tokens += row.prompt.size();
      poisoned = poisoned || poison_prefill.count(ids.back()) != 0;
    }
    prefill_ids.push_back(ids);
    prefill_prompt_tokens.push_back(tokens);
    if (poisoned) {
      failed_ids.insert(ids.begin(), ids.end());
      ++failed_prefill_calls;
      leave();
      throw std::runtime_error("poisoned prompt in this prefill");
    }
    for (std::size_t r = 0; r < batch.rows.size(); ++r) {
      const replay::PrefillRow& row = batch.rows[r];
      slots.at(row.slot) = Slot{ids[r], row.prompt.size(), prefill_calls};
      batch.first_tokens[r] = model->token_at(ids[r], row.prompt.size());
    }
    leave();
  }

  void decode(replay::DecodeBatch& batch) {
    std::unique_lock lock(mutex);
    enter(lock);
    ++decode_calls;
    launch_log.push_back({});
    step(batch, false);
  }

  // Chunked prefill: the chunks written (each continuing its slot), then one
  // step of the decode rows.
  void prefill_and_decode(replay::MixedBatch& batch) {
    std::unique_lock lock(mutex);
    enter(lock);
    ++mixed_calls;
    if (!chunked) {
      violation("prefill_and_decode() called with DecodePrefill::separate");
    }
    const std::span<const replay::PrefillRow> rows = batch.prefill.rows;
    if (rows.empty() || batch.prefill.first_tokens.size() != rows.size()) {
      violation("a mixed launch with no chunks or a wrong output size");
    }
    Launch entry;
    entry.mixed = true;
    std::set<std::size_t> seen;
    std::size_t tokens = 0;
    bool poisoned = false;
    for (const replay::PrefillRow& row : rows) {
      if (row.slot >= max_slots || !seen.insert(row.slot).second) {
        violation("chunk slot out of range or twice: " + std::to_string(row.slot));
        continue;
      }
      if (row.prompt.empty() || row.start + row.prompt.size() >= max_len) {
        violation("a chunk of " + std::to_string(row.prompt.size()) + " tokens at " + std::to_string(row.start));
      }
      std::size_t id = row.prompt.empty() ? 0 : static_cast<std::size_t>(row.prompt[0]);
      if (row.start != 0) {
        if (!slots[row.slot] || slots[row.slot]->next_position != row.start) {
          violation("a chunk of slot " + std::to_string(row.slot) + " starts at " + std::to_string(row.start) +
                    "; the slot holds " + std::to_string(slots[row.slot] ? slots[row.slot]->next_position : 0) +
                    " positions");
        }
        id = slots[row.slot] ? slots[row.slot]->id : 0;
      }
      tokens += row.prompt.size();
      poisoned = poisoned || poison_prefill.count(id) != 0;
      entry.chunks.push_back({id, row.start, row.prompt.size()});
    }
    for (const replay::DecodeRow& row : batch.decode.rows) {
      if (seen.count(row.slot) != 0) {
        violation("slot " + std::to_string(row.slot) + " is both a chunk and a decode row");
      }
    }
    if (max_prefill_tokens != 0 && tokens > max_prefill_tokens) {
      violation("a mixed launch of " + std::to_string(tokens) + " prompt tokens, over max_prefill_tokens");
    }
    launch_log.push_back(entry);
    if (poisoned) {
      for (const Chunk& c : entry.chunks) {
        failed_ids.insert(c.id);
      }
      for (const replay::DecodeRow& row : batch.decode.rows) {
        failed_ids.insert(slots[row.slot]->id);
      }
      ++failed_mixed_calls;
      leave();
      throw std::runtime_error("poisoned prompt in this mixed launch");
    }
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const replay::PrefillRow& row = rows[r];
      const Chunk& c = entry.chunks[r];
      if (row.start == 0) {
        slots.at(row.slot) = Slot{c.id, row.prompt.size(), calls};
      } else {
        slots.at(row.slot)->next_position += row.prompt.size();
      }
      // The greedy token after the chunk: the request's first token only
      // when the chunk ends its prompt.
      batch.prefill.first_tokens[r] = model->token_at(c.id, row.start + row.prompt.size());
    }
    step(batch.decode, true);
  }

  // The rows of a decode() launch or of a mixed one (one step), checked,
  // then each its tokens. Lock held; leaves the call.
  void step(replay::DecodeBatch& batch, bool mixed) {
    const std::size_t n = batch.rows.size();
    if ((n == 0 && !mixed) || n > max_slots) {
      violation("a launch of " + std::to_string(n) + " rows");
    }
    std::size_t context = 0;
    std::size_t steps = 0;
    std::set<std::size_t> prefills;
    bool poisoned = false;
    for (std::size_t r = 0; r < n; ++r) {
      const replay::DecodeRow& row = batch.rows[r];
      if (r > 0 && batch.rows[r - 1].slot >= row.slot) {
        violation("launch rows not in strictly ascending slot order (a slot twice?)");
      }
      if (row.slot >= max_slots || !slots[row.slot]) {
        violation("launch row in a slot never prefilled: " + std::to_string(row.slot));
        continue;
      }
      const Slot& s = *slots[row.slot];
      if (row.position != s.next_position) {
        violation("request " + std::to_string(s.id) + ": position " + std::to_string(row.position) + ", expected " +
                  std::to_string(s.next_position));
      }
      if (row.token != model->token_at(s.id, row.position)) {
        violation("request " + std::to_string(s.id) + ": fed a token it did not produce");
      }
      if (row.max_tokens == 0 || row.max_tokens > (mixed ? 1 : steps_per_launch) ||
          row.position + row.max_tokens > max_len) {
        violation("row max_tokens " + std::to_string(row.max_tokens));
      }
      launch_log.back().stepped.push_back(s.id);
      context = std::max(context, row.position + row.max_tokens);
      steps = std::max(steps, row.max_tokens);
      prefills.insert(s.prefill_call);
      // A poisoned sequence fails its launch a few tokens in.
      poisoned = poisoned || (poison_decode.count(s.id) != 0 && row.position >= poison_after);
    }
    if (batch.batch_bucket != (n == 0 ? 0 : smallest_fitting(batch_buckets, n))) {
      violation("batch bucket " + std::to_string(batch.batch_bucket) + " for " + std::to_string(n) + " rows");
    }
    if (batch.context_bucket != (n == 0 ? 0 : smallest_fitting(context_buckets, context))) {
      violation("context bucket " + std::to_string(batch.context_bucket) + " for " + std::to_string(context) +
                " positions");
    }
    if (batch.max_steps != (n == 0 ? 1 : steps) || batch.tokens.size() != n * steps || batch.counts.size() != n ||
        std::any_of(batch.counts.begin(), batch.counts.end(), [](std::size_t c) { return c != 0; })) {
      violation("launch output spans of the wrong size, or counts not zeroed");
    }
    if (static_batches && (prefills.size() > 1 || (!prefills.empty() && *prefills.begin() != prefill_calls))) {
      violation("static batching: a launch with sequences of an earlier batch");
    }
    mixed_launches += prefills.size() > 1 ? 1 : 0;
    most_steps = std::max(most_steps, steps);
    if (!mixed) {
      ++launches_per_bucket[{batch.batch_bucket, batch.context_bucket}];
    }
    if (poisoned) {
      for (const replay::DecodeRow& row : batch.rows) {
        failed_ids.insert(slots[row.slot]->id);
      }
      ++failed_decode_calls;
      leave();
      throw std::runtime_error("poisoned sequence in this launch");
    }
    if (!mixed && decode_calls == bad_counts_at_launch) {
      for (const replay::DecodeRow& row : batch.rows) {
        failed_ids.insert(slots[row.slot]->id);
      }
      ++failed_decode_calls;
      leave();
      return;  // row 0 reports no token
    }
    for (std::size_t r = 0; r < n; ++r) {
      const replay::DecodeRow& row = batch.rows[r];
      Slot& s = *slots[row.slot];
      for (std::size_t j = 0; j < row.max_tokens; ++j) {
        const TokenId t = model->token_at(s.id, row.position + j + 1);
        batch.emit(r, t);
        if (t == kEos && !keep_going_after_eos) {
          break;
        }
      }
      s.next_position += batch.counts[r];
    }
    leave();
  }
};

// The executor the scheduler owns: a handle on the shared StandIn.
struct StandInExecutor {
  std::shared_ptr<StandIn> state;

  explicit StandInExecutor(std::shared_ptr<StandIn> s) : state(std::move(s)) {}
  StandInExecutor(StandInExecutor&& other) noexcept = default;
  StandInExecutor& operator=(StandInExecutor&&) = delete;
  ~StandInExecutor() {
    if (state) {
      std::lock_guard lock(state->mutex);
      ++state->executors_destroyed;
    }
  }
  void prefill(replay::PrefillBatch& batch) { state->prefill(batch); }
  void decode(replay::DecodeBatch& batch) { state->decode(batch); }
  void prefill_and_decode(replay::MixedBatch& batch) { state->prefill_and_decode(batch); }
};
static_assert(replay::MixedDecodeExecutor<StandInExecutor>);
static_assert(replay::MixedDecodeExecutor<StandInExecutor&>);
static_assert(replay::DecodeExecutor<StandInExecutor&>);
static_assert(std::input_iterator<replay::DecodeStream::iterator>);
static_assert(std::sentinel_for<std::default_sentinel_t, replay::DecodeStream::iterator>);

using Scheduler = replay::DecodeScheduler<StandInExecutor>;

// How each request ended, gathered from its updates.
struct Outcome {
  std::vector<TokenId> tokens;
  DecodeStatus status = DecodeStatus::running;
  std::string message;
  std::uint64_t scheduler_id = 0;
  int finals = 0;
  int after_final = 0;  // updates after the final one (must stay 0)
  bool id_changed = false;
};

// How each request's updates arrived. Declare it before the scheduler, so
// that it outlives the scheduler's last updates.
class Recorder {
 public:
  Scheduler::update_callback callback(std::size_t id) {
    return [this, id](const replay::DecodeUpdate& update) { record(id, update); };
  }
  // Notifies under the lock: a waiter may destroy the recorder as soon as it wakes.
  void record(std::size_t id, const replay::DecodeUpdate& update) {
    {
      std::lock_guard lock(mutex_);
      Outcome& o = outcomes_[id];
      if (o.finals != 0) {
        ++o.after_final;
      }
      if (o.scheduler_id != 0 && o.scheduler_id != update.id) {
        o.id_changed = true;
      }
      o.scheduler_id = update.id;
      o.tokens.insert(o.tokens.end(), update.tokens.begin(), update.tokens.end());
      if (update.done()) {
        o.status = update.status;
        o.message = std::string(update.message);
        ++o.finals;
        ++finals_;
      }
      changed_.notify_all();
    }
  }
  void put(std::size_t id, const replay::DecodeResult& result, std::uint64_t scheduler_id) {
    {
      std::lock_guard lock(mutex_);
      Outcome& o = outcomes_[id];
      o.tokens = result.tokens;
      o.status = result.status;
      o.message = result.message;
      o.scheduler_id = scheduler_id;
      ++o.finals;
      ++finals_;
      changed_.notify_all();
    }
  }
  // Waits (at most a minute: a lost request fails the test instead of hanging it).
  bool wait_finals(std::size_t n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 60s, [&] { return finals_ >= n; });
  }
  std::map<std::size_t, Outcome> outcomes() {
    std::lock_guard lock(mutex_);
    return outcomes_;
  }
  Outcome outcome(std::size_t id) {
    std::lock_guard lock(mutex_);
    return outcomes_[id];
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::size_t, Outcome> outcomes_;
  std::size_t finals_ = 0;
};

replay::DecodeOptions small_options() {
  replay::DecodeOptions options;
  options.max_slots = 8;
  options.max_len = 64;
  options.batch_buckets = {1, 2, 4, 8};
  options.context_buckets = {8, 16, 32, 64};
  options.eos_tokens = {kEos};
  return options;
}

std::vector<TokenId> prompt_of(std::size_t id, std::size_t length) {
  std::vector<TokenId> prompt(length, 7);
  prompt[0] = static_cast<TokenId>(id);
  return prompt;
}

// A random request set: prompt length, max_new_tokens and EOS position per id.
struct Workload {
  std::shared_ptr<Model> model = std::make_shared<Model>();
  std::vector<std::size_t> prompt;
  std::vector<std::size_t> max_new;

  Workload(std::size_t count, std::size_t max_len, std::mt19937& rng, std::size_t longest_prompt) {
    std::uniform_int_distribution<std::size_t> prompt_len(1, longest_prompt);
    std::uniform_int_distribution<std::size_t> new_tokens(0, max_len);
    std::uniform_int_distribution<int> coin(0, 2);
    for (std::size_t id = 0; id < count; ++id) {
      prompt.push_back(prompt_len(rng));
      max_new.push_back(coin(rng) == 0 ? 0 : new_tokens(rng) / 2);
      // A third end at an EOS a few tokens after the prompt, the rest never.
      model->eos_position.push_back(coin(rng) == 0 ? prompt.back() + new_tokens(rng) / 4 : kNoEos);
    }
  }
  replay::DecodeRequest request(std::size_t id) const { return {prompt_of(id, prompt[id]), max_new[id]}; }
};

// Submits every request of `work` (callbacks), waits for all, returns the outcomes.
std::map<std::size_t, Outcome> run_all(Scheduler& scheduler, Recorder& recorder, const Workload& work) {
  for (std::size_t id = 0; id < work.prompt.size(); ++id) {
    scheduler.submit(work.request(id), recorder.callback(id));
  }
  REQUIRE(recorder.wait_finals(work.prompt.size()));
  return recorder.outcomes();
}

void check_exact(const std::map<std::size_t, Outcome>& outcomes, const Workload& work, std::size_t max_len) {
  for (const auto& [id, o] : outcomes) {
    CAPTURE(id);
    const auto [tokens, status] = work.model->expected(id, work.prompt[id], work.max_new[id], max_len);
    CHECK(o.finals == 1);
    CHECK(o.after_final == 0);
    CHECK(o.status == status);
    CHECK(o.tokens == tokens);
  }
}

bool is_prefix(const std::vector<TokenId>& part, const std::vector<TokenId>& whole) {
  return part.size() <= whole.size() && std::equal(part.begin(), part.end(), whole.begin());
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("decode policy: smallest bucket, tokens left, launch shape") {
    const std::vector<std::int64_t> buckets{1, 2, 4, 8};
    CHECK(replay::smallest_bucket(buckets, 0) == 1);
    CHECK(replay::smallest_bucket(buckets, 1) == 1);
    CHECK(replay::smallest_bucket(buckets, 3) == 4);
    CHECK(replay::smallest_bucket(buckets, 4) == 4);
    CHECK(replay::smallest_bucket(buckets, 8) == 8);
    CHECK(replay::smallest_bucket(buckets, 9) == 0);

    // prompt 10, max_len 16: 6 tokens fit; max_new_tokens cuts earlier.
    CHECK(replay::tokens_left(10, 0, 0, 16) == 6);
    CHECK(replay::tokens_left(10, 4, 0, 16) == 2);
    CHECK(replay::tokens_left(10, 6, 0, 16) == 0);
    CHECK(replay::tokens_left(10, 1, 3, 16) == 2);
    CHECK(replay::tokens_left(10, 3, 3, 16) == 0);
    CHECK(replay::tokens_left(15, 0, 100, 16) == 1);

    const std::vector<std::int64_t> contexts{16, 32, 64};
    std::vector<replay::DecodeRow> rows{{0, 10, 1, 1}, {3, 15, 1, 1}, {5, 4, 1, 1}};
    auto shape = replay::plan_launch(rows, buckets, contexts);
    CHECK(shape.batch_bucket == 4);
    CHECK(shape.context_bucket == 16);  // position 15 + 1 step attends to 16 positions
    CHECK(shape.max_steps == 1);
    rows[1].max_tokens = 2;  // two steps: the second attends to 17
    shape = replay::plan_launch(rows, buckets, contexts);
    CHECK(shape.context_bucket == 32);
    CHECK(shape.max_steps == 2);
    rows[1].position = 63;
    CHECK(replay::plan_launch(rows, buckets, contexts).context_bucket == 0);  // fits none
  }

  TEST_CASE("decode policy: admission, continuous with a prefill budget and static batches") {
    using replay::DecodeBatching;
    const std::vector<std::size_t> prompts{10, 10, 10, 40, 5};
    replay::DecodeAdmissionLimits continuous{DecodeBatching::continuous, 4, 0};
    CHECK(replay::plan_admission(prompts, 4, 0, false, continuous) == 4);
    CHECK(replay::plan_admission(prompts, 2, 2, false, continuous) == 2);  // joins running sequences
    CHECK(replay::plan_admission(prompts, 0, 4, true, continuous) == 0);
    CHECK(replay::plan_admission({}, 4, 0, true, continuous) == 0);
    continuous.max_prefill_tokens = 25;
    CHECK(replay::plan_admission(prompts, 4, 0, false, continuous) == 2);
    const std::vector<std::size_t> long_first{40, 5};
    CHECK(replay::plan_admission(long_first, 4, 0, false, continuous) == 1);  // the first always goes

    const replay::DecodeAdmissionLimits batches{DecodeBatching::static_batches, 4, 25};
    CHECK(replay::plan_admission(prompts, 4, 0, false, batches) == 4);  // a full batch, budget ignored
    const std::vector<std::size_t> three{10, 10, 10};
    CHECK(replay::plan_admission(three, 4, 0, false, batches) == 0);  // waits to fill
    CHECK(replay::plan_admission(three, 4, 0, true, batches) == 3);   // ... until the oldest is due
    CHECK(replay::plan_admission(three, 3, 1, true, batches) == 0);   // never while one runs
  }

  TEST_CASE("decode policy: continuous admission grouped by min_admission") {
    using replay::DecodeBatching;
    using replay::plan_admission;
    const std::vector<std::size_t> prompts{10, 10, 10, 40, 5};
    const std::span<const std::size_t> waiting(prompts);
    replay::DecodeAdmissionLimits grouped{DecodeBatching::continuous, 8, 0, 4};
    // While sequences run: none until 4 can join together, waiting requests
    // and free slots both ...
    CHECK(plan_admission(waiting.first(3), 6, 2, false, grouped) == 0);  // 3 wait
    CHECK(plan_admission(waiting, 3, 5, false, grouped) == 0);           // 3 slots free
    CHECK(plan_admission(waiting.first(4), 6, 2, false, grouped) == 4);
    CHECK(plan_admission(waiting, 6, 2, false, grouped) == 5);  // then all that fit
    CHECK(plan_admission(waiting, 4, 4, false, grouped) == 4);
    // ... or once the oldest is due (its delay passed, or a drain) ...
    CHECK(plan_admission(waiting.first(1), 6, 2, true, grouped) == 1);
    CHECK(plan_admission(waiting, 3, 5, true, grouped) == 3);
    // ... and with nothing running, at once.
    CHECK(plan_admission(waiting.first(1), 8, 0, false, grouped) == 1);
    CHECK(plan_admission(waiting.first(3), 8, 0, false, grouped) == 3);
    CHECK(plan_admission({}, 8, 2, true, grouped) == 0);
    // max_prefill_tokens still cuts what is admitted (the first always goes).
    grouped.max_prefill_tokens = 25;
    CHECK(plan_admission(waiting, 6, 2, false, grouped) == 2);
    CHECK(plan_admission(waiting.first(3), 6, 2, false, grouped) == 0);
    CHECK(plan_admission(waiting.first(3), 6, 2, true, grouped) == 2);
    CHECK(plan_admission(waiting.subspan(3), 6, 0, false, grouped) == 1);  // 40 alone, over the budget

    // min_admission 1 admits at every boundary, as without it.
    const replay::DecodeAdmissionLimits every{DecodeBatching::continuous, 8, 0, 1};
    CHECK(plan_admission(waiting.first(1), 6, 2, false, every) == 1);
    CHECK(plan_admission(waiting, 2, 6, false, every) == 2);

    // Static batches do not look at it.
    const replay::DecodeAdmissionLimits batches{DecodeBatching::static_batches, 4, 0, 4};
    CHECK(plan_admission(waiting.first(3), 4, 0, false, batches) == 0);  // waits to fill, as before
    CHECK(plan_admission(waiting.first(3), 4, 0, true, batches) == 3);
    CHECK(plan_admission(waiting, 4, 0, false, batches) == 4);
    CHECK(plan_admission(waiting, 3, 1, true, batches) == 0);  // never while one runs
    const replay::DecodeAdmissionLimits batches_min_one{DecodeBatching::static_batches, 4, 0, 1};
    CHECK(plan_admission(waiting.first(3), 4, 0, false, batches_min_one) == 0);

    // The policy is constexpr.
    static constexpr std::array<std::size_t, 2> two{10, 10};
    static_assert(plan_admission(two, 6, 2, false, {DecodeBatching::continuous, 8, 0, 4}) == 0);
    static_assert(plan_admission(two, 6, 2, true, {DecodeBatching::continuous, 8, 0, 4}) == 2);
    static_assert(plan_admission(two, 6, 0, false, {DecodeBatching::continuous, 8, 0, 4}) == 2);
    static_assert(plan_admission(two, 6, 2, false, {DecodeBatching::continuous, 8, 0, 2}) == 2);
  }

  TEST_CASE("decode policy: admission_delay counts from the last admission, static_batch_delay from the arrival") {
    using std::chrono::milliseconds;
    using replay::DecodeBatching;
    using replay::admission_due;
    // Under load: the oldest request arrived long ago (t = 0), the last
    // admission was 2 ms ago: not due yet with a 5 ms delay.
    static_assert(!admission_due(DecodeBatching::continuous, milliseconds(100), milliseconds(0), milliseconds(98),
                                 milliseconds(5)));
    CHECK_FALSE(admission_due(DecodeBatching::continuous, milliseconds(100), milliseconds(0), milliseconds(98),
                              milliseconds(5)));
    // 5 ms after the last admission: due.
    CHECK(admission_due(DecodeBatching::continuous, milliseconds(103), milliseconds(0), milliseconds(98), milliseconds(5)));
    // A request that arrived after the last admission waits its own delay.
    CHECK_FALSE(admission_due(DecodeBatching::continuous, milliseconds(103), milliseconds(100), milliseconds(98),
                              milliseconds(5)));
    CHECK(admission_due(DecodeBatching::continuous, milliseconds(105), milliseconds(100), milliseconds(98),
                        milliseconds(5)));
    // Static batches count from the oldest request's arrival only.
    CHECK(admission_due(DecodeBatching::static_batches, milliseconds(100), milliseconds(0), milliseconds(98),
                        milliseconds(5)));
    CHECK_FALSE(admission_due(DecodeBatching::static_batches, milliseconds(3), milliseconds(0), milliseconds(2),
                              milliseconds(5)));
    // With real clock time points, and no admission yet (the epoch).
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(admission_due(DecodeBatching::continuous, t0 + milliseconds(6), t0, std::chrono::steady_clock::time_point{},
                        std::chrono::microseconds(5000)));
  }

  TEST_CASE("decode policy: chunked prefill takes the oldest prompts first, within the launch's budget") {
    const std::vector<std::size_t> remaining{10, 3, 7};
    std::vector<std::size_t> take(3, 99);
    CHECK(replay::plan_prefill_chunks(remaining, 0, take) == 3);  // no budget: whole prompts
    CHECK(take == std::vector<std::size_t>{10, 3, 7});
    CHECK(replay::plan_prefill_chunks(remaining, 4, take) == 1);  // the oldest's first chunk only
    CHECK(take == std::vector<std::size_t>{4, 0, 0});
    CHECK(replay::plan_prefill_chunks(remaining, 12, take) == 2);  // the oldest whole, the next cut
    CHECK(take == std::vector<std::size_t>{10, 2, 0});
    CHECK(replay::plan_prefill_chunks(remaining, 20, take) == 3);
    CHECK(take == std::vector<std::size_t>{10, 3, 7});
    CHECK(replay::plan_prefill_chunks(remaining, 100, take) == 3);
    CHECK(take == std::vector<std::size_t>{10, 3, 7});
    CHECK(replay::plan_prefill_chunks({}, 8, std::span<std::size_t>{}) == 0);
    // Chunks of one prompt over launches add up to it, in order.
    std::size_t left = 23;
    std::size_t launches = 0;
    while (left != 0) {
      std::size_t one = 0;
      const std::size_t rem = left;
      REQUIRE(replay::plan_prefill_chunks(std::span<const std::size_t>(&rem, 1), 5, std::span<std::size_t>(&one, 1)) ==
              1);
      CHECK(one == std::min<std::size_t>(5, rem));
      left -= one;
      ++launches;
    }
    CHECK(launches == 5);
  }

  TEST_CASE("DecodeScheduler: bad options and an empty callback are refused with a clear usage_error") {
    auto model = std::make_shared<Model>();
    auto make = [&](replay::DecodeOptions options) {
      Scheduler scheduler(StandInExecutor(std::make_shared<StandIn>(model, small_options())), std::move(options));
    };
    CHECK_THROWS_WITH_AS(make({}), doctest::Contains("give max_slots or batch_buckets"), replay::usage_error);
    replay::DecodeOptions options = small_options();
    options.batch_buckets = {4, 2, 8};
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("batch_buckets must be positive and strictly ascending"),
                         replay::usage_error);
    options = small_options();
    options.max_slots = 9;
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("the largest of batch_buckets is 8, less than max_slots (9)"),
                         replay::usage_error);
    options = small_options();
    options.context_buckets = {8, 16};
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("less than max_len (64)"), replay::usage_error);
    options = small_options();
    options.max_len = 1;
    options.context_buckets = {};
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("at least 2"), replay::usage_error);
    options = small_options();
    options.steps_per_launch = 0;
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("steps_per_launch"), replay::usage_error);
    options = small_options();
    options.queue_capacity = 0;
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("queue_capacity"), replay::usage_error);
    options = small_options();
    options.min_admission = 0;
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("min_admission is 0; it must be at least 1"),
                         replay::usage_error);
    options = small_options();
    options.max_slots = 0;  // the largest batch bucket, 8
    options.min_admission = 9;
    CHECK_THROWS_WITH_AS(make(options),
                         doctest::Contains("min_admission is 9; it must be at least 1 and at most max_slots (8)"),
                         replay::usage_error);
    options.min_admission = 8;
    CHECK_NOTHROW(make(options));
    options = small_options();
    options.admission_delay = -1us;
    CHECK_THROWS_WITH_AS(make(options), doctest::Contains("admission_delay is -1 us; it must not be negative"),
                         replay::usage_error);

    // Chunked prefill needs an executor that can take a mixed launch.
    struct PlainExecutor {
      void prefill(replay::PrefillBatch&) {}
      void decode(replay::DecodeBatch&) {}
    };
    static_assert(replay::DecodeExecutor<PlainExecutor> && !replay::MixedDecodeExecutor<PlainExecutor>);
    options = small_options();
    options.prefill = replay::DecodePrefill::with_decode;
    CHECK_THROWS_WITH_AS(replay::DecodeScheduler<PlainExecutor>(PlainExecutor{}, options),
                         doctest::Contains("needs an executor with prefill_and_decode(MixedBatch&)"),
                         replay::usage_error);
    CHECK_NOTHROW(make(options));

    // Defaults fill in from each other.
    replay::DecodeOptions minimal;
    minimal.max_slots = 3;
    minimal.context_buckets = {32, 128};
    Scheduler filled(StandInExecutor(std::make_shared<StandIn>(model, small_options())), minimal);
    CHECK(filled.options().batch_buckets == std::vector<std::int64_t>{3});
    CHECK(filled.options().max_len == 128);

    Scheduler scheduler(StandInExecutor(std::make_shared<StandIn>(model, small_options())), small_options());
    CHECK_THROWS_WITH_AS(scheduler.submit({prompt_of(1, 3), 2}, Scheduler::update_callback{}),
                         doctest::Contains("update callback is empty"), replay::usage_error);
    replay::DecodeStream moved = scheduler.submit({prompt_of(1, 3), 2});
    replay::DecodeStream taken = std::move(moved);
    CHECK_THROWS_WITH_AS(moved.wait(), doctest::Contains("moved from"), replay::usage_error);
    CHECK(taken.wait().ok());
  }

  TEST_CASE("DecodeScheduler: a stream yields exactly the request's tokens; eos, token_limit and context_limit") {
    auto model = std::make_shared<Model>();
    model->eos_position = {kNoEos, 9, kNoEos, kNoEos};
    const replay::DecodeOptions options = small_options();
    Scheduler scheduler(StandInExecutor(std::make_shared<StandIn>(model, options)), options);

    replay::DecodeStream eos = scheduler.submit({prompt_of(1, 4), 0});  // EOS at position 9: 6 tokens
    std::vector<TokenId> read;
    for (const TokenId t : eos) {
      read.push_back(t);
    }
    const replay::DecodeResult eos_result = eos.wait();
    CHECK(eos_result.status == DecodeStatus::eos);
    CHECK(eos_result.ok());
    CHECK(read == model->expected(1, 4, 0, 64).first);
    CHECK(read.size() == 6);
    CHECK(read.back() == kEos);
    CHECK(eos_result.tokens == read);
    CHECK_FALSE(eos.next().has_value());  // everything was read

    replay::DecodeResult limited = scheduler.submit({prompt_of(2, 5), 7}).wait();
    CHECK(limited.status == DecodeStatus::token_limit);
    CHECK(limited.tokens == model->expected(2, 5, 7, 64).first);
    CHECK(limited.tokens.size() == 7);

    // No EOS and no limit: the sequence runs into max_len and says so.
    replay::DecodeResult full = scheduler.submit({prompt_of(3, 60), 0}).wait();
    CHECK(full.status == DecodeStatus::context_limit);
    CHECK(full.ok());
    CHECK(full.tokens == model->expected(3, 60, 0, 64).first);
    CHECK(full.tokens.size() == 4);
    CHECK(full.message.find("max_len (64 positions)") != std::string::npos);

    const replay::DecodeStats stats = scheduler.stats();
    CHECK(stats.finished_eos == 1);
    CHECK(stats.finished_token_limit == 1);
    CHECK(stats.finished_context_limit == 1);
    CHECK(stats.admitted == 3);
    CHECK(stats.tokens == 6 + 7 + 4);
    CHECK(stats.prefills == 3);
    CHECK(stats.active == 0);
  }

  TEST_CASE("DecodeScheduler: too long prompts, empty prompts and a full queue are refused at once, never queued") {
    auto model = std::make_shared<Model>();
    replay::DecodeOptions options = small_options();
    options.max_len = 16;
    options.context_buckets = {16};
    options.max_slots = 1;
    options.queue_capacity = 2;
    auto standin = std::make_shared<StandIn>(model, options);
    standin->block_at = {1};  // the first request's prefill holds the worker
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(standin), options);

    scheduler.submit({prompt_of(0, 15), 0}, recorder.callback(0));  // the longest prompt that fits: one token
    standin->wait_calls(1);
    scheduler.submit({prompt_of(1, 16), 0}, recorder.callback(1));
    Outcome too_long = recorder.outcome(1);  // delivered before submit() returned
    CHECK(too_long.finals == 1);
    CHECK(too_long.status == DecodeStatus::prompt_too_long);
    CHECK(too_long.tokens.empty());
    CHECK(too_long.message.find("a prompt of 16 tokens") != std::string::npos);
    CHECK(too_long.message.find("max_len (16 positions)") != std::string::npos);
    scheduler.submit({{}, 4}, recorder.callback(2));
    CHECK(recorder.outcome(2).status == DecodeStatus::invalid_request);

    scheduler.submit({prompt_of(3, 2), 3}, recorder.callback(3));  // waits
    scheduler.submit({prompt_of(4, 2), 3}, recorder.callback(4));  // waits: the queue is full now
    scheduler.submit({prompt_of(5, 2), 3}, recorder.callback(5));
    const Outcome full = recorder.outcome(5);
    CHECK(full.finals == 1);
    CHECK(full.status == DecodeStatus::queue_full);
    CHECK(full.message.find("queue is full (2 requests") != std::string::npos);
    replay::DecodeStream refused_stream = scheduler.submit({prompt_of(6, 2), 3});
    CHECK(refused_stream.done());
    CHECK(refused_stream.status() == DecodeStatus::queue_full);

    standin->release();
    REQUIRE(recorder.wait_finals(6));
    CHECK(recorder.outcome(0).status == DecodeStatus::context_limit);
    CHECK(recorder.outcome(0).tokens.size() == 1);
    CHECK(recorder.outcome(3).tokens == model->expected(3, 2, 3, 16).first);
    CHECK(recorder.outcome(4).tokens == model->expected(4, 2, 3, 16).first);
    const replay::DecodeStats stats = scheduler.stats();
    CHECK(stats.prompt_too_long == 1);
    CHECK(stats.invalid == 1);
    CHECK(stats.refused == 2);
    CHECK(stats.enqueued == 3);
    CHECK(stats.finished() == 3);
    std::lock_guard lock(standin->mutex);
    CHECK(standin->violations.empty());
  }

  TEST_CASE("DecodeScheduler: with vocab_size, a prompt token outside the vocabulary is refused at once, naming it") {
    auto model = std::make_shared<Model>();
    replay::DecodeOptions options = small_options();
    options.vocab_size = 100;
    auto standin = std::make_shared<StandIn>(model, options);
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(standin), options);
    scheduler.submit({{5, 100, 7}, 2}, recorder.callback(0));
    const Outcome high = recorder.outcome(0);  // delivered before submit() returned
    CHECK(high.finals == 1);
    CHECK(high.status == DecodeStatus::invalid_request);
    CHECK(high.tokens.empty());
    CHECK(high.message.find("prompt token 1 is 100, outside the vocabulary (0..99)") != std::string::npos);
    scheduler.submit({{-1}, 2}, recorder.callback(1));
    CHECK(recorder.outcome(1).status == DecodeStatus::invalid_request);
    CHECK(recorder.outcome(1).message.find("prompt token 0 is -1") != std::string::npos);
    scheduler.submit({{0, 99}, 2}, recorder.callback(2));  // the vocabulary's ends are accepted
    REQUIRE(recorder.wait_finals(3));
    CHECK(recorder.outcome(2).status == DecodeStatus::token_limit);
    CHECK(recorder.outcome(2).tokens.size() == 2);
    CHECK(scheduler.stats().invalid == 2);
    std::lock_guard lock(standin->mutex);
    CHECK(standin->violations.empty());
  }

  TEST_CASE("DecodeScheduler: every launch takes the smallest batch and context buckets that fit") {
    const replay::DecodeOptions options = small_options();
    Workload work(48, options.max_len, replay_test::rng(), 40);
    auto standin = std::make_shared<StandIn>(work.model, options);
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(standin), options);
    check_exact(run_all(scheduler, recorder, work), work, options.max_len);

    const replay::DecodeStats stats = scheduler.stats();
    std::lock_guard lock(standin->mutex);
    for (const std::string& v : standin->violations) {
      FAIL_CHECK(v);
    }
    CHECK(standin->violations.empty());
    CHECK(standin->launches_per_bucket.size() >= 3);  // the run went through several buckets
    std::uint64_t total = 0;
    for (const auto& [bucket, launches] : standin->launches_per_bucket) {
      CAPTURE(bucket.first);
      CAPTURE(bucket.second);
      CHECK(stats.launches_in(bucket.first, bucket.second) == launches);
      total += launches;
    }
    CHECK(total == stats.launches);
    CHECK(stats.launches == standin->decode_calls);
    CHECK(stats.steps == stats.launches);  // one step per launch
    CHECK(stats.padded_rows >= stats.rows);
    CHECK(stats.launches_in(3, 8) == 0);  // no such bucket
  }

  TEST_CASE("DecodeScheduler: K steps per launch give the same tokens as one step, in fewer launches") {
    const std::size_t count = 40;
    replay::DecodeOptions base = small_options();
    Workload work(count, base.max_len, replay_test::rng(), 30);
    std::map<std::size_t, std::uint64_t> launches;
    std::map<std::size_t, std::map<std::size_t, Outcome>> results;
    for (const std::size_t k : {1, 2, 4, 7}) {
      CAPTURE(k);
      replay::DecodeOptions options = base;
      options.steps_per_launch = k;
      auto standin = std::make_shared<StandIn>(work.model, options);
      standin->keep_going_after_eos = k > 2;  // the scheduler must drop what follows an EOS
      Recorder recorder;
      Scheduler scheduler(StandInExecutor(standin), options);
      results[k] = run_all(scheduler, recorder, work);
      check_exact(results[k], work, options.max_len);
      launches[k] = scheduler.stats().launches;
      std::lock_guard lock(standin->mutex);
      CHECK(standin->violations.empty());
      CHECK(standin->most_steps == k);
      CHECK(scheduler.stats().steps >= scheduler.stats().launches);
    }
    for (std::size_t id = 0; id < count; ++id) {
      CHECK(results[4][id].tokens == results[1][id].tokens);
    }
    CHECK(launches[2] < launches[1]);
    CHECK(launches[4] < launches[2]);
  }

  TEST_CASE("DecodeScheduler: static batches and continuous batching give every request the same tokens") {
    const std::size_t count = 40;
    Workload work(count, small_options().max_len, replay_test::rng(), 30);
    std::map<replay::DecodeBatching, std::map<std::size_t, Outcome>> results;
    std::map<replay::DecodeBatching, std::size_t> mixed;
    for (const auto batching : {replay::DecodeBatching::continuous, replay::DecodeBatching::static_batches}) {
      replay::DecodeOptions options = small_options();
      options.batching = batching;
      options.static_batch_delay = 2ms;
      auto standin = std::make_shared<StandIn>(work.model, options);
      standin->static_batches = batching == replay::DecodeBatching::static_batches;
      // The first call waits until every request is queued, so that requests
      // wait for a slot while others run, however the threads are scheduled
      // (a submitter descheduled between requests let every sequence finish
      // before the next arrived, and nothing could join).
      standin->block_at = {1};
      Recorder recorder;
      Scheduler scheduler(StandInExecutor(standin), options);
      for (std::size_t id = 0; id < count; ++id) {
        scheduler.submit(work.request(id), recorder.callback(id));
      }
      standin->release();
      REQUIRE(recorder.wait_finals(count));
      results[batching] = recorder.outcomes();
      check_exact(results[batching], work, options.max_len);
      std::lock_guard lock(standin->mutex);
      for (const std::string& v : standin->violations) {
        FAIL_CHECK(v);
      }
      mixed[batching] = standin->mixed_launches;
    }
    for (std::size_t id = 0; id < count; ++id) {
      CHECK(results[replay::DecodeBatching::static_batches][id].tokens ==
            results[replay::DecodeBatching::continuous][id].tokens);
    }
    // Continuous batching let sequences join running ones; static never did.
    CHECK(mixed[replay::DecodeBatching::continuous] > 0);
    CHECK(mixed[replay::DecodeBatching::static_batches] == 0);
  }

  TEST_CASE("DecodeScheduler: max_prefill_tokens bounds each prefill") {
    auto model = std::make_shared<Model>();
    replay::DecodeOptions options = small_options();
    options.max_prefill_tokens = 25;
    auto standin = std::make_shared<StandIn>(model, options);
    standin->block_at = {1};
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(standin), options);
    scheduler.submit({prompt_of(0, 10), 2}, recorder.callback(0));
    standin->wait_calls(1);  // the others queue up behind it
    scheduler.submit({prompt_of(1, 40), 2}, recorder.callback(1));
    for (std::size_t id = 2; id < 8; ++id) {
      scheduler.submit({prompt_of(id, 10), 2}, recorder.callback(id));
    }
    standin->release();
    REQUIRE(recorder.wait_finals(8));
    std::lock_guard lock(standin->mutex);
    REQUIRE(standin->prefill_prompt_tokens.size() >= 4);
    CHECK(standin->prefill_prompt_tokens[1] == 40);  // alone, over the budget: the first always goes
    for (std::size_t i = 2; i < standin->prefill_prompt_tokens.size(); ++i) {
      CHECK(standin->prefill_prompt_tokens[i] <= 25);
    }
  }

  TEST_CASE("DecodeScheduler: chunked prefill gives every request the same tokens as separate prefill") {
    const std::size_t count = 40;
    replay::DecodeOptions base = small_options();
    Workload work(count, base.max_len, replay_test::rng(), 50);
    // The last request's prompt is chunked last; it outlives every prompt, so
    // some launches carry none (whatever the random lengths drew) and must run
    // K steps.
    work.prompt[count - 1] = std::min<std::size_t>(work.prompt[count - 1], 32);
    work.max_new[count - 1] = 16;
    work.model->eos_position[count - 1] = kNoEos;
    std::size_t prompt_tokens = 0;
    for (const std::size_t p : work.prompt) {
      prompt_tokens += p;
    }
    std::map<std::size_t, Outcome> separate;
    {
      Recorder recorder;
      Scheduler scheduler(StandInExecutor(std::make_shared<StandIn>(work.model, base)), base);
      separate = run_all(scheduler, recorder, work);
      check_exact(separate, work, base.max_len);
    }
    for (const std::size_t k : {1, 3}) {
      for (const std::size_t budget : {0, 5, 16}) {
        CAPTURE(k);
        CAPTURE(budget);
        replay::DecodeOptions options = base;
        options.prefill = replay::DecodePrefill::with_decode;
        options.steps_per_launch = k;
        options.max_prefill_tokens = budget;
        auto standin = std::make_shared<StandIn>(work.model, options);
        Recorder recorder;
        Scheduler scheduler(StandInExecutor(standin), options);
        const auto outcomes = run_all(scheduler, recorder, work);
        check_exact(outcomes, work, options.max_len);
        for (std::size_t id = 0; id < count; ++id) {
          CHECK(outcomes.at(id).tokens == separate.at(id).tokens);
        }
        const replay::DecodeStats stats = scheduler.stats();
        CHECK(stats.prefills == 0);
        CHECK(stats.mixed_launches > 0);
        CHECK(stats.failed_mixed_launches == 0);
        CHECK(stats.prefill_tokens == prompt_tokens);
        CHECK(stats.prefill_chunks >= count);
        CHECK(stats.finished() == count);
        std::size_t delivered = 0;
        for (const auto& [id, o] : outcomes) {
          delivered += o.tokens.size();
        }
        CHECK(stats.tokens == delivered);
        std::lock_guard lock(standin->mutex);
        for (const std::string& v : standin->violations) {
          FAIL_CHECK(v);
        }
        CHECK(standin->prefill_calls == 0);
        CHECK(standin->mixed_calls == stats.mixed_launches);
        // Each prompt's chunks: in order, adding up to it, each within the budget.
        std::map<std::size_t, std::size_t> written;
        std::size_t most_chunks = 0;
        for (const StandIn::Launch& launch : standin->launch_log) {
          for (const StandIn::Chunk& c : launch.chunks) {
            CHECK(c.start == written[c.id]);
            written[c.id] += c.size;
            CHECK((budget == 0 || c.size <= budget));
          }
          most_chunks = std::max(most_chunks, launch.chunks.size());
        }
        for (std::size_t id = 0; id < count; ++id) {
          CHECK(written[id] == work.prompt[id]);
        }
        CHECK(stats.prefill_chunks > (budget == 5 ? count : 0));  // a budget of 5 cut some prompts
        CHECK(most_chunks >= 1);
        const bool launches_without_prompts = std::any_of(standin->launch_log.begin(), standin->launch_log.end(),
                                                          [](const StandIn::Launch& l) { return !l.mixed; });
        CHECK(launches_without_prompts);
        if (k > 1) {
          CHECK(standin->most_steps == k);  // launches without prompts still run K steps
        }
      }
    }
  }

  TEST_CASE("DecodeScheduler: with chunked prefill no running sequence waits for a prompt: one token every launch") {
    // Request 0 runs; while its first launch blocks, request 1 arrives with
    // a 40-token prompt, which a budget of 6 cuts into 7 chunks. Every
    // launch from then on steps request 0 too, and request 1's first token
    // comes from its last chunk.
    auto model = std::make_shared<Model>();
    replay::DecodeOptions options = small_options();
    options.prefill = replay::DecodePrefill::with_decode;
    options.max_prefill_tokens = 6;
    options.steps_per_launch = 2;
    auto standin = std::make_shared<StandIn>(model, options);
    standin->block_at = {2};
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(standin), options);
    scheduler.submit({prompt_of(0, 3), 30}, recorder.callback(0));
    standin->wait_calls(2);  // the first launch of request 0
    replay::DecodeStream late = scheduler.submit({prompt_of(1, 40), 5});
    standin->release();
    const replay::DecodeResult result = late.wait();
    CHECK(result.status == DecodeStatus::token_limit);
    CHECK(result.tokens == model->expected(1, 40, 5, options.max_len).first);
    REQUIRE(recorder.wait_finals(1));
    CHECK(recorder.outcome(0).tokens == model->expected(0, 3, 30, options.max_len).first);
    std::lock_guard lock(standin->mutex);
    for (const std::string& v : standin->violations) {
      FAIL_CHECK(v);
    }
    const std::vector<StandIn::Launch>& log = standin->launch_log;
    REQUIRE(log.size() >= 10);
    // 1: request 0's prompt alone; 2: its first decode (2 steps).
    CHECK(log[0].mixed);
    CHECK(log[0].chunks == std::vector<StandIn::Chunk>{{0, 0, 3}});
    CHECK_FALSE(log[1].mixed);
    // 3 to 9: request 1's chunks, request 0 stepped in each.
    for (std::size_t i = 0; i < 7; ++i) {
      CAPTURE(i);
      const StandIn::Launch& launch = log[2 + i];
      CHECK(launch.mixed);
      CHECK(launch.chunks == std::vector<StandIn::Chunk>{{1, 6 * i, i < 6 ? std::size_t{6} : std::size_t{4}}});
      CHECK(launch.stepped == std::vector<std::size_t>{0});
    }
    // Then both decode in K-step launches.
    CHECK_FALSE(log[9].mixed);
    CHECK(log[9].stepped == std::vector<std::size_t>{0, 1});
    const replay::DecodeStats stats = scheduler.stats();
    CHECK(stats.prefill_chunks == 8);
    CHECK(stats.mixed_launches == 8);
    CHECK(stats.mixed_rows == 7);
  }

  TEST_CASE("DecodeScheduler: chunked prefill: a failed mixed launch fails its sequences only; a cancelled prompt frees its slot") {
    auto model = std::make_shared<Model>();
    replay::DecodeOptions options = small_options();
    options.prefill = replay::DecodePrefill::with_decode;
    options.max_prefill_tokens = 4;
    {
      // Request 2's prompt is poisoned: the mixed launch of its first chunk
      // fails it and request 0 (stepped in that launch); request 3, admitted
      // after, is served.
      auto standin = std::make_shared<StandIn>(model, options);
      standin->poison_prefill = {2};
      standin->block_at = {2};
      Recorder recorder;
      Scheduler scheduler(StandInExecutor(standin), options);
      scheduler.submit({prompt_of(0, 3), 20}, recorder.callback(0));
      standin->wait_calls(2);
      scheduler.submit({prompt_of(2, 10), 5}, recorder.callback(2));
      standin->release();
      REQUIRE(recorder.wait_finals(2));
      for (const std::size_t id : {0, 2}) {
        CAPTURE(id);
        const Outcome o = recorder.outcome(id);
        CHECK(o.status == DecodeStatus::failed);
        CHECK(o.message.find("prefill_and_decode of 1 prompt chunk (4 tokens) and 1 sequence failed: poisoned prompt") !=
              std::string::npos);
      }
      replay::DecodeStream after = scheduler.submit({prompt_of(3, 9), 4});
      CHECK(after.wait().tokens == model->expected(3, 9, 4, options.max_len).first);
      const replay::DecodeStats stats = scheduler.stats();
      CHECK(stats.failed_mixed_launches == 1);
      CHECK(stats.failed == 2);
      std::lock_guard lock(standin->mutex);
      CHECK(standin->violations.empty());
    }
    {
      // Request 1's 40-token prompt, one token per launch (budget 1), is
      // cancelled part-way; its slot goes to request 2, whose chunks start
      // at 0 again.
      options.max_prefill_tokens = 1;
      auto standin = std::make_shared<StandIn>(model, options);
      standin->block_at = {6};
      Recorder recorder;
      Scheduler scheduler(StandInExecutor(standin), options);
      replay::DecodeStream cancelled = scheduler.submit({prompt_of(1, 40), 5});
      standin->wait_calls(6);
      cancelled.cancel();
      replay::DecodeStream next = scheduler.submit({prompt_of(2, 3), 4});
      standin->release();
      const replay::DecodeResult gone = cancelled.wait();
      CHECK(gone.status == DecodeStatus::cancelled);
      CHECK(gone.tokens.empty());
      CHECK(next.wait().tokens == model->expected(2, 3, 4, options.max_len).first);
      const replay::DecodeStats stats = scheduler.stats();
      CHECK(stats.cancelled == 1);
      CHECK(stats.active == 0);
      std::lock_guard lock(standin->mutex);
      for (const std::string& v : standin->violations) {
        FAIL_CHECK(v);
      }
      std::size_t chunks_of_1 = 0;
      for (const StandIn::Launch& launch : standin->launch_log) {
        for (const StandIn::Chunk& c : launch.chunks) {
          chunks_of_1 += c.id == 1 ? 1 : 0;
          CHECK(c.size == 1);
        }
      }
      CHECK(chunks_of_1 >= 6);
      CHECK(chunks_of_1 < 40);
    }
  }

  TEST_CASE("DecodeScheduler: min_admission admits requests that arrive one by one together, separate or chunked prefill") {
    // A long request runs; the worker blocks in its launches 3, 5, 7 and 9,
    // and one more request arrives during each, so the boundaries after
    // them see 1, 2, 3, then 4 waiting. Without grouping each is a prefill
    // (or, with chunked prefill, a mixed launch) of its own; with
    // min_admission 4 the four are one.
    auto model = std::make_shared<Model>();
    using replay::DecodePrefill;
    for (const auto& [min_admission, prefill] :
         {std::pair{std::size_t{1}, DecodePrefill::separate}, std::pair{std::size_t{4}, DecodePrefill::separate},
          std::pair{std::size_t{1}, DecodePrefill::with_decode},
          std::pair{std::size_t{4}, DecodePrefill::with_decode}}) {
      CAPTURE(min_admission);
      const bool chunked = prefill == DecodePrefill::with_decode;
      CAPTURE(chunked);
      replay::DecodeOptions options = small_options();
      options.min_admission = min_admission;
      options.prefill = prefill;
      options.admission_delay = 30s;  // never due here
      auto standin = std::make_shared<StandIn>(model, options);
      standin->block_at = {3, 5, 7, 9};
      Recorder recorder;
      Scheduler scheduler(StandInExecutor(standin), options);
      scheduler.submit({prompt_of(0, 2), 0}, recorder.callback(0));  // runs into max_len: 62 tokens
      for (std::size_t id = 1; id <= 4; ++id) {
        standin->wait_calls(2 * id + 1);
        scheduler.submit({prompt_of(id, 3), 5}, recorder.callback(id));
        standin->release();
      }
      REQUIRE(recorder.wait_finals(5));
      CHECK(recorder.outcome(0).tokens == model->expected(0, 2, 0, options.max_len).first);
      CHECK(recorder.outcome(0).status == DecodeStatus::context_limit);
      for (std::size_t id = 1; id <= 4; ++id) {
        CAPTURE(id);
        const Outcome o = recorder.outcome(id);
        CHECK(o.finals == 1);
        CHECK(o.status == DecodeStatus::token_limit);
        CHECK(o.tokens == model->expected(id, 3, 5, options.max_len).first);
      }
      const std::vector<std::vector<std::size_t>> expected_prefills =
          min_admission == 1 ? std::vector<std::vector<std::size_t>>{{0}, {1}, {2}, {3}, {4}}
                             : std::vector<std::vector<std::size_t>>{{0}, {1, 2, 3, 4}};
      std::lock_guard lock(standin->mutex);
      if (chunked) {
        // The prompts of each admission ride one mixed launch (no budget).
        std::vector<std::vector<std::size_t>> chunk_ids;
        for (const StandIn::Launch& launch : standin->launch_log) {
          if (launch.chunks.empty()) {
            continue;
          }
          std::vector<std::size_t>& ids = chunk_ids.emplace_back();
          for (const StandIn::Chunk& c : launch.chunks) {
            ids.push_back(c.id);
          }
          std::sort(ids.begin(), ids.end());
        }
        CHECK(chunk_ids == expected_prefills);
        CHECK(scheduler.stats().prefills == 0);
        CHECK(scheduler.stats().mixed_launches == expected_prefills.size());
      } else {
        CHECK(scheduler.stats().prefills == expected_prefills.size());
        CHECK(standin->prefill_ids == expected_prefills);
      }
      CHECK(standin->violations.empty());
    }
  }

  TEST_CASE("DecodeScheduler: a request short of min_admission joins the running ones after admission_delay") {
    auto model = std::make_shared<Model>();
    replay::DecodeOptions options = small_options();
    options.min_admission = 8;  // never reached: one request waits
    options.admission_delay = 20ms;
    auto standin = std::make_shared<StandIn>(model, options);
    standin->block_at = {2};    // the runner's first launch holds the worker until the request waits
    standin->call_delay = 1ms;  // the runner's 60 launches after it outlast the delay
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(standin), options);
    scheduler.submit({prompt_of(0, 2), 0}, recorder.callback(0));  // runs into max_len: 62 tokens
    standin->wait_calls(2);
    replay::DecodeStream lone = scheduler.submit({prompt_of(1, 3), 5});
    standin->release();
    const replay::DecodeResult result = lone.wait();
    CHECK(result.status == DecodeStatus::token_limit);
    CHECK(result.tokens == model->expected(1, 3, 5, options.max_len).first);
    CHECK(result.queue_delay >= options.admission_delay);
    CHECK(result.queue_delay < 5s);
    REQUIRE(recorder.wait_finals(1));
    CHECK(recorder.outcome(0).tokens == model->expected(0, 2, 0, options.max_len).first);
    std::lock_guard lock(standin->mutex);
    // Admitted alone, and while the runner ran (they shared launches).
    CHECK(standin->prefill_ids == std::vector<std::vector<std::size_t>>{{0}, {1}});
    CHECK(standin->mixed_launches > 0);
    CHECK(standin->violations.empty());
  }

  TEST_CASE("DecodeScheduler: an executor failure fails the sequences of that call only; the rest are served") {
    const replay::DecodeOptions options = small_options();
    Workload work(60, options.max_len, replay_test::rng(), 20);
    for (const std::size_t id : {44, 52}) {  // long runs, so that they reach their poisoned positions
      work.prompt[id] = 4;
      work.max_new[id] = 0;
      work.model->eos_position[id] = kNoEos;
    }
    auto standin = std::make_shared<StandIn>(work.model, options);
    standin->poison_prefill = {5, 31};
    standin->poison_decode = {44, 52};
    standin->poison_after = 8;
    standin->bad_counts_at_launch = 1;  // never holds 44 or 52, which come later
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(standin), options);
    const auto outcomes = run_all(scheduler, recorder, work);
    std::set<std::size_t> failed_ids;
    std::size_t failed_prefill_calls = 0;
    std::size_t failed_decode_calls = 0;
    {
      std::lock_guard lock(standin->mutex);
      failed_ids = standin->failed_ids;
      failed_prefill_calls = standin->failed_prefill_calls;
      failed_decode_calls = standin->failed_decode_calls;
      CHECK(standin->violations.empty());
    }
    for (const std::size_t poisoned : {5, 31, 44, 52}) {
      CHECK(failed_ids.count(poisoned) == 1);
    }
    CHECK(failed_prefill_calls >= 1);
    CHECK(failed_decode_calls >= 2);
    std::size_t failed = 0;
    for (const auto& [id, o] : outcomes) {
      CAPTURE(id);
      CHECK(o.finals == 1);
      const auto [tokens, status] = work.model->expected(id, work.prompt[id], work.max_new[id], options.max_len);
      if (failed_ids.count(id) != 0) {
        ++failed;
        CHECK(o.status == DecodeStatus::failed);
        CHECK(is_prefix(o.tokens, tokens));
        const bool says_why = o.message.find("poisoned") != std::string::npos ||
                              o.message.find("reported 0 tokens for row 0") != std::string::npos;
        CHECK(says_why);
      } else {
        CHECK(o.status == status);
        CHECK(o.tokens == tokens);
      }
    }
    CHECK(failed < work.prompt.size());
    const replay::DecodeStats stats = scheduler.stats();
    CHECK(stats.failed == failed);
    CHECK(stats.failed_prefills == failed_prefill_calls);
    CHECK(stats.failed_launches == failed_decode_calls);
    CHECK(stats.finished() + stats.failed == work.prompt.size());

    // And it goes on serving.
    const replay::DecodeResult after = scheduler.submit({prompt_of(3, 4), 5}).wait();
    CHECK(after.ok());
    CHECK(after.tokens == work.model->expected(3, 4, 5, options.max_len).first);
  }

  TEST_CASE("DecodeScheduler: cancel() ends a waiting or running request and frees its slot") {
    auto model = std::make_shared<Model>();
    replay::DecodeOptions options = small_options();
    options.max_slots = 1;
    options.max_len = 64;
    auto standin = std::make_shared<StandIn>(model, options);
    standin->block_at = {3};  // the running request's second launch holds the worker
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(standin), options);
    const replay::DecodeHandle running = scheduler.submit({prompt_of(0, 4), 0}, recorder.callback(0));
    const replay::DecodeHandle waiting = scheduler.submit({prompt_of(1, 4), 0}, recorder.callback(1));
    replay::DecodeStream next = scheduler.submit({prompt_of(2, 4), 3});
    CHECK(running.id() != waiting.id());
    standin->wait_calls(3);
    std::thread canceller([&] {
      waiting.cancel();
      running.cancel();
      running.cancel();  // idempotent
    });
    canceller.join();
    standin->release();
    REQUIRE(recorder.wait_finals(2));
    const Outcome r = recorder.outcome(0);
    CHECK(r.status == DecodeStatus::cancelled);
    CHECK(r.tokens.size() == 3);  // the prefill's token and the two launches'
    CHECK(is_prefix(r.tokens, model->expected(0, 4, 0, 64).first));
    CHECK(r.scheduler_id == running.id());
    const Outcome w = recorder.outcome(1);
    CHECK(w.status == DecodeStatus::cancelled);
    CHECK(w.tokens.empty());
    CHECK(w.message.find("waiting for a slot") != std::string::npos);
    // The one slot went to the third request, which ran to its end.
    const replay::DecodeResult third = next.wait();
    CHECK(third.status == DecodeStatus::token_limit);
    CHECK(third.tokens == model->expected(2, 4, 3, 64).first);
    running.cancel();  // after the end: nothing
    CHECK(recorder.outcome(0).finals == 1);
    const replay::DecodeStats stats = scheduler.stats();
    CHECK(stats.cancelled == 2);
    CHECK(stats.admitted == 2);  // the cancelled waiting request never got a slot
    std::lock_guard lock(standin->mutex);
    CHECK(standin->prefill_calls == 2);
    CHECK(standin->violations.empty());
  }

  TEST_CASE("DecodeScheduler: an update callback that throws cancels its request only") {
    auto model = std::make_shared<Model>();
    const replay::DecodeOptions options = small_options();
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(std::make_shared<StandIn>(model, options)), options);
    int calls = 0;
    scheduler.submit({prompt_of(0, 3), 10}, [&](const replay::DecodeUpdate& update) {
      recorder.record(0, update);
      if (++calls == 2) {
        throw std::runtime_error("client went away");
      }
    });
    scheduler.submit({prompt_of(1, 3), 10}, recorder.callback(1));
    REQUIRE(recorder.wait_finals(2));
    const Outcome o = recorder.outcome(0);
    CHECK(o.status == DecodeStatus::cancelled);
    CHECK(o.message.find("client went away") != std::string::npos);
    const std::vector<TokenId> expected = model->expected(0, 3, 10, 64).first;
    CHECK(o.tokens == std::vector<TokenId>(expected.begin(), expected.begin() + 2));
    CHECK(recorder.outcome(1).tokens == model->expected(1, 3, 10, 64).first);
  }

  TEST_CASE("DecodeScheduler: 8 producers, 200 requests, random lengths and cancellations: each ends once, exactly") {
    for (const auto& [k, prefill] : {std::pair{std::size_t{1}, replay::DecodePrefill::separate},
                                     std::pair{std::size_t{3}, replay::DecodePrefill::separate},
                                     std::pair{std::size_t{1}, replay::DecodePrefill::with_decode},
                                     std::pair{std::size_t{3}, replay::DecodePrefill::with_decode}}) {
      CAPTURE(k);
      CAPTURE(prefill == replay::DecodePrefill::with_decode);
      replay::DecodeOptions options = small_options();
      options.prefill = prefill;
      options.max_prefill_tokens = prefill == replay::DecodePrefill::with_decode ? 16 : 0;
      options.max_len = 128;
      options.context_buckets = {16, 32, 64, 128};
      options.steps_per_launch = k;
      options.queue_capacity = 64;
      constexpr std::size_t producers = 8;
      constexpr std::size_t per_producer = 25;
      constexpr std::size_t count = producers * per_producer;
      Workload work(count, options.max_len, replay_test::rng(), 40);
      // A few prompts too long for the cache.
      for (std::size_t id = 7; id < count; id += 29) {
        work.prompt[id] = options.max_len + id % 3;
      }
      auto standin = std::make_shared<StandIn>(work.model, options);
      standin->call_delay = 10us;  // leaves room for submissions and cancellations between steps
      Recorder recorder;
      Scheduler scheduler(StandInExecutor(standin), options);
      std::mutex handles_mutex;
      std::vector<replay::DecodeHandle> handles;
      std::atomic<bool> submitting{true};
      std::vector<std::thread> threads;
      for (std::size_t p = 0; p < producers; ++p) {
        threads.emplace_back([&, p] {
          std::mt19937 rng(replay_test::case_seed_for(p));
          std::vector<std::pair<std::size_t, replay::DecodeStream>> streams;
          for (std::size_t i = 0; i < per_producer; ++i) {
            const std::size_t id = p * per_producer + i;
            replay::DecodeHandle handle;
            if (p % 2 == 0) {
              handle = scheduler.submit(work.request(id), recorder.callback(id));
            } else {
              streams.emplace_back(id, scheduler.submit(work.request(id)));
              handle = streams.back().second.handle();
            }
            {
              std::lock_guard lock(handles_mutex);
              handles.push_back(handle);
            }
            std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1000));
          }
          for (auto& [id, stream] : streams) {
            std::vector<TokenId> read;
            for (const TokenId t : stream) {
              read.push_back(t);
            }
            replay::DecodeResult result = stream.wait();
            CHECK(read == result.tokens);
            recorder.put(id, result, stream.id());
          }
        });
      }
      std::thread canceller([&] {
        std::mt19937 rng(replay_test::case_seed_for(99));
        while (submitting.load()) {
          {
            std::lock_guard lock(handles_mutex);
            if (!handles.empty() && rng() % 2 == 0) {
              handles[rng() % handles.size()].cancel();
            }
          }
          std::this_thread::sleep_for(100us);
        }
      });
      for (auto& t : threads) {
        t.join();
      }
      REQUIRE(recorder.wait_finals(count));
      submitting = false;
      canceller.join();
      scheduler.shutdown(replay::DecodeShutdown::drain);

      std::map<DecodeStatus, std::size_t> by_status;
      std::size_t tokens = 0;
      std::set<std::uint64_t> scheduler_ids;
      for (const auto& [id, o] : recorder.outcomes()) {
        CAPTURE(id);
        CHECK(o.finals == 1);
        CHECK(o.after_final == 0);
        CHECK_FALSE(o.id_changed);
        scheduler_ids.insert(o.scheduler_id);
        ++by_status[o.status];
        tokens += o.tokens.size();
        const auto [expected, status] = work.model->expected(id, work.prompt[id], work.max_new[id], options.max_len);
        if (work.prompt[id] >= options.max_len) {
          CHECK(o.status == DecodeStatus::prompt_too_long);
        } else if (o.status == DecodeStatus::cancelled) {
          CHECK(is_prefix(o.tokens, expected));
        } else if (o.status == DecodeStatus::queue_full) {
          CHECK(o.tokens.empty());
        } else {
          CHECK(o.status == status);
          CHECK(o.tokens == expected);
        }
      }
      CHECK(scheduler_ids.size() == count);  // ids are unique
      CHECK(by_status[DecodeStatus::failed] == 0);
      CHECK(by_status[DecodeStatus::shut_down] == 0);
      const replay::DecodeStats stats = scheduler.stats();
      CHECK(stats.cancelled == by_status[DecodeStatus::cancelled]);
      CHECK(stats.refused == by_status[DecodeStatus::queue_full]);
      CHECK(stats.prompt_too_long == by_status[DecodeStatus::prompt_too_long]);
      CHECK(stats.enqueued == stats.finished() + stats.cancelled);
      CHECK(stats.enqueued + stats.refused + stats.prompt_too_long == count);
      CHECK(stats.tokens == tokens);
      CHECK(stats.queue_depth == 0);
      CHECK(stats.active == 0);
      std::uint64_t histogram = 0;
      for (const std::uint64_t n : stats.queue_delay_histogram) {
        histogram += n;
      }
      CHECK(histogram == stats.admitted);
      CHECK(stats.queue_delay_max_us >= stats.queue_delay_p99_us);
      std::lock_guard lock(standin->mutex);
      for (const std::string& v : standin->violations) {
        FAIL_CHECK(v);
      }
      CHECK(standin->violations.empty());
      CHECK(standin->mixed_launches > 0);
    }
  }

  TEST_CASE("DecodeScheduler: shutdown(drain) finishes every request in flight; later ones are refused") {
    const replay::DecodeOptions options = small_options();
    Workload work(30, options.max_len, replay_test::rng(), 20);
    auto standin = std::make_shared<StandIn>(work.model, options);
    standin->block_at = {2};
    Recorder recorder;
    Scheduler scheduler(StandInExecutor(standin), options);
    for (std::size_t id = 0; id < 30; ++id) {
      scheduler.submit(work.request(id), recorder.callback(id));
    }
    standin->wait_calls(2);
    std::thread stopper([&] { scheduler.shutdown(replay::DecodeShutdown::drain); });
    while (scheduler.accepting()) {
      std::this_thread::yield();
    }
    const replay::DecodeResult late = scheduler.submit({prompt_of(40, 3), 2}).wait();
    CHECK(late.status == DecodeStatus::shut_down);
    CHECK(late.message.find("shutting down") != std::string::npos);
    standin->release();
    stopper.join();  // returns once every request ended
    CHECK(recorder.outcomes().size() == 30);
    check_exact(recorder.outcomes(), work, options.max_len);
    CHECK(scheduler.stats().rejected_shut_down == 1);
    CHECK(scheduler.stats().finished() == 30);
  }

  TEST_CASE("DecodeScheduler: shutdown(cancel) and the destructor end requests in flight with shut_down") {
    auto model = std::make_shared<Model>();
    replay::DecodeOptions options = small_options();
    options.max_len = 64;
    options.max_slots = 4;
    auto standin = std::make_shared<StandIn>(model, options);
    // The first call holds until every request is queued; by the fourth (a
    // launch, whatever the first prefill held) all four slots run.
    standin->block_at = {1, 4};
    Recorder recorder;
    std::optional<replay::DecodeHandle> handle;
    {
      Scheduler scheduler(StandInExecutor(standin), options);
      for (std::size_t id = 0; id < 10; ++id) {
        scheduler.submit({prompt_of(id, 4), 0}, recorder.callback(id));  // each would run to max_len
      }
      handle = scheduler.submit({prompt_of(10, 4), 0}, recorder.callback(10));
      standin->wait_calls(1);
      standin->release();
      standin->wait_calls(4);
      std::thread stopper([&] { scheduler.shutdown(replay::DecodeShutdown::cancel); });
      while (scheduler.accepting()) {
        std::this_thread::yield();
      }
      standin->release();
      stopper.join();
      REQUIRE(recorder.wait_finals(11));
      const replay::DecodeStats stats = scheduler.stats();
      CHECK(stats.shut_down == 11);
      std::size_t with_tokens = 0;
      for (const auto& [id, o] : recorder.outcomes()) {
        CAPTURE(id);
        CHECK(o.finals == 1);
        CHECK(o.status == DecodeStatus::shut_down);
        CHECK(is_prefix(o.tokens, model->expected(id, 4, 0, 64).first));
        with_tokens += o.tokens.empty() ? 0 : 1;
      }
      CHECK(with_tokens == 4);  // the four running ones kept their tokens; the waiting ones had none
      std::lock_guard lock(standin->mutex);
      CHECK(standin->calls == 4);  // no executor call after the cancel
    }
    handle->cancel();  // the scheduler is gone: a no-op

    // The destructor alone cancels too.
    auto second = std::make_shared<StandIn>(model, options);
    Recorder recorder2;
    {
      Scheduler scheduler(StandInExecutor(second), options);
      for (std::size_t id = 0; id < 6; ++id) {
        scheduler.submit({prompt_of(id, 4), 0}, recorder2.callback(id));
      }
      second->wait_calls(3);
    }
    CHECK(recorder2.wait_finals(6));
    for (const auto& [id, o] : recorder2.outcomes()) {
      CHECK(o.finals == 1);
      const bool ended = o.status == DecodeStatus::shut_down || o.status == DecodeStatus::context_limit;
      CHECK(ended);
    }
    std::lock_guard lock(second->mutex);
    CHECK(second->executors_destroyed == 1);
  }

  TEST_CASE("DecodeScheduler: destroyed from its own update callback, it neither joins itself nor loses a request") {
    auto model = std::make_shared<Model>();
    const replay::DecodeOptions options = small_options();
    auto standin = std::make_shared<StandIn>(model, options);
    standin->block_at = {1};  // nothing runs before every submit() returned
    Recorder recorder;
    auto owner = std::make_unique<Scheduler>(StandInExecutor(standin), options);
    Scheduler* scheduler = owner.get();
    std::mutex owner_mutex;  // the callback takes the scheduler over
    std::unique_ptr<Scheduler> held;
    {
      std::lock_guard lock(owner_mutex);
      held = std::move(owner);
    }
    for (std::size_t id = 1; id < 6; ++id) {
      scheduler->submit({prompt_of(id, 4), 0}, recorder.callback(id));
    }
    std::atomic<int> destroyed{0};
    std::size_t calls_before = 0;
    scheduler->submit({prompt_of(0, 4), 0}, [&](const replay::DecodeUpdate& update) {
      recorder.record(0, update);
      if (!update.done() && update.tokens.size() > 0 && destroyed.load() == 0) {
        {
          std::lock_guard lock(standin->mutex);
          calls_before = standin->calls;
        }
        std::lock_guard lock(owner_mutex);
        held.reset();  // ~DecodeScheduler on its own worker thread
        destroyed = 1;
      }
    });
    standin->wait_calls(1);
    standin->release();
    REQUIRE(recorder.wait_finals(6));
    CHECK(destroyed.load() == 1);
    for (const auto& [id, o] : recorder.outcomes()) {
      CAPTURE(id);
      CHECK(o.finals == 1);
      CHECK(o.after_final == 0);
      const bool ended = o.status == DecodeStatus::shut_down || replay::is_finished(o.status);
      CHECK(ended);
      CHECK(is_prefix(o.tokens, model->expected(id, 4, 0, 64).first));
    }
    // The worker exits on its own and destroys the executor it owned.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      {
        std::lock_guard lock(standin->mutex);
        if (standin->executors_destroyed == 1 || std::chrono::steady_clock::now() > deadline) {
          CHECK(standin->executors_destroyed == 1);
          CHECK(standin->calls == calls_before);  // the executor was not called after the destruction
          break;
        }
      }
      std::this_thread::sleep_for(1ms);
    }
  }

  TEST_CASE("DecodeScheduler: a borrowed executor (DecodeScheduler<E&>) and reset_stats()") {
    auto model = std::make_shared<Model>();
    const replay::DecodeOptions options = small_options();
    StandInExecutor executor(std::make_shared<StandIn>(model, options));
    replay::DecodeScheduler<StandInExecutor&> scheduler(executor, options);
    const replay::DecodeResult result = scheduler.submit({prompt_of(2, 5), 4}).wait();
    CHECK(result.tokens == model->expected(2, 5, 4, 64).first);
    CHECK(scheduler.stats().tokens == 4);
    CHECK(scheduler.stats().admitted == 1);
    scheduler.reset_stats();
    const replay::DecodeStats reset = scheduler.stats();
    CHECK(reset.tokens == 0);
    CHECK(reset.launches == 0);
    CHECK(reset.bucket_launches.size() == 16);
    scheduler.shutdown(replay::DecodeShutdown::drain);
    std::lock_guard lock(executor.state->mutex);
    CHECK(executor.state->executors_destroyed == 0);  // borrowed, not destroyed
  }
}
