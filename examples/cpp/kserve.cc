// The Open Inference Protocol's request and response bodies (kserve.h).
#include "kserve.h"

#include <tvmsched/engine.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <type_traits>

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

/*! \brief A value from the client, quoted for an error line (nlohmann's dump, invalid UTF-8 replaced, cut short). */
std::string Quote(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

/*! \brief Call `f(T{})` with the C++ type of `dtype` (the datatypes JSON data can hold; bool stored as a byte). */
template <typename F>
bool DispatchJson(DLDataType dtype, F&& f) {
  if (dtype.lanes != 1) return false;
  switch (dtype.code) {
    case kDLBool:
      if (dtype.bits == 8) return f(bool{}), true;
      break;
    case kDLFloat:
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

/*! \brief One element of an input's JSON data as a T, or a 400 naming what is wrong with it. */
template <typename T>
T Element(const json& v, const std::string& input, const std::string& datatype) {
  auto bad = [&]() {
    return Error(400, "input '" + input + "' holds " + Quote(v) + ", which is not a " + datatype + " value");
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) throw bad();
    return v.get<bool>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (v.is_string()) {  // how JSON outputs carry non-finite values (NonFinite), sent back
      const std::string& text = v.get_ref<const std::string&>();
      if (text == "NaN") return std::numeric_limits<T>::quiet_NaN();
      if (text == "Infinity") return std::numeric_limits<T>::infinity();
      if (text == "-Infinity") return -std::numeric_limits<T>::infinity();
    }
    if (!v.is_number()) throw bad();
    return static_cast<T>(v.get<double>());
  } else {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw bad();
      return static_cast<T>(u);
    }
    if (!v.is_number_integer()) throw bad();
    int64_t i = v.get<int64_t>();  // negative (nlohmann parses non-negative integers as unsigned)
    if (!std::is_signed_v<T> || i < static_cast<int64_t>(std::numeric_limits<T>::min())) throw bad();
    return static_cast<T>(i);
  }
}

/*! \brief Write `data` (flat or nested, as Triton accepts it) into `out` of `count` elements; 400 on a count
 *  or element that does not fit. */
template <typename T>
void FillFromJson(const json& data, T* out, size_t count, const std::string& input, const std::string& datatype,
                  const std::vector<int64_t>& shape) {
  size_t written = 0;
  auto wrong_count = [&](size_t got) {
    return Error(400, "input '" + input + "' has " + std::to_string(got) + " elements in 'data'; its shape " +
                          ShapeText(shape) + " needs " + std::to_string(count));
  };
  std::vector<std::pair<const json*, size_t>> stack;  // depth-first, without recursion
  if (!data.is_array()) {
    if (count != 1) throw wrong_count(1);
    out[0] = Element<T>(data, input, datatype);
    return;
  }
  stack.push_back({&data, 0});
  size_t seen = 0;  // elements counted past `count` (to name how many came)
  while (!stack.empty()) {
    auto& [array, at] = stack.back();
    if (at == array->size()) {
      stack.pop_back();
      continue;
    }
    const json& item = (*array)[at++];
    if (item.is_array()) {
      stack.push_back({&item, 0});
    } else if (written < count) {
      out[written++] = Element<T>(item, input, datatype);
    } else {
      ++seen;
    }
  }
  if (written != count || seen) throw wrong_count(written + seen);
}

template <typename T>
void AppendJson(json& out, const char* data, size_t count) {
  const T* values = reinterpret_cast<const T*>(data);
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_floating_point_v<T>)
      out.push_back(FloatJson(static_cast<double>(values[i])));
    else
      out.push_back(values[i]);
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
const json* Parameters(const json& owner, const std::string& what) {
  auto found = owner.find("parameters");
  if (found == owner.end() || found->is_null()) return nullptr;
  if (!found->is_object()) throw Error(400, what + "'s 'parameters' must be an object, not " + Quote(*found));
  return &*found;
}

/*! \brief A boolean parameter (`fallback` when absent). */
bool BoolParameter(const json* parameters, const char* key, bool fallback, const std::string& what) {
  if (parameters == nullptr) return fallback;
  auto found = parameters->find(key);
  if (found == parameters->end()) return fallback;
  if (!found->is_boolean())
    throw Error(400, what + "'s parameter '" + key + "' must be true or false, not " + Quote(*found));
  return found->get<bool>();
}

const std::string& StringField(const json& owner, const char* key, const std::string& what) {
  auto found = owner.find(key);
  if (found == owner.end()) throw Error(400, what + " has no '" + key + "'");
  if (!found->is_string()) throw Error(400, what + "'s '" + key + "' must be a string, not " + Quote(*found));
  return found->get_ref<const std::string&>();
}

std::string Names(const std::vector<TensorInfo>& tensors) {
  std::string out;
  for (const TensorInfo& t : tensors) out += (out.empty() ? "'" : ", '") + t.name + "'";
  return out;
}

}  // namespace

json FloatJson(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return value;
}

std::string Datatype(DLDataType dtype) {
  for (const Named& n : kDatatypes)
    if (Same(n.dtype, dtype)) return n.name;
  return "";
}

std::string ConfigDatatype(DLDataType dtype) {
  std::string name = Datatype(dtype);
  return name.empty() ? "TYPE_INVALID" : "TYPE_" + name;
}

json Metadata(const TensorInfo& tensor) {
  return {{"name", tensor.name}, {"datatype", Datatype(tensor.dtype)}, {"shape", tensor.shape}};
}

std::string NonFiniteHint(const std::string& text, size_t byte) {
  // nlohmann's error byte is one past the character it stopped at: the N or I of NaN, Infinity or -Infinity
  if (byte == 0 || byte > text.size()) return "";
  size_t at = byte - 1;
  for (const char* literal : {"NaN", "Infinity"}) {
    if (text.compare(at, std::strlen(literal), literal) == 0) {
      return std::string(": ") + (at > 0 && text[at - 1] == '-' ? "-" : "") + literal +
             " is not a JSON number; send non-finite values as the strings \"NaN\", \"Infinity\", \"-Infinity\", "
             "or as binary data";
    }
  }
  return "";
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
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

Request ParseRequest(const std::string& body, std::optional<size_t> header_length, const std::string& model,
                     const std::vector<TensorInfo>& inputs, const std::vector<TensorInfo>& outputs) {
  size_t json_size = header_length.value_or(body.size());
  std::string header = body.substr(0, json_size);
  try {  // nlohmann's parser recurses per level: 100000 '[' would overflow the stack
    tvmsched::CheckJsonDepth(header, "the request's JSON", tvmsched::kMaxJsonDepth);
  } catch (const std::invalid_argument& err) {
    throw Error(400, err.what());
  }
  json parsed;
  try {
    parsed = json::parse(header);
  } catch (const json::parse_error& err) {
    throw Error(400, "the request is not valid JSON (parse error at byte " + std::to_string(err.byte) + ")" +
                         NonFiniteHint(header, err.byte));
  }
  if (!parsed.is_object()) throw Error(400, "the request must be a JSON object, not " + Quote(parsed));
  Request request;
  if (auto id = parsed.find("id"); id != parsed.end()) {
    if (!id->is_string()) throw Error(400, "the request's 'id' must be a string, not " + Quote(*id));
    request.id = *id;
  }
  const json* parameters = Parameters(parsed, "the request");
  if (parameters) request.parameters = *parameters;
  bool binary_outputs = BoolParameter(parameters, "binary_data_output", false, "the request");

  auto list = parsed.find("inputs");
  if (list == parsed.end() || !list->is_array())
    throw Error(400,
                "the request needs 'inputs', a list of tensors (model '" + model + "' takes " + Names(inputs) + ")");
  std::map<std::string, const TensorInfo*> known;
  for (const TensorInfo& t : inputs) known[t.name] = &t;
  size_t cursor = json_size;  // where the next input's binary data starts
  for (const json& input : *list) {
    if (!input.is_object()) throw Error(400, "each of 'inputs' must be an object, not " + Quote(input));
    const std::string& name = StringField(input, "name", "an input");
    std::string what = "input '" + name + "'";
    auto info = known.find(name);
    if (info == known.end()) {
      throw Error(400, "model '" + model + "' has no input named '" + name + "' (its inputs: " + Names(inputs) + ")");
    }
    if (request.inputs.count(name)) throw Error(400, what + " is given twice");
    const TensorInfo& expected = *info->second;
    const std::string& datatype = StringField(input, "datatype", what);
    if (datatype != Datatype(expected.dtype)) {
      throw Error(
          400, what + " has datatype '" + datatype + "' but model '" + model + "' expects " + Datatype(expected.dtype));
    }
    auto shape_json = input.find("shape");
    if (shape_json == input.end() || !shape_json->is_array())
      throw Error(400, what + " needs a 'shape', a list of dimensions");
    std::vector<int64_t> shape;
    for (const json& d : *shape_json) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
        throw Error(400, what + " has a shape with the dimension " + Quote(d) + ", not a size");
      shape.push_back(d.get<int64_t>());
    }
    bool fits = shape.size() == expected.shape.size();
    for (size_t i = 0; fits && i < shape.size(); ++i) fits = expected.shape[i] < 0 || expected.shape[i] == shape[i];
    if (!fits) {
      throw Error(400, what + " has shape " + ShapeText(shape) + " but model '" + model + "' expects " +
                           ShapeText(expected.shape));
    }
    size_t nbytes = Bytes(shape, expected.dtype);
    ffi::Tensor tensor = tvmsched::EmptyHostTensor(shape, expected.dtype);
    char* out = static_cast<char*>(tensor.data_ptr());
    const json* input_parameters = Parameters(input, what);
    auto data = input.find("data");
    const json* size = nullptr;
    if (input_parameters) {
      auto found = input_parameters->find("binary_data_size");
      if (found != input_parameters->end()) size = &*found;
    }
    if (size) {
      if (data != input.end()) throw Error(400, what + " has both 'data' and parameters.binary_data_size");
      if (!size->is_number_unsigned())
        throw Error(400, what + "'s binary_data_size must be a number of bytes, not " + Quote(*size));
      uint64_t given = size->get<uint64_t>();
      if (given != nbytes) {
        throw Error(400, what + " has binary_data_size " + std::to_string(given) + " but its shape " +
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
      if (data == input.end()) throw Error(400, what + " has neither 'data' nor parameters.binary_data_size");
      size_t count = static_cast<size_t>(Elements(shape));
      bool supported = DispatchJson(expected.dtype, [&](auto zero) {
        using T = decltype(zero);
        FillFromJson<T>(*data, reinterpret_cast<T*>(out), count, name, datatype, shape);
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

  auto requested = parsed.find("outputs");
  if (requested == parsed.end() || requested->is_null()) {
    for (const TensorInfo& t : outputs) request.outputs.emplace_back(t.name, binary_outputs);
    return request;
  }
  if (!requested->is_array()) throw Error(400, "the request's 'outputs' must be a list, not " + Quote(*requested));
  std::set<std::string> seen;
  for (const json& output : *requested) {
    if (!output.is_object()) throw Error(400, "each of 'outputs' must be an object, not " + Quote(output));
    const std::string& name = StringField(output, "name", "an output");
    std::string what = "output '" + name + "'";
    bool found = false;
    for (const TensorInfo& t : outputs) found = found || t.name == name;
    if (!found) {
      throw Error(400,
                  "model '" + model + "' has no output named '" + name + "' (its outputs: " + Names(outputs) + ")");
    }
    if (!seen.insert(name).second) throw Error(400, what + " is requested twice");
    const json* output_parameters = Parameters(output, what);
    if (output_parameters && output_parameters->contains("classification"))
      throw Error(400, what + " asks for classification, which this server does not do");
    request.outputs.emplace_back(name, BoolParameter(output_parameters, "binary_data", binary_outputs, what));
  }
  return request;
}

Response EncodeResponse(const std::string& model, const std::string& version, const Request& request,
                        const ffi::Map<ffi::String, ffi::Tensor>& outputs) {
  json head = {{"model_name", model}, {"model_version", version}};
  if (!request.id.is_null()) head["id"] = request.id;
  json list = json::array();
  std::string binary;
  bool any_binary = false;
  for (const auto& [name, as_binary] : request.outputs) {
    auto found = outputs.find(ffi::String(name));
    if (found == outputs.end()) throw Error(500, "the engine gave no output '" + name + "'");
    const DLTensor* t = (*found).second.GetDLTensorPtr();
    std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
    const char* data = static_cast<const char*>(t->data) + t->byte_offset;
    size_t nbytes = Bytes(shape, t->dtype);
    json out = {{"name", name}, {"datatype", Datatype(t->dtype)}, {"shape", shape}};
    if (as_binary) {
      out["parameters"] = {{"binary_data_size", nbytes}};
      binary.append(data, nbytes);
      any_binary = true;
    } else {
      json values = json::array();
      bool supported = DispatchJson(
          t->dtype, [&](auto zero) { AppendJson<decltype(zero)>(values, data, static_cast<size_t>(Elements(shape))); });
      if (!supported) {
        throw Error(400, "output '" + name + "' is " + Datatype(t->dtype) +
                             ": ask for it as binary data (parameters.binary_data), not JSON");
      }
      out["data"] = std::move(values);
    }
    list.push_back(std::move(out));
  }
  head["outputs"] = std::move(list);
  Response response;
  response.body = head.dump(-1, ' ', false, json::error_handler_t::replace);
  if (any_binary) {
    response.header_length = response.body.size();
    response.body += binary;
  }
  return response;
}

ffi::Tensor FromJson(const json& value, DLDataType dtype, const std::string& name) {
  std::vector<int64_t> shape;
  for (const json* v = &value; v->is_array(); v = &(*v)[0]) {
    shape.push_back(static_cast<int64_t>(v->size()));
    if (v->empty()) break;
  }
  ffi::Tensor tensor = tvmsched::EmptyHostTensor(shape, dtype);
  std::string datatype = Datatype(dtype);
  bool supported = DispatchJson(dtype, [&](auto zero) {
    using T = decltype(zero);
    FillFromJson<T>(value, static_cast<T*>(tensor.data_ptr()), static_cast<size_t>(Elements(shape)), name, datatype,
                    shape);
  });
  if (!supported) throw Error(400, "input '" + name + "' is " + datatype + ": send it as binary data on /v2");
  return tensor;
}

json ToJson(const ffi::Tensor& tensor) {
  const DLTensor* t = tensor.GetDLTensorPtr();
  std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
  json flat = json::array();
  const char* data = static_cast<const char*>(t->data) + t->byte_offset;
  if (!DispatchJson(t->dtype, [&](auto zero) { AppendJson<decltype(zero)>(flat, data, Elements(shape)); }))
    throw Error(400, "an output is " + Datatype(t->dtype) + ": ask for it as binary data on /v2");
  if (shape.empty()) return flat[0];
  for (size_t d = shape.size() - 1; d > 0 && shape[d] > 0; --d) {  // fold the innermost dimension into lists
    json folded = json::array();
    for (size_t i = 0; i < flat.size(); i += shape[d])
      folded.push_back(json(flat.begin() + i, flat.begin() + i + shape[d]));
    flat = std::move(folded);
  }
  return flat;
}

}  // namespace kserve
