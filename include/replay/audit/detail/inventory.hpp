#pragma once
// What a captured graph holds, for the audit's inventory: its kernel nodes
// by (demangled) name, child graphs included, and its copy and memset
// nodes. Names come from the runtime (cudaFuncGetName) or, failing that,
// the driver (cuFuncGetName / cuKernelGetName); a node neither can name
// counts as "". No error is left in the runtime's last-error slot.
#include <replay/detail/require_cxx20.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

#include "replay/audit/detail/classify.hpp"
#include "replay/audit/detail/recorder.hpp"
#include "replay/audit/detail/symbolize.hpp"
#include "replay/detail/kernel_node_symbol.hpp"
#include "replay/error.hpp"

namespace replay::detail::audit {

// The (demangled) name of the kernel a kernel node launches, or "".
inline ::std::string kernel_node_name(::cudaGraphNode_t node) {
  const char* symbol = kernel_node_symbol(node);
  return symbol == nullptr ? ::std::string() : demangle(symbol);
}

// The (demangled) name of a launched kernel that CUPTI did not name, or "".
inline ::std::string kernel_name(const KernelHandle& handle) {
  const OwnCalls own;
  const char* name = nullptr;
  switch (handle.kind) {
    case KernelHandle::Kind::host_function:
#if CUDART_VERSION >= 12030
      if (succeeded(::cudaFuncGetName(&name, handle.value)) && name != nullptr) {
        return demangle(name);
      }
#endif
      return {};
    case KernelHandle::Kind::library_kernel: {
      static const auto get = reinterpret_cast<KernelGetNameFn>(find_driver_function("cuKernelGetName", 12030));
      if (get != nullptr && get(&name, static_cast<CUkernel>(const_cast<void*>(handle.value))) == CUDA_SUCCESS &&
          name != nullptr) {
        return demangle(name);
      }
      return {};
    }
    case KernelHandle::Kind::function: {
      static const auto get = reinterpret_cast<FuncGetNameFn>(find_driver_function("cuFuncGetName", 12030));
      if (get != nullptr && get(&name, static_cast<CUfunction>(const_cast<void*>(handle.value))) == CUDA_SUCCESS &&
          name != nullptr) {
        return demangle(name);
      }
      return {};
    }
    case KernelHandle::Kind::none:
      break;
  }
  return {};
}

inline void read_graph(::cudaGraph_t graph, GraphContents& out, int depth = 0) {
  ::std::size_t count = 0;
  if (graph == nullptr || depth > 16 || !succeeded(::cudaGraphGetNodes(graph, nullptr, &count)) || count == 0) {
    return;
  }
  ::std::vector<::cudaGraphNode_t> nodes(count);
  if (!succeeded(::cudaGraphGetNodes(graph, nodes.data(), &count))) {
    return;
  }
  nodes.resize(count);
  for (::cudaGraphNode_t node : nodes) {
    ::cudaGraphNodeType type = ::cudaGraphNodeTypeEmpty;
    if (!succeeded(::cudaGraphNodeGetType(node, &type))) {
      ++out.other;
      continue;
    }
    switch (type) {
      case ::cudaGraphNodeTypeKernel:
        ++out.kernels[kernel_node_name(node)];
        break;
      case ::cudaGraphNodeTypeMemcpy:
        ++out.copies;
        break;
      case ::cudaGraphNodeTypeMemset:
        ++out.memsets;
        break;
      case ::cudaGraphNodeTypeGraph: {
        ::cudaGraph_t child = nullptr;
        if (succeeded(::cudaGraphChildGraphNodeGetGraph(node, &child))) {
          read_graph(child, out, depth + 1);
        }
        break;
      }
      default:
        ++out.other;
        break;
    }
  }
}

inline GraphContents graph_contents(::cudaGraph_t graph) {
  const OwnCalls own;  // the audit's own calls are not recorded
  GraphContents out;
  read_graph(graph, out);
  return out;
}

}  // namespace replay::detail::audit
