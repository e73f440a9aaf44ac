#pragma once
#include <replay/detail/require_cxx20.hpp>
// Collectives on typed device buffers: all_reduce, all_gather,
// reduce_scatter, broadcast. The NCCL data type comes from the element type
// (nccl_data_type<T>); sizes are checked against the communicator before any
// call; NCCL's own argument checks (root, rank) come back as nccl_error
// naming the call. Every one is capturable into a CUDA graph once it has run
// eagerly with the same sizes (NCCL sets up its connections on first use,
// which must not happen inside a capture): warm up, then capture.
//
// One thread driving several GPUs issues each collective for all of its
// ranks inside one NcclGroup (ncclGroupStart/End), or NCCL deadlocks waiting
// for the ranks it has not been given yet.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>

#include "replay/error.hpp"
#include "replay/nccl/communicator.hpp"
#include "replay/nccl/error.hpp"
#include "replay/nccl/stream_device.hpp"
#include "replay/static_buffer.hpp"
#include "replay/stream_ref.hpp"

namespace replay {

enum class ReduceOp : int {
  sum = ::ncclSum,
  prod = ::ncclProd,
  max = ::ncclMax,
  min = ::ncclMin,
  avg = ::ncclAvg,
};

// The NCCL data type of element type T; no value for types NCCL cannot reduce.
template <class T>
struct nccl_data_type {};
template <> struct nccl_data_type<::std::int8_t> { static constexpr ::ncclDataType_t value = ::ncclInt8; };
template <> struct nccl_data_type<::std::uint8_t> { static constexpr ::ncclDataType_t value = ::ncclUint8; };
template <> struct nccl_data_type<::std::int32_t> { static constexpr ::ncclDataType_t value = ::ncclInt32; };
template <> struct nccl_data_type<::std::uint32_t> { static constexpr ::ncclDataType_t value = ::ncclUint32; };
template <> struct nccl_data_type<::std::int64_t> { static constexpr ::ncclDataType_t value = ::ncclInt64; };
template <> struct nccl_data_type<::std::uint64_t> { static constexpr ::ncclDataType_t value = ::ncclUint64; };
template <> struct nccl_data_type<::__half> { static constexpr ::ncclDataType_t value = ::ncclFloat16; };
template <> struct nccl_data_type<float> { static constexpr ::ncclDataType_t value = ::ncclFloat32; };
template <> struct nccl_data_type<double> { static constexpr ::ncclDataType_t value = ::ncclFloat64; };
template <> struct nccl_data_type<::__nv_bfloat16> { static constexpr ::ncclDataType_t value = ::ncclBfloat16; };
// long long and long are distinct types from int64_t on some platforms: map them by size.
template <class T>
  requires(::std::is_integral_v<T> && !::std::is_same_v<T, bool> && sizeof(T) == 8 &&
           !::std::is_same_v<T, ::std::int64_t> && !::std::is_same_v<T, ::std::uint64_t>)
struct nccl_data_type<T> {
  static constexpr ::ncclDataType_t value = ::std::is_signed_v<T> ? ::ncclInt64 : ::ncclUint64;
};

// An element type the collectives accept.
template <class T>
concept NcclElement = BufferElement<T> && requires {
  { nccl_data_type<T>::value } -> ::std::convertible_to<::ncclDataType_t>;
};

template <NcclElement T>
inline constexpr ::ncclDataType_t nccl_data_type_v = nccl_data_type<T>::value;

namespace detail {

// Checked when the collective runs eagerly (its warm-up, before any capture);
// during a capture only cudaStreamIsCapturing is called, which every driver
// accepts there.
inline void check_collective_stream(const Communicator& comm, StreamRef stream, const char* what,
                                    const ::std::source_location& where) {
  ::cudaStreamCaptureStatus status = ::cudaStreamCaptureStatusNone;
  check(::cudaStreamIsCapturing(stream.get(), &status), "cudaStreamIsCapturing", where);
  if (status != ::cudaStreamCaptureStatusNone) {
    return;
  }
  const int device = stream_device(stream, where);
  if (device != comm.device()) [[unlikely]] {
    throw usage_error(::std::string(what) + ": the stream is on device " + ::std::to_string(device) +
                          " but the communicator's rank " + ::std::to_string(comm.rank()) + " is on device " +
                          ::std::to_string(comm.device()) + "; issue each rank's collectives on a stream of its device",
                      where);
  }
}

[[noreturn, gnu::cold]] inline void throw_collective_size(const char* what, const ::std::string& rule,
                                                          const ::std::source_location& where) {
  throw usage_error(::std::string(what) + ": " + rule, where);
}

}  // namespace detail

// recv[i] = op over ranks of send[i]; send and recv hold the same count and
// may be the same buffer (in place).
template <NcclElement T>
void all_reduce(const Communicator& comm, BufferView<T> send, BufferView<T> recv, ReduceOp op, StreamRef stream,
                ::std::source_location where = ::std::source_location::current()) {
  if (send.size() != recv.size()) {
    detail::throw_collective_size("all_reduce", "send holds " + ::std::to_string(send.size()) + " elements, recv " +
                                                    ::std::to_string(recv.size()) + "; they must match",
                                  where);
  }
  detail::check_collective_stream(comm, stream, "all_reduce", where);
  comm.check(::ncclAllReduce(send.data(), recv.data(), send.size(), nccl_data_type_v<T>,
                             static_cast<::ncclRedOp_t>(op), comm.handle(where), stream.get()),
             "ncclAllReduce", where);
}
// In place.
template <NcclElement T>
void all_reduce(const Communicator& comm, BufferView<T> data, ReduceOp op, StreamRef stream,
                ::std::source_location where = ::std::source_location::current()) {
  all_reduce(comm, data, data, op, stream, where);
}

// recv = the send buffers of ranks 0, 1, ... one after the other:
// recv.size() == send.size() * comm.size().
template <NcclElement T>
void all_gather(const Communicator& comm, BufferView<T> send, BufferView<T> recv, StreamRef stream,
                ::std::source_location where = ::std::source_location::current()) {
  const auto ranks = static_cast<::std::size_t>(comm.size());
  if (recv.size() != send.size() * ranks) {
    detail::throw_collective_size("all_gather", "recv must hold send.size() * ranks = " +
                                                    ::std::to_string(send.size()) + " * " + ::std::to_string(ranks) +
                                                    " elements, it holds " + ::std::to_string(recv.size()),
                                  where);
  }
  detail::check_collective_stream(comm, stream, "all_gather", where);
  comm.check(::ncclAllGather(send.data(), recv.data(), send.size(), nccl_data_type_v<T>, comm.handle(where),
                             stream.get()),
             "ncclAllGather", where);
}

// recv = this rank's block of op over ranks of send:
// send.size() == recv.size() * comm.size(); rank r gets block r.
template <NcclElement T>
void reduce_scatter(const Communicator& comm, BufferView<T> send, BufferView<T> recv, ReduceOp op,
                    StreamRef stream, ::std::source_location where = ::std::source_location::current()) {
  const auto ranks = static_cast<::std::size_t>(comm.size());
  if (send.size() != recv.size() * ranks) {
    detail::throw_collective_size("reduce_scatter", "send must hold recv.size() * ranks = " +
                                                        ::std::to_string(recv.size()) + " * " +
                                                        ::std::to_string(ranks) + " elements, it holds " +
                                                        ::std::to_string(send.size()),
                                  where);
  }
  detail::check_collective_stream(comm, stream, "reduce_scatter", where);
  comm.check(::ncclReduceScatter(send.data(), recv.data(), recv.size(), nccl_data_type_v<T>,
                                 static_cast<::ncclRedOp_t>(op), comm.handle(where), stream.get()),
             "ncclReduceScatter", where);
}

// recv = root's send on every rank (send is read on the root only). NCCL
// checks the root: one outside [0, ranks) throws nccl_error naming ncclBroadcast.
template <NcclElement T>
void broadcast(const Communicator& comm, BufferView<T> send, BufferView<T> recv, int root, StreamRef stream,
               ::std::source_location where = ::std::source_location::current()) {
  if (send.size() != recv.size()) {
    detail::throw_collective_size("broadcast", "send holds " + ::std::to_string(send.size()) + " elements, recv " +
                                                   ::std::to_string(recv.size()) + "; they must match",
                                  where);
  }
  detail::check_collective_stream(comm, stream, "broadcast", where);
  comm.check(::ncclBroadcast(send.data(), recv.data(), send.size(), nccl_data_type_v<T>, root, comm.handle(where),
                             stream.get()),
             "ncclBroadcast", where);
}
// In place.
template <NcclElement T>
void broadcast(const Communicator& comm, BufferView<T> data, int root, StreamRef stream,
               ::std::source_location where = ::std::source_location::current()) {
  broadcast(comm, data, data, root, stream, where);
}

// ncclGroupStart/End for a scope: the collectives issued inside are launched
// together when it ends, which one thread driving several GPUs needs (one
// call per rank inside the group). end() reports the group's errors; a scope
// left without end() (an exception) still ends the group, ignoring its result.
class NcclGroup {
 public:
  explicit NcclGroup(::std::source_location where = ::std::source_location::current()) {
    check_nccl(::ncclGroupStart(), "ncclGroupStart", nullptr, where);
    open_ = true;
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  NcclGroup(NcclGroup&&) = delete;
  NcclGroup& operator=(NcclGroup&&) = delete;
  ~NcclGroup() {
    if (open_) {
      (void)::ncclGroupEnd();
    }
  }

  void end(::std::source_location where = ::std::source_location::current()) {
    if (!open_) {
      throw usage_error("NcclGroup::end() called twice", where);
    }
    open_ = false;
    check_nccl(::ncclGroupEnd(), "ncclGroupEnd", nullptr, where);
  }

 private:
  bool open_ = false;
};

}  // namespace replay
