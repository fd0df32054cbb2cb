// A small strict JSON reader for request bodies (kserve.cc): one pass, no recursion, nodes in one vector, strings
// viewed in place unless they hold escapes. What it refuses, with one line each: nesting deeper than a limit, the bare
// literals NaN/Infinity (which Triton's and Python's parsers accept), lone UTF-16 surrogate escapes, control
// characters in strings, leading zeros, trailing text. tvm-ffi's parser (ffi::json::Parse) builds a Map per object and
// boxes every element: 4 µs for a request's 200-byte header and 5 ms for 16384 floats, where this takes a fraction.
#ifndef TVMSCHED_JSON_READER_H_
#define TVMSCHED_JSON_READER_H_

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tvmsched {
namespace json_reader {

enum class Kind : uint8_t { kNull, kBool, kInt, kDouble, kString, kArray, kObject };

/*! \brief A value; arrays and objects point at their children (objects: key, value, key, value, ...). */
struct Node {
  Kind kind = Kind::kNull;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string_view text;          // a string's characters (unescaped)
  uint32_t first = 0, count = 0;  // children: nodes[first .. first + count)
};

/*! \brief A parsed text. The text (and the Document) must outlive the views. Throws std::invalid_argument with one
 *  line (no "what" prefix) when the text is not JSON this reads. */
class Document {
 public:
  Document(std::string_view text, int max_depth);
  const Node& root() const { return nodes_[root_]; }
  const Node& child(const Node& node, uint32_t i) const { return nodes_[node.first + i]; }
  /*! \brief An object's member, or nullptr (the last one when a key repeats, as tvm-ffi's and Python's parsers do). */
  const Node* member(const Node& object, std::string_view key) const {
    const Node* found = nullptr;
    for (uint32_t i = 0; i + 1 < object.count; i += 2) {
      if (nodes_[object.first + i].text == key) found = &nodes_[object.first + i + 1];
    }
    return found;
  }

 private:
  std::vector<Node> nodes_;
  std::deque<std::string> unescaped_;  // strings that held escapes (a deque: their addresses stay put)
  uint32_t root_ = 0;
};

inline Document::Document(std::string_view text, int max_depth) {
  size_t at = 0;
  auto fail = [&](const std::string& why) -> std::invalid_argument {
    return std::invalid_argument(why + " at byte " + std::to_string(at));
  };
  auto skip_space = [&] {
    while (at < text.size() && (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r')) ++at;
  };
  // the values read so far whose container is still open, and per open container where its children start
  std::vector<Node> pending;
  struct Open {
    Kind kind;
    size_t start;  // index into pending of its first child
  };
  std::vector<Open> open;
  auto hex4 = [&](size_t from) -> uint32_t {
    if (from + 4 > text.size()) throw fail("a \\u escape with fewer than 4 hex digits");
    uint32_t v = 0;
    for (size_t k = from; k < from + 4; ++k) {
      char c = text[k];
      v = v * 16 + (c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : throw fail("a \\u escape with a character that is not hex"));
    }
    return v;
  };
  auto read_string = [&]() -> std::string_view {  // at the opening quote
    size_t start = ++at;
    bool escaped = false;
    while (at < text.size() && text[at] != '"') {
      auto c = static_cast<unsigned char>(text[at]);
      if (c < 0x20) throw fail("a control character in a string");
      if (c == '\\') escaped = true, ++at;
      ++at;
    }
    if (at >= text.size()) throw fail("an unterminated string");
    std::string_view raw = text.substr(start, at - start);
    ++at;
    if (!escaped) return raw;
    std::string out;
    for (size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] != '\\') {
        out += raw[k];
        continue;
      }
      char e = raw[++k];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t code = hex4(start + k + 1);
          k += 4;
          if (code >= 0xdc00 && code <= 0xdfff) throw fail("a lone UTF-16 surrogate escape (\\uDC00-\\uDFFF)");
          if (code >= 0xd800 && code <= 0xdbff) {  // half of a pair: the other half must follow
            if (k + 6 >= raw.size() + 0 || raw[k + 1] != '\\' || raw[k + 2] != 'u')
              throw fail("a lone UTF-16 surrogate escape (\\uD800-\\uDBFF)");
            uint32_t low = hex4(start + k + 3);
            if (low < 0xdc00 || low > 0xdfff) throw fail("a lone UTF-16 surrogate escape (\\uD800-\\uDBFF)");
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
            k += 6;
          }
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xc0 | (code >> 6)), out += static_cast<char>(0x80 | (code & 0x3f));
          } else if (code < 0x10000) {
            out += static_cast<char>(0xe0 | (code >> 12)), out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (code & 0x3f));
          } else {
            out += static_cast<char>(0xf0 | (code >> 18)), out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3f)), out += static_cast<char>(0x80 | (code & 0x3f));
          }
          break;
        }
        default:
          throw fail(std::string("an unknown escape \\") + e);
      }
    }
    unescaped_.push_back(std::move(out));
    return unescaped_.back();
  };
  auto read_scalar = [&]() -> Node {
    Node node;
    char c = text[at];
    auto literal = [&](const char* word, Node value) {
      size_t n = std::strlen(word);
      if (text.compare(at, n, word) != 0) throw fail("an unexpected character '" + std::string(1, c) + "'");
      at += n;
      return value;
    };
    if (c == 't') return literal("true", Node{Kind::kBool, true});
    if (c == 'f') return literal("false", Node{Kind::kBool, false});
    if (c == 'n') return literal("null", Node{});
    bool minus = c == '-';
    char lead = at + minus < text.size() ? text[at + minus] : '\0';
    if (lead == 'N' || lead == 'I') {
      std::string_view word = lead == 'N' ? "NaN" : "Infinity";
      if (text.compare(at + minus, word.size(), word) == 0) {
        throw std::invalid_argument((minus ? "-" : "") + std::string(word) +
                                    " is not a JSON number; send non-finite values as the strings \"NaN\", "
                                    "\"Infinity\", \"-Infinity\", or as binary data");
      }
    }
    if (lead < '0' || lead > '9') throw fail("an unexpected character '" + std::string(1, c) + "'");
    size_t start = at, k = at + minus;
    if (text[k] == '0' && k + 1 < text.size() && text[k + 1] >= '0' && text[k + 1] <= '9')
      throw fail("a number with a leading zero");
    while (k < text.size() && text[k] >= '0' && text[k] <= '9') ++k;
    bool fraction = false;
    if (k < text.size() && text[k] == '.') {
      fraction = true, ++k;
      if (k >= text.size() || text[k] < '0' || text[k] > '9') throw fail("a number with no digit after its '.'");
      while (k < text.size() && text[k] >= '0' && text[k] <= '9') ++k;
    }
    if (k < text.size() && (text[k] == 'e' || text[k] == 'E')) {
      fraction = true, ++k;
      if (k < text.size() && (text[k] == '+' || text[k] == '-')) ++k;
      if (k >= text.size() || text[k] < '0' || text[k] > '9') throw fail("a number with no digit in its exponent");
      while (k < text.size() && text[k] >= '0' && text[k] <= '9') ++k;
    }
    at = k;
    const char* begin = text.data() + start;
    const char* end = text.data() + k;
    if (!fraction) {
      auto [ptr, ec] = std::from_chars(begin, end, node.integer);
      if (ec == std::errc() && ptr == end) return node.kind = Kind::kInt, node;
    }
    node.kind = Kind::kDouble;  // a fraction, an exponent, or an integer past int64's range
    auto [ptr, ec] = std::from_chars(begin, end, node.number);
    if (ec == std::errc::result_out_of_range) {  // past double's range (inf) or below its normal range (subnormal, 0)
      node.number = std::strtod(std::string(begin, end).c_str(), nullptr);  // strtod gives those values; the C locale
    } else if (ec != std::errc() || ptr != end) {
      throw fail("a number that does not read");
    }
    return node;
  };

  skip_space();
  bool expect_value = true;  // else: a ',' or a closing bracket
  bool expect_key = false;   // inside an object, before a key
  while (true) {
    if (at >= text.size()) {
      if (open.empty() && !expect_value) break;
      throw fail("the text ends early");
    }
    char c = text[at];
    if (expect_value) {
      if (expect_key) {
        if (c == '}' && pending.size() == open.back().start) {  // {}
          expect_value = false, expect_key = false;
          goto close;
        }
        if (c != '"') throw fail("an object key that is not a string");
        Node key{Kind::kString};
        key.text = read_string();
        pending.push_back(key);
        skip_space();
        if (at >= text.size() || text[at] != ':') throw fail("a key with no ':' after it");
        ++at;
        skip_space();
        expect_key = false;
        continue;
      }
      if (c == '[' || c == '{') {
        if (static_cast<int>(open.size()) >= max_depth)
          throw std::invalid_argument("nests deeper than " + std::to_string(max_depth) + " levels");
        open.push_back({c == '[' ? Kind::kArray : Kind::kObject, pending.size()});
        ++at;
        skip_space();
        if (at < text.size() && c == '[' && text[at] == ']') {
          expect_value = false;
          goto close;
        }
        expect_key = c == '{';
        continue;
      }
      if (c == '"') {
        Node s{Kind::kString};
        s.text = read_string();
        pending.push_back(s);
      } else {
        pending.push_back(read_scalar());
      }
      expect_value = false;
      skip_space();
      if (open.empty()) {
        if (at != text.size()) throw fail("text after the JSON value");
        break;
      }
      continue;
    }
    // after a value: a ',' or the closing bracket of the open container
    if (open.empty()) throw fail("text after the JSON value");
    if (c == ',') {
      ++at;
      skip_space();
      expect_value = true, expect_key = open.back().kind == Kind::kObject;
      continue;
    }
  close:
    {
      c = text[at];
      Open container = open.back();
      if ((container.kind == Kind::kArray && c != ']') || (container.kind == Kind::kObject && c != '}'))
        throw fail(container.kind == Kind::kArray ? "a list with no ',' or ']' after an element"
                                                  : "an object with no ',' or '}' after a member");
      ++at;
      open.pop_back();
      Node node{container.kind};
      node.first = static_cast<uint32_t>(nodes_.size());
      node.count = static_cast<uint32_t>(pending.size() - container.start);
      nodes_.insert(nodes_.end(), pending.begin() + static_cast<long>(container.start), pending.end());
      pending.resize(container.start);
      pending.push_back(node);
      skip_space();
      if (open.empty()) {
        if (at != text.size()) throw fail("text after the JSON value");
        break;
      }
      expect_value = false;
    }
  }
  root_ = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back(pending.back());
}

}  // namespace json_reader
}  // namespace tvmsched

#endif  // TVMSCHED_JSON_READER_H_
