// Protocol Buffers' wire format (https://protobuf.dev/programming-guides/encoding/), read and written for the KServe
// v2 gRPC messages ModelInferRequest and ModelInferResponse (tvmsched/serve/proto/grpc_service.proto; kserve.cc).
// `tvmsched serve` receives a ModelInfer call's bytes and hands them to the engine's codec, as its REST route does with
// a body: decoding them into protobuf's Python objects, then into numpy arrays and engine tensors, took most of a gRPC
// request's time inside the server (bench/results/serving.md).
//
// The reader takes what protobuf's parsers take: fields in any order and repeated, unknown fields skipped (groups
// too, nested at most kMaxGroupDepth levels, protobuf's recursion limit), repeated scalars packed or not. Malformed
// bytes (a truncated field, a varint past 10 bytes, a length past the end, wire types 6 and 7, an unmatched end-group)
// throw std::invalid_argument.
#ifndef TVMSCHED_PROTOBUF_WIRE_H_
#define TVMSCHED_PROTOBUF_WIRE_H_

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tvmsched {
namespace protobuf_wire {

enum WireType : int { kVarint = 0, kFixed64 = 1, kLength = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5 };

constexpr int kMaxGroupDepth = 100;

/*! \brief The fields of one message, in order: Next() gives each field's number and wire type, then one of the
 *  value readers (or Skip) reads its value. */
class Reader {
 public:
  explicit Reader(std::string_view bytes) : at_(bytes.data()), end_(bytes.data() + bytes.size()) {}

  bool AtEnd() const { return at_ == end_; }
  bool Next(uint32_t* field, int* type) {
    if (at_ == end_) return false;
    uint64_t key = Varint();
    *field = static_cast<uint32_t>(key >> 3), *type = static_cast<int>(key & 7);
    if (*field == 0 || key >> 32) Fail("a field number out of range");
    return true;
  }
  uint64_t Varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (at_ == end_) Fail("a varint cut short");
      auto byte = static_cast<uint8_t>(*at_++);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
    Fail("a varint longer than 10 bytes");
  }
  template <typename T>  // uint32_t / float (fixed32), uint64_t / double (fixed64)
  T Fixed() {
    if (static_cast<size_t>(end_ - at_) < sizeof(T)) Fail("a fixed-width value cut short");
    T value;
    std::memcpy(&value, at_, sizeof(T));  // little-endian, as the wire (and every host the engine builds for)
    at_ += sizeof(T);
    return value;
  }
  std::string_view Bytes() {
    uint64_t length = Varint();
    if (length > static_cast<uint64_t>(end_ - at_)) Fail("a length past the end of the message");
    std::string_view out(at_, static_cast<size_t>(length));
    at_ += length;
    return out;
  }
  /*! \brief Skip a value of wire type `type` (a group: to its end-group, nested groups included). */
  void Skip(int type) {
    int depth = 0;
    for (;;) {
      switch (type) {
        case kVarint:
          Varint();
          break;
        case kFixed64:
          Fixed<uint64_t>();
          break;
        case kLength:
          Bytes();
          break;
        case kFixed32:
          Fixed<uint32_t>();
          break;
        case kStartGroup:
          if (++depth > kMaxGroupDepth) Fail("groups nested deeper than 100");
          break;
        case kEndGroup:
          if (--depth < 0) Fail("an end-group without its start");
          break;
        default:
          Fail("wire type " + std::to_string(type));
      }
      if (depth == 0) return;
      uint32_t field;
      if (!Next(&field, &type)) Fail("a group without its end");
    }
  }

 private:
  [[noreturn]] void Fail(const std::string& what) { throw std::invalid_argument(what); }
  const char* at_;
  const char* end_;
};

/*! \brief `read(field, wire type, reader)` for each field of `message`, which returns whether it read the value; a
 *  field it leaves is skipped. */
template <typename F>
void ForEachField(std::string_view message, F&& read) {
  Reader r(message);
  uint32_t field;
  int type;
  while (r.Next(&field, &type)) {
    if (!read(field, type, r)) r.Skip(type);
  }
}

/*! \brief A repeated scalar field's values whose wire type is `element` (kVarint, kFixed32 or kFixed64), packed (one
 *  length-delimited field) or not, appended to `out` as their bits; false for a field of another wire type. */
template <typename T>
bool ReadRepeated(Reader& r, int type, int element, std::vector<T>& out) {
  auto one = [element](Reader& from) -> uint64_t {
    return element == kFixed32 ? from.Fixed<uint32_t>() : element == kFixed64 ? from.Fixed<uint64_t>() : from.Varint();
  };
  if (type == kLength) {
    Reader packed(r.Bytes());
    while (!packed.AtEnd()) out.push_back(static_cast<T>(one(packed)));
    return true;
  }
  if (type != element) return false;
  out.push_back(static_cast<T>(one(r)));
  return true;
}

/*! \brief A message's bytes, appended field by field. */
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void Varint(uint64_t value) {
    while (value >= 0x80) out_ += static_cast<char>(value | 0x80), value >>= 7;
    out_ += static_cast<char>(value);
  }
  void Key(uint32_t field, int type) { Varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(type)); }
  void Bytes(uint32_t field, std::string_view bytes) {
    Key(field, kLength);
    Varint(bytes.size());
    out_.append(bytes);
  }
  /*! \brief A length-delimited field whose bytes the caller appends next (`length` of them). */
  void LengthOf(uint32_t field, size_t length) {
    Key(field, kLength);
    Varint(length);
  }
  static size_t VarintSize(uint64_t value) {
    size_t n = 1;
    while (value >= 0x80) value >>= 7, ++n;
    return n;
  }

 private:
  std::string& out_;
};

}  // namespace protobuf_wire
}  // namespace tvmsched

#endif  // TVMSCHED_PROTOBUF_WIRE_H_
