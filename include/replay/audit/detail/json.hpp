#pragma once
// JSON text for the audit report: string escaping and a small writer of
// objects and arrays (output only; nothing here parses JSON).
#include <replay/detail/require_cxx20.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

namespace replay::detail::audit {

// `text` as a JSON string literal, quotes included. Bytes of 0x80 and above
// are passed through (UTF-8 stays UTF-8); control characters are escaped.
inline ::std::string json_string(::std::string_view text) {
  ::std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          (void)::std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

// Appends members to one JSON object: {"a":1,"b":"x"}.
class JsonObject {
 public:
  explicit JsonObject(::std::string& out) : out_(out) { out_ += '{'; }
  JsonObject(const JsonObject&) = delete;
  JsonObject& operator=(const JsonObject&) = delete;
  ~JsonObject() { out_ += '}'; }

  // A member whose value is already JSON text (an object, an array, null).
  JsonObject& raw(::std::string_view key, ::std::string_view json) {
    name(key);
    out_ += json;
    return *this;
  }
  JsonObject& text(::std::string_view key, ::std::string_view value) {
    name(key);
    out_ += json_string(value);
    return *this;
  }
  template <class T>
    requires ::std::is_arithmetic_v<T>
  JsonObject& number(::std::string_view key, T value) {
    name(key);
    if constexpr (::std::is_same_v<T, bool>) {
      out_ += value ? "true" : "false";
    } else {
      out_ += ::std::to_string(value);
    }
    return *this;
  }
  JsonObject& boolean(::std::string_view key, bool value) { return number(key, value); }

 private:
  void name(::std::string_view key) {
    if (!first_) {
      out_ += ',';
    }
    first_ = false;
    out_ += json_string(key);
    out_ += ':';
  }
  ::std::string& out_;
  bool first_ = true;
};

// "[a,b,c]" from already-written JSON elements.
template <class Range, class Write>
::std::string json_array(const Range& items, Write write) {
  ::std::string out = "[";
  bool first = true;
  for (const auto& item : items) {
    if (!first) {
      out += ',';
    }
    first = false;
    write(out, item);
  }
  out += ']';
  return out;
}

}  // namespace replay::detail::audit
