#pragma once
#include <replay/detail/require_cxx20.hpp>
// ComputeStage: a pipeline's compute stage, type-erased (move-only callables too).
#include <cstddef>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include "replay/static_buffer.hpp"
#include "replay/stream_ref.hpp"

namespace replay::detail {

// The compute stage, type-erased; move-only callables (holding a GraphExec,
// say) are fine.
template <class In, class Out>
class ComputeStage {
 public:
  ComputeStage() = default;
  template <class F>
  explicit ComputeStage(F compute) : holder_(::std::make_unique<Holder<F>>(::std::move(compute))) {}

  explicit operator bool() const noexcept { return holder_ != nullptr; }
  bool reports_count() const noexcept { return holder_->reports_count(); }
  ::std::size_t operator()(BufferView<In> in, BufferView<Out> out, StreamRef stream) const {
    return holder_->run(in, out, stream);
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual bool reports_count() const noexcept = 0;
    virtual ::std::size_t run(BufferView<In> in, BufferView<Out> out, StreamRef stream) = 0;
  };
  template <class F>
  struct Holder final : Base {
    explicit Holder(F f) : compute(::std::move(f)) {}
    using result = ::std::invoke_result_t<F&, BufferView<In>, BufferView<Out>, StreamRef>;
    bool reports_count() const noexcept override { return !::std::is_void_v<result>; }
    ::std::size_t run(BufferView<In> in, BufferView<Out> out, StreamRef stream) override {
      if constexpr (::std::is_void_v<result>) {
        ::std::invoke(compute, in, out, stream);
        return out.size();
      } else {
        return static_cast<::std::size_t>(::std::invoke(compute, in, out, stream));
      }
    }
    F compute;
  };
  ::std::unique_ptr<Base> holder_;
};

}  // namespace replay::detail
