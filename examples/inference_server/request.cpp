#include "request.hpp"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <system_error>

namespace inference_server {
namespace {

using json = nlohmann::json;
// Numbers written as float32 (the shortest text that reads back as the same float).
using json_float32 = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t, std::uint64_t, float>;

// A JSON string literal of `text` (invalid UTF-8 replaced: a header may hold any bytes).
std::string json_quoted(std::string_view text) {
  return json(std::string(text)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Reads an infer request's JSON as nlohmann_json parses it (SAX: no document
// is built; the numbers go straight into the float rows), refusing at the
// first fault. The grammar: {"inputs": [[n, ...], ...] | [n, ...], "id": n}.
class InferRequestReader {
 public:
  InferRequestReader(std::size_t width, InferInput& out) : width_(width), out_(out) {}

  const std::string& error() const { return error_; }
  bool finished() const { return place_ == Place::done; }

  // ---- nlohmann::json_sax interface ----
  bool null() { return unexpected("null"); }
  bool boolean(bool) { return unexpected("a boolean"); }
  bool string(std::string&) { return unexpected("a string"); }
  bool binary(json::binary_t&) { return unexpected("binary data"); }
  bool number_integer(json::number_integer_t v) {
    if (place_ == Place::id_value) {
      return fail("\"id\" must be an integer from 0 to 18446744073709551615; got " + std::to_string(v));
    }
    return number(static_cast<double>(v), std::to_string(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (place_ == Place::id_value) {
      out_.id = v;
      place_ = Place::object;
      return true;
    }
    return number(static_cast<double>(v), std::to_string(v));
  }
  bool number_float(json::number_float_t v, const std::string& text) {
    if (place_ == Place::id_value) {
      return fail("\"id\" must be an integer from 0 to 18446744073709551615; got " + text);
    }
    return number(v, text);
  }
  bool start_object(std::size_t) {
    if (place_ != Place::start) {
      return unexpected("an object");
    }
    place_ = Place::object;
    return true;
  }
  bool key(std::string& name) {
    if (name == "inputs" || name == "id") {
      bool& seen = name == "inputs" ? seen_inputs_ : seen_id_;
      if (seen) {
        return fail("the key " + json_quoted(name) + " appears twice");
      }
      seen = true;
      place_ = name == "inputs" ? Place::inputs_value : Place::id_value;
      return true;
    }
    return fail("unknown key " + json_quoted(name) + "; the body holds \"inputs\" and optionally \"id\"");
  }
  bool end_object() {
    if (!seen_inputs_) {
      return fail("the JSON object has no \"inputs\"");
    }
    if (out_.values.empty()) {
      return fail("\"inputs\" is empty");
    }
    if (flat_ && out_.values.size() % width_ != 0) {
      return fail("the flat \"inputs\" list holds " + std::to_string(out_.values.size()) +
                  " numbers, not whole rows of " + std::to_string(width_));
    }
    place_ = Place::done;
    return true;
  }
  bool start_array(std::size_t) {
    if (place_ == Place::inputs_value) {
      place_ = Place::inputs;
      return true;
    }
    if (place_ == Place::inputs && !flat_) {
      rows_started_ = true;
      row_size_ = 0;
      place_ = Place::row;
      return true;
    }
    return unexpected("a list");
  }
  bool end_array() {
    if (place_ == Place::row) {
      if (row_size_ != width_) {
        return fail("inputs[" + std::to_string(rows_) + "] holds " + std::to_string(row_size_) +
                    " numbers; each row holds " + std::to_string(width_));
      }
      ++rows_;
      place_ = Place::inputs;
      return true;
    }
    place_ = Place::object;  // the end of "inputs" (the only other list the grammar allows)
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const json::exception& e) {
    std::string_view what = e.what();
    if (const std::size_t cut = what.find("] "); what.starts_with("[json.exception") && cut != std::string_view::npos) {
      what.remove_prefix(cut + 2);  // drop nlohmann's "[json.exception.parse_error.101] " tag
    }
    return fail("malformed JSON at byte " + std::to_string(position) + ": " + std::string(what));
  }

 private:
  enum class Place { start, object, id_value, inputs_value, inputs, row, done };

  // Where the value being read sits, for messages: inputs[r][c] or inputs[i].
  std::string here() const {
    if (place_ == Place::row) {
      return "inputs[" + std::to_string(rows_) + "][" + std::to_string(row_size_) + "]";
    }
    if (place_ == Place::inputs) {
      return "inputs[" + std::to_string(rows_started_ ? rows_ : out_.values.size()) + "]";
    }
    if (place_ == Place::inputs_value) {
      return "\"inputs\"";
    }
    if (place_ == Place::id_value) {
      return "\"id\"";
    }
    return "the body";
  }

  bool number(double v, const std::string& text) {
    if (place_ == Place::inputs && rows_started_) {
      return fail(here() + " is a number, but the earlier elements of \"inputs\" are rows; give rows or numbers");
    }
    if (place_ != Place::row && place_ != Place::inputs) {
      return unexpected("a number");
    }
    if (!std::isfinite(v) || std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max())) {
      return fail(here() + " is " + text + ", outside the float32 range");
    }
    if (place_ == Place::inputs) {
      flat_ = true;
    } else {
      ++row_size_;
    }
    out_.values.push_back(static_cast<float>(v));
    return true;
  }

  bool unexpected(const char* what) {
    switch (place_) {
      case Place::start: return fail("the body must be a JSON object {\"inputs\": ...}; it is " + std::string(what));
      case Place::id_value:
        return fail("\"id\" must be an integer from 0 to 18446744073709551615; got " + std::string(what));
      case Place::inputs_value: return fail("\"inputs\" must be a list of rows or of numbers; got " + std::string(what));
      case Place::inputs:
        if (flat_) {
          return fail(here() + " is " + what + ", but the earlier elements of \"inputs\" are numbers");
        }
        return fail(here() + " is " + what + "; \"inputs\" holds rows (lists of numbers) or numbers");
      case Place::row: return fail(here() + " is " + what + "; a row holds numbers only");
      case Place::object:
      case Place::done: break;
    }
    return fail(std::string("unexpected ") + what);
  }

  bool fail(std::string message) {
    error_ = std::move(message);
    return false;
  }

  std::size_t width_;
  InferInput& out_;
  std::string error_;
  Place place_ = Place::start;
  bool seen_inputs_ = false;
  bool seen_id_ = false;
  bool flat_ = false;          // "inputs" is a list of numbers
  bool rows_started_ = false;  // "inputs" is a list of rows
  std::size_t rows_ = 0;       // complete rows
  std::size_t row_size_ = 0;   // numbers in the row being read
};

}  // namespace

std::string parse_json_input(std::string_view body, std::size_t width, InferInput& out) {
  InferRequestReader reader(width, out);
  const bool parsed = json::sax_parse(body.data(), body.data() + body.size(), &reader);
  if (!parsed || !reader.finished()) {
    return reader.error().empty() ? "malformed JSON" : reader.error();
  }
  return {};
}

std::string parse_raw_input(std::string_view body, std::size_t width, InferInput& out) {
  const std::size_t row_bytes = width * sizeof(float);
  if (body.empty() || body.size() % row_bytes != 0) {
    return "a raw body must be whole rows of " + std::to_string(width) + " float32 values (" +
           std::to_string(row_bytes) + " bytes each); got " + std::to_string(body.size()) + " bytes";
  }
  out.values.resize(body.size() / sizeof(float));
  std::memcpy(out.values.data(), body.data(), body.size());
  for (std::size_t i = 0; i < out.values.size(); ++i) {
    if (!std::isfinite(out.values[i])) {
      return "input " + std::to_string(i) + " (row " + std::to_string(i / width) + ", column " +
             std::to_string(i % width) + ") is " + (std::isnan(out.values[i]) ? "NaN" : "infinite") +
             "; the inputs must be finite";
    }
  }
  return {};
}

std::string parse_header_integer(std::string_view name, std::string_view text, std::uint64_t min, std::uint64_t max,
                                 std::uint64_t& out) {
  std::uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  const bool digits_only = !text.empty() && text.front() >= '0' && text.front() <= '9';
  if (!digits_only || error != std::errc{} || stop != end || value < min || value > max) {
    return std::string(name) + " must be an integer from " + std::to_string(min) + " to " + std::to_string(max) +
           "; got " + json_quoted(text.substr(0, 64));
  }
  out = value;
  return {};
}

std::string json_outputs(std::span<const float> output, std::size_t row, std::size_t batch_rows) {
  json_float32 rows = json_float32::array();
  for (std::size_t r = 0; r < output.size() / row; ++r) {
    const std::span<const float> values = output.subspan(r * row, row);
    rows.push_back(json_float32(std::vector<float>(values.begin(), values.end())));
  }
  json_float32 body = {{"outputs", std::move(rows)}, {"batch_rows", batch_rows}};
  return body.dump() + "\n";
}

std::string json_error(std::string_view status, std::string_view message) {
  // Replacement characters for invalid UTF-8 (a message may quote the request).
  return json{{"error", std::string(message)}, {"status", std::string(status)}}.dump(
             -1, ' ', false, json::error_handler_t::replace) +
         "\n";
}

}  // namespace inference_server
