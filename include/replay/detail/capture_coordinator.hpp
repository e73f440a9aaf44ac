#pragma once
// Per-device bookkeeping of the captures replay has open (CaptureScope, the
// torch adapter), so that replay's own device-wide synchronization waits for
// them instead of invalidating them (cudaDeviceSynchronize during another
// thread's capture breaks it), and the device a stream belongs to.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <source_location>

#include "replay/detail/device_scope.hpp"
#include "replay/error.hpp"

namespace replay::detail {

// The device `stream` was created on (cudaStreamGetDevice where the runtime
// has it; the current device otherwise, and for the special handles).
inline int device_of(::cudaStream_t stream, const ::std::source_location& where) {
  int device = 0;
#if CUDART_VERSION >= 12080
  if (stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread) {
    check(::cudaStreamGetDevice(stream, &device), "cudaStreamGetDevice", where);
    return device;
  }
#else
  (void)stream;
#endif
  check(::cudaGetDevice(&device), "cudaGetDevice", where);
  return device;
}

// How many replay captures are open on each device. Captures never wait (a
// thread may nest captures); synchronize() waits for a moment with none open
// on the device and holds new ones back while the device synchronizes.
class CaptureCoordinator {
 public:
  static CaptureCoordinator& instance() noexcept {
    static CaptureCoordinator coordinator;
    return coordinator;
  }

  void begin(int device) {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    ++open_[device];
  }
  void end(int device) noexcept {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = open_.find(device);
    if (it != open_.end() && --it->second == 0) {
      idle_.notify_all();
    }
  }
  int open_on(int device) const {
    const ::std::lock_guard<::std::mutex> lock(mutex_);
    const auto it = open_.find(device);
    return it == open_.end() ? 0 : it->second;
  }

  // cudaDeviceSynchronize on the current device once no replay capture is
  // open there.
  void synchronize(const ::std::source_location& where) {
    int device = 0;
    check(::cudaGetDevice(&device), "cudaGetDevice", where);
    ::std::unique_lock<::std::mutex> lock(mutex_);
    idle_.wait(lock, [&] {
      const auto it = open_.find(device);
      return it == open_.end() || it->second == 0;
    });
    check(::cudaDeviceSynchronize(), "cudaDeviceSynchronize", where);
  }

 private:
  CaptureCoordinator() = default;
  mutable ::std::mutex mutex_;
  ::std::condition_variable idle_;
  ::std::map<int, int> open_;
};

// One open capture on a device, for the coordinator.
class CaptureToken {
 public:
  CaptureToken() noexcept = default;
  explicit CaptureToken(int device) : device_(device) { CaptureCoordinator::instance().begin(device); }
  CaptureToken(const CaptureToken&) = delete;
  CaptureToken& operator=(const CaptureToken&) = delete;
  ~CaptureToken() { release(); }
  void acquire(int device) {
    release();
    CaptureCoordinator::instance().begin(device);
    device_ = device;
  }
  void release() noexcept {
    if (device_ >= 0) {
      CaptureCoordinator::instance().end(device_);
      device_ = -1;
    }
  }

 private:
  int device_ = -1;
};

}  // namespace replay::detail
