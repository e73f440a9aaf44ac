#pragma once
#include <replay/detail/require_cxx20.hpp>
// DecodeOptions checked and completed (defaults filled in) for a scheduler.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string_view>
#include <vector>

#include "replay/decode/options.hpp"
#include "replay/detail/message.hpp"
#include "replay/error.hpp"

namespace replay::detail {

inline void check_decode_buckets(const ::std::vector<::std::int64_t>& buckets, ::std::string_view name,
                                 const ::std::source_location& where) {
  if (buckets.front() <= 0 || !::std::is_sorted(buckets.begin(), buckets.end()) ||
      ::std::adjacent_find(buckets.begin(), buckets.end()) != buckets.end()) {
    throw usage_error(concat("DecodeScheduler: ", name, " must be positive and strictly ascending"), where);
  }
}

// max_slots / max_len from the largest bucket when 0, the bucket lists from
// them when empty; then every rule of DecodeOptions.
inline DecodeOptions checked_decode_options(DecodeOptions options, const ::std::source_location& where) {
  auto complete = [&](::std::size_t& limit, ::std::vector<::std::int64_t>& buckets, ::std::string_view limit_name,
                      ::std::string_view buckets_name) {
    if (limit == 0 && buckets.empty()) {
      throw usage_error(concat("DecodeScheduler: give ", limit_name, " or ", buckets_name), where);
    }
    if (buckets.empty()) {
      buckets.push_back(static_cast<::std::int64_t>(limit));
    }
    check_decode_buckets(buckets, buckets_name, where);
    if (limit == 0) {
      limit = static_cast<::std::size_t>(buckets.back());
    }
    if (static_cast<::std::size_t>(buckets.back()) < limit) {
      throw usage_error(concat("DecodeScheduler: the largest of ", buckets_name, " is ", buckets.back(),
                               ", less than ", limit_name, " (", limit, ")"),
                        where);
    }
  };
  complete(options.max_slots, options.batch_buckets, "max_slots", "batch_buckets");
  complete(options.max_len, options.context_buckets, "max_len", "context_buckets");
  if (options.max_len < 2) {
    throw usage_error(concat("DecodeScheduler: max_len is ", options.max_len,
                             "; it must be at least 2 (a one-token prompt and one new token)"),
                      where);
  }
  if (options.steps_per_launch == 0) {
    throw usage_error("DecodeScheduler: steps_per_launch must be at least 1", where);
  }
  if (options.queue_capacity == 0) {
    throw usage_error("DecodeScheduler: queue_capacity must be at least 1", where);
  }
  if (options.static_batch_delay.count() < 0) {
    throw usage_error("DecodeScheduler: static_batch_delay must not be negative", where);
  }
  if (options.min_admission == 0 || options.min_admission > options.max_slots) {
    throw usage_error(concat("DecodeScheduler: min_admission is ", options.min_admission,
                             "; it must be at least 1 and at most max_slots (", options.max_slots, ")"),
                      where);
  }
  if (options.admission_delay.count() < 0) {
    throw usage_error(concat("DecodeScheduler: admission_delay is ", options.admission_delay.count(),
                             " us; it must not be negative"),
                      where);
  }
  return options;
}

}  // namespace replay::detail
