#pragma once
// How ShapeRouter maps a key to the shape it runs: validating the options,
// padding a key up to its buckets, finding oversize keys, listing and
// ordering bucket shapes. Pure functions of the (immutable) options, so the
// router calls them without its lock.
#include <replay/detail/require_cxx20.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "replay/detail/message.hpp"
#include "replay/shape_router/detail/keys.hpp"
#include "replay/error.hpp"
#include "replay/shape_router/keys.hpp"
#include "replay/shape_router/options.hpp"

namespace replay::detail {

template <class Key>
struct ShapePlan {
  static constexpr ::std::size_t no_dimension = ::std::numeric_limits<::std::size_t>::max();
  static constexpr ::std::size_t no_slot = ::std::numeric_limits<::std::size_t>::max();
  struct Planned {
    Key shape;
    bool oversize = false;
    // Bucketed: the bucket shape's index in the cartesian product of the
    // lists (row-major, see slot_count); no_slot otherwise.
    ::std::size_t slot = no_slot;
  };

  // Bucket list of dimension `dim` (bucketed); empty with the exact policy.
  static ::std::span<const ::std::int64_t> buckets(const ShapeRouterOptions<Key>& options, ::std::size_t dim) noexcept {
    if (options.buckets.empty()) {
      return {};
    }
    return options.buckets.size() == 1 ? options.buckets[0] : options.buckets[dim];
  }

  // Bucketed: every bucket shape (cartesian product of the lists), largest first.
  static ::std::vector<Key> bucket_shapes(const ShapeRouterOptions<Key>& options) {
    ::std::vector<Key> out;
    if constexpr (ShapeKey<Key>) {
      if (options.policy != RoutingPolicy::bucketed) {
        return out;
      }
      static_assert(::std::default_initializable<Key>,
                    "bucket_shapes() builds keys: the key type must be "
                    "default-constructible");
      constexpr ::std::size_t rank = shape_traits<Key>::rank;
      ::std::array<::std::size_t, rank> index{};
      for (;;) {
        Key shape{};
        for (::std::size_t d = 0; d < rank; ++d) {
          shape_traits<Key>::set_extent(shape, d, buckets(options, d)[index[d]]);
        }
        out.push_back(shape);
        ::std::size_t d = 0;
        for (; d < rank; ++d) {
          if (++index[d] < buckets(options, d).size()) {
            break;
          }
          index[d] = 0;
        }
        if (d == rank) {
          break;
        }
      }
      sort_largest_first(out);
    }
    return out;
  }

  // usage_error for options ShapeRouter cannot route by (see its constructor).
  static void validate(const ShapeRouterOptions<Key>& options, const ::std::source_location& where) {
    if (options.max_graphs == 0) {
      throw usage_error(
          "ShapeRouter: max_graphs is 0; it must allow at least one graph (leave it at "
          "ShapeRouterOptions::unlimited for no limit)",
          where);
    }
    if (options.max_bytes == 0) {
      throw usage_error("ShapeRouter: max_bytes is 0; leave it at ShapeRouterOptions::unlimited for no limit", where);
    }
    if (options.max_entries == 0) {
      throw usage_error("ShapeRouter: max_entries is 0; the router needs room for at least one key", where);
    }
    if (options.capture_threads == 0) {
      throw usage_error("ShapeRouter: capture_threads is 0; use 1 for the calling thread alone", where);
    }
    if (options.capture_attempts == 0) {
      throw usage_error("ShapeRouter: capture_attempts is 0; it must allow at least one attempt", where);
    }
    if (options.policy == RoutingPolicy::exact) {
      if (!options.buckets.empty()) {
        throw usage_error(
            "ShapeRouter: bucket lists were given but the policy is RoutingPolicy::exact; set "
            ".policy = RoutingPolicy::bucketed (or use ShapeRouterOptions::bucketed())",
            where);
      }
      return;
    }
    if constexpr (!ShapeKey<Key>) {
      throw usage_error(
          "ShapeRouter: RoutingPolicy::bucketed needs a shape key (an integer, std::array, "
          "std::tuple or std::pair of integers, or a type with a replay::shape_traits "
          "specialization)",
          where);
    } else {
      constexpr ::std::size_t rank = shape_traits<Key>::rank;
      if (options.buckets.empty()) {
        throw usage_error(
            "ShapeRouter: RoutingPolicy::bucketed with no bucket list; give one sorted list "
            "of sizes (or one per dimension)",
            where);
      }
      if (options.buckets.size() != 1 && options.buckets.size() != rank) {
        throw usage_error(detail::concat("ShapeRouter: ", options.buckets.size(), " bucket lists for a key of rank ",
                                         rank, "; give one list per dimension, or one list for all"),
                          where);
      }
      for (::std::size_t d = 0; d < options.buckets.size(); ++d) {
        const auto& list = options.buckets[d];
        const ::std::string dim = options.buckets.size() == 1 ? ::std::string("the bucket list")
                                                              : detail::concat("the bucket list of dimension ", d);
        if (list.empty()) {
          throw usage_error(detail::concat("ShapeRouter: ", dim, " is empty; give at least one size"), where);
        }
        for (::std::size_t i = 0; i < list.size(); ++i) {
          if (list[i] <= 0) {
            throw usage_error(
                detail::concat("ShapeRouter: ", dim, " holds ", list[i], "; bucket sizes must be positive"), where);
          }
          const ::std::size_t checked_dim = options.buckets.size() == 1 ? 0 : d;
          for (::std::size_t k = 0; k < rank; ++k) {
            if ((options.buckets.size() == 1 || k == checked_dim) && list[i] > detail::max_extent<Key>(k)) {
              throw usage_error(
                  detail::concat("ShapeRouter: ", dim, " holds ", list[i], ", which does not fit the key's type (max ",
                                 detail::max_extent<Key>(k), ")"),
                  where);
            }
          }
          if (i > 0 && list[i] == list[i - 1]) {
            throw usage_error(
                detail::concat("ShapeRouter: ", dim, " holds ", list[i], " twice; bucket sizes must be distinct"),
                where);
          }
          if (i > 0 && list[i] < list[i - 1]) {
            throw usage_error(detail::concat("ShapeRouter: ", dim, " is not sorted (", list[i - 1], " comes before ",
                                             list[i], "); give the sizes in ascending order"),
                              where);
          }
        }
      }
    }
  }

  static void check_extents(const Key& key, const ::std::source_location& where) {
    if constexpr (ShapeKey<Key>) {
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        if (shape_traits<Key>::extent(key, d) <= 0) [[unlikely]] {
          throw_bad_extent(key, d, where);
        }
      }
    }
  }

  // Out of line: message building stays off the hot path.
  [[noreturn, gnu::cold, gnu::noinline]] static void throw_bad_extent(const Key& key, ::std::size_t d,
                                                                      const ::std::source_location& where) {
    if constexpr (ShapeKey<Key>) {
      throw usage_error(detail::concat("ShapeRouter: key ", detail::describe_key(key), " has a ",
                                       shape_traits<Key>::extent(key, d) == 0 ? "zero" : "negative", " dimension (", d,
                                       "); every dimension must be positive"),
                        where);
    } else {
      throw usage_error("ShapeRouter: bad key", where);
    }
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void throw_oversize(const Key& key, ::std::size_t d,
                                                                    ::std::int64_t largest,
                                                                    const ::std::source_location& where) {
    throw usage_error(
        detail::concat("ShapeRouter: key ", detail::describe_key(key), " is above the largest bucket (", largest,
                       ") in dimension ", d, "; add a larger bucket or set OversizePolicy::run_eager"),
        where);
  }

  // The first dimension in which `key` is above the largest bucket, or no_dimension.
  static ::std::size_t oversize_dimension(const ShapeRouterOptions<Key>& options, const Key& key) noexcept {
    if constexpr (ShapeKey<Key>) {
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        if (shape_traits<Key>::extent(key, d) > buckets(options, d).back()) {
          return d;
        }
      }
    }
    return no_dimension;
  }

  // Bucketed: how many bucket shapes there are (the product of the list
  // sizes), or `limit` + 1 when above `limit`; 0 with the exact policy.
  static ::std::size_t slot_count(const ShapeRouterOptions<Key>& options, ::std::size_t limit) noexcept {
    if (options.policy != RoutingPolicy::bucketed) {
      return 0;
    }
    ::std::size_t count = 1;
    if constexpr (ShapeKey<Key>) {
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        count *= buckets(options, d).size();
        if (count > limit) {
          return limit + 1;
        }
      }
    }
    return count;
  }
  // Bucketed: the slot of a bucket shape (as plan() gives it), or no_slot
  // for a shape that is not one.
  static ::std::size_t slot_of(const ShapeRouterOptions<Key>& options, const Key& shape) noexcept {
    if (options.policy != RoutingPolicy::bucketed) {
      return no_slot;
    }
    ::std::size_t slot = 0;
    if constexpr (ShapeKey<Key>) {
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        const auto list = buckets(options, d);
        const auto it = ::std::lower_bound(list.begin(), list.end(), shape_traits<Key>::extent(shape, d));
        if (it == list.end() || *it != shape_traits<Key>::extent(shape, d)) {
          return no_slot;
        }
        slot = slot * list.size() + static_cast<::std::size_t>(it - list.begin());
      }
    }
    return slot;
  }

  // The shape `key` runs with (padded up to its buckets), or the key itself
  // marked oversize; usage_error for a bad extent or a refused oversize key.
  static Planned plan(const ShapeRouterOptions<Key>& options, const Key& key, const ::std::source_location& where) {
    check_extents(key, where);
    if (options.policy == RoutingPolicy::exact) {
      return Planned{key, false};
    }
    if constexpr (ShapeKey<Key>) {
      Planned out{key, false, 0};
      for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
        const auto list = buckets(options, d);
        const ::std::int64_t extent = shape_traits<Key>::extent(key, d);
        const auto it = ::std::lower_bound(list.begin(), list.end(), extent);
        if (it == list.end()) [[unlikely]] {
          if (options.oversize == OversizePolicy::throw_error) {
            throw_oversize(key, d, list.back(), where);
          }
          return Planned{key, true};
        }
        shape_traits<Key>::set_extent(out.shape, d, *it);
        out.slot = out.slot * list.size() + static_cast<::std::size_t>(it - list.begin());
      }
      return out;
    } else {
      return Planned{key, false};  // unreachable: validate() refused bucketing a non-shape key
    }
  }

  static void sort_largest_first(::std::vector<Key>& shapes) {
    if constexpr (ShapeKey<Key>) {
      ::std::stable_sort(shapes.begin(), shapes.end(), [](const Key& a, const Key& b) {
        const auto ea = detail::element_count(a);
        const auto eb = detail::element_count(b);
        if (ea != eb) {
          return ea > eb;
        }
        for (::std::size_t d = 0; d < shape_traits<Key>::rank; ++d) {
          const auto xa = shape_traits<Key>::extent(a, d);
          const auto xb = shape_traits<Key>::extent(b, d);
          if (xa != xb) {
            return xa > xb;
          }
        }
        return false;
      });
    }
  }
};

}  // namespace replay::detail
