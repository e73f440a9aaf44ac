#pragma once
// What a POST /v1/infer carries, read strictly: the body (JSON through
// nlohmann_json's SAX parser, or raw float32 rows) and the header values.
// Each function returns "" when the input is good, else the message for a
// 400 answer, naming the fault.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace inference_server {

struct InferInput {
  std::vector<float> values;         // rows * width, row after row
  std::optional<std::uint64_t> id;   // JSON "id"
};

// {"inputs": [[...], ...]} (rows of exactly `width` numbers) or
// {"inputs": [...]} (a flat list of whole rows), and optionally "id": an
// integer from 0 to 2^64-1. Exactly those keys, each once; every number
// finite and within float32's range.
std::string parse_json_input(std::string_view body, std::size_t width, InferInput& out);

// Little-endian float32 values, whole rows of `width`, all finite.
std::string parse_raw_input(std::string_view body, std::size_t width, InferInput& out);

// A header value that must be a decimal integer in [min, max]: digits only
// (no sign, space or suffix). `name` is used in the message.
std::string parse_header_integer(std::string_view name, std::string_view text, std::uint64_t min, std::uint64_t max,
                                 std::uint64_t& out);

// {"outputs": [[...], ...], "batch_rows": n}: `output` cut into rows of `row`.
std::string json_outputs(std::span<const float> output, std::size_t row, std::size_t batch_rows);

// {"error": message, "status": status}
std::string json_error(std::string_view status, std::string_view message);

}  // namespace inference_server
