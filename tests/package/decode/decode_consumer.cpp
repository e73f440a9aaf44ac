// Compiles the decode component against the installed package and runs a
// DecodeScheduler over a stand-in executor (no device needed): a prompt of
// three tokens gets the tokens 1, 2, 3, 4 (each one more than the last) and
// ends at its max_new_tokens.
#include <cstddef>
#include <cstdio>
#include <exception>
#include <vector>

#include <replay/decode.hpp>
#include <replay/version.hpp>

namespace {

// Each step's token is one more than its input; the first is 1.
struct CountingExecutor {
  void prefill(replay::PrefillBatch& batch) {
    for (std::size_t r = 0; r < batch.rows.size(); ++r) {
      batch.first_tokens[r] = 1;
    }
  }
  void decode(replay::DecodeBatch& batch) {
    for (std::size_t r = 0; r < batch.rows.size(); ++r) {
      replay::TokenId token = batch.rows[r].token;
      for (std::size_t step = 0; step < batch.rows[r].max_tokens; ++step) {
        batch.emit(r, ++token);
      }
    }
  }
};

}  // namespace

int main() {
  try {
    replay::DecodeOptions options;
    options.max_slots = 2;
    options.max_len = 16;
    options.batch_buckets = {1, 2};
    options.context_buckets = {16};
    options.steps_per_launch = 2;
    replay::DecodeScheduler scheduler(CountingExecutor{}, options);
    replay::DecodeStream stream = scheduler.submit({.prompt = {7, 8, 9}, .max_new_tokens = 4});
    const replay::DecodeResult result = stream.wait();
    const std::vector<replay::TokenId> expected{1, 2, 3, 4};
    if (result.status != replay::DecodeStatus::token_limit || result.tokens != expected) {
      std::printf("consumer: replay decode component: expected tokens 1 2 3 4 ending at the token limit, got %zu "
                  "tokens (%s)\n",
                  result.tokens.size(), result.message.c_str());
      return 1;
    }
    std::printf("consumer: replay %s decode component: ok\n", REPLAY_VERSION_STRING);
    return 0;
  } catch (const std::exception& e) {
    std::printf("consumer: replay decode component: %s\n", e.what());
    return 1;
  }
}
