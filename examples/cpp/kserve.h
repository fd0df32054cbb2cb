// The Open Inference Protocol (KServe v2) over REST for tvmsched_server: an inference request's JSON
// header and binary tensor data as engine tensors, and the engine's outputs as an inference response.
//
//   https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/ (the REST protocol)
//   Triton's binary tensor data extension: a request whose `Inference-Header-Content-Length: N` header is set
//   has N bytes of JSON, then the inputs' raw bytes (row-major, little-endian) in the order of the inputs whose
//   `parameters.binary_data_size` is set; binary outputs come back the same way.
//
// Every problem with a request is a kserve::Error: an HTTP status and one line, answered {"error": line}.
#ifndef TVMSCHED_EXAMPLES_KSERVE_H_
#define TVMSCHED_EXAMPLES_KSERVE_H_

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kserve {

using json = nlohmann::json;
namespace ffi = tvm::ffi;

/*! \brief A request the client got wrong (400, 404) or one the server cannot take now (503). */
struct Error : std::runtime_error {
  int status;
  Error(int status, const std::string& message) : std::runtime_error(message), status(status) {}
};

/*! \brief A model input or output as the protocol describes it. */
struct TensorInfo {
  std::string name;
  DLDataType dtype;
  std::vector<int64_t> shape;  // a negative dimension takes any size
};

/*! \brief The protocol's name of `dtype` ("FP32", "INT64", "BOOL", ...), or "" when it has none. */
std::string Datatype(DLDataType dtype);
/*! \brief Triton's model-configuration name of `dtype` ("TYPE_FP32"), or "TYPE_INVALID". */
std::string ConfigDatatype(DLDataType dtype);
/*! \brief {"name", "datatype", "shape"}: a tensor in model metadata. */
json Metadata(const TensorInfo& tensor);
/*! \brief "[1,784]" */
std::string ShapeText(const std::vector<int64_t>& shape);

/*! \brief A float as JSON output data: a number, or for NaN and infinities (which JSON has no numbers for) the strings
 *  "NaN", "Infinity" and "-Infinity" (tvmsched serve writes the same: tvmsched/serve/jsonio.py; tritonclient's
 *  as_numpy reads them back). Input data takes these strings for FP32 and FP64 elements too. */
json FloatJson(double value);

/*! \brief When nlohmann's parse error at `byte` of `text` is a bare NaN, Infinity or -Infinity (Triton's dialect of
 *  JSON, refused here as by tvmsched serve): ": NaN is not a JSON number; send ..." to end the error line; else "". */
std::string NonFiniteHint(const std::string& text, size_t byte);

/*! \brief The JSON header's length from the Inference-Header-Content-Length header (`value`; empty: absent, the
 *  whole body is JSON); 400 when it is not a length within the body. */
std::optional<size_t> HeaderLength(const std::string& value, bool present, size_t body_size);

/*! \brief A parsed inference request. */
struct Request {
  json id;          // the request's "id" (null: none)
  json parameters;  // the request's "parameters" object (null: none): priority, timeout, ...
  ffi::Map<ffi::String, ffi::Tensor> inputs;
  /*! \brief The outputs to answer, in order, each with whether it goes as binary data. */
  std::vector<std::pair<std::string, bool>> outputs;
};

/*! \brief Parse `body` (its first `header_length` bytes JSON and the rest binary tensor data, or all JSON) for
 *  `model`, whose inputs and outputs are `inputs` and `outputs`: names, datatypes, shapes and sizes checked. */
Request ParseRequest(const std::string& body, std::optional<size_t> header_length, const std::string& model,
                     const std::vector<TensorInfo>& inputs, const std::vector<TensorInfo>& outputs);

/*! \brief An inference response: its body, and the JSON header's length when binary data follows it. */
struct Response {
  std::string body;
  std::optional<size_t> header_length;
};

/*! \brief The response to `request` from the engine's `outputs`. */
Response EncodeResponse(const std::string& model, const std::string& version, const Request& request,
                        const ffi::Map<ffi::String, ffi::Tensor>& outputs);

/*! \brief A tensor of `dtype` from JSON data nested as its shape (a number: a scalar), as np.asarray does: the /v1
 *  contract's inputs (elements checked as /v2's). */
ffi::Tensor FromJson(const json& value, DLDataType dtype, const std::string& name);
/*! \brief A tensor as nested JSON lists (tensor.tolist(); non-finite floats as FloatJson writes them). */
json ToJson(const ffi::Tensor& tensor);

}  // namespace kserve

#endif  // TVMSCHED_EXAMPLES_KSERVE_H_
