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
#include "protobuf_wire.h"
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

Error WrongCount(const std::string& input, size_t given, const std::vector<int64_t>& shape, size_t count) {
  return Error(400, "input '" + input + "' has " + std::to_string(given) + " elements in 'data'; its shape " +
                        ShapeText(shape) + " needs " + std::to_string(count));
}

/*! \brief `f(element)` for each element of `data` (flat or nested, as Triton accepts it; a scalar: itself), depth
 *  first, without recursion. */
template <typename F>
void ForEachElement(const Document& doc, const Node& data, F&& f) {
  if (data.kind != Kind::kArray) return f(data);
  std::vector<std::pair<const Node*, uint32_t>> stack{{&data, 0}};
  while (!stack.empty()) {
    auto& [array, at] = stack.back();
    if (at == array->count) {
      stack.pop_back();
      continue;
    }
    const Node& item = doc.child(*array, at++);
    if (item.kind == Kind::kArray)
      stack.push_back({&item, 0});
    else
      f(item);
  }
}

size_t JsonElements(const Document& doc, const Node& data) {
  size_t count = 0;
  ForEachElement(doc, data, [&](const Node&) { ++count; });
  return count;
}

/*! \brief Write `data`'s elements (JsonElements(data) of them, checked against `out`'s size first) into `out`; 400 on
 *  an element that does not fit. */
template <typename T>
void FillFromJson(const Document& doc, const Node& data, T* out, const std::string& input,
                  const std::string& datatype) {
  size_t written = 0;
  ForEachElement(doc, data, [&](const Node& v) { out[written++] = Element<T>(doc, v, input, datatype); });
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

/*! \brief The elements of a shape of sizes (each 0 to 2^40), at most 2^62: a larger count than any body holds. */
int64_t Elements(const std::vector<int64_t>& shape) {
  constexpr int64_t kMost = int64_t{1} << 62;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    n = n > kMost / d ? kMost : n * d;
  }
  return n;
}

/*! \brief A shape's bytes (at most SIZE_MAX: a claim no body meets). */
size_t Bytes(const std::vector<int64_t>& shape, DLDataType dtype) {
  auto elements = static_cast<size_t>(Elements(shape));
  size_t each = (dtype.bits * dtype.lanes + 7) / 8;
  return each && elements > SIZE_MAX / each ? SIZE_MAX : elements * each;
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

namespace {

// The checks both wire formats make (a REST body's JSON, a gRPC ModelInferRequest), with the same lines.

/*! \brief The model's input a request's tensor `name` of `datatype` and `shape` is for: 400 when the model has no such
 *  input, the request gave it already, or the datatype or shape is not the model's. */
const TensorInfo& ExpectedInput(const std::string& model, const std::vector<TensorInfo>& inputs, const Request& request,
                                const std::string& name, const std::string& datatype,
                                const std::vector<int64_t>& shape) {
  const TensorInfo* expected = nullptr;
  for (const TensorInfo& t : inputs) expected = t.name == name ? &t : expected;
  if (expected == nullptr) {
    throw Error(400, "model '" + model + "' has no input named '" + name + "' (its inputs: " + Names(inputs) + ")");
  }
  std::string what = "input '" + name + "'";
  if (request.inputs.count(name)) throw Error(400, what + " is given twice");
  if (datatype != Datatype(expected->dtype)) {
    throw Error(400, what + " has datatype '" + datatype.substr(0, 40) + "' but model '" + model + "' expects " +
                         Datatype(expected->dtype));
  }
  bool fits = shape.size() == expected->shape.size();
  for (size_t i = 0; fits && i < shape.size(); ++i) fits = expected->shape[i] < 0 || expected->shape[i] == shape[i];
  if (!fits) {
    throw Error(400, what + " has shape " + ShapeText(shape) + " but model '" + model + "' expects " +
                         ShapeText(expected->shape));
  }
  return *expected;
}

/*! \brief A dimension of an input's shape: 400 unless it is a size (0 to 2^40). */
void CheckDimension(int64_t d, const std::string& what, const std::function<std::string()>& quoted) {
  if (d < 0 || d > (int64_t{1} << 40))
    throw Error(400, what + " has a shape with the dimension " + quoted() + ", not a size");
}

void RequireEveryInput(const std::string& model, const std::vector<TensorInfo>& inputs, const Request& request) {
  for (const TensorInfo& t : inputs) {
    if (!request.inputs.count(t.name)) {
      throw Error(400, "model '" + model + "' needs input '" + t.name + "', which the request does not give");
    }
  }
}

/*! \brief Add the output `name` to answer (as binary data or not): 400 when the model has no such output, it is
 *  requested twice, or it asks for classification. */
void RequestOutput(const std::string& model, const std::vector<TensorInfo>& outputs, Request& request,
                   const std::string& name, bool binary, bool classification) {
  std::string what = "output '" + name + "'";
  bool found = false;
  for (const TensorInfo& t : outputs) found = found || t.name == name;
  if (!found) {
    throw Error(400, "model '" + model + "' has no output named '" + name + "' (its outputs: " + Names(outputs) + ")");
  }
  for (const auto& given : request.outputs)
    if (given.first == name) throw Error(400, what + " is requested twice");
  if (classification) throw Error(400, what + " asks for classification, which this server does not do");
  request.outputs.emplace_back(name, binary);
}

}  // namespace

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
    std::string datatype = StringField(doc, input, "datatype", what);
    const Node* shape_json = doc.member(input, "shape");
    if (shape_json == nullptr || shape_json->kind != Kind::kArray)
      throw Error(400, what + " needs a 'shape', a list of dimensions");
    std::vector<int64_t> shape;
    for (uint32_t i = 0; i < shape_json->count; ++i) {
      const Node& d = doc.child(*shape_json, i);
      CheckDimension(d.kind == Kind::kInt ? d.integer : -1, what, [&] { return QuoteNode(doc, d); });
      shape.push_back(d.integer);
    }
    const TensorInfo* expected = &ExpectedInput(model, inputs, request, name, datatype, shape);
    size_t nbytes = Bytes(shape, expected->dtype);
    const Node* input_parameters = Parameters(doc, input, what);
    const Node* data = doc.member(input, "data");
    const Node* size = input_parameters ? doc.member(*input_parameters, "binary_data_size") : nullptr;
    if (size && data) throw Error(400, what + " has both 'data' and parameters.binary_data_size");
    if (!size && !data) throw Error(400, what + " has neither 'data' nor parameters.binary_data_size");
    // every size is checked before the tensor is allocated: a shape is the client's claim (2^40 rows, say)
    ffi::Tensor tensor;
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
      tensor = EmptyHostTensor(shape, expected->dtype);
      if (nbytes) std::memcpy(tensor.data_ptr(), body.data() + cursor, nbytes);
      cursor += nbytes;
    } else {
      size_t count = static_cast<size_t>(Elements(shape));
      if (!DispatchJson(expected->dtype, [](auto) {}))
        throw Error(400, what + " is " + datatype + ": send it as binary data, not JSON 'data'");
      if (size_t given = JsonElements(doc, *data); given != count) throw WrongCount(name, given, shape, count);
      tensor = EmptyHostTensor(shape, expected->dtype);
      DispatchJson(expected->dtype, [&](auto zero) {
        using T = decltype(zero);
        FillFromJson<T>(doc, *data, static_cast<T*>(tensor.data_ptr()), name, datatype);
      });
    }
    request.inputs.Set(ffi::String(name), tensor);
  }
  RequireEveryInput(model, inputs, request);
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
  for (uint32_t k = 0; k < requested->count; ++k) {
    const Node& output = doc.child(*requested, k);
    if (output.kind != Kind::kObject)
      throw Error(400, "each of 'outputs' must be an object, not " + QuoteNode(doc, output));
    std::string name = StringField(doc, output, "name", "an output");
    const Node* output_parameters = Parameters(doc, output, "output '" + name + "'");
    RequestOutput(model, outputs, request, name,
                  BoolParameter(doc, output_parameters, "binary_data", binary_outputs, "output '" + name + "'"),
                  output_parameters && doc.member(*output_parameters, "classification"));
  }
  return request;
}

namespace {

/*! \brief The engine's output `name` (500 when it gave none: a model's outputs are checked when it loads). */
ffi::Tensor EngineOutput(const ffi::Map<ffi::String, ffi::Tensor>& outputs, const std::string& name) {
  auto found = outputs.find(ffi::String(name));
  if (found == outputs.end()) throw Error(500, "the engine gave no output '" + name + "'");
  return (*found).second;
}

}  // namespace

Response EncodeResponse(const std::string& model, const std::string& version, const Request& request,
                        const ffi::Map<ffi::String, ffi::Tensor>& outputs) {
  // The JSON header first, then the binary outputs appended to it in one allocation (each output copied once: a
  // 64 KiB output copied twice more, into its own buffer and again behind the header, cost bert-tiny's answer ~3 µs)
  std::string head = "{\"model_name\":";
  AppendString(head, model);
  head += ",\"model_version\":";
  AppendString(head, version);
  if (auto id = request.id.as<ffi::String>()) head += ",\"id\":", AppendString(head, std::string(*id));
  head += ",\"outputs\":[";
  std::vector<std::pair<const DLTensor*, size_t>> binary;  // the binary outputs in order, and their sizes
  size_t binary_bytes = 0;
  for (const auto& [name, as_binary] : request.outputs) {
    ffi::Tensor tensor = EngineOutput(outputs, name);
    const DLTensor* t = tensor.GetDLTensorPtr();
    std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
    if (head.back() != '[') head += ',';
    head += "{\"name\":";
    AppendString(head, name);
    head += ",\"datatype\":\"" + Datatype(t->dtype) + "\",\"shape\":" + ShapeText(shape);
    if (as_binary) {
      size_t nbytes = Bytes(shape, t->dtype);
      head += ",\"parameters\":{\"binary_data_size\":" + std::to_string(nbytes) + "}}";
      binary.emplace_back(t, nbytes);
      binary_bytes += nbytes;
    } else {
      head += ",\"data\":";
      AppendTensor(head, tensor, false, "output '" + name + "'");
      head += '}';
    }
  }
  head += "]}";
  Response response;
  if (!binary.empty()) {
    response.header_length = head.size();
    head.reserve(head.size() + binary_bytes);
    for (const auto& [t, nbytes] : binary) head.append(static_cast<const char*>(t->data) + t->byte_offset, nbytes);
  }
  response.body = std::move(head);
  return response;
}

namespace {

namespace wire = protobuf_wire;

const char kNotAMessage[] =
    "the request is not an inference.ModelInferRequest message protobuf can decode (malformed, truncated, or nested "
    "deeper than its limit): ";

/*! \brief A proto3 string field: its bytes, which must be UTF-8 (as protobuf's parsers require). */
std::string Utf8(std::string_view bytes) {
  if (!IsUtf8(bytes)) throw std::invalid_argument("a string field that is not UTF-8");
  return std::string(bytes);
}

/*! \brief An InferParameter (its oneof's value; none set: None). */
ffi::Any ReadParameter(std::string_view bytes) {
  ffi::Any value;
  wire::ForEachField(bytes, [&](uint32_t field, int type, wire::Reader& r) {
    if (field == 1 && type == wire::kVarint) {
      value = r.Varint() != 0;
    } else if ((field == 2 || field == 5) && type == wire::kVarint) {
      uint64_t v = r.Varint();  // int64_param (two's complement), uint64_param (past int64's range: a double)
      if (field == 2 || v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        value = static_cast<int64_t>(v);
      else
        value = static_cast<double>(v);
    } else if (field == 3 && type == wire::kLength) {
      value = ffi::String(Utf8(r.Bytes()));
    } else if (field == 4 && type == wire::kFixed64) {
      value = r.Fixed<double>();
    } else {
      return false;
    }
    return true;
  });
  return value;
}

/*! \brief One entry of a map<string, InferParameter> into `out`. */
void ReadParameterEntry(std::string_view bytes, ffi::Map<ffi::Any, ffi::Any>& out) {
  std::string key;
  ffi::Any value;
  wire::ForEachField(bytes, [&](uint32_t field, int type, wire::Reader& r) {
    if (type != wire::kLength || (field != 1 && field != 2)) return false;
    if (field == 1)
      key = Utf8(r.Bytes());
    else
      value = ReadParameter(r.Bytes());
    return true;
  });
  out.Set(ffi::String(key), value);
}

/*! \brief An InferInputTensor as read: the checks come after the whole message is read. */
struct InputTensor {
  std::string name, datatype;
  std::vector<int64_t> shape;
  std::string_view contents;  // its InferTensorContents message (empty: none)
};

InputTensor ReadInputTensor(std::string_view bytes) {
  InputTensor t;
  wire::ForEachField(bytes, [&](uint32_t field, int type, wire::Reader& r) {
    if (field == 3) return wire::ReadRepeated(r, type, wire::kVarint, t.shape);
    if (type != wire::kLength) return false;
    if (field == 1) {
      t.name = Utf8(r.Bytes());
    } else if (field == 2) {
      t.datatype = Utf8(r.Bytes());
    } else if (field == 5) {
      t.contents = r.Bytes();  // (a message given twice merges in protobuf; clients send it once)
    } else {
      return false;
    }
    return true;
  });
  return t;
}

/*! \brief An InferRequestedOutputTensor: its name, and whether its parameters ask for classification. */
std::pair<std::string, bool> ReadOutputTensor(std::string_view bytes) {
  std::pair<std::string, bool> out{"", false};
  wire::ForEachField(bytes, [&](uint32_t field, int type, wire::Reader& r) {
    if (type != wire::kLength || (field != 1 && field != 2)) return false;
    if (field == 1) {
      out.first = Utf8(r.Bytes());
    } else {
      ffi::Map<ffi::Any, ffi::Any> parameters;
      ReadParameterEntry(r.Bytes(), parameters);
      out.second = out.second || parameters.count(ffi::String("classification"));
    }
    return true;
  });
  return out;
}

/*! \brief The InferTensorContents field that holds elements of `dtype`, and its wire type when packed elements are
 *  fixed-width (0: varints); field 0: none (FP16, BF16 come only as raw contents). */
std::pair<uint32_t, int> ContentsField(DLDataType dtype) {
  switch (dtype.code) {
    case kDLBool:
      return {1, 0};
    case kDLInt:
      return {dtype.bits == 64 ? 3u : 2u, 0};
    case kDLUInt:
      return {dtype.bits == 64 ? 5u : 4u, 0};
    case kDLFloat:
      if (dtype.bits == 32) return {6, wire::kFixed32};
      if (dtype.bits == 64) return {7, wire::kFixed64};
  }
  return {0, 0};
}

/*! \brief Typed contents' `count` elements of the input's datatype, each as its varint's or fixed value's bits: 400 for
 *  another count or a datatype without typed contents. */
std::vector<uint64_t> ReadContents(std::string_view contents, const TensorInfo& info, const std::vector<int64_t>& shape,
                                   size_t count, const std::string& datatype) {
  auto [number, fixed] = ContentsField(info.dtype);
  std::string what = "input '" + info.name + "'";
  if (number == 0) throw Error(400, what + " is " + datatype + ": send it in raw_input_contents, not typed contents");
  // the elements, as read: varints as their 64 bits, fixed-width values as their bits
  std::vector<uint64_t> values;
  wire::ForEachField(contents, [&](uint32_t field, int type, wire::Reader& r) {
    return field == number && wire::ReadRepeated(r, type, fixed ? fixed : wire::kVarint, values);
  });
  if (values.size() != count) {
    throw Error(400, what + " has " + std::to_string(values.size()) + " elements in its contents; its shape " +
                         ShapeText(shape) + " needs " + std::to_string(count));
  }
  return values;
}

/*! \brief ReadContents' values into `out` as the input's datatype: 400 for a value out of its range (an int_contents
 *  value for INT8, say). */
void StoreContents(const std::vector<uint64_t>& values, const TensorInfo& info, char* out,
                   const std::string& datatype) {
  std::string what = "input '" + info.name + "'";
  size_t count = values.size();
  DispatchJson(info.dtype, [&](auto zero) {
    using T = decltype(zero);
    T* to = reinterpret_cast<T*>(out);
    for (size_t i = 0; i < count; ++i) {
      uint64_t bits = values[i];
      if constexpr (std::is_same_v<T, float>) {
        std::memcpy(&to[i], &bits, 4);  // (the low 4 bytes: little-endian)
      } else if constexpr (std::is_same_v<T, double>) {
        std::memcpy(&to[i], &bits, 8);
      } else if constexpr (std::is_same_v<T, bool>) {
        to[i] = bits != 0;
      } else if constexpr (std::is_integral_v<T>) {
        // int_contents are int32 (sign-extended on the wire), uint_contents uint32; both must fit the datatype
        bool signed_field = ContentsField(info.dtype).first == 2 || ContentsField(info.dtype).first == 3;
        bool fits;
        if (signed_field) {
          auto v = static_cast<int64_t>(bits);
          fits = v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                 v <= static_cast<int64_t>(std::numeric_limits<T>::max());
        } else {
          fits = bits <= static_cast<uint64_t>(std::numeric_limits<T>::max());
        }
        if (!fits) {
          std::string text = signed_field ? std::to_string(static_cast<int64_t>(bits)) : std::to_string(bits);
          throw Error(400, what + " holds " + text + ", which is not a " + datatype + " value");
        }
        to[i] = static_cast<T>(bits);
      }
    }
  });
}

}  // namespace

std::pair<std::string, std::string> InferMessageModel(std::string_view message) {
  std::pair<std::string, std::string> out;
  try {
    wire::ForEachField(message, [&](uint32_t field, int type, wire::Reader& r) {
      if (type != wire::kLength || (field != 1 && field != 2)) return false;
      (field == 1 ? out.first : out.second) = Utf8(r.Bytes());
      return true;
    });
  } catch (const std::invalid_argument& err) {
    throw Error(400, kNotAMessage + std::string(err.what()));
  }
  return out;
}

Request ParseInferMessage(std::string_view message, const std::string& model, const std::vector<TensorInfo>& inputs,
                          const std::vector<TensorInfo>& outputs) {
  Request request;
  std::vector<InputTensor> given;
  std::vector<std::string_view> raw;
  std::vector<std::pair<std::string, bool>> wanted;
  std::string_view named;  // model_name (the last one, as protobuf reads a field given twice)
  try {
    wire::ForEachField(message, [&](uint32_t field, int type, wire::Reader& r) {
      if (type != wire::kLength || field < 1 || field > 7) return false;  // fields this proto does not have
      std::string_view bytes = r.Bytes();
      if (field <= 2) {
        Utf8(bytes);  // model_name and model_version: the server read them to choose this codec
        if (field == 1) named = bytes;
      } else if (field == 3) {
        request.id = ffi::String(Utf8(bytes));
      } else if (field == 4) {
        ReadParameterEntry(bytes, request.parameters);
      } else if (field == 5) {
        given.push_back(ReadInputTensor(bytes));
      } else if (field == 6) {
        wanted.push_back(ReadOutputTensor(bytes));
      } else {
        raw.push_back(bytes);
      }
      return true;
    });
  } catch (const std::invalid_argument& err) {
    throw Error(400, kNotAMessage + std::string(err.what()));
  }
  if (named != model) {  // (a server that peeked at the first model_name: the message names another model last)
    throw Error(400, "the request's model_name is '" + std::string(named) + "', not '" + model + "'");
  }
  if (!raw.empty() && raw.size() != given.size()) {
    throw Error(400, "the request has " + std::to_string(raw.size()) + " raw_input_contents for its " +
                         std::to_string(given.size()) + " inputs (one each, in order)");
  }
  for (size_t k = 0; k < given.size(); ++k) {
    const InputTensor& t = given[k];
    std::string what = "input '" + t.name + "'";
    for (int64_t d : t.shape) CheckDimension(d, what, [d] { return std::to_string(d); });
    const TensorInfo& expected = ExpectedInput(model, inputs, request, t.name, t.datatype, t.shape);
    size_t nbytes = Bytes(t.shape, expected.dtype);
    if (!raw.empty() && raw[k].size() != nbytes) {
      throw Error(400, what + " has " + std::to_string(raw[k].size()) + " bytes of raw_input_contents but its shape " +
                           ShapeText(t.shape) + " of " + t.datatype + " needs " + std::to_string(nbytes) + " bytes");
    }
    if (raw.empty() && t.contents.empty() && nbytes) {
      throw Error(400, what + " has neither raw_input_contents nor contents");
    }
    std::vector<uint64_t> values;  // (typed contents: read and counted first)
    if (raw.empty()) values = ReadContents(t.contents, expected, t.shape, Elements(t.shape), t.datatype);
    ffi::Tensor tensor = EmptyHostTensor(t.shape, expected.dtype);  // sizes checked first: a shape is a claim
    char* out = static_cast<char*>(tensor.data_ptr());
    if (!raw.empty()) {
      if (nbytes) std::memcpy(out, raw[k].data(), nbytes);
    } else {
      StoreContents(values, expected, out, t.datatype);
    }
    request.inputs.Set(ffi::String(t.name), tensor);
  }
  RequireEveryInput(model, inputs, request);
  if (wanted.empty()) {
    for (const TensorInfo& t : outputs) request.outputs.emplace_back(t.name, true);
  }
  for (const auto& [name, classification] : wanted) RequestOutput(model, outputs, request, name, true, classification);
  return request;
}

std::string EncodeInferMessage(const std::string& model, const std::string& version, const Request& request,
                               const ffi::Map<ffi::String, ffi::Tensor>& outputs) {
  // the output tensors' messages first (small), then the response with the raw contents appended once, in order
  std::string head;
  wire::Writer w(head);
  w.Bytes(1, model);
  if (!version.empty()) w.Bytes(2, version);
  if (auto id = request.id.as<ffi::String>(); id && !id->empty()) w.Bytes(3, std::string_view(id->data(), id->size()));
  std::vector<std::pair<const char*, size_t>> contents;
  size_t total = 0;
  for (const auto& [name, binary] : request.outputs) {
    ffi::Tensor tensor = EngineOutput(outputs, name);
    const DLTensor* t = tensor.GetDLTensorPtr();
    std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
    std::string dims, message;
    wire::Writer d(dims);
    for (int64_t x : shape) d.Varint(static_cast<uint64_t>(x));
    wire::Writer o(message);
    o.Bytes(1, name);
    o.Bytes(2, Datatype(t->dtype));
    o.Bytes(3, dims);
    w.Bytes(5, message);
    size_t nbytes = Bytes(shape, t->dtype);
    contents.emplace_back(static_cast<const char*>(t->data) + t->byte_offset, nbytes);
    total += nbytes + 12;
  }
  head.reserve(head.size() + total);
  for (const auto& [data, nbytes] : contents) {
    w.LengthOf(6, nbytes);
    head.append(data, nbytes);
  }
  return head;
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
    std::string datatype = Datatype(dtype);
    if (!DispatchJson(dtype, [](auto) {}))
      throw Error(400, "input '" + name + "' is " + datatype + ": send it as binary data on /v2");
    // a ragged list is refused before its first elements' shape is allocated (three nested lists of 1000 in a body
    // of a few KiB would be 10^9 elements)
    auto count = static_cast<size_t>(Elements(shape));
    if (size_t given = JsonElements(doc, value); given != count) throw WrongCount(name, given, shape, count);
    ffi::Tensor tensor = EmptyHostTensor(shape, dtype);
    DispatchJson(dtype, [&](auto zero) {
      using T = decltype(zero);
      FillFromJson<T>(doc, value, static_cast<T*>(tensor.data_ptr()), name, datatype);
    });
    out.Set(ffi::String(name), tensor);
  }
  return out;
}

std::string EncodeV1(const ffi::Map<ffi::String, ffi::Tensor>& outputs) {
  std::string out = "{\"outputs\":{";
  for (const auto& [key, value] : outputs) {
    if (out.back() != '{') out += ',';
    AppendString(out, std::string(key));
    out += ':';
    AppendTensor(out, value, true, "output '" + std::string(key) + "'");
  }
  return out + "}}";
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
      throw Error(400,
                  "parameter timeout must be a whole number of microseconds, 0 or more (0: none), not " + Quote(t));
    }
    out.timeout_us = *us;
  }
  return out;
}

ffi::Array<ffi::Any> Pending(const Request& request) {
  ffi::Array<ffi::Any> out{request.id};
  for (const auto& [name, binary] : request.outputs) out.push_back(ffi::Array<ffi::Any>{ffi::String(name), binary});
  return out;
}

ffi::Array<ffi::Any> Refusal(const Error& err) { return {static_cast<int64_t>(err.status), ffi::String(err.what())}; }

namespace {

Request FromPending(const ffi::Array<ffi::Any>& pending) {
  Request request;
  request.id = pending[0];
  for (size_t i = 1; i < pending.size(); ++i) {
    auto pair = pending[i].cast<ffi::Array<ffi::Any>>();
    request.outputs.emplace_back(std::string(pair[0].cast<ffi::String>()), pair[1].cast<bool>());
  }
  return request;
}

}  // namespace

ffi::Array<ffi::Any> CodecFunctions(const std::string& name, const std::string& v, std::vector<TensorInfo> inputs,
                                    std::vector<TensorInfo> outputs) {
  auto in = std::make_shared<std::vector<TensorInfo>>(std::move(inputs));
  auto out = std::make_shared<std::vector<TensorInfo>>(std::move(outputs));
  auto parsed = [](const Request& request) {
    return ffi::Array<ffi::Any>{int64_t{0}, request.inputs, request.parameters, Pending(request)};
  };
  auto parse = ffi::Function::FromTyped([in, out, name, parsed](ffi::Bytes body, ffi::Optional<ffi::String> header) {
    try {
      std::string_view text(body.data(), body.size());
      std::optional<size_t> length = HeaderLength(header ? std::string(*header) : "", header.has_value(), text.size());
      return parsed(ParseRequest(text, length, name, *in, *out));
    } catch (const Error& err) {
      return Refusal(err);
    }
  });
  auto encode =
      ffi::Function::FromTyped([name, v](ffi::Array<ffi::Any> pending, ffi::Map<ffi::String, ffi::Tensor> outputs) {
        try {
          Response response = EncodeResponse(name, v, FromPending(pending), outputs);
          int64_t length = response.header_length ? static_cast<int64_t>(*response.header_length) : -1;
          return ffi::Array<ffi::Any>{int64_t{0}, ffi::Bytes(std::move(response.body)), length};
        } catch (const Error& err) {
          return Refusal(err);
        }
      });
  auto parse_message = ffi::Function::FromTyped([in, out, name, parsed](ffi::Bytes message) {
    try {
      return parsed(ParseInferMessage(std::string_view(message.data(), message.size()), name, *in, *out));
    } catch (const Error& err) {
      return Refusal(err);
    }
  });
  auto encode_message = ffi::Function::FromTyped([name, v](ffi::Array<ffi::Any> pending,
                                                           ffi::Map<ffi::String, ffi::Tensor> outputs) {
    try {
      return ffi::Array<ffi::Any>{int64_t{0}, ffi::Bytes(EncodeInferMessage(name, v, FromPending(pending), outputs))};
    } catch (const Error& err) {
      return Refusal(err);
    }
  });
  // /v1 (examples/server.py's contract), for the model's inputs: parse_v1(body) -> [0, inputs];
  // encode_v1(outputs) -> [0, body]
  auto parse_v1 = ffi::Function::FromTyped([in](ffi::Bytes body) {
    try {
      return ffi::Array<ffi::Any>{int64_t{0}, ParseV1(std::string_view(body.data(), body.size()), *in)};
    } catch (const Error& err) {
      return Refusal(err);
    }
  });
  auto encode_v1 = ffi::Function::FromTyped([](ffi::Map<ffi::String, ffi::Tensor> outputs) {
    try {
      return ffi::Array<ffi::Any>{int64_t{0}, ffi::Bytes(EncodeV1(outputs))};
    } catch (const Error& err) {
      return Refusal(err);
    }
  });
  return ffi::Array<ffi::Any>{parse, encode, parse_message, encode_message, parse_v1, encode_v1};
}

TVM_FFI_STATIC_INIT_BLOCK() {
  // tvmsched.engine.kserve_codec(model, version, inputs, outputs) -> [parse, encode, parse_message, encode_message,
  // parse_v1, encode_v1],
  // functions over the model's tensors ([[name, datatype, shape], ...]). Each answers [status, one line] for a bad
  // request (status > 0):
  //   parse(body: bytes, Inference-Header-Content-Length's value or None) -> [0, inputs, parameters, pending]
  //   encode(pending, outputs) -> [0, body: bytes, header_length: int, -1 when the body is all JSON]
  //   parse_message(ModelInferRequest: bytes) -> [0, inputs, parameters, pending]
  //   encode_message(pending, outputs) -> [0, ModelInferResponse: bytes]
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def("tvmsched.engine.kserve_codec",
                        [](ffi::String model, ffi::String version, ffi::Array<ffi::Array<ffi::Any>> inputs,
                           ffi::Array<ffi::Array<ffi::Any>> outputs) {
                          return CodecFunctions(model, version, Infos(inputs), Infos(outputs));
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
