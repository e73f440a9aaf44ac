// A kernel trace of any CUDA program, graphed work included: every kernel,
// memcpy and memset the GPU ran, with its start and end on the GPU clock,
// its stream and, for work launched from a CUDA graph, its graph node. It
// answers what a step's time goes to when the step is one graph: the
// kernels' own durations, and the idle time between them.
//
// The CUDA driver loads it into the program (CUPTI's injection entry point):
//   REPLAY_KERNEL_TRACE=trace.csv CUDA_INJECTION64_PATH=.../libreplay_kernel_trace.so program args...
// and the CSV is written when the program exits: one line per activity,
//   start_ns,end_ns,stream,graph_node,name
// (graph_node 0: not launched from a graph; names demangled, their commas
// written as ';'). bench/kernel_trace/summarize_trace.py splits it into
// steps. CUPTI's concurrent-kernel records do not serialize kernels; a
// traced program may still run slower, so compare a traced step's span with
// its untraced time before reading the gaps.
#include <cupti.h>
#include <cxxabi.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

struct Activity {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint32_t stream = 0;
  std::uint64_t graph_node = 0;
  std::string name;
};

constexpr std::size_t kBufferBytes = std::size_t{8} << 20;

std::mutex activities_mutex;
std::vector<Activity> activities;
std::unordered_map<std::string, std::string> demangled_names;  // guarded by activities_mutex
std::atomic<bool> failed{false};  // a CUPTI call failed or records were dropped: no file is written

// Reports a failed CUPTI call on stderr, naming it; the trace is then incomplete and not written.
bool checked(CUptiResult result, const char* api) {
  if (result == CUPTI_SUCCESS) return true;
  const char* text = nullptr;
  if (cuptiGetResultString(result, &text) != CUPTI_SUCCESS || text == nullptr) text = "unknown error";
  std::fprintf(stderr, "replay kernel trace: %s failed: %s (%d)\n", api, text, static_cast<int>(result));
  failed = true;
  return false;
}

// The kernel's name, demangled, without its parameter list; commas become ';' (the file is CSV).
const std::string& display_name(const char* mangled) {
  const std::string key = mangled != nullptr ? mangled : "(unnamed)";
  if (const auto found = demangled_names.find(key); found != demangled_names.end()) return found->second;
  int status = 0;
  const std::unique_ptr<char, decltype(&std::free)> demangled(
      abi::__cxa_demangle(key.c_str(), nullptr, nullptr, &status), &std::free);
  std::string name = status == 0 && demangled ? demangled.get() : key;
  for (std::string::size_type at = name.find("(anonymous namespace)::"); at != std::string::npos;
       at = name.find("(anonymous namespace)::")) {
    name.erase(at, sizeof("(anonymous namespace)::") - 1);
  }
  // The parameter list is the last parenthesized group; a '(' inside the template arguments (a lambda's or a
  // cast's) stays.
  if (!name.empty() && name.back() == ')') {
    int depth = 0;
    for (std::string::size_type at = name.size(); at-- > 0;) {
      depth += name[at] == ')' ? 1 : name[at] == '(' ? -1 : 0;
      if (depth == 0) {
        name.resize(at);
        break;
      }
    }
  }
  for (char& c : name) {
    if (c == ',') c = ';';
  }
  return demangled_names.emplace(key, std::move(name)).first->second;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  const std::lock_guard lock(activities_mutex);
  CUpti_Activity* record = nullptr;
  for (;;) {
    const CUptiResult next = cuptiActivityGetNextRecord(buffer, valid, &record);
    if (next == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
    if (!checked(next, "cuptiActivityGetNextRecord")) break;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        activities.push_back({kernel->start, kernel->end, kernel->streamId, kernel->graphNodeId,
                              display_name(kernel->name)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        activities.push_back({copy->start, copy->end, copy->streamId, copy->graphNodeId, "[memcpy]"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        activities.push_back({set->start, set->end, set->streamId, set->graphNodeId, "[memset]"});
        break;
      }
      default:
        break;
    }
  }
  std::size_t dropped = 0;
  if (checked(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped), "cuptiActivityGetNumDroppedRecords") &&
      dropped > 0) {
    std::fprintf(stderr, "replay kernel trace: CUPTI dropped %zu records\n", dropped);
    failed = true;
  }
  std::free(buffer);
}

void write_trace() {
  checked(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  const std::lock_guard lock(activities_mutex);
  const char* path = std::getenv("REPLAY_KERNEL_TRACE");
  if (path == nullptr || *path == '\0') path = "kernel_trace.csv";
  if (failed) {
    std::fprintf(stderr, "replay kernel trace: not written to %s: the trace is incomplete (above)\n", path);
    return;
  }
  std::FILE* file = std::fopen(path, "w");
  if (file == nullptr) {
    std::fprintf(stderr, "replay kernel trace: cannot open %s for writing\n", path);
    return;
  }
  for (const Activity& a : activities) {
    std::fprintf(file, "%llu,%llu,%u,%llu,%s\n", static_cast<unsigned long long>(a.start),
                 static_cast<unsigned long long>(a.end), a.stream, static_cast<unsigned long long>(a.graph_node),
                 a.name.c_str());
  }
  if (std::fclose(file) != 0) {
    std::fprintf(stderr, "replay kernel trace: writing %s failed\n", path);
    return;
  }
  std::fprintf(stderr, "replay kernel trace: %zu activities written to %s\n", activities.size(), path);
}

}  // namespace

// CUPTI's injection entry point: the driver calls it once, when the program initializes CUDA.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  bool ok = checked(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
                    "cuptiActivityRegisterCallbacks");
  for (const auto& [kind, call] :
       {std::pair{CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)"},
        std::pair{CUPTI_ACTIVITY_KIND_MEMCPY, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY)"},
        std::pair{CUPTI_ACTIVITY_KIND_MEMSET, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET)"}}) {
    ok = ok && checked(cuptiActivityEnable(kind), call);
  }
  if (ok) std::atexit(write_trace);
  return ok ? 1 : 0;
}
