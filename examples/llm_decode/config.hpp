#pragma once
// The shape of a Llama-style decoder, read from and written to a Hugging Face
// style config.json (the key names of transformers' LlamaConfig), so that the
// Python side and Hugging Face build the same model from the same file.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>

namespace llm_decode {

struct LlamaConfig {
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t max_len = 0;  // max_position_embeddings: the KV cache's length and the rotary tables'
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;  // lm_head is the embedding matrix

  std::int64_t head_dim() const { return num_heads > 0 ? hidden_size / num_heads : 0; }
  // Query heads that share one key/value head (grouped-query attention).
  std::int64_t group_size() const { return num_kv_heads > 0 ? num_heads / num_kv_heads : 0; }

  // Throws std::invalid_argument naming the first key whose value cannot make
  // a model (a zero size, heads that do not divide the width, an odd head
  // width that rotary embeddings cannot split in halves).
  void validate() const {
    const auto require = [](bool ok, std::string_view key, std::string_view what) {
      if (!ok) {
        throw std::invalid_argument("llm_decode: config: " + std::string(key) + " " + std::string(what));
      }
    };
    require(vocab_size > 0, "vocab_size", "must be positive");
    require(hidden_size > 0, "hidden_size", "must be positive");
    require(intermediate_size > 0, "intermediate_size", "must be positive");
    require(num_layers > 0, "num_hidden_layers", "must be positive");
    require(num_heads > 0, "num_attention_heads", "must be positive");
    require(num_kv_heads > 0, "num_key_value_heads", "must be positive");
    require(max_len > 0, "max_position_embeddings", "must be positive");
    require(hidden_size % num_heads == 0, "hidden_size", "must be a multiple of num_attention_heads");
    require(num_heads % num_kv_heads == 0, "num_attention_heads", "must be a multiple of num_key_value_heads");
    require(head_dim() % 2 == 0, "hidden_size / num_attention_heads", "(the head width) must be even for rotary embeddings");
    require(std::isfinite(rope_theta) && rope_theta > 0.0, "rope_theta", "must be positive");
    require(std::isfinite(rms_norm_eps) && rms_norm_eps > 0.0, "rms_norm_eps", "must be positive");
  }

  // The sizes the example and its tests name: "tiny" (tests: a few thousand
  // parameters), "small" (about GPT-2 124M) and "1b" (about 1.1B, TinyLlama's shape).
  static LlamaConfig preset(std::string_view name) {
    if (name == "tiny") {
      return {.vocab_size = 256, .hidden_size = 64, .intermediate_size = 128, .num_layers = 2, .num_heads = 4,
              .num_kv_heads = 2, .max_len = 64, .rope_theta = 10000.0, .rms_norm_eps = 1e-5, .tie_embeddings = true};
    }
    if (name == "small") {
      return {.vocab_size = 32000, .hidden_size = 768, .intermediate_size = 2048, .num_layers = 12, .num_heads = 12,
              .num_kv_heads = 4, .max_len = 1024, .rope_theta = 10000.0, .rms_norm_eps = 1e-5, .tie_embeddings = true};
    }
    if (name == "1b") {
      return {.vocab_size = 32000, .hidden_size = 2048, .intermediate_size = 8192, .num_layers = 16, .num_heads = 32,
              .num_kv_heads = 8, .max_len = 1024, .rope_theta = 10000.0, .rms_norm_eps = 1e-5, .tie_embeddings = false};
    }
    throw std::invalid_argument("llm_decode: unknown model preset \"" + std::string(name) +
                                "\" (the presets are tiny, small and 1b)");
  }

  // The preset whose sizes these are (vocabulary, widths, layers, heads, tied
  // embeddings; the cache length, rope_theta and eps may differ), or "custom".
  // A weights directory records its sizes, not the preset that wrote it, and
  // a report names the model it measured.
  static std::string_view preset_of(const LlamaConfig& config) {
    for (const std::string_view name : {"tiny", "small", "1b"}) {
      const LlamaConfig p = preset(name);
      if (p.vocab_size == config.vocab_size && p.hidden_size == config.hidden_size &&
          p.intermediate_size == config.intermediate_size && p.num_layers == config.num_layers &&
          p.num_heads == config.num_heads && p.num_kv_heads == config.num_kv_heads &&
          p.tie_embeddings == config.tie_embeddings) {
        return name;
      }
    }
    return "custom";
  }
};

namespace detail {

inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("llm_decode: cannot open " + path.string());
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The value of `key` in `json`, or a message naming the key and the file.
inline const nlohmann::json& config_entry(const nlohmann::json& json, const char* key,
                                          const std::filesystem::path& path) {
  const auto found = json.find(key);
  if (found == json.end()) {
    throw std::invalid_argument("llm_decode: " + path.string() + ": key \"" + key + "\" is missing");
  }
  return *found;
}

[[noreturn]] inline void wrong_config_type(const nlohmann::json& value, const char* key, const char* expected,
                                           const std::filesystem::path& path) {
  throw std::invalid_argument("llm_decode: " + path.string() + ": key \"" + key + "\" must be " + expected +
                              ", not " + value.type_name() + " " + value.dump());
}

inline std::int64_t config_integer(const nlohmann::json& json, const char* key, const std::filesystem::path& path) {
  const nlohmann::json& value = config_entry(json, key, path);
  if (!value.is_number_integer()) {
    wrong_config_type(value, key, "an integer", path);
  }
  return value.get<std::int64_t>();
}

inline double config_number(const nlohmann::json& value, const char* key, const std::filesystem::path& path) {
  if (!value.is_number()) {
    wrong_config_type(value, key, "a number", path);
  }
  return value.get<double>();
}

inline bool config_boolean(const nlohmann::json& json, const char* key, const std::filesystem::path& path) {
  const nlohmann::json& value = config_entry(json, key, path);
  if (!value.is_boolean()) {
    wrong_config_type(value, key, "true or false", path);
  }
  return value.get<bool>();
}

// Keys of Hugging Face's LlamaConfig that this model implements only at one
// value: a file asking for anything else would load into a different model.
inline void check_supported_variant(const nlohmann::json& json, const LlamaConfig& config,
                                    const std::filesystem::path& path) {
  const auto refuse = [&](const char* key, const char* supported) {
    throw std::invalid_argument("llm_decode: " + path.string() + ": key \"" + key + "\" is " + json.at(key).dump() +
                                "; only " + supported + " is supported");
  };
  if (json.contains("head_dim") && !json.at("head_dim").is_null() &&
      !(json.at("head_dim").is_number_integer() && json.at("head_dim").get<std::int64_t>() == config.head_dim())) {
    refuse("head_dim", "hidden_size / num_attention_heads");
  }
  if (json.contains("hidden_act") && json.at("hidden_act") != "silu") {
    refuse("hidden_act", "\"silu\"");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (json.contains(key) && json.at(key) != false) {
      refuse(key, "false");
    }
  }
  if (json.contains("rope_scaling") && !json.at("rope_scaling").is_null()) {
    refuse("rope_scaling", "null");
  }
}

}  // namespace detail

// Reads a Hugging Face style config.json. Missing keys, values of the wrong
// type, and variants this model does not implement (rope_scaling, biases, a
// head_dim other than hidden_size / heads) throw std::invalid_argument naming
// the key; a file that cannot be opened throws std::runtime_error.
inline LlamaConfig read_config(const std::filesystem::path& path) {
  const std::string text = detail::read_text_file(path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument("llm_decode: " + path.string() + " is not valid JSON: " + e.what());
  }
  if (!json.is_object()) {
    throw std::invalid_argument("llm_decode: " + path.string() + " must hold a JSON object, not " + json.type_name());
  }
  LlamaConfig config;
  config.vocab_size = detail::config_integer(json, "vocab_size", path);
  config.hidden_size = detail::config_integer(json, "hidden_size", path);
  config.intermediate_size = detail::config_integer(json, "intermediate_size", path);
  config.num_layers = detail::config_integer(json, "num_hidden_layers", path);
  config.num_heads = detail::config_integer(json, "num_attention_heads", path);
  config.num_kv_heads = detail::config_integer(json, "num_key_value_heads", path);
  config.max_len = detail::config_integer(json, "max_position_embeddings", path);
  // Newer transformers releases move rope_theta into "rope_parameters".
  if (!json.contains("rope_theta") && json.contains("rope_parameters") && json.at("rope_parameters").is_object()) {
    config.rope_theta = detail::config_number(detail::config_entry(json.at("rope_parameters"), "rope_theta", path),
                                              "rope_parameters.rope_theta", path);
  } else {
    config.rope_theta = detail::config_number(detail::config_entry(json, "rope_theta", path), "rope_theta", path);
  }
  config.rms_norm_eps = detail::config_number(detail::config_entry(json, "rms_norm_eps", path), "rms_norm_eps", path);
  config.tie_embeddings = detail::config_boolean(json, "tie_word_embeddings", path);
  config.validate();
  detail::check_supported_variant(json, config, path);
  return config;
}

// Writes config.json with LlamaConfig's key names (and the fixed choices of
// this model spelled out, so that Hugging Face builds the same one).
// `torch_dtype` names the dtype of the weights saved beside it.
inline void write_config(const LlamaConfig& config, const std::filesystem::path& path,
                         std::string_view torch_dtype = "float16") {
  config.validate();
  const nlohmann::ordered_json json = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", config.vocab_size},
      {"hidden_size", config.hidden_size},
      {"intermediate_size", config.intermediate_size},
      {"num_hidden_layers", config.num_layers},
      {"num_attention_heads", config.num_heads},
      {"num_key_value_heads", config.num_kv_heads},
      {"head_dim", config.head_dim()},
      {"max_position_embeddings", config.max_len},
      {"rope_theta", config.rope_theta},
      {"rms_norm_eps", config.rms_norm_eps},
      {"tie_word_embeddings", config.tie_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"rope_scaling", nullptr},
      {"torch_dtype", std::string(torch_dtype)},
  };
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << json.dump(2) << '\n';
  if (!out.flush()) {
    throw std::runtime_error("llm_decode: cannot write " + path.string());
  }
}

}  // namespace llm_decode
