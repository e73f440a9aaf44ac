#pragma once
// Per-device bookkeeping of the captures replay has open (CaptureScope, the
// torch adapter), so that replay's own device-wide synchronization waits for
// them instead of invalidating them (cudaDeviceSynchronize during another
// thread's capture breaks it), and the device a stream belongs to.
#include <replay/detail/require_cxx20.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
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

// How many replay captures are open on each device. A capture that begins
// while the device is being synchronized waits for that to end, unless its
// thread already holds a capture open on that device (a nested capture never
// waits: the synchronization waits for the outer one); synchronize() waits for a moment
// with no capture open on the device and holds new ones back meanwhile, so a
// stream of new captures cannot starve it.
//
// Beginning and ending a capture cost one atomic read-modify-write and one
// load each, with no lock: a capture raises its device's `open` count and
// then checks `syncing`; a synchronization raises `syncing` and then waits
// for `open` to be zero. With sequentially consistent operations on both,
// at least one side sees the other: the capture steps back and waits, or the
// synchronization waits for it to end. Counters are per device ordinal
// modulo max_devices: two devices sharing one only make a synchronization
// wait for the other's captures too, never miss one.
class CaptureCoordinator {
 public:
  static constexpr int max_devices = 64;

  static CaptureCoordinator& instance() noexcept {
    static CaptureCoordinator coordinator;
    return coordinator;
  }

  // `may_wait`: this thread holds no other capture open on `device`.
  void begin(int device, bool may_wait) {
    Slot& s = slot(device);
    for (;;) {
      s.open.fetch_add(1);
      if (!may_wait || s.syncing.load() == 0) [[likely]] {
        return;
      }
      end(device);  // step back while the device synchronizes
      ::std::unique_lock<::std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return s.syncing.load() == 0; });
    }
  }
  void end(int device) noexcept {
    Slot& s = slot(device);
    if (s.open.fetch_sub(1) == 1 && s.syncing.load() != 0) [[unlikely]] {
      const ::std::lock_guard<::std::mutex> lock(mutex_);  // the waiter checks under it: no lost wake-up
      changed_.notify_all();
    }
  }
  int open_on(int device) const noexcept { return slot(device).open.load(); }

  // `sync()` (cudaDeviceSynchronize) once no replay capture is open on
  // `device`; captures that would begin meanwhile wait for it to return.
  template <class Sync>
  void synchronize_with(int device, Sync&& sync) {
    Slot& s = slot(device);
    s.syncing.fetch_add(1);
    struct Done {
      CaptureCoordinator& self;
      Slot& s;
      ~Done() {
        s.syncing.fetch_sub(1);
        const ::std::lock_guard<::std::mutex> lock(self.mutex_);  // a stepping-back capture checks under it
        self.changed_.notify_all();
      }
    } done{*this, s};
    {
      ::std::unique_lock<::std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return s.open.load() == 0; });
    }
    // Without the lock: synchronizing one device holds up no other device's
    // captures or synchronizations.
    sync();
  }
  // cudaDeviceSynchronize on the current device once no replay capture is
  // open there.
  void synchronize(const ::std::source_location& where) {
    int device = 0;
    check(::cudaGetDevice(&device), "cudaGetDevice", where);
    synchronize_with(device, [&] { check(::cudaDeviceSynchronize(), "cudaDeviceSynchronize", where); });
  }

 private:
  struct Slot {
    ::std::atomic<int> open{0};
    ::std::atomic<int> syncing{0};
  };
  CaptureCoordinator() = default;
  Slot& slot(int device) noexcept { return slots_[static_cast<unsigned>(device) % max_devices]; }
  const Slot& slot(int device) const noexcept { return slots_[static_cast<unsigned>(device) % max_devices]; }

  ::std::mutex mutex_;  // for waiting only
  ::std::condition_variable changed_;
  Slot slots_[max_devices];
};

// One open capture on a device, for the coordinator. A capture begun while
// this thread holds another on the same device never waits (see above).
class CaptureToken {
 public:
  CaptureToken() noexcept = default;
  explicit CaptureToken(int device) { acquire(device); }
  CaptureToken(const CaptureToken&) = delete;
  CaptureToken& operator=(const CaptureToken&) = delete;
  ~CaptureToken() { release(); }
  void acquire(int device) {
    release();
    int& held = held_by_this_thread(device);
    CaptureCoordinator::instance().begin(device, held == 0);
    ++held;
    device_ = device;
  }
  void release() noexcept {
    if (device_ >= 0) {
      CaptureCoordinator::instance().end(device_);
      --held_by_this_thread(device_);
      device_ = -1;
    }
  }

 private:
  static int& held_by_this_thread(int device) noexcept {
    thread_local int held[CaptureCoordinator::max_devices] = {};
    return held[static_cast<unsigned>(device) % CaptureCoordinator::max_devices];
  }
  int device_ = -1;
};

}  // namespace replay::detail
