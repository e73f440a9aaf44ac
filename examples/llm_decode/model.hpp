#pragma once
// A Llama-style decoder written with ATen operators, with the math of Hugging
// Face's LlamaForCausalLM: the same operator order and dtypes (rmsnorm and
// softmax in float32, everything else in the model dtype), so that a model
// saved here loads into Hugging Face and gives the same tokens. Some things
// differ in form, to issue fewer kernels per step: q/k/v and gate/up are each
// one matrix (rows concatenated at load: two matrix products per layer
// fewer); RMSNorm is at::rms_norm (one fused kernel on CUDA); q and k are
// rotated together; and the decode step's attention is fused scaled
// dot-product attention, a key/value head's query group being the query rows
// of one attention instead of repeating the keys. Logits agree with Hugging
// Face's within float16 rounding (scripts/llm_decode_compare.py measures it).
//
// decode() is the step a CUDA graph captures: it reads only tensor sizes on
// the host, never values, and indexes everything it needs (rotary tables,
// the position mask) on the device.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/cuda/CUDAStream.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config.hpp"
#include "fused_kernels.hpp"
#include "kv_cache.hpp"

namespace llm_decode {

// The kernels a decode step issues.
enum class DecodeKernels : std::uint8_t {
  // ATen operators, one by one (about 20 per layer): the reference, and the
  // same operators as llama.py's step.
  aten,
  // fused_kernels.hpp: rotary, cache write and decode attention reading the
  // cache by slot in one kernel, residual add with RMSNorm, and the
  // products as GEMVs (1 to 8 rows) or narrow tensor-core products (2 to
  // 8) or tensor-core skinny GEMMs (16 to 64),
  // the down one computing SiLU x up as it loads (7 kernels per layer; 5 at
  // one row with fused::set_fold_norms(true), each norm computed by the
  // product after it; other row counts: torch's GEMMs and a SiLU x up
  // kernel, 8; a packed prefill's
  // rotary and cache write are a kernel of their own). The fused kernels are
  // programmatic launches (in a captured step, after torch's kernels too
  // only with fused::ProgrammaticLaunches::always). fp16 only; on the CPU the
  // kernels' host versions run (for tests). Agrees with `aten` to fp16 rounding, not bit for bit (it
  // rounds once where the operators round at each step).
  fused,
};

// The workspace of the fused attention over `context` positions
// (fused::AttentionWorkspace) as tensors on `options`' device: float
// partials and counters at zero, or none when one block per (row,
// key/value head) attends.
struct AttentionWorkspaceTensors {
  at::Tensor partials;
  at::Tensor counters;
  fused::AttentionWorkspace view() const {
    return {.partials = partials.defined() ? partials.data_ptr<float>() : nullptr,
            .counters = counters.defined() ? reinterpret_cast<unsigned int*>(counters.data_ptr<int>()) : nullptr};
  }
};

inline AttentionWorkspaceTensors attention_workspace(const at::TensorOptions& options, int rows, int heads,
                                                     int kv_heads, int head_dim, int context) {
  const std::size_t floats = fused::attention_partial_floats(rows, heads, kv_heads, head_dim, context);
  if (floats == 0) return {};
  return {at::empty({static_cast<std::int64_t>(floats)}, options.dtype(at::kFloat)),
          at::zeros({static_cast<std::int64_t>(rows) * kv_heads}, options.dtype(at::kInt))};
}

// The name of a weight in Hugging Face's LlamaForCausalLM state dict and its shape.
struct WeightShape {
  std::string name;
  std::vector<std::int64_t> shape;
};

namespace detail {

inline std::string layer_weight(std::int64_t layer, std::string_view rest) {
  return "model.layers." + std::to_string(layer) + "." + std::string(rest);
}

[[noreturn]] inline void invalid(const std::string& message) { throw std::invalid_argument("llm_decode: " + message); }

inline std::string sizes_text(at::IntArrayRef sizes) {
  std::string text = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(sizes[i]);
  }
  return text + "]";
}

// config.json's torch_dtype for the dtypes a model may hold.
inline std::string_view dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kFloat:
      return "float32";
    default:
      invalid(std::string("the model dtype must be float16, bfloat16 or float32, not ") + c10::toString(dtype));
  }
}

// RMSNorm as Hugging Face's LlamaRMSNorm computes it (the statistics in
// float32 whatever the model dtype), through at::rms_norm: on CUDA one fused
// kernel instead of seven (it applies the weight before rounding to the model
// dtype, where LlamaRMSNorm rounds first: at most one unit in the last place
// apart). llama.py uses the same operator.
inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

// Host integers as an int64 tensor on `device` (eager paths only: a copy
// from the host).
inline at::Tensor to_device(const std::vector<std::int64_t>& values, const at::Device& device) {
  return at::tensor(values, at::TensorOptions().dtype(at::kLong)).to(device);
}

// Hugging Face's rotate_half and apply_rotary_pos_emb (the half-split form,
// not the interleaved one of the original Llama code).
inline at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({at::neg(x.narrow(-1, half, half)), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

// torch::pickle_save's archive (what Python's torch.save writes), but with
// the dict left untagged: pickle_save tags every dict with its TorchScript
// type (torch.jit._pickle.restore_type_tag), which Python's torch.load
// refuses by default (weights_only=True) — an untagged dict of tensors it
// loads as it is. torch::pickle_load reads either.
inline std::vector<char> pickle_untagged(const c10::IValue& value) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t size) { pickled.insert(pickled.end(), bytes, bytes + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t size) {
    const char* begin = static_cast<const char*>(bytes);
    archive.insert(archive.end(), begin, begin + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

inline std::vector<char> read_binary_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("llm_decode: cannot open " + path.string());
  }
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace detail

// Every weight of a model of this shape, in Hugging Face's names and in the
// order random() draws them (embedding; per layer q, k, v, o, gate, up, down
// and the two norms; the final norm; lm_head when untied).
inline std::vector<WeightShape> weight_shapes(const LlamaConfig& config) {
  config.validate();
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t head_dim = config.head_dim();
  std::vector<WeightShape> shapes;
  shapes.push_back({"model.embed_tokens.weight", {config.vocab_size, hidden}});
  for (std::int64_t layer = 0; layer < config.num_layers; ++layer) {
    shapes.push_back({detail::layer_weight(layer, "self_attn.q_proj.weight"), {config.num_heads * head_dim, hidden}});
    shapes.push_back({detail::layer_weight(layer, "self_attn.k_proj.weight"), {config.num_kv_heads * head_dim, hidden}});
    shapes.push_back({detail::layer_weight(layer, "self_attn.v_proj.weight"), {config.num_kv_heads * head_dim, hidden}});
    shapes.push_back({detail::layer_weight(layer, "self_attn.o_proj.weight"), {hidden, config.num_heads * head_dim}});
    shapes.push_back({detail::layer_weight(layer, "mlp.gate_proj.weight"), {config.intermediate_size, hidden}});
    shapes.push_back({detail::layer_weight(layer, "mlp.up_proj.weight"), {config.intermediate_size, hidden}});
    shapes.push_back({detail::layer_weight(layer, "mlp.down_proj.weight"), {hidden, config.intermediate_size}});
    shapes.push_back({detail::layer_weight(layer, "input_layernorm.weight"), {hidden}});
    shapes.push_back({detail::layer_weight(layer, "post_attention_layernorm.weight"), {hidden}});
  }
  shapes.push_back({"model.norm.weight", {hidden}});
  if (!config.tie_embeddings) {
    shapes.push_back({"lm_head.weight", {config.vocab_size, hidden}});
  }
  return shapes;
}

// A matrix product's sizes: `rows` rows of `in` inputs into `out` outputs.
struct ProductShape {
  int rows;
  int in;
  int out;
};

// The matrix products of one decode step of `rows` rows: q/k/v (one
// matrix), o, gate/up (one matrix), down, and the logits' over
// `logits_rows` rows (a packed prefill computes only its prompts' last rows).
inline std::array<ProductShape, 5> step_products(const LlamaConfig& config, int rows, int logits_rows) {
  const auto hidden = static_cast<int>(config.hidden_size);
  const auto head_dim = static_cast<int>(config.head_dim());
  const auto heads = static_cast<int>(config.num_heads);
  const auto kv_heads = static_cast<int>(config.num_kv_heads);
  const auto intermediate = static_cast<int>(config.intermediate_size);
  return {ProductShape{rows, hidden, (heads + 2 * kv_heads) * head_dim}, ProductShape{rows, heads * head_dim, hidden},
          ProductShape{rows, hidden, 2 * intermediate}, ProductShape{rows, intermediate, hidden},
          ProductShape{logits_rows, hidden, static_cast<int>(config.vocab_size)}};
}

class LlamaModel {
 public:
  using StateDict = c10::Dict<std::string, at::Tensor>;

  // Random weights that every machine draws alike: normal(0, 0.02) matrices
  // drawn in float32 on the CPU from a generator seeded with `seed`, in the
  // order of weight_shapes(), then cast and moved; norms are 1. (The same
  // draws in Python: g = torch.Generator().manual_seed(seed), then
  // torch.empty(shape).normal_(0, 0.02, generator=g) per matrix in that order.)
  static LlamaModel random(const LlamaConfig& config, std::uint64_t seed, at::Device device,
                           at::ScalarType dtype = at::kHalf) {
    (void)detail::dtype_name(dtype);
    at::Generator generator = at::detail::createCPUGenerator(seed);
    StateDict weights;
    for (const WeightShape& weight : weight_shapes(config)) {
      // Cast on the CPU at once, so that a 1B model never holds all of its float32 draws.
      const at::Tensor value = weight.shape.size() == 1
                                   ? at::ones(weight.shape, at::kFloat)
                                   : at::empty(weight.shape, at::kFloat).normal_(0.0, 0.02, generator);
      weights.insert(weight.name, value.to(dtype));
    }
    return from_state_dict(config, weights, device, dtype);
  }

  // Builds the model from Hugging Face named weights (any device and floating
  // dtype; cast and moved here). Every name of weight_shapes() must be there
  // with its shape; any other name is refused, except lm_head.weight of a tied
  // model (a Python state_dict() lists it), which is ignored.
  static LlamaModel from_state_dict(const LlamaConfig& config, const StateDict& weights, at::Device device,
                                    at::ScalarType dtype = at::kHalf) {
    return LlamaModel(config, weights, device, dtype);
  }

  // Reads config.json and weights.pt (save(), or Python's torch.save of a
  // plain dict of tensors with Hugging Face's names) from `dir`.
  static LlamaModel load(const std::filesystem::path& dir, at::Device device, at::ScalarType dtype = at::kHalf) {
    const LlamaConfig config = read_config(dir / "config.json");
    const std::filesystem::path weights_path = dir / "weights.pt";
    c10::IValue loaded;
    try {
      loaded = torch::pickle_load(detail::read_binary_file(weights_path));
    } catch (const c10::Error& e) {
      // Python's state_dict() is an OrderedDict with metadata, which the C++ unpickler cannot rebuild.
      detail::invalid(weights_path.string() + " cannot be read by torch::pickle_load (" + e.what_without_backtrace() +
                      "); save a plain dict of tensors: torch.save(dict(model.state_dict()), path)");
    }
    if (!loaded.isGenericDict()) {
      detail::invalid(weights_path.string() + " must hold a dict of tensors, not a " + loaded.tagKind());
    }
    StateDict weights;
    for (const auto& entry : loaded.toGenericDict()) {
      if (!entry.key().isString() || !entry.value().isTensor()) {
        detail::invalid(weights_path.string() + " must map names to tensors; it holds a " + entry.key().tagKind() +
                        " -> " + entry.value().tagKind() + " entry");
      }
      weights.insert(entry.key().toStringRef(), entry.value().toTensor());
    }
    return from_state_dict(config, weights, device, dtype);
  }

  // Writes config.json and weights.pt into `dir` (created if needed): the
  // weights unfused, on the CPU, in the model dtype, under Hugging Face's
  // names, so that Python's torch.load (weights_only, its default) gives a
  // state dict LlamaForCausalLM accepts.
  void save(const std::filesystem::path& dir) const {
    std::filesystem::create_directories(dir);
    write_config(config_, dir / "config.json", detail::dtype_name(dtype_));
    const std::vector<char> bytes = detail::pickle_untagged(c10::IValue(state_dict()));
    const std::filesystem::path weights_path = dir / "weights.pt";
    std::ofstream out(weights_path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) {
      throw std::runtime_error("llm_decode: cannot write " + weights_path.string());
    }
  }

  // The weights as Hugging Face names them, unfused: CPU copies in the model
  // dtype, each owning its storage (not views into the fused matrices).
  StateDict state_dict() const {
    const std::int64_t head_dim = config_.head_dim();
    const std::int64_t q_rows = config_.num_heads * head_dim;
    const std::int64_t kv_rows = config_.num_kv_heads * head_dim;
    const std::int64_t intermediate = config_.intermediate_size;
    const auto cpu_copy = [](const at::Tensor& t) {
      return t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
    };
    StateDict weights;
    weights.insert("model.embed_tokens.weight", cpu_copy(embed_));
    for (std::int64_t i = 0; i < config_.num_layers; ++i) {
      const Layer& layer = layers_[static_cast<std::size_t>(i)];
      weights.insert(detail::layer_weight(i, "self_attn.q_proj.weight"), cpu_copy(layer.qkv.narrow(0, 0, q_rows)));
      weights.insert(detail::layer_weight(i, "self_attn.k_proj.weight"), cpu_copy(layer.qkv.narrow(0, q_rows, kv_rows)));
      weights.insert(detail::layer_weight(i, "self_attn.v_proj.weight"),
                     cpu_copy(layer.qkv.narrow(0, q_rows + kv_rows, kv_rows)));
      weights.insert(detail::layer_weight(i, "self_attn.o_proj.weight"), cpu_copy(layer.o));
      weights.insert(detail::layer_weight(i, "mlp.gate_proj.weight"), cpu_copy(layer.gate_up.narrow(0, 0, intermediate)));
      weights.insert(detail::layer_weight(i, "mlp.up_proj.weight"),
                     cpu_copy(layer.gate_up.narrow(0, intermediate, intermediate)));
      weights.insert(detail::layer_weight(i, "mlp.down_proj.weight"), cpu_copy(layer.down));
      weights.insert(detail::layer_weight(i, "input_layernorm.weight"), cpu_copy(layer.input_norm));
      weights.insert(detail::layer_weight(i, "post_attention_layernorm.weight"), cpu_copy(layer.post_norm));
    }
    weights.insert("model.norm.weight", cpu_copy(norm_));
    if (!config_.tie_embeddings) {
      weights.insert("lm_head.weight", cpu_copy(lm_head_));
    }
    return weights;
  }

  const LlamaConfig& config() const { return config_; }
  at::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }

  // Where each packed prompt token belongs: its slot (written when there is a
  // cache), its position in its own prompt, and which prompt (segment) it is
  // part of; tokens attend only to earlier tokens of their own segment.
  struct Packing {
    at::Tensor slots;      // int64 [N] (undefined without a cache)
    at::Tensor positions;  // int64 [N]
    at::Tensor segments;   // int64 [N]
  };

  // Prefill of one prompt: writes its keys/values into `slot` at positions
  // 0..T-1 and returns the logits of its last position, [vocab] float32.
  // `tokens`: int64 [T] on the model's device, 1 <= T <= max_len. Eager:
  // the prompt length changes every call, so this is not the captured step.
  at::Tensor prefill(KvCache& cache, std::int64_t slot, const at::Tensor& tokens) const {
    check_cache(cache);
    check_prompt(tokens);
    if (slot < 0 || slot >= cache.slots()) {
      detail::invalid("prefill slot " + std::to_string(slot) + " is out of range: the cache has slots 0.." +
                      std::to_string(cache.slots() - 1) + " (slot " + std::to_string(cache.spare_slot()) +
                      " is the spare one, for padding rows)");
    }
    return prefill_many(cache, {slot}, {tokens})[0];
  }

  // Several prompts in one forward (eager, like prefill()): their tokens
  // packed one after the other, each attending only to its own earlier
  // tokens, each written into its slot. One pass over the weights and one
  // set of kernels for all of them, where prompt-by-prompt prefill pays the
  // kernel launches per prompt. Returns each prompt's last-position logits,
  // [prompts, vocab] float32. Slots distinct and below slots(); the packed
  // length is the caller's to bound (attention is [tokens x tokens]).
  at::Tensor prefill_many(KvCache& cache, const std::vector<std::int64_t>& slots,
                          const std::vector<at::Tensor>& prompts) const {
    check_cache(cache);
    if (slots.size() != prompts.size() || prompts.empty()) {
      detail::invalid("prefill_many: " + std::to_string(slots.size()) + " slots for " + std::to_string(prompts.size()) +
                      " prompts (one slot per prompt, at least one prompt)");
    }
    std::vector<std::int64_t> packed_slots;
    std::vector<std::int64_t> packed_positions;
    std::vector<std::int64_t> packed_segments;
    std::vector<std::int64_t> last_rows;
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      check_prompt(prompts[p]);
      const std::int64_t slot = slots[p];
      if (slot < 0 || slot >= cache.slots()) {
        detail::invalid("prefill slot " + std::to_string(slot) + " is out of range: the cache has slots 0.." +
                        std::to_string(cache.slots() - 1) + " (slot " + std::to_string(cache.spare_slot()) +
                        " is the spare one, for padding rows)");
      }
      if (std::count(slots.begin(), slots.end(), slot) > 1) {
        detail::invalid("prefill_many: slot " + std::to_string(slot) + " is given to more than one prompt");
      }
      for (std::int64_t t = 0; t < prompts[p].size(0); ++t) {
        packed_slots.push_back(slot);
        packed_positions.push_back(t);
        packed_segments.push_back(static_cast<std::int64_t>(p));
      }
      last_rows.push_back(static_cast<std::int64_t>(packed_positions.size()) - 1);
    }
    const at::Tensor tokens = prompts.size() == 1 ? prompts[0] : at::cat(prompts);
    const Packing packing{.slots = detail::to_device(packed_slots, device_),
                          .positions = detail::to_device(packed_positions, device_),
                          .segments = detail::to_device(packed_segments, device_)};
    return prefill_packed(cache, tokens, packing, detail::to_device(last_rows, device_)).to(at::kFloat);
  }

  // The packed prefill over device tensors only, capture-safe (no host
  // tensors, no synchronization): `tokens` and the packing's slots, positions
  // and segments int64 [N], `last_rows` int64 [P], the packed rows whose
  // logits to return. Returns [P, vocab] in the model dtype. Tokens of
  // different segments never attend to each other, so padding tokens (a
  // segment of their own, written into the spare slot) leave every prompt's
  // keys and values alone. Only sizes are checked (values would need a
  // synchronization): positions below max_len, slots below the cache's
  // spare_slot() + 1 and rows below N are the caller's. With
  // DecodeKernels::fused the prompts' tokens are the rows of one fused decode
  // step: every token's key and value is written into the cache first, then
  // each token attends to its own slot up to its own position, which is the
  // causal attention within its prompt (prompts are told apart by their
  // slots; the segments are not read). So there the positions need not start
  // at 0: a segment may continue keys and values already in its slot (a
  // chunk of a longer prompt) or be one decode row, which is how chunked
  // prefill carries prompts and decode steps in one forward. The operators'
  // path attends within the packed tokens only: whole prompts from 0.
  at::Tensor prefill_packed(KvCache& cache, const at::Tensor& tokens, const Packing& packing,
                            const at::Tensor& last_rows, DecodeKernels kernels = DecodeKernels::aten) const {
    check_cache(cache);
    check_prompt(tokens);
    const std::int64_t length = tokens.size(0);
    for (const auto& [tensor, name] : {std::pair{&packing.slots, "slots"}, std::pair{&packing.positions, "positions"},
                                       std::pair{&packing.segments, "segments"}}) {
      if (!tensor->defined() || tensor->dim() != 1 || tensor->scalar_type() != at::kLong ||
          tensor->device() != device_ || tensor->size(0) != length) {
        detail::invalid(std::string("prefill_packed: the packing's ") + name + " must be int64 [" +
                        std::to_string(length) + "] on " + device_.str() + " (one entry per packed token)");
      }
    }
    if (!last_rows.defined() || last_rows.dim() != 1 || last_rows.scalar_type() != at::kLong ||
        last_rows.device() != device_ || last_rows.size(0) < 1) {
      detail::invalid("prefill_packed: last_rows must be a non-empty 1-D int64 tensor on " + device_.str());
    }
    if (kernels == DecodeKernels::fused) {
      // The context only clamps each row's keys (0 .. its position).
      return decode_fused(cache, packing.slots, packing.positions, tokens, config_.max_len, &last_rows);
    }
    const at::Tensor hidden = packed_hidden(tokens, packing, &cache);
    const at::Tensor last = hidden.index_select(0, last_rows);
    return at::linear(detail::rms_norm(last, norm_, config_.rms_norm_eps), lm_head_);
  }

  // One decode step for B rows, capture-safe: no host synchronization, no
  // host tensors, every allocation through torch's allocator, all on torch's
  // current stream. Writes the keys/values of tokens[r] at (slots[r],
  // positions[r]) and attends to positions 0..positions[r] of that slot,
  // reading the cache only up to `context` (every positions[r] < context <=
  // max_len: the graph of a context bucket reads no more than it needs).
  // slots, positions, tokens: int64 [B] on the model's device. Returns the
  // logits [B, vocab] in the model dtype. Only sizes are checked here (values
  // would need a synchronization); check_decode_values() checks the values.
  // The rows' slots must differ, except the spare slot, which padding rows
  // share (with DecodeKernels::fused each row writes and reads its own slot
  // in one kernel; what padding rows read there is never used).
  at::Tensor decode(KvCache& cache, const at::Tensor& slots, const at::Tensor& positions, const at::Tensor& tokens,
                    std::int64_t context, DecodeKernels kernels = DecodeKernels::aten) const {
    check_cache(cache);
    check_rows(tokens, "tokens", -1);
    const std::int64_t rows = tokens.size(0);
    check_rows(slots, "slots", rows);
    check_rows(positions, "positions", rows);
    if (context < 1 || context > config_.max_len) {
      detail::invalid("decode context " + std::to_string(context) + " must be in 1.." + std::to_string(config_.max_len) +
                      " (max_position_embeddings)");
    }
    if (kernels == DecodeKernels::fused) return decode_fused(cache, slots, positions, tokens, context);
    const std::int64_t heads = config_.num_heads;
    const std::int64_t kv_heads = config_.num_kv_heads;
    const std::int64_t head_dim = config_.head_dim();
    const std::int64_t group = config_.group_size();

    at::Tensor x = embed_.index_select(0, tokens);                   // [B, hidden]
    const at::Tensor cos = cos_.index_select(0, positions).unsqueeze(1);  // [B, 1, head_dim]
    const at::Tensor sin = sin_.index_select(0, positions).unsqueeze(1);
    // Keys up to a row's own position take part; later ones (older tokens of
    // the slot's previous sequence, or nothing yet) do not: [B, 1, 1, context].
    const at::Tensor visible =
        at::le(positions_.narrow(0, 0, context).unsqueeze(0), positions.unsqueeze(1)).view({rows, 1, 1, context});
    c10::List<std::optional<at::Tensor>> write_at;
    write_at.push_back(slots);
    write_at.push_back(std::nullopt);  // every key/value head
    write_at.push_back(positions);

    for (std::int64_t i = 0; i < config_.num_layers; ++i) {
      const Layer& layer = layers_[static_cast<std::size_t>(i)];
      const at::Tensor qkv = at::linear(detail::rms_norm(x, layer.input_norm, config_.rms_norm_eps), layer.qkv);
      // q and k rotated together (one set of element-wise kernels).
      const at::Tensor qk = detail::apply_rotary(
          qkv.narrow(1, 0, (heads + kv_heads) * head_dim).view({rows, heads + kv_heads, head_dim}), cos, sin);
      const at::Tensor q = qk.narrow(1, 0, heads);
      const at::Tensor k = qk.narrow(1, heads, kv_heads);
      const at::Tensor v = qkv.narrow(1, (heads + kv_heads) * head_dim, kv_heads * head_dim).view({rows, kv_heads, head_dim});
      at::Tensor cache_k = cache.k.select(0, i);  // [slots + 1, kv_heads, max_len, head_dim]
      at::Tensor cache_v = cache.v.select(0, i);
      cache_k.index_put_(write_at, k);
      cache_v.index_put_(write_at, v);
      // Each row's slot, up to `context`: [B, kv_heads, context, head_dim].
      const at::Tensor keys = cache_k.narrow(2, 0, context).index_select(0, slots);
      const at::Tensor values = cache_v.narrow(2, 0, context).index_select(0, slots);
      // A key/value head's `group` query heads are the query rows of one
      // attention over that head's keys: fused scaled dot-product attention
      // (float32 accumulation and softmax inside the kernel).
      const at::Tensor attended =
          at::scaled_dot_product_attention(q.reshape({rows, kv_heads, group, head_dim}), keys, values, visible,
                                           /*dropout_p=*/0.0, /*is_causal=*/false, scale_)
              .reshape({rows, heads * head_dim});
      x = x + at::linear(attended, layer.o);
      x = x + mlp(detail::rms_norm(x, layer.post_norm, config_.rms_norm_eps), layer);
    }
    return at::linear(detail::rms_norm(x, norm_, config_.rms_norm_eps), lm_head_);
  }

  // The value checks decode() leaves out: slots in 0..spare_slot(), distinct
  // but for the spare slot, positions in 0..context-1, tokens in
  // 0..vocab_size-1. Reads the values, so it
  // synchronizes with the device; for tests and debugging, never inside a capture.
  void check_decode_values(const KvCache& cache, const at::Tensor& slots, const at::Tensor& positions,
                           const at::Tensor& tokens, std::int64_t context) const {
    check_cache(cache);
    check_rows(tokens, "tokens", -1);
    check_rows(slots, "slots", tokens.size(0));
    check_rows(positions, "positions", tokens.size(0));
    const auto on_host = [](const at::Tensor& values) { return values.to(at::kCPU).contiguous(); };
    const auto check_range = [](const at::Tensor& host, const char* name, std::int64_t end, const char* bound) {
      const std::int64_t* data = host.data_ptr<std::int64_t>();
      for (std::int64_t r = 0; r < host.numel(); ++r) {
        if (data[r] < 0 || data[r] >= end) {
          detail::invalid(std::string("decode ") + name + "[" + std::to_string(r) + "] = " + std::to_string(data[r]) +
                          " is out of range: it must be in 0.." + std::to_string(end - 1) + " (" + bound + ")");
        }
      }
    };
    const at::Tensor host_slots = on_host(slots);
    check_range(host_slots, "slots", cache.spare_slot() + 1, "the spare slot included");
    check_range(on_host(positions), "positions", context, "below the context");
    check_range(on_host(tokens), "tokens", config_.vocab_size, "vocab_size");
    // Two rows in one slot would write the same cache row and read each
    // other's keys (or not, by the kernels' order): only padding rows share a slot.
    const std::int64_t* slot = host_slots.data_ptr<std::int64_t>();
    std::vector<std::int64_t> first_row(static_cast<std::size_t>(cache.spare_slot()), -1);
    for (std::int64_t r = 0; r < host_slots.numel(); ++r) {
      if (slot[r] == cache.spare_slot()) continue;
      std::int64_t& first = first_row[static_cast<std::size_t>(slot[r])];
      if (first >= 0) {
        detail::invalid("decode slots[" + std::to_string(first) + "] and slots[" + std::to_string(r) + "] are both " +
                        std::to_string(slot[r]) + ": the rows of a step need slots of their own (only padding rows "
                        "share the spare slot, " + std::to_string(cache.spare_slot()) + ")");
      }
      first = r;
    }
  }

  // The logits of every position of `tokens` [T] under full causal attention,
  // without a cache: [T, vocab] float32. The reference that prefill and
  // decode are tested against (and what Hugging Face computes for a prompt).
  at::Tensor forward_full(const at::Tensor& tokens) const {
    check_prompt(tokens);
    const std::int64_t length = tokens.size(0);
    const Packing packing{.slots = {}, .positions = positions_.narrow(0, 0, length),
                          .segments = at::zeros({length}, positions_.options())};
    const at::Tensor hidden = packed_hidden(tokens, packing, nullptr);
    return at::linear(detail::rms_norm(hidden, norm_, config_.rms_norm_eps), lm_head_).to(at::kFloat);
  }

 private:
  struct Layer {
    at::Tensor input_norm;  // [hidden]
    at::Tensor qkv;         // [(heads + 2 kv_heads) head_dim, hidden]: q_proj, k_proj, v_proj rows
    at::Tensor o;           // [hidden, heads head_dim]
    at::Tensor post_norm;   // [hidden]
    at::Tensor gate_up;     // [2 intermediate, hidden]: gate_proj, up_proj rows
    at::Tensor down;        // [hidden, intermediate]
  };

  LlamaModel(const LlamaConfig& config, const StateDict& weights, at::Device device, at::ScalarType dtype)
      : config_(config), device_(device), dtype_(dtype) {
    (void)detail::dtype_name(dtype);
    const std::vector<WeightShape> shapes = weight_shapes(config);
    for (const auto& entry : weights) {
      const bool known = std::any_of(shapes.begin(), shapes.end(),
                                     [&](const WeightShape& s) { return s.name == entry.key(); });
      if (!known && !(config.tie_embeddings && entry.key() == "lm_head.weight")) {
        detail::invalid("unexpected weight \"" + entry.key() + "\" (not part of a model of this config)");
      }
    }
    const at::TensorOptions options = at::TensorOptions().device(device).dtype(dtype);
    const auto take = [&](const std::string& name) {
      const auto found = weights.find(name);
      if (found == weights.end()) {
        detail::invalid("weight \"" + name + "\" is missing");
      }
      const at::Tensor& value = found->value();
      const auto expected = std::find_if(shapes.begin(), shapes.end(), [&](const WeightShape& s) { return s.name == name; });
      if (value.sizes() != at::IntArrayRef(expected->shape)) {
        detail::invalid("weight \"" + name + "\" has shape " + detail::sizes_text(value.sizes()) + ", the config needs " +
                        detail::sizes_text(expected->shape));
      }
      if (!at::isFloatingType(value.scalar_type())) {
        detail::invalid("weight \"" + name + "\" must be floating point, not " + c10::toString(value.scalar_type()));
      }
      // 32-byte aligned, as a fresh allocation is: the fused kernels read
      // norm weights 8 halves at a time and the products' tensor-core loads
      // need 32 bytes (a view into a larger buffer, as a loaded file may
      // give, is copied).
      const at::Tensor stored = value.to(options).contiguous();
      return reinterpret_cast<std::uintptr_t>(stored.data_ptr()) % 32 == 0 ? stored : stored.clone();
    };
    embed_ = take("model.embed_tokens.weight");
    device_ = embed_.device();  // "cuda" becomes "cuda:<current>": inputs are compared against it
    for (std::int64_t i = 0; i < config.num_layers; ++i) {
      const auto name = [&](std::string_view rest) { return detail::layer_weight(i, rest); };
      Layer layer;
      layer.input_norm = take(name("input_layernorm.weight"));
      layer.qkv = at::cat({take(name("self_attn.q_proj.weight")), take(name("self_attn.k_proj.weight")),
                           take(name("self_attn.v_proj.weight"))},
                          0);
      layer.o = take(name("self_attn.o_proj.weight"));
      layer.post_norm = take(name("post_attention_layernorm.weight"));
      layer.gate_up = at::cat({take(name("mlp.gate_proj.weight")), take(name("mlp.up_proj.weight"))}, 0);
      layer.down = take(name("mlp.down_proj.weight"));
      layers_.push_back(std::move(layer));
    }
    norm_ = take("model.norm.weight");
    lm_head_ = config.tie_embeddings ? embed_ : take("lm_head.weight");

    // Rotary tables as LlamaRotaryEmbedding computes them: inv_freq in
    // float32 on the CPU (where Hugging Face builds it, at construction),
    // position * inv_freq and cos/sin in float32 on the model's device, then
    // cast to the model dtype.
    const std::int64_t head_dim = config.head_dim();
    const at::Tensor inv_freq =
        at::reciprocal(at::pow(config.rope_theta, at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / head_dim));
    const at::Tensor freqs = at::arange(config.max_len, at::TensorOptions().device(device_).dtype(at::kFloat)).unsqueeze(1) *
                             inv_freq.to(device_).unsqueeze(0);
    const at::Tensor angles = at::cat({freqs, freqs}, -1);  // [max_len, head_dim]
    cos_ = angles.cos().to(dtype);
    sin_ = angles.sin().to(dtype);
    positions_ = at::arange(config.max_len, at::TensorOptions().device(device_).dtype(at::kLong));
    scale_ = std::pow(static_cast<double>(head_dim), -0.5);  // Python's head_dim**-0.5
  }

  // gate/up in one product, then down_proj(silu(gate) * up).
  at::Tensor mlp(const at::Tensor& h, const Layer& layer) const {
    const std::int64_t intermediate = config_.intermediate_size;
    const at::Tensor gate_up = at::linear(h, layer.gate_up);
    return at::linear(at::silu(gate_up.narrow(-1, 0, intermediate)) * gate_up.narrow(-1, intermediate, intermediate),
                      layer.down);
  }

  // The hidden states [N, hidden] of packed prompts, each token attending to
  // the tokens of its own prompt up to its position; with a cache, each
  // token's keys and values written at (its slot, its position).
  at::Tensor packed_hidden(const at::Tensor& tokens, const Packing& packing, KvCache* cache) const {
    const std::int64_t length = tokens.size(0);
    const std::int64_t heads = config_.num_heads;
    const std::int64_t kv_heads = config_.num_kv_heads;
    const std::int64_t head_dim = config_.head_dim();
    const std::int64_t group = config_.group_size();

    at::Tensor x = embed_.index_select(0, tokens);  // [N, hidden]
    const at::Tensor cos = cos_.index_select(0, packing.positions).unsqueeze(1);  // [N, 1, head_dim]
    const at::Tensor sin = sin_.index_select(0, packing.positions).unsqueeze(1);
    // [N, N]: key j is hidden from query t when it comes later in the same
    // prompt or belongs to another prompt.
    const at::Tensor future = at::gt(packing.positions.unsqueeze(0), packing.positions.unsqueeze(1))
                                  .logical_or(at::ne(packing.segments.unsqueeze(0), packing.segments.unsqueeze(1)));
    c10::List<std::optional<at::Tensor>> write_at;
    if (cache != nullptr) {
      write_at.push_back(packing.slots);
      write_at.push_back(std::nullopt);  // every key/value head
      write_at.push_back(packing.positions);
    }

    for (std::int64_t i = 0; i < config_.num_layers; ++i) {
      const Layer& layer = layers_[static_cast<std::size_t>(i)];
      const at::Tensor qkv = at::linear(detail::rms_norm(x, layer.input_norm, config_.rms_norm_eps), layer.qkv);
      const at::Tensor q = detail::apply_rotary(qkv.narrow(1, 0, heads * head_dim).view({length, heads, head_dim}), cos, sin);
      const at::Tensor k = detail::apply_rotary(
          qkv.narrow(1, heads * head_dim, kv_heads * head_dim).view({length, kv_heads, head_dim}), cos, sin);
      const at::Tensor v =
          qkv.narrow(1, (heads + kv_heads) * head_dim, kv_heads * head_dim).view({length, kv_heads, head_dim});
      if (cache != nullptr) {
        cache->k.select(0, i).index_put_(write_at, k);
        cache->v.select(0, i).index_put_(write_at, v);
      }
      const at::Tensor keys = k.transpose(0, 1);  // [kv_heads, N, head_dim]
      const at::Tensor values = v.transpose(0, 1);
      // [kv_heads, group * N, head_dim]: a key/value head's query heads stacked.
      const at::Tensor queries = q.transpose(0, 1).reshape({kv_heads, group * length, head_dim});
      at::Tensor scores = at::matmul(queries, keys.transpose(1, 2)) * scale_;  // [kv_heads, group * N, N]
      scores.view({kv_heads, group, length, length}).masked_fill_(future, -std::numeric_limits<double>::infinity());
      const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(dtype_);
      const at::Tensor attended =
          at::matmul(probs, values).view({heads, length, head_dim}).transpose(0, 1).reshape({length, heads * head_dim});
      x = x + at::linear(attended, layer.o);
      x = x + mlp(detail::rms_norm(x, layer.post_norm, config_.rms_norm_eps), layer);
    }
    return x;
  }

  static __half* half_ptr(const at::Tensor& t) { return reinterpret_cast<__half*>(t.data_ptr<at::Half>()); }

  // decode() with DecodeKernels::fused: the same math, 7 kernels per layer
  // where the step uses its own products (fused::use_own_product: by default
  // batch 1; fused::linear_fits says which shapes they take: 1 to 8, 16, 32,
  // 48, 64 rows; 4 products, the SiLU product computed by the gate and up
  // product (1 to 8 rows, unfolded) or by the down product as it loads (16
  // to 64, and folded);
  // attention; 2 residual-add norms; 5 at one row with
  // fused::fold_norms(), the norms inside the products), 8 elsewhere (torch's GEMMs and
  // the SiLU product's own kernel); one more for a packed prefill; and one
  // fill of counters per call for the attention past fused::kSplitKeys
  // positions of context and for products split over blocks. Capture-safe
  // like decode(): device tensors only, torch's allocator, the current stream.
  // `logit_rows`: when given (a packed prefill), only these rows' logits are
  // computed, and the rows, which share slots, write every key and value
  // before any attends (two kernels); a decode step's rows have slots of
  // their own and do both in one.
  at::Tensor decode_fused(KvCache& cache, const at::Tensor& slots, const at::Tensor& positions,
                          const at::Tensor& tokens, std::int64_t context,
                          const at::Tensor* logit_rows = nullptr) const {
    // The product sets read once for the whole forward: a change on another
    // thread meanwhile cannot give it two.
    const fused::ThreadProductSets products(fused::product_sets_in_force());
    if (dtype_ != at::kHalf || !(device_.is_cuda() || device_.is_cpu())) {
      detail::invalid("DecodeKernels::fused needs the model in fp16 (on a CUDA device; on the CPU its kernels' host "
                      "versions run); this one is " +
                      std::string(c10::toString(dtype_)) + " on " + device_.str() + " (use DecodeKernels::aten)");
    }
    const fused::Kernels& k = device_.is_cuda() ? fused::kernels() : fused::host_kernels();
    const auto rows = static_cast<int>(tokens.size(0));
    const auto heads = static_cast<int>(config_.num_heads);
    const auto kv_heads = static_cast<int>(config_.num_kv_heads);
    const auto head_dim = static_cast<int>(config_.head_dim());
    const auto hidden = static_cast<int>(config_.hidden_size);
    const auto intermediate = static_cast<int>(config_.intermediate_size);
    const auto eps = static_cast<float>(config_.rms_norm_eps);
    const cudaStream_t stream = device_.is_cuda() ? c10::cuda::getCurrentCUDAStream(device_.index()).stream() : nullptr;
    const at::TensorOptions options = embed_.options();
    const at::Tensor slot_index = slots.contiguous();
    const at::Tensor position_index = positions.contiguous();
    const auto* slot_data = slot_index.data_ptr<std::int64_t>();
    const auto* position_data = position_index.data_ptr<std::int64_t>();

    const auto qkv_width = static_cast<int>(layers_[0].qkv.size(0));
    const auto vocab = static_cast<int>(config_.vocab_size);
    // Folded (fused::fold_norms(), one row, the step's own products): each
    // residual add and RMSNorm is computed by the product after it
    // (Kernels::norm_linear), 5 kernels per layer instead of 7. The residual
    // then alternates between x and x_spare: every block of a product reads
    // it while block 0 writes the sum.
    const bool fold =
        logit_rows == nullptr && fused::folds_norms(rows, hidden, qkv_width, 2 * intermediate, vocab);
    at::Tensor x = embed_.index_select(0, tokens);  // [B, hidden], the residual stream
    at::Tensor h = at::empty_like(x);                // the normed input of the next product
    at::Tensor x_spare = fold ? at::empty_like(x) : at::Tensor();
    at::Tensor pending;  // folded: what the next norm adds to the residual (undefined: nothing)
    if (!fold) {
      k.add_rms_norm(half_ptr(x), nullptr, half_ptr(layers_[0].input_norm), half_ptr(h), rows, hidden, eps, stream);
    }
    const at::Tensor q = logit_rows != nullptr ? at::empty({rows, heads, head_dim}, options) : at::Tensor();
    // A context of more than fused::kSplitKeys positions splits each row's
    // attention over several blocks: their states and counters, one set for
    // every layer (the counters are left at zero by each call).
    const auto context_positions = static_cast<int>(context);
    const AttentionWorkspaceTensors workspace_tensors =
        attention_workspace(options, rows, heads, kv_heads, head_dim, context_positions);
    const fused::AttentionWorkspace workspace = workspace_tensors.view();
    const at::Tensor attended = at::empty({rows, heads * head_dim}, options);
    // The products: the fused GEMVs, narrow and skinny products where the step uses them
    // (fused::use_own_product: at the row counts of the own set in force, where
    // they take the shape), launched programmatically like the other
    // kernels; torch's GEMM (cuBLAS) elsewhere. A skinny GEMM that splits its
    // width over blocks uses the workspace: one set for every product of the
    // step (each call leaves the counters at zero).
    const auto logits_rows = static_cast<int>(logit_rows != nullptr ? logit_rows->size(0) : rows);
    std::size_t linear_floats = 0;
    std::size_t linear_counters = 0;
    for (const auto [product_rows, in, out] : step_products(config_, rows, logits_rows)) {
      if (!fused::use_own_product(product_rows, in, out)) continue;
      linear_floats = std::max(linear_floats, fused::linear_partial_floats(product_rows, in, out));
      linear_counters = std::max(linear_counters, fused::linear_counters(out));
    }
    const at::Tensor linear_partials =
        linear_floats > 0 ? at::empty({static_cast<std::int64_t>(linear_floats)}, options.dtype(at::kFloat))
                          : at::Tensor();
    const at::Tensor linear_counts =
        linear_floats > 0 ? at::zeros({static_cast<std::int64_t>(linear_counters)}, options.dtype(at::kInt))
                          : at::Tensor();
    const fused::LinearWorkspace linear_workspace{
        .partials = linear_floats > 0 ? linear_partials.data_ptr<float>() : nullptr,
        .counters = linear_floats > 0 ? reinterpret_cast<unsigned int*>(linear_counts.data_ptr<int>()) : nullptr};
    const auto product = [&](const at::Tensor& input, const at::Tensor& weight) {
      const auto input_rows = static_cast<int>(input.size(0));
      const auto in = static_cast<int>(weight.size(1));
      const auto out = static_cast<int>(weight.size(0));
      if (!fused::use_own_product(input_rows, in, out)) return at::linear(input, weight);
      at::Tensor y = at::empty({input_rows, out}, options);
      k.linear(half_ptr(input), half_ptr(weight), half_ptr(y), input_rows, in, out, linear_workspace, stream);
      return y;
    };
    // The MLP's down product over silu(gate) * up: the SiLU product computed
    // by the gate and up product (Kernels::gate_up_silu, unfolded, 1
    // to kMaxGemvRows rows of the step's own products), or as the fused down
    // product loads its input, or by its own kernel before torch's GEMM.
    const bool silu_in_gate_up =
        !fold && rows <= fused::kMaxGemvRows && fused::use_own_product(rows, hidden, 2 * intermediate);
    const bool gated_down = fused::use_own_product(rows, intermediate, hidden);
    const at::Tensor act =
        gated_down && !silu_in_gate_up ? at::Tensor() : at::empty({rows, intermediate}, options);
    const auto down_product = [&](const at::Tensor& gate_up, const at::Tensor& weight) {
      if (!gated_down) {
        k.silu_mul(half_ptr(gate_up), half_ptr(act), rows, intermediate, stream);
        return at::linear(act, weight);
      }
      at::Tensor y = at::empty({rows, hidden}, options);
      k.gated_linear(half_ptr(gate_up), half_ptr(weight), half_ptr(y), rows, intermediate, hidden, linear_workspace,
                     stream);
      return y;
    };
    // Folded: the product of norm(residual + pending) and `weight`; the sum
    // becomes the residual.
    const auto norm_product = [&](const at::Tensor& norm_weight, const at::Tensor& weight) {
      at::Tensor y = at::empty({static_cast<std::int64_t>(rows), weight.size(0)}, options);
      k.norm_linear(half_ptr(x), pending.defined() ? half_ptr(pending) : nullptr, half_ptr(norm_weight), eps,
                    half_ptr(x_spare), half_ptr(weight), half_ptr(y), rows, hidden, static_cast<int>(weight.size(0)),
                    linear_workspace, stream);
      if (pending.defined()) std::swap(x, x_spare);
      pending = at::Tensor();
      return y;
    };
    for (std::int64_t i = 0; i < config_.num_layers; ++i) {
      const Layer& layer = layers_[static_cast<std::size_t>(i)];
      const at::Tensor cache_k = cache.k.select(0, i);
      const at::Tensor cache_v = cache.v.select(0, i);
      const at::Tensor qkv = fold ? norm_product(layer.input_norm, layer.qkv) : product(h, layer.qkv);
      if (logit_rows == nullptr) {
        k.rotary_attention(half_ptr(qkv), qkv.stride(0), half_ptr(cos_), half_ptr(sin_), position_data, slot_data,
                           half_ptr(cache_k), half_ptr(cache_v), half_ptr(attended), rows, heads, kv_heads, head_dim,
                           config_.max_len, context_positions, static_cast<float>(scale_), workspace, stream);
      } else {
        k.rotary_and_cache_write(half_ptr(qkv), qkv.stride(0), half_ptr(cos_), half_ptr(sin_), position_data,
                                 slot_data, half_ptr(q), half_ptr(cache_k), half_ptr(cache_v), rows, heads, kv_heads,
                                 head_dim, config_.max_len, stream);
        k.decode_attention(half_ptr(q), half_ptr(cache_k), half_ptr(cache_v), slot_data, position_data,
                           half_ptr(attended), rows, heads, kv_heads, head_dim, config_.max_len, context_positions,
                           static_cast<float>(scale_), workspace, stream);
      }
      const at::Tensor o = product(attended, layer.o);
      if (fold) {
        pending = o;
        const at::Tensor gate_up = norm_product(layer.post_norm, layer.gate_up);
        pending = down_product(gate_up, layer.down);
        continue;  // the next norm_product adds it
      }
      k.add_rms_norm(half_ptr(x), half_ptr(o), half_ptr(layer.post_norm), half_ptr(h), rows, hidden, eps, stream);
      at::Tensor down;
      if (silu_in_gate_up) {
        k.gate_up_silu(half_ptr(h), half_ptr(layer.gate_up), half_ptr(act), rows, hidden, intermediate, stream);
        down = product(act, layer.down);
      } else {
        down = down_product(product(h, layer.gate_up), layer.down);
      }
      const at::Tensor& next_norm =
          i + 1 < config_.num_layers ? layers_[static_cast<std::size_t>(i + 1)].input_norm : norm_;
      k.add_rms_norm(half_ptr(x), half_ptr(down), half_ptr(next_norm), half_ptr(h), rows, hidden, eps, stream);
    }
    if (fold) return norm_product(norm_, lm_head_);
    return product(logit_rows != nullptr ? h.index_select(0, *logit_rows) : h, lm_head_);
  }

  // The cache must be one made for this model: a mismatch would index out of
  // bounds on the device, where the error surfaces late and unnamed.
  void check_cache(const KvCache& cache) const {
    const std::vector<std::int64_t> expected{config_.num_layers, cache.k.defined() ? cache.k.size(1) : 0,
                                             config_.num_kv_heads, config_.max_len, config_.head_dim()};
    for (const auto& [tensor, name] : {std::pair{&cache.k, "k"}, std::pair{&cache.v, "v"}}) {
      if (!tensor->defined() || tensor->dim() != 5 || tensor->sizes() != at::IntArrayRef(expected) || expected[1] < 2) {
        detail::invalid(std::string("the KV cache's ") + name + " has shape " +
                        (tensor->defined() ? detail::sizes_text(tensor->sizes()) : std::string("(undefined)")) +
                        "; this model needs [layers, slots + 1, kv_heads, max_len, head_dim] = [" +
                        std::to_string(config_.num_layers) + ", slots + 1, " + std::to_string(config_.num_kv_heads) +
                        ", " + std::to_string(config_.max_len) + ", " + std::to_string(config_.head_dim()) + "]");
      }
      if (tensor->scalar_type() != dtype_ || tensor->device() != device_) {
        detail::invalid(std::string("the KV cache's ") + name + " is " + c10::toString(tensor->scalar_type()) + " on " +
                        tensor->device().str() + "; the model is " + c10::toString(dtype_) + " on " + device_.str());
      }
    }
  }

  // An int64 vector on the model's device, of `rows` entries when rows >= 0 (at least one otherwise).
  void check_rows(const at::Tensor& t, const char* name, std::int64_t rows) const {
    if (!t.defined() || t.dim() != 1 || t.scalar_type() != at::kLong || t.device() != device_) {
      detail::invalid(std::string("decode ") + name + " must be a 1-D int64 tensor on " + device_.str() + ", not " +
                      (t.defined() ? std::string(c10::toString(t.scalar_type())) + " " + detail::sizes_text(t.sizes()) +
                                         " on " + t.device().str()
                                   : std::string("an undefined tensor")));
    }
    if (rows < 0 && t.size(0) < 1) {
      detail::invalid(std::string("decode ") + name + " is empty: a step needs at least one row");
    }
    if (rows >= 0 && t.size(0) != rows) {
      detail::invalid(std::string("decode ") + name + " has " + std::to_string(t.size(0)) + " rows, tokens has " +
                      std::to_string(rows) + ": every row needs a slot, a position and a token");
    }
  }

  // A prompt: int64 [T] on the model's device, 1 <= T <= max_len (the rotary tables' and the cache's length).
  void check_prompt(const at::Tensor& tokens) const {
    if (!tokens.defined() || tokens.dim() != 1 || tokens.scalar_type() != at::kLong || tokens.device() != device_) {
      detail::invalid("prompt tokens must be a 1-D int64 tensor on " + device_.str() + ", not " +
                      (tokens.defined() ? std::string(c10::toString(tokens.scalar_type())) + " " +
                                              detail::sizes_text(tokens.sizes()) + " on " + tokens.device().str()
                                        : std::string("an undefined tensor")));
    }
    if (tokens.size(0) < 1 || tokens.size(0) > config_.max_len) {
      detail::invalid("a prompt of " + std::to_string(tokens.size(0)) + " tokens: it must hold 1.." +
                      std::to_string(config_.max_len) + " (max_position_embeddings)");
    }
  }

  LlamaConfig config_;
  at::Device device_;
  at::ScalarType dtype_;
  at::Tensor embed_;    // [vocab, hidden]
  std::vector<Layer> layers_;
  at::Tensor norm_;     // [hidden]
  at::Tensor lm_head_;  // [vocab, hidden]; embed_ itself when tied
  at::Tensor cos_;      // [max_len, head_dim], model dtype
  at::Tensor sin_;
  at::Tensor positions_;  // arange(max_len), int64: the masks are cut from it
  double scale_ = 1.0;    // head_dim^-0.5
};

}  // namespace llm_decode
