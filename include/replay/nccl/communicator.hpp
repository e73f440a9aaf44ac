#pragma once
#include <replay/detail/require_cxx20.hpp>
// Communicator: an owning, move-only ncclComm_t for one rank on one device.
// CommunicatorGroup: the communicators of one process that drives several
// GPUs (ncclCommInitAll), one per device.
//
//   // one process per GPU: the unique id comes from rank 0 (replay/nccl/unique_id.hpp)
//   replay::Communicator comm(id, nranks, rank, device);
//   // one process, several GPUs (one thread per GPU, or one thread with group calls)
//   replay::CommunicatorGroup group({0, 1});
//
// The destructor destroys the communicator (ncclCommDestroy), or aborts it
// (ncclCommAbort) when an NCCL call on it failed, a replay timed out, or
// mark_failed() was called: a communicator in error may have collectives
// that will never complete, and ncclCommDestroy would wait for them.
// Destroy graphs that hold its collectives (routers) before it.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <source_location>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "replay/error.hpp"
#include "replay/nccl/error.hpp"
#include "replay/nccl/stream_device.hpp"

namespace replay {

// NVLink multicast (NVLS) stays off unless a user turns it on: NCCL sets it
// up with multicast objects that, on GPUs shared between jobs, can leave the
// GPUs unusable until they are reset. Sets NCCL_NVLS_ENABLE=0 when it is
// unset (or empty); an explicit setting is left as it is. Call it before the
// first NCCL call of the process: NCCL reads the variable once. Returns true
// when multicast is off afterwards.
inline bool keep_nvlink_multicast_off() noexcept {
  const char* value = ::std::getenv("NCCL_NVLS_ENABLE");
  if (value == nullptr || *value == '\0') {
    return ::setenv("NCCL_NVLS_ENABLE", "0", 1) == 0;
  }
  return ::std::strcmp(value, "0") == 0;
}

// The NCCL version of the library linked at run time (ncclGetVersion), e.g. 22809.
inline int nccl_runtime_version(::std::source_location where = ::std::source_location::current()) {
  int version = 0;
  check_nccl(::ncclGetVersion(&version), "ncclGetVersion", nullptr, where);
  return version;
}

class Communicator {
 public:
  // ncclCommInitRank for `rank` of `nranks` on `device` (made current for the
  // call; the caller's current device is restored). Blocks until every rank
  // has joined. NCCL validates rank and nranks: a bad one throws nccl_error
  // naming ncclCommInitRank.
  Communicator(const ::ncclUniqueId& id, int nranks, int rank, int device,
               ::std::source_location where = ::std::source_location::current()) {
    ScopedDevice on(device, where);
    ::ncclComm_t comm = nullptr;
    check_nccl(::ncclCommInitRank(&comm, nranks, id, rank), "ncclCommInitRank", nullptr, where);
    comm_.store(comm);
    describe(where);
  }

  // Adopts a communicator made elsewhere; the Communicator destroys it.
  [[nodiscard]] static Communicator from_native_handle(::ncclComm_t comm,
                                                       ::std::source_location where = ::std::source_location::current()) {
    if (comm == nullptr) {
      throw usage_error("Communicator::from_native_handle: null communicator", where);
    }
    Communicator out(adopt_tag{}, comm);
    out.describe(where);
    return out;
  }

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&& other) noexcept
      : comm_(other.comm_.exchange(nullptr)),
        failed_(other.failed_.load()),
        rank_(other.rank_),
        size_(other.size_),
        device_(other.device_) {}
  Communicator& operator=(Communicator&& other) noexcept {
    if (this != &other) {
      reset();
      comm_.store(other.comm_.exchange(nullptr));
      failed_.store(other.failed_.load());
      rank_ = other.rank_;
      size_ = other.size_;
      device_ = other.device_;
    }
    return *this;
  }
  ~Communicator() { reset(); }

  // The handle; usage_error on a moved-from or aborted communicator.
  ::ncclComm_t handle(::std::source_location where = ::std::source_location::current()) const {
    ::ncclComm_t comm = comm_.load(::std::memory_order_acquire);
    if (comm == nullptr) [[unlikely]] {
      throw usage_error("Communicator used after move, release() or abort()", where);
    }
    return comm;
  }
  ::ncclComm_t get() const noexcept { return comm_.load(::std::memory_order_acquire); }
  explicit operator bool() const noexcept { return get() != nullptr; }
  [[nodiscard]] ::ncclComm_t release() noexcept { return comm_.exchange(nullptr); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }

  // After an error: the destructor aborts instead of destroying.
  void mark_failed() noexcept { failed_.store(true); }
  bool failed() const noexcept { return failed_.load(); }

  // ncclCommAbort now: collectives in flight on it are stopped (a hung
  // replay returns). Safe from any thread, once; the communicator is unusable after.
  void abort() noexcept {
    failed_.store(true);
    if (::ncclComm_t comm = comm_.exchange(nullptr)) {
      (void)::ncclCommAbort(comm);
    }
  }

  // An error NCCL found asynchronously (ncclCommGetAsyncError), ncclSuccess if none.
  ::ncclResult_t async_error(::std::source_location where = ::std::source_location::current()) const {
    ::ncclResult_t async = ::ncclSuccess;
    check_nccl(::ncclCommGetAsyncError(handle(where), &async), "ncclCommGetAsyncError", get(), where);
    return async;
  }

  // Throws nccl_error (and marks the communicator failed) for a failed call on it.
  void check(::ncclResult_t result, ::std::string_view api,
             ::std::source_location where = ::std::source_location::current()) const {
    if (result != ::ncclSuccess) [[unlikely]] {
      failed_.store(true);
      detail::throw_nccl_error(result, api, get(), where);
    }
  }

 private:
  friend class CommunicatorGroup;
  struct adopt_tag {};
  Communicator(adopt_tag, ::ncclComm_t comm) noexcept : comm_(comm) {}

  void describe(const ::std::source_location& where) {
    ::ncclComm_t comm = comm_.load();
    try {
      check_nccl(::ncclCommUserRank(comm, &rank_), "ncclCommUserRank", comm, where);
      check_nccl(::ncclCommCount(comm, &size_), "ncclCommCount", comm, where);
      check_nccl(::ncclCommCuDevice(comm, &device_), "ncclCommCuDevice", comm, where);
    } catch (...) {
      abort();
      throw;
    }
  }

  void reset() noexcept {
    if (::ncclComm_t comm = comm_.exchange(nullptr)) {
      if (failed_.load()) {
        (void)::ncclCommAbort(comm);
      } else {
        (void)::ncclCommDestroy(comm);
      }
    }
  }

  ::std::atomic<::ncclComm_t> comm_{nullptr};
  mutable ::std::atomic<bool> failed_{false};
  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
};

// One communicator per device for a process that drives several GPUs
// (ncclCommInitAll): communicator i is rank i on devices[i].
class CommunicatorGroup {
 public:
  // usage_error for an empty list or a device listed twice (NCCL does not
  // support two ranks of one communicator on one device; they would hang).
  explicit CommunicatorGroup(::std::span<const int> devices,
                             ::std::source_location where = ::std::source_location::current()) {
    if (devices.empty()) {
      throw usage_error("CommunicatorGroup: the device list is empty", where);
    }
    for (::std::size_t i = 0; i < devices.size(); ++i) {
      for (::std::size_t j = 0; j < i; ++j) {
        if (devices[i] == devices[j]) {
          throw usage_error("CommunicatorGroup: device " + ::std::to_string(devices[i]) +
                                " is listed twice; each rank needs a device of its own",
                            where);
        }
      }
    }
    ::std::vector<::ncclComm_t> comms(devices.size(), nullptr);
    int current = 0;
    check(::cudaGetDevice(&current), "cudaGetDevice", where);
    const ::ncclResult_t result = ::ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data());
    (void)::cudaSetDevice(current);  // whatever NCCL left current, the caller's device comes back
    if (result != ::ncclSuccess) {
      for (::ncclComm_t c : comms) {
        if (c != nullptr) {
          (void)::ncclCommAbort(c);
        }
      }
      check_nccl(result, "ncclCommInitAll", nullptr, where);
    }
    // Adopt every handle first, so that none leaks if describing one throws.
    comms_.reserve(comms.size());
    for (::ncclComm_t c : comms) {
      comms_.push_back(Communicator(Communicator::adopt_tag{}, c));
    }
    for (Communicator& c : comms_) {
      c.describe(where);
    }
  }
  CommunicatorGroup(::std::initializer_list<int> devices,
                    ::std::source_location where = ::std::source_location::current())
      : CommunicatorGroup(::std::span<const int>(devices.begin(), devices.size()), where) {}
  // Devices 0 .. count-1.
  [[nodiscard]] static CommunicatorGroup first_devices(int count,
                                                       ::std::source_location where = ::std::source_location::current()) {
    if (count < 1) {
      throw usage_error("CommunicatorGroup::first_devices: count must be at least 1, got " + ::std::to_string(count),
                        where);
    }
    ::std::vector<int> devices(static_cast<::std::size_t>(count));
    for (int i = 0; i < count; ++i) {
      devices[static_cast<::std::size_t>(i)] = i;
    }
    return CommunicatorGroup(::std::span<const int>(devices), where);
  }

  CommunicatorGroup(CommunicatorGroup&&) noexcept = default;
  CommunicatorGroup& operator=(CommunicatorGroup&&) noexcept = default;
  ~CommunicatorGroup() = default;

  ::std::size_t size() const noexcept { return comms_.size(); }
  Communicator& operator[](::std::size_t rank) noexcept { return comms_[rank]; }
  const Communicator& operator[](::std::size_t rank) const noexcept { return comms_[rank]; }
  Communicator& at(::std::size_t rank, ::std::source_location where = ::std::source_location::current()) {
    if (rank >= comms_.size()) {
      throw usage_error("CommunicatorGroup::at(" + ::std::to_string(rank) + "): the group has " +
                            ::std::to_string(comms_.size()) + " ranks",
                        where);
    }
    return comms_[rank];
  }
  auto begin() noexcept { return comms_.begin(); }
  auto end() noexcept { return comms_.end(); }

 private:
  ::std::vector<Communicator> comms_;
};

}  // namespace replay
