// The Open Inference Protocol's request and response bodies (tvmsched/kserve.h), and tvmsched.engine.kserve_codec: the
// same parser and encoder for `tvmsched serve`.
#include "tvmsched/kserve.h"

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/extra/json.h>  // Stringify: Quote
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <type_traits>

#include "json_reader.h"
#include "tvmsched/artifact.h"
#include "tvmsched/model.h"

namespace tvmsched {
namespace kserve {

namespace {

struct Named {
  const char* name;
  DLDataType dtype;
};

// BYTES (strings) has no engine dtype; every other datatype of the protocol has one
constexpr Named kDatatypes[] = {
    {"BOOL", {kDLBool, 8, 1}},    {"UINT8", {kDLUInt, 8, 1}},   {"UINT16", {kDLUInt, 16, 1}},
    {"UINT32", {kDLUInt, 32, 1}}, {"UINT64", {kDLUInt, 64, 1}}, {"INT8", {kDLInt, 8, 1}},
    {"INT16", {kDLInt, 16, 1}},   {"INT32", {kDLInt, 32, 1}},   {"INT64", {kDLInt, 64, 1}},
    {"FP16", {kDLFloat, 16, 1}},  {"FP32", {kDLFloat, 32, 1}},  {"FP64", {kDLFloat, 64, 1}},
    {"BF16", {kDLBfloat, 16, 1}},
};

bool Same(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

/*! \brief IEEE half precision, stored as its bits (FP16 elements of JSON data; round to nearest even). */
struct Half {
  uint16_t bits = 0;
  static Half From(double value) {
    float f = static_cast<float>(value);
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
    uint32_t abs = x & 0x7fffffff;
    if (abs >= 0x7f800000) return {static_cast<uint16_t>(sign | (abs > 0x7f800000 ? 0x7e00 : 0x7c00))};
    if (abs >= 0x477ff000) return {static_cast<uint16_t>(sign | 0x7c00)};  // rounds past 65504: infinity
    if (abs < 0x38800000) {  // a subnormal half (or zero): scale to units of 2^-24, round to nearest even
      float scaled = std::fabs(f) * 16777216.0f;
      return {static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)))};
    }
    uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
    return {static_cast<uint16_t>(sign | ((rounded - 0x38000000) >> 13))};
  }
  double Value() const {
    int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
    double magnitude = exponent == 0    ? std::ldexp(mantissa, -24)
                       : exponent == 31 ? (mantissa ? std::numeric_limits<double>::quiet_NaN()
                                                    : std::numeric_limits<double>::infinity())
                                        : std::ldexp(mantissa | 0x400, exponent - 25);
    return bits & 0x8000 ? -magnitude : magnitude;
  }
};

/*! \brief Call `f(T{})` with the C++ type of `dtype` (the datatypes JSON data can hold; bool stored as a byte). */
template <typename F>
bool DispatchJson(DLDataType dtype, F&& f) {
  if (dtype.lanes != 1) return false;
  switch (dtype.code) {
    case kDLBool:
      if (dtype.bits == 8) return f(bool{}), true;
      break;
    case kDLFloat:
      if (dtype.bits == 16) return f(Half{}), true;
      if (dtype.bits == 32) return f(float{}), true;
      if (dtype.bits == 64) return f(double{}), true;
      break;
    case kDLInt:
      if (dtype.bits == 8) return f(int8_t{}), true;
      if (dtype.bits == 16) return f(int16_t{}), true;
      if (dtype.bits == 32) return f(int32_t{}), true;
      if (dtype.bits == 64) return f(int64_t{}), true;
      break;
    case kDLUInt:
      if (dtype.bits == 8) return f(uint8_t{}), true;
      if (dtype.bits == 16) return f(uint16_t{}), true;
      if (dtype.bits == 32) return f(uint32_t{}), true;
      if (dtype.bits == 64) return f(uint64_t{}), true;
      break;
  }
  return false;
}

using json_reader::Document;
using json_reader::Kind;
using json_reader::Node;

std::string QuoteNode(const Document& doc, const Node& v);

/*! \brief One element of an input's JSON data as a T, or a 400 naming what is wrong with it. */
template <typename T>
T Element(const Document& doc, const Node& v, const std::string& input, const std::string& datatype) {
  auto bad = [&]() {
    return Error(400, "input '" + input + "' holds " + QuoteNode(doc, v) + ", which is not a " + datatype + " value");
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (v.kind != Kind::kBool) throw bad();
    return v.boolean;
  } else if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half>) {
    double value;
    if (v.kind == Kind::kDouble) {
      value = v.number;
    } else if (v.kind == Kind::kInt) {
      value = static_cast<double>(v.integer);
    } else if (v.kind == Kind::kString && (v.text == "NaN" || v.text == "Infinity" || v.text == "-Infinity")) {
      // how JSON outputs carry non-finite values, sent back
      value = v.text == "NaN"    ? std::numeric_limits<double>::quiet_NaN()
              : v.text[0] == '-' ? -std::numeric_limits<double>::infinity()
                                 : std::numeric_limits<double>::infinity();
    } else {
      throw bad();
    }
    if constexpr (std::is_same_v<T, Half>)
      return Half::From(value);
    else
      return static_cast<T>(value);
  } else {
    if (v.kind != Kind::kInt) throw bad();  // an integer past int64's range reads as a double: refused here
    if constexpr (std::is_signed_v<T>) {
      if (v.integer < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          v.integer > static_cast<int64_t>(std::numeric_limits<T>::max()))
        throw bad();
    } else {
      if (v.integer < 0 || static_cast<uint64_t>(v.integer) > static_cast<uint64_t>(std::numeric_limits<T>::max()))
        throw bad();
    }
    return static_cast<T>(v.integer);
  }
}

/*! \brief Write `data` (flat or nested, as Triton accepts it) into `out` of `count` elements; 400 on a count
 *  or element that does not fit. */
template <typename T>
void FillFromJson(const Document& doc, const Node& data, T* out, size_t count, const std::string& input,
                  const std::string& datatype, const std::vector<int64_t>& shape) {
  auto wrong_count = [&](size_t got) {
    return Error(400, "input '" + input + "' has " + std::to_string(got) + " elements in 'data'; its shape " +
                          ShapeText(shape) + " needs " + std::to_string(count));
  };
  if (data.kind != Kind::kArray) {
    if (count != 1) throw wrong_count(1);
    out[0] = Element<T>(doc, data, input, datatype);
    return;
  }
  size_t written = 0, seen = 0;  // seen: elements counted past `count` (to name how many came)
  std::vector<std::pair<const Node*, uint32_t>> stack{{&data, 0}};  // depth-first, without recursion
  while (!stack.empty()) {
    auto& [array, at] = stack.back();
    if (at == array->count) {
      stack.pop_back();
      continue;
    }
    const Node& item = doc.child(*array, at++);
    if (item.kind == Kind::kArray) {
      stack.push_back({&item, 0});
    } else if (written < count) {
      out[written++] = Element<T>(doc, item, input, datatype);
    } else {
      ++seen;
    }
  }
  if (written != count || seen) throw wrong_count(written + seen);
}

void AppendNumber(std::string& out, double value, bool single) {
  if (std::isnan(value)) {
    out += "\"NaN\"";
  } else if (std::isinf(value)) {
    out += value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  } else {
    char buffer[32];  // the shortest text that reads back as the same float (or double)
    auto written = single ? std::to_chars(buffer, buffer + sizeof(buffer), static_cast<float>(value))
                          : std::to_chars(buffer, buffer + sizeof(buffer), value);
    out.append(buffer, written.ptr);
    if (std::find_if(buffer, written.ptr, [](char c) { return c == '.' || c == 'e'; }) == written.ptr)
      out += ".0";  // a float stays a float to the client's parser (3.0, not 3), as Python and Triton write it
  }
}

template <typename T>
void AppendElement(std::string& out, const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    out += value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, Half>) {
    AppendNumber(out, value.Value(), true);
  } else if constexpr (std::is_floating_point_v<T>) {
    AppendNumber(out, value, std::is_same_v<T, float>);
  } else {
    char buffer[24];
    out.append(buffer, std::to_chars(buffer, buffer + sizeof(buffer), value).ptr);
  }
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t Bytes(const std::vector<int64_t>& shape, DLDataType dtype) {
  return static_cast<size_t>(Elements(shape)) * ((dtype.bits * dtype.lanes + 7) / 8);
}

/*! \brief A "parameters" object (or none): 400 when it is something else. */
const Node* Parameters(const Document& doc, const Node& owner, const std::string& what) {
  const Node* found = doc.member(owner, "parameters");
  if (found == nullptr || found->kind == Kind::kNull) return nullptr;
  if (found->kind != Kind::kObject)
    throw Error(400, what + "'s 'parameters' must be an object, not " + QuoteNode(doc, *found));
  return found;
}

/*! \brief A boolean parameter (`fallback` when absent). */
bool BoolParameter(const Document& doc, const Node* parameters, const char* key, bool fallback,
                   const std::string& what) {
  const Node* found = parameters ? doc.member(*parameters, key) : nullptr;
  if (found == nullptr) return fallback;
  if (found->kind != Kind::kBool)
    throw Error(400, what + "'s parameter '" + key + "' must be true or false, not " + QuoteNode(doc, *found));
  return found->boolean;
}

std::string StringField(const Document& doc, const Node& owner, const char* key, const std::string& what) {
  const Node* found = doc.member(owner, key);
  if (found == nullptr) throw Error(400, what + " has no '" + key + "'");
  if (found->kind != Kind::kString)
    throw Error(400, what + "'s '" + key + "' must be a string, not " + QuoteNode(doc, *found));
  return std::string(found->text);
}

std::string Names(const std::vector<TensorInfo>& tensors) {
  std::string out;
  for (const TensorInfo& t : tensors) out += (out.empty() ? "'" : ", '") + t.name + "'";
  return out;
}

/*! \brief `text` (a BOM skipped) read as JSON; 400 naming `what` when it is not JSON this reads. */
Document Read(std::string_view text, const std::string& what) {
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // a UTF-8 byte-order mark
  if (!IsUtf8(text)) throw Error(400, what + " is not valid JSON: it is not UTF-8");
  try {
    return Document(text, kMaxJsonDepth);
  } catch (const std::invalid_argument& err) {
    std::string why = err.what();
    throw Error(400, what + (why.rfind("nests deeper", 0) == 0 ? " " : " is not valid JSON: ") + why);
  }
}

/*! \brief A value as tvm-ffi's (objects: Map<Any, Any>); nesting is bounded by the reader's depth. */
ffi::Any ToAny(const Document& doc, const Node& v) {
  switch (v.kind) {
    case Kind::kNull:
      return ffi::Any();
    case Kind::kBool:
      return v.boolean;
    case Kind::kInt:
      return v.integer;
    case Kind::kDouble:
      return v.number;
    case Kind::kString:
      return ffi::String(std::string(v.text));
    case Kind::kArray: {
      ffi::Array<ffi::Any> out;
      for (uint32_t i = 0; i < v.count; ++i) out.push_back(ToAny(doc, doc.child(v, i)));
      return out;
    }
    case Kind::kObject: {
      ffi::Map<ffi::Any, ffi::Any> out;
      for (uint32_t i = 0; i + 1 < v.count; i += 2)
        out.Set(ffi::String(std::string(doc.child(v, i).text)), ToAny(doc, doc.child(v, i + 1)));
      return out;
    }
  }
  return ffi::Any();
}

void AppendNode(std::string& out, const Document& doc, const Node& v, size_t limit) {
  if (out.size() > limit) return;
  switch (v.kind) {
    case Kind::kNull:
      out += "null";
      break;
    case Kind::kBool:
      out += v.boolean ? "true" : "false";
      break;
    case Kind::kInt:
      out += std::to_string(v.integer);
      break;
    case Kind::kDouble:
      AppendNumber(out, v.number, false);
      break;
    case Kind::kString:
      AppendString(out, v.text);
      break;
    case Kind::kArray:
    case Kind::kObject: {
      bool object = v.kind == Kind::kObject;
      out += object ? '{' : '[';
      for (uint32_t i = 0; i < v.count && out.size() <= limit; ++i) {
        if (i) out += object && i % 2 ? ':' : ',';
        AppendNode(out, doc, doc.child(v, i), limit);
      }
      out += object ? '}' : ']';
    }
  }
}

std::string QuoteNode(const Document& doc, const Node& v) {
  std::string text;
  AppendNode(text, doc, v, 80);
  if (!IsUtf8(text)) {
    for (char& c : text) c = static_cast<unsigned char>(c) < 0x80 ? c : '?';
  }
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

}  // namespace

std::string Datatype(DLDataType dtype) {
  for (const Named& n : kDatatypes)
    if (Same(n.dtype, dtype)) return n.name;
  return "";
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string Quote(const ffi::Any& value) {
  std::string text;
  try {
    text = std::string(ffi::json::Stringify(value));
  } catch (const std::exception&) {
    text = "(a value)";
  }
  if (!IsUtf8(text)) {
    for (char& c : text) c = static_cast<unsigned char>(c) < 0x80 ? c : '?';
  }
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

void AppendString(std::string& out, std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\', out += c;
    } else if (u < 0x20) {
      out += "\\u00", out += kHex[u >> 4], out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

void AppendTensor(std::string& out, const ffi::Tensor& tensor, bool nested, const std::string& what) {
  const DLTensor* t = tensor.GetDLTensorPtr();
  std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
  const char* data = static_cast<const char*>(t->data) + t->byte_offset;
  int64_t count = Elements(shape);
  bool supported = DispatchJson(t->dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* values = reinterpret_cast<const T*>(data);
    if (nested && shape.empty()) return AppendElement(out, values[0]);
    if (!nested) shape = {count};  // one flat list
    // span[d]: the elements in one list at depth d; element i opens the lists whose span divides i (the innermost
    // first), and closes those whose span divides i + 1
    std::vector<int64_t> span(shape.size() + 1, 1);
    for (size_t d = shape.size(); d-- > 0;) span[d] = span[d + 1] * shape[d];
    if (count == 0) {  // lists down to the first empty dimension: [[], []] for shape (2, 0)
      std::function<void(size_t)> empty = [&](size_t d) {
        out += '[';
        for (int64_t k = 0; d + 1 < shape.size() && shape[d] > 0 && k < shape[d]; ++k)
          out += k ? "," : "", empty(d + 1);
        out += ']';
      };
      return empty(0);
    }
    size_t ndim = shape.size();
    for (int64_t i = 0; i < count; ++i) {
      if (i > 0) out += ',';
      for (size_t d = ndim; d-- > 0 && i % span[d] == 0;) out += '[';
      AppendElement(out, values[i]);
      for (size_t d = ndim; d-- > 0 && (i + 1) % span[d] == 0;) out += ']';
    }
  });
  if (!supported) {
    throw Error(400,
                what + " is " + Datatype(t->dtype) + ": ask for it as binary data (parameters.binary_data), not JSON");
  }
}

std::optional<size_t> HeaderLength(const std::string& value, bool present, size_t body_size) {
  if (!present) return std::nullopt;
  size_t length = 0;
  bool digits = !value.empty() && value.size() <= 19;
  for (char c : value) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) length = length * 10 + static_cast<size_t>(c - '0');
  }
  if (!digits || length == 0 || length > body_size) {
    throw Error(400, "Inference-Header-Content-Length is '" + value.substr(0, 40) +
                         "': it must be the length of the JSON header, 1 to the body's " + std::to_string(body_size) +
                         " bytes");
  }
  return length;
}

Request ParseRequest(std::string_view body, std::optional<size_t> header_length, const std::string& model,
                     const std::vector<TensorInfo>& inputs, const std::vector<TensorInfo>& outputs) {
  size_t json_size = header_length.value_or(body.size());
  Document doc = Read(body.substr(0, json_size), "the request");
  const Node& parsed = doc.root();
  if (parsed.kind != Kind::kObject)
    throw Error(400, "the request must be a JSON object, not " + QuoteNode(doc, parsed));
  Request request;
  if (const Node* id = doc.member(parsed, "id")) {
    if (id->kind != Kind::kString) throw Error(400, "the request's 'id' must be a string, not " + QuoteNode(doc, *id));
    request.id = ffi::String(std::string(id->text));
  }
  const Node* parameters = Parameters(doc, parsed, "the request");
  if (parameters) request.parameters = ToAny(doc, *parameters).cast<ffi::Map<ffi::Any, ffi::Any>>();
  bool binary_outputs = BoolParameter(doc, parameters, "binary_data_output", false, "the request");

  const Node* list = doc.member(parsed, "inputs");
  if (list == nullptr || list->kind != Kind::kArray)
    throw Error(400,
                "the request needs 'inputs', a list of tensors (model '" + model + "' takes " + Names(inputs) + ")");
  size_t cursor = json_size;  // where the next input's binary data starts
  for (uint32_t k = 0; k < list->count; ++k) {
    const Node& input = doc.child(*list, k);
    if (input.kind != Kind::kObject)
      throw Error(400, "each of 'inputs' must be an object, not " + QuoteNode(doc, input));
    std::string name = StringField(doc, input, "name", "an input");
    std::string what = "input '" + name + "'";
    const TensorInfo* expected = nullptr;
    for (const TensorInfo& t : inputs) expected = t.name == name ? &t : expected;
    if (expected == nullptr) {
      throw Error(400, "model '" + model + "' has no input named '" + name + "' (its inputs: " + Names(inputs) + ")");
    }
    if (request.inputs.count(name)) throw Error(400, what + " is given twice");
    std::string datatype = StringField(doc, input, "datatype", what);
    if (datatype != Datatype(expected->dtype)) {
      throw Error(400, what + " has datatype '" + datatype.substr(0, 40) + "' but model '" + model + "' expects " +
                           Datatype(expected->dtype));
    }
    const Node* shape_json = doc.member(input, "shape");
    if (shape_json == nullptr || shape_json->kind != Kind::kArray)
      throw Error(400, what + " needs a 'shape', a list of dimensions");
    std::vector<int64_t> shape;
    for (uint32_t i = 0; i < shape_json->count; ++i) {
      const Node& d = doc.child(*shape_json, i);
      if (d.kind != Kind::kInt || d.integer < 0 || d.integer > (int64_t{1} << 40))
        throw Error(400, what + " has a shape with the dimension " + QuoteNode(doc, d) + ", not a size");
      shape.push_back(d.integer);
    }
    bool fits = shape.size() == expected->shape.size();
    for (size_t i = 0; fits && i < shape.size(); ++i) fits = expected->shape[i] < 0 || expected->shape[i] == shape[i];
    if (!fits) {
      throw Error(400, what + " has shape " + ShapeText(shape) + " but model '" + model + "' expects " +
                           ShapeText(expected->shape));
    }
    size_t nbytes = Bytes(shape, expected->dtype);
    const Node* input_parameters = Parameters(doc, input, what);
    const Node* data = doc.member(input, "data");
    const Node* size = input_parameters ? doc.member(*input_parameters, "binary_data_size") : nullptr;
    if (size && data) throw Error(400, what + " has both 'data' and parameters.binary_data_size");
    if (!size && !data) throw Error(400, what + " has neither 'data' nor parameters.binary_data_size");
    ffi::Tensor tensor = EmptyHostTensor(shape, expected->dtype);
    char* out = static_cast<char*>(tensor.data_ptr());
    if (size) {
      if (size->kind != Kind::kInt || size->integer < 0)
        throw Error(400, what + "'s binary_data_size must be a number of bytes, not " + QuoteNode(doc, *size));
      if (static_cast<uint64_t>(size->integer) != nbytes) {
        throw Error(400, what + " has binary_data_size " + std::to_string(size->integer) + " but its shape " +
                             ShapeText(shape) + " of " + datatype + " needs " + std::to_string(nbytes) + " bytes");
      }
      if (!header_length) {
        throw Error(400, what +
                             " has binary_data_size but the request has no Inference-Header-Content-Length: "
                             "no binary data follows its JSON");
      }
      if (body.size() - cursor < nbytes) {
        throw Error(400, what + " has binary_data_size " + std::to_string(nbytes) + " but only " +
                             std::to_string(body.size() - cursor) + " bytes of binary data are left for it");
      }
      if (nbytes) std::memcpy(out, body.data() + cursor, nbytes);
      cursor += nbytes;
    } else {
      size_t count = static_cast<size_t>(Elements(shape));
      bool supported = DispatchJson(expected->dtype, [&](auto zero) {
        using T = decltype(zero);
        FillFromJson<T>(doc, *data, reinterpret_cast<T*>(out), count, name, datatype, shape);
      });
      if (!supported) throw Error(400, what + " is " + datatype + ": send it as binary data, not JSON 'data'");
    }
    request.inputs.Set(ffi::String(name), tensor);
  }
  for (const TensorInfo& t : inputs) {
    if (!request.inputs.count(t.name)) {
      throw Error(400, "model '" + model + "' needs input '" + t.name + "', which the request does not give");
    }
  }
  if (cursor != body.size()) {
    throw Error(400, "the request has " + std::to_string(body.size() - json_size) +
                         " bytes after its JSON header but its inputs' binary_data_size add up to " +
                         std::to_string(cursor - json_size));
  }

  const Node* requested = doc.member(parsed, "outputs");
  if (requested == nullptr || requested->kind == Kind::kNull) {
    for (const TensorInfo& t : outputs) request.outputs.emplace_back(t.name, binary_outputs);
    return request;
  }
  if (requested->kind != Kind::kArray)
    throw Error(400, "the request's 'outputs' must be a list, not " + QuoteNode(doc, *requested));
  std::set<std::string> seen;
  for (uint32_t k = 0; k < requested->count; ++k) {
    const Node& output = doc.child(*requested, k);
    if (output.kind != Kind::kObject)
      throw Error(400, "each of 'outputs' must be an object, not " + QuoteNode(doc, output));
    std::string name = StringField(doc, output, "name", "an output");
    std::string what = "output '" + name + "'";
    bool found = false;
    for (const TensorInfo& t : outputs) found = found || t.name == name;
    if (!found) {
      throw Error(400,
                  "model '" + model + "' has no output named '" + name + "' (its outputs: " + Names(outputs) + ")");
    }
    if (!seen.insert(name).second) throw Error(400, what + " is requested twice");
    const Node* output_parameters = Parameters(doc, output, what);
    if (output_parameters && doc.member(*output_parameters, "classification"))
      throw Error(400, what + " asks for classification, which this server does not do");
    request.outputs.emplace_back(name, BoolParameter(doc, output_parameters, "binary_data", binary_outputs, what));
  }
  return request;
}

Response EncodeResponse(const std::string& model, const std::string& version, const Request& request,
                        const ffi::Map<ffi::String, ffi::Tensor>& outputs) {
  std::string head = "{\"model_name\":", binary;
  AppendString(head, model);
  head += ",\"model_version\":";
  AppendString(head, version);
  if (auto id = request.id.as<ffi::String>()) head += ",\"id\":", AppendString(head, std::string(*id));
  head += ",\"outputs\":[";
  bool any_binary = false;
  for (const auto& [name, as_binary] : request.outputs) {
    auto found = outputs.find(ffi::String(name));
    if (found == outputs.end()) throw Error(500, "the engine gave no output '" + name + "'");
    const DLTensor* t = (*found).second.GetDLTensorPtr();
    std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
    if (head.back() != '[') head += ',';
    head += "{\"name\":";
    AppendString(head, name);
    head += ",\"datatype\":\"" + Datatype(t->dtype) + "\",\"shape\":" + ShapeText(shape);
    if (as_binary) {
      size_t nbytes = Bytes(shape, t->dtype);
      head += ",\"parameters\":{\"binary_data_size\":" + std::to_string(nbytes) + "}}";
      binary.append(static_cast<const char*>(t->data) + t->byte_offset, nbytes);
      any_binary = true;
    } else {
      head += ",\"data\":";
      AppendTensor(head, (*found).second, false, "output '" + name + "'");
      head += '}';
    }
  }
  head += "]}";
  Response response;
  if (any_binary) response.header_length = head.size();
  response.body = std::move(head);
  response.body += binary;
  return response;
}

ffi::Map<ffi::String, ffi::Tensor> ParseV1(std::string_view body, const std::vector<TensorInfo>& inputs) {
  Document doc = Read(body, "the body");
  const Node* map = doc.root().kind == Kind::kObject ? doc.member(doc.root(), "inputs") : nullptr;
  if (map == nullptr || map->kind != Kind::kObject) throw Error(422, "the body must be {\"inputs\": {name: values}}");
  ffi::Map<ffi::String, ffi::Tensor> out;
  for (uint32_t k = 0; k + 1 < map->count; k += 2) {
    std::string name(doc.child(*map, k).text);
    const Node& value = doc.child(*map, k + 1);
    DLDataType dtype{kDLFloat, 32, 1};  // a name the model lacks: the engine's Submit names the problem
    for (const TensorInfo& t : inputs) dtype = t.name == name ? t.dtype : dtype;
    std::vector<int64_t> shape;  // nested as its shape, as np.asarray reads it
    for (const Node* a = &value; a->kind == Kind::kArray;) {
      shape.push_back(a->count);
      if (a->count == 0) break;
      a = &doc.child(*a, 0);
    }
    ffi::Tensor tensor = EmptyHostTensor(shape, dtype);
    std::string datatype = Datatype(dtype);
    bool supported = DispatchJson(dtype, [&](auto zero) {
      using T = decltype(zero);
      FillFromJson<T>(doc, value, static_cast<T*>(tensor.data_ptr()), static_cast<size_t>(Elements(shape)), name,
                      datatype, shape);
    });
    if (!supported) throw Error(400, "input '" + name + "' is " + datatype + ": send it as binary data on /v2");
    out.Set(ffi::String(name), tensor);
  }
  return out;
}

namespace {

/*! \brief A model's tensors as the codec's Python caller gives them: [[name, "FP32", [1, 784]], ...]. */
std::vector<TensorInfo> Infos(const ffi::Array<ffi::Array<ffi::Any>>& list) {
  std::vector<TensorInfo> out;
  for (const auto& t : list) {
    TensorInfo info{std::string(t[0].cast<ffi::String>()), {}, {}};
    std::string datatype(t[1].cast<ffi::String>());
    const Named* named = nullptr;
    for (const Named& n : kDatatypes) named = datatype == n.name ? &n : named;
    if (named == nullptr) TVM_FFI_THROW(ValueError) << "no datatype " << datatype;
    info.dtype = named->dtype;
    for (const ffi::Any& d : t[2].cast<ffi::Array<ffi::Any>>()) info.shape.push_back(d.cast<int64_t>());
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace

Scheduling ReadScheduling(const ffi::Map<ffi::Any, ffi::Any>& parameters) {
  Scheduling out;
  if (auto found = parameters.find(ffi::String("priority")); found != parameters.end()) {
    const ffi::Any& p = (*found).second;
    auto text = p.as<ffi::String>();
    auto number = p.type_index() == ffi::TypeIndex::kTVMFFIBool ? std::nullopt : p.as<int64_t>();
    if ((number && *number == 1) || (text && (*text == "realtime" || *text == "1"))) {
      out.priority = 1;
    } else if ((text && *text == "best_effort") || (number && *number > 1)) {
      out.priority = 0;
    } else if (!((number && *number == 0) || (text && (*text == "" || *text == "0")) || p == nullptr)) {
      throw Error(400,
                  "parameter priority must be 0 (the model's), 1 or 'realtime' (real-time), 2 or more or "
                  "'best_effort', not " +
                      Quote(p));
    }
  }
  if (auto found = parameters.find(ffi::String("timeout")); found != parameters.end()) {
    const ffi::Any& t = (*found).second;
    auto us = t.type_index() == ffi::TypeIndex::kTVMFFIBool ? std::nullopt : t.as<int64_t>();
    if (!us || *us < 0) {
      throw Error(400, "parameter timeout must be a non-negative number of microseconds, not " + Quote(t));
    }
    out.timeout_us = *us;
  }
  return out;
}

namespace {

/*! \brief A request as the Python caller holds it between parse and encode: [id, [name, binary?]...]. */
ffi::Array<ffi::Any> Pending(const Request& request) {
  ffi::Array<ffi::Any> out{request.id};
  for (const auto& [name, binary] : request.outputs) out.push_back(ffi::Array<ffi::Any>{ffi::String(name), binary});
  return out;
}

Request FromPending(const ffi::Array<ffi::Any>& pending) {
  Request request;
  request.id = pending[0];
  for (size_t i = 1; i < pending.size(); ++i) {
    auto pair = pending[i].cast<ffi::Array<ffi::Any>>();
    request.outputs.emplace_back(std::string(pair[0].cast<ffi::String>()), pair[1].cast<bool>());
  }
  return request;
}

ffi::Array<ffi::Any> Refusal(const Error& err) { return {static_cast<int64_t>(err.status), ffi::String(err.what())}; }

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  // tvmsched.engine.kserve_codec(model, version, inputs, outputs) -> [parse, encode], two functions over the model's
  // tensors ([[name, datatype, shape], ...]). Each answers [status, one line] for a bad request (status > 0):
  //   parse(body: bytes, Inference-Header-Content-Length's value or None) -> [0, inputs, parameters, pending]
  //   encode(pending, outputs) -> [0, body: bytes, header_length: int, -1 when the body is all JSON]
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def("tvmsched.engine.kserve_codec", [](ffi::String model, ffi::String version,
                                                           ffi::Array<ffi::Array<ffi::Any>> inputs,
                                                           ffi::Array<ffi::Array<ffi::Any>> outputs) {
    auto in = std::make_shared<std::vector<TensorInfo>>(Infos(inputs));
    auto out = std::make_shared<std::vector<TensorInfo>>(Infos(outputs));
    std::string name(model), v(version);
    auto parse = ffi::Function::FromTyped([in, out, name](ffi::Bytes body, ffi::Optional<ffi::String> header) {
      try {
        std::string_view text(body.data(), body.size());
        std::optional<size_t> length =
            HeaderLength(header ? std::string(*header) : "", header.has_value(), text.size());
        Request request = ParseRequest(text, length, name, *in, *out);
        return ffi::Array<ffi::Any>{int64_t{0}, request.inputs, request.parameters, Pending(request)};
      } catch (const Error& err) {
        return Refusal(err);
      }
    });
    auto encode =
        ffi::Function::FromTyped([name, v](ffi::Array<ffi::Any> pending, ffi::Map<ffi::String, ffi::Tensor> outputs) {
          try {
            Response response = EncodeResponse(name, v, FromPending(pending), outputs);
            int64_t length = response.header_length ? static_cast<int64_t>(*response.header_length) : -1;
            return ffi::Array<ffi::Any>{int64_t{0}, ffi::Bytes(response.body), length};
          } catch (const Error& err) {
            return Refusal(err);
          }
        });
    return ffi::Array<ffi::Any>{parse, encode};
  });
  // tvmsched.engine.kserve_scheduling(parameters) -> [0, priority (1, 0, -1), timeout µs (0: none)] or [400, line]
  refl::GlobalDef().def("tvmsched.engine.kserve_scheduling", [](ffi::Map<ffi::Any, ffi::Any> parameters) {
    try {
      Scheduling s = ReadScheduling(parameters);
      return ffi::Array<ffi::Any>{int64_t{0}, static_cast<int64_t>(s.priority), s.timeout_us};
    } catch (const Error& err) {
      return Refusal(err);
    }
  });
}

}  // namespace kserve
}  // namespace tvmsched
