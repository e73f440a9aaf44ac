#pragma once
// The pipeline's chunk policy and the threads that run host copies chunk by
// chunk. CUDA-free (the CUDA runner supplies the per-chunk work), so the CPU
// tests drive it with stand-in work.
//
// plan_chunks() splits a staged copy into chunks: the host copy of one chunk
// overlaps the DMA of the previous one. HostCopyPool runs a job's chunks on
// the calling thread and on a few helper threads at once: a large item's host
// copy runs at several cores' memcpy speed, and no single thread (a producer,
// or the completion thread) copies a whole large item alone.
#include <replay/detail/require_cxx20.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace replay::detail {

inline constexpr ::std::size_t staging_page_bytes = 4096;
// A job never has more chunks than this: a huge item gets larger chunks rather
// than thousands of tiny tasks (and each slot needs at most this many events).
inline constexpr ::std::size_t max_staging_chunks = 64;

// Chunk k covers bytes [offset(k), offset(k) + length(k)).
struct ChunkPlan {
  ::std::size_t bytes = 0;
  ::std::size_t chunk_bytes = 0;
  ::std::size_t count = 0;

  constexpr ::std::size_t offset(::std::size_t k) const noexcept { return k * chunk_bytes; }
  constexpr ::std::size_t length(::std::size_t k) const noexcept {
    return ::std::min(chunk_bytes, bytes - offset(k));
  }
};

// Chunks of `chunk_bytes` (a multiple of the page size, checked by the
// options), grown to a page multiple when more than `max_chunks` would be
// needed. 0 bytes: no chunks.
constexpr ChunkPlan plan_chunks(::std::size_t bytes, ::std::size_t chunk_bytes,
                                ::std::size_t max_chunks = max_staging_chunks) noexcept {
  ChunkPlan plan;
  plan.bytes = bytes;
  if (bytes == 0) {
    return plan;
  }
  ::std::size_t chunk = ::std::max<::std::size_t>(chunk_bytes, 1);
  if (max_chunks != 0 && (bytes + chunk - 1) / chunk > max_chunks) {
    chunk = (bytes + max_chunks - 1) / max_chunks;
    chunk = (chunk + staging_page_bytes - 1) / staging_page_bytes * staging_page_bytes;
  }
  plan.chunk_bytes = ::std::min(chunk, bytes);
  plan.count = (bytes + plan.chunk_bytes - 1) / plan.chunk_bytes;
  return plan;
}

// The most chunks any item of up to `capacity_bytes` is split into.
constexpr ::std::size_t max_chunks_for(::std::size_t capacity_bytes, ::std::size_t chunk_bytes) noexcept {
  // plan_chunks(b, c).count <= min(max_staging_chunks, ceil(b / c)), which grows with b.
  return capacity_bytes == 0 || chunk_bytes == 0
             ? 0
             : ::std::min(max_staging_chunks, (capacity_bytes + chunk_bytes - 1) / chunk_bytes);
}

// Runs the chunks of a job on the calling thread and up to `helpers` helper
// threads (started on first use; `bind` runs first on each, e.g. to make a
// device current). Several jobs (from several producers and the completion
// thread) may run at once; an idle helper joins the job with fewest helpers.
class HostCopyPool {
 public:
  HostCopyPool(::std::size_t helpers, ::std::function<void()> bind) : helpers_(helpers), bind_(::std::move(bind)) {}
  HostCopyPool(const HostCopyPool&) = delete;
  HostCopyPool& operator=(const HostCopyPool&) = delete;
  ~HostCopyPool() {
    {
      ::std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    for (::std::thread& t : threads_) {
      t.join();
    }
  }

  ::std::size_t helpers() const noexcept { return helpers_; }
  // Helper threads started so far.
  ::std::size_t started() const {
    ::std::lock_guard lock(mutex_);
    return threads_.size();
  }

  // Calls work(k) once for every k in [0, count), in increasing order of
  // claims (so chunk k starts no later than chunk k+1 on any one thread), and
  // returns once every call returned. After a call throws, unclaimed chunks
  // are skipped and the first exception is rethrown here.
  template <class Work>
  void run(::std::size_t count, Work& work) {
    if (count == 0) {
      return;
    }
    if (count == 1 || helpers_ == 0) {
      for (::std::size_t k = 0; k < count; ++k) {
        work(k);
      }
      return;
    }
    Job job;
    job.count = count;
    job.context = &work;
    job.call = [](void* context, ::std::size_t k) { (*static_cast<Work*>(context))(k); };
    {
      ::std::lock_guard lock(mutex_);
      start_helpers();
      jobs_.push_back(&job);
      job.listed = true;
    }
    work_.notify_all();
    for (;;) {
      ::std::size_t k = 0;
      {
        ::std::lock_guard lock(mutex_);
        if (job.next >= job.count) {
          break;
        }
        k = claim(job);
      }
      run_chunk(job, k, false);
    }
    {
      ::std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return job.finished == job.count; });
      unlist(job);
    }
    if (job.error != nullptr) {
      ::std::rethrow_exception(job.error);
    }
  }

 private:
  struct Job {
    ::std::size_t count = 0;
    ::std::size_t next = 0;      // next chunk to claim (under mutex_)
    ::std::size_t finished = 0;  // chunks done or skipped (under mutex_)
    ::std::size_t helping = 0;   // helper threads working on it now (under mutex_)
    bool listed = false;
    void* context = nullptr;
    void (*call)(void*, ::std::size_t) = nullptr;
    ::std::exception_ptr error;  // first failure (under mutex_)
  };

  // Under mutex_. Threads are started once; if starting one fails, the pool
  // runs with those it has (the caller always works on its own job).
  void start_helpers() {
    if (started_) {
      return;
    }
    started_ = true;
    try {
      threads_.reserve(helpers_);
      jobs_.reserve(16);
      for (::std::size_t i = 0; i < helpers_; ++i) {
        threads_.emplace_back([this] { helper_loop(); });
      }
    } catch (...) {
    }
  }

  // Under mutex_.
  ::std::size_t claim(Job& job) {
    const ::std::size_t k = job.next++;
    if (job.next >= job.count) {
      unlist(job);  // fully claimed: helpers look elsewhere
    }
    return k;
  }
  void unlist(Job& job) {
    if (job.listed) {
      job.listed = false;
      jobs_.erase(::std::find(jobs_.begin(), jobs_.end(), &job));
    }
  }

  void run_chunk(Job& job, ::std::size_t k, bool as_helper) noexcept {
    bool skip = false;
    {
      ::std::lock_guard lock(mutex_);
      skip = job.error != nullptr;
    }
    ::std::exception_ptr error;
    if (!skip) {
      try {
        job.call(job.context, k);
      } catch (...) {
        error = ::std::current_exception();
      }
    }
    bool done = false;
    {
      ::std::lock_guard lock(mutex_);
      if (error != nullptr && job.error == nullptr) {
        job.error = error;
      }
      // Let go of the exception while still under the lock: once the owner
      // has rethrown it and returned, its destructor must not run on a
      // helper, after the caller's frame (and what it refers to) is gone.
      error = nullptr;
      if (as_helper) {
        --job.helping;
      }
      done = ++job.finished == job.count;
      // After this unlock the owner may return and destroy `job`.
    }
    if (done) {
      done_.notify_all();
    }
  }

  void helper_loop() noexcept {
    if (bind_) {
      bind_();
    }
    ::std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) {
        return;  // stopping
      }
      Job* job = *::std::min_element(jobs_.begin(), jobs_.end(),
                                     [](const Job* a, const Job* b) { return a->helping < b->helping; });
      const ::std::size_t k = claim(*job);
      ++job->helping;
      lock.unlock();
      run_chunk(*job, k, true);  // its last access to the job is under the lock
      lock.lock();
    }
  }

  ::std::size_t helpers_;
  ::std::function<void()> bind_;
  mutable ::std::mutex mutex_;
  ::std::condition_variable work_;
  ::std::condition_variable done_;
  ::std::vector<Job*> jobs_;
  ::std::vector<::std::thread> threads_;
  bool started_ = false;
  bool stopping_ = false;
};

}  // namespace replay::detail
