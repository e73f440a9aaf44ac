#pragma once
// The little JSON the inference server needs: a strict parser for request
// bodies (any JSON value; numbers are read from "inputs", flattened, and an
// integer from "id") and escaping for responses.
#include <cctype>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace inference_server {

struct InferRequestJson {
  std::vector<float> inputs;
  std::optional<unsigned long long> id;
  std::size_t rows_given = 0;  // nested arrays in "inputs" (0: a flat list)
};

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : text_(text) {}

  // Parses {"inputs": [...], "id": n, ...}; returns an error message or "".
  std::string parse_infer(InferRequestJson& out) {
    skip_space();
    if (!consume('{')) {
      return fail("expected a JSON object");
    }
    skip_space();
    if (consume('}')) {
      return "the JSON object has no \"inputs\"";
    }
    bool have_inputs = false;
    for (;;) {
      skip_space();
      std::string key;
      if (!parse_string(key)) {
        return error_.empty() ? fail("expected a string key") : error_;
      }
      skip_space();
      if (!consume(':')) {
        return fail("expected ':'");
      }
      skip_space();
      if (key == "inputs") {
        have_inputs = true;
        if (!parse_inputs(out)) {
          return error_;
        }
      } else if (key == "id") {
        double value = 0;
        if (!parse_number(value) || value < 0 || value != static_cast<double>(static_cast<unsigned long long>(value))) {
          return error_.empty() ? fail("\"id\" must be a non-negative integer") : error_;
        }
        out.id = static_cast<unsigned long long>(value);
      } else if (!skip_value(0)) {
        return error_;
      }
      skip_space();
      if (consume(',')) {
        continue;
      }
      if (consume('}')) {
        break;
      }
      return fail("expected ',' or '}'");
    }
    skip_space();
    if (pos_ != text_.size()) {
      return fail("unexpected text after the JSON object");
    }
    return have_inputs ? "" : "the JSON object has no \"inputs\"";
  }

 private:
  std::string fail(std::string_view what) {
    error_ = "malformed JSON at byte " + std::to_string(pos_) + ": " + std::string(what);
    return error_;
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool parse_string(std::string& out) {
    if (!consume('"')) {
      return false;
    }
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') {
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        fail("control character in a string");
        return false;
      }
      if (c == '\\') {
        if (pos_ >= text_.size()) {
          break;
        }
        const char e = text_[pos_++];
        switch (e) {
          case '"': case '\\': case '/': out += e; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u':
            for (int i = 0; i < 4; ++i) {
              if (pos_ >= text_.size() || std::isxdigit(static_cast<unsigned char>(text_[pos_])) == 0) {
                fail("bad \\u escape");
                return false;
              }
              ++pos_;
            }
            out += '?';  // keys and ignored strings only: the code point itself is not needed
            break;
          default: fail("bad escape"); return false;
        }
      } else {
        out += c;
      }
    }
    fail("unterminated string");
    return false;
  }
  bool parse_number(double& value) {
    const std::size_t start = pos_;
    consume('-');
    if (pos_ >= text_.size() || std::isdigit(static_cast<unsigned char>(text_[pos_])) == 0) {
      pos_ = start;
      fail("expected a number");
      return false;
    }
    if (text_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])) != 0) {
        ++pos_;
      }
    }
    if (consume('.')) {
      if (pos_ >= text_.size() || std::isdigit(static_cast<unsigned char>(text_[pos_])) == 0) {
        fail("expected a digit after '.'");
        return false;
      }
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])) != 0) {
        ++pos_;
      }
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (!consume('+')) {
        consume('-');
      }
      if (pos_ >= text_.size() || std::isdigit(static_cast<unsigned char>(text_[pos_])) == 0) {
        fail("expected an exponent");
        return false;
      }
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])) != 0) {
        ++pos_;
      }
    }
    const std::string number(text_.substr(start, pos_ - start));
    value = std::strtod(number.c_str(), nullptr);
    return true;
  }
  // "inputs": [numbers] or [[numbers], [numbers], ...]
  bool parse_inputs(InferRequestJson& out) {
    if (!consume('[')) {
      fail("\"inputs\" must be an array");
      return false;
    }
    skip_space();
    if (consume(']')) {
      return true;
    }
    for (;;) {
      skip_space();
      if (consume('[')) {
        ++out.rows_given;
        skip_space();
        if (!consume(']')) {
          for (;;) {
            skip_space();
            double v = 0;
            if (!parse_number(v)) {
              return false;
            }
            out.inputs.push_back(static_cast<float>(v));
            skip_space();
            if (consume(',')) {
              continue;
            }
            if (consume(']')) {
              break;
            }
            fail("expected ',' or ']' in a row of \"inputs\"");
            return false;
          }
        }
      } else {
        double v = 0;
        if (!parse_number(v)) {
          return false;
        }
        out.inputs.push_back(static_cast<float>(v));
      }
      skip_space();
      if (consume(',')) {
        continue;
      }
      if (consume(']')) {
        return true;
      }
      fail("expected ',' or ']' in \"inputs\"");
      return false;
    }
  }
  bool skip_value(int depth) {
    if (depth > 64) {
      fail("nested too deeply");
      return false;
    }
    skip_space();
    if (pos_ >= text_.size()) {
      fail("unexpected end");
      return false;
    }
    const char c = text_[pos_];
    if (c == '"') {
      std::string ignored;
      return parse_string(ignored) || (error_.empty() ? (fail("bad string"), false) : false);
    }
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      skip_space();
      if (consume(close)) {
        return true;
      }
      for (;;) {
        skip_space();
        if (c == '{') {
          std::string key;
          if (!parse_string(key)) {
            if (error_.empty()) {
              fail("expected a string key");
            }
            return false;
          }
          skip_space();
          if (!consume(':')) {
            fail("expected ':'");
            return false;
          }
        }
        if (!skip_value(depth + 1)) {
          return false;
        }
        skip_space();
        if (consume(',')) {
          continue;
        }
        if (consume(close)) {
          return true;
        }
        fail("expected ',' or a closing bracket");
        return false;
      }
    }
    for (std::string_view word : {"true", "false", "null"}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return true;
      }
    }
    double ignored = 0;
    return parse_number(ignored);
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::string error_;
};

// A JSON string literal of `text`.
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace inference_server
