// The Open Inference Protocol (KServe v2) over REST: an inference request's JSON header and binary tensor data as
// engine tensors, and the engine's outputs as an inference response. The one implementation both servers use:
// `tvmsched serve` (tvmsched/serve/http.py, through tvmsched.engine.kserve_codec) and examples/cpp/server.cc.
//
//   https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/ (the REST protocol)
//   Triton's binary tensor data extension: a request whose `Inference-Header-Content-Length: N` header is set
//   has N bytes of JSON, then the inputs' raw bytes (row-major, little-endian) in the order of the inputs whose
//   `parameters.binary_data_size` is set; binary outputs come back the same way.
//
// JSON as both servers read it (src/json_reader.h, one pass without recursion): UTF-8, nested at most kMaxJsonDepth
// levels, strict (a bare NaN or Infinity, which Triton's parser and Python's accept, is a 400 that
// says how to send such values). Non-finite elements of JSON outputs are the strings "NaN", "Infinity" and
// "-Infinity" (tritonclient's as_numpy reads them back); inputs take those strings for FP16/FP32/FP64 elements.
//
// The gRPC service's ModelInfer messages (grpc_service.proto) are read and written here too, in protobuf's wire format
// (src/protobuf_wire.h), with the same checks: `tvmsched serve` hands a call's bytes over as it does a REST body.
//
// Every problem with a request is a kserve::Error: an HTTP status and one line.
#ifndef TVMSCHED_KSERVE_H_
#define TVMSCHED_KSERVE_H_

#include <dlpack/dlpack.h>
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tvmsched {
namespace kserve {

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
/*! \brief "[1,784]" */
std::string ShapeText(const std::vector<int64_t>& shape);

/*! \brief A client's value quoted for an error line (JSON, cut to 80 characters, non-UTF-8 bytes as '?'). */
std::string Quote(const ffi::Any& value);
/*! \brief `text` as a JSON string literal, appended to `out`. */
void AppendString(std::string& out, std::string_view text);
/*! \brief A tensor's elements as JSON, appended to `out`: a flat list, or lists nested as its shape (np.tolist());
 *  400 naming `what` for a datatype JSON has no numbers for (FP16, BF16). */
void AppendTensor(std::string& out, const ffi::Tensor& tensor, bool nested, const std::string& what);

/*! \brief The JSON header's length from the Inference-Header-Content-Length header (`value`; not `present`: absent,
 *  the whole body is JSON); 400 when it is not a length within the body. */
std::optional<size_t> HeaderLength(const std::string& value, bool present, size_t body_size);

/*! \brief A parsed inference request. */
struct Request {
  ffi::Any id;                              // the request's "id" (None: none)
  ffi::Map<ffi::Any, ffi::Any> parameters;  // the request's "parameters" (empty: none): priority, timeout, ...
  ffi::Map<ffi::String, ffi::Tensor> inputs;
  /*! \brief The outputs to answer, in order, each with whether it goes as binary data. */
  std::vector<std::pair<std::string, bool>> outputs;
};

/*! \brief Parse `body` (its first `header_length` bytes JSON and the rest binary tensor data, or all JSON) for
 *  `model`, whose inputs and outputs are `inputs` and `outputs`: names, datatypes, shapes and sizes checked. */
Request ParseRequest(std::string_view body, std::optional<size_t> header_length, const std::string& model,
                     const std::vector<TensorInfo>& inputs, const std::vector<TensorInfo>& outputs);

/*! \brief An inference response: its body, and the JSON header's length when binary data follows it. */
struct Response {
  std::string body;
  std::optional<size_t> header_length;
};

/*! \brief The response to `request` from the engine's `outputs`. */
Response EncodeResponse(const std::string& model, const std::string& version, const Request& request,
                        const ffi::Map<ffi::String, ffi::Tensor>& outputs);

/*! \brief The model a gRPC ModelInferRequest (protobuf's wire format) is for: its model_name and model_version; 400
 *  when the bytes are not such a message. */
std::pair<std::string, std::string> InferMessageModel(std::string_view message);

/*! \brief Parse a gRPC ModelInferRequest for `model` with the checks and lines of ParseRequest: inputs from
 *  raw_input_contents (one per input, in order) or typed contents; every output answered as raw contents. */
Request ParseInferMessage(std::string_view message, const std::string& model, const std::vector<TensorInfo>& inputs,
                          const std::vector<TensorInfo>& outputs);

/*! \brief The gRPC ModelInferResponse to `request` from the engine's `outputs`, as protobuf's wire format: the outputs
 *  in raw_output_contents, in the order of `request.outputs`. */
std::string EncodeInferMessage(const std::string& model, const std::string& version, const Request& request,
                               const ffi::Map<ffi::String, ffi::Tensor>& outputs);

/*! \brief A request's scheduling parameters (Triton's `priority` and `timeout`), read once for both servers. */
struct Scheduling {
  int priority = -1;       ///< 1: real-time, 0: best-effort, -1: its model's
  int64_t timeout_us = 0;  ///< the longest it may stay queued (0: its model's default)
};
/*! \brief `parameters.priority`: 1 or "realtime" real-time; 0, "", "0" or absent its model's; 2 or more or
 *  "best_effort" best-effort. `.timeout`: a non-negative whole number of µs. 400 for anything else. */
Scheduling ReadScheduling(const ffi::Map<ffi::Any, ffi::Any>& parameters);

/*! \brief The inputs of a /v1 request body, {"inputs": {NAME: data nested as its shape}} (examples/server.py's JSON
 *  contract; elements checked as /v2's, each of the dtype of the model's input of that name, else FP32); 422 for a
 *  body of another form. */
ffi::Map<ffi::String, ffi::Tensor> ParseV1(std::string_view body, const std::vector<TensorInfo>& inputs);
/*! \brief A /v1 answer: {"outputs": {NAME: data nested as its shape}} (non-finite elements as /v2's JSON outputs). */
std::string EncodeV1(const ffi::Map<ffi::String, ffi::Tensor>& outputs);

/*! \brief A parsed request as a server in Python holds it between parse and encode: [id, [name, binary?]...]. */
ffi::Array<ffi::Any> Pending(const Request& request);
/*! \brief A refusal as the functions for a server in Python answer it: [status, one line]. */
ffi::Array<ffi::Any> Refusal(const Error& err);

/*! \brief A model's codec for a server in Python (tvmsched.engine.kserve_codec, the served book's `codec`): [parse,
 *  encode, parse_message, encode_message, parse_v1, encode_v1] over `inputs` and `outputs`, each answering
 *  [status, one line] for a bad request (src/kserve.cc states their arguments). */
ffi::Array<ffi::Any> CodecFunctions(const std::string& model, const std::string& version,
                                    std::vector<TensorInfo> inputs, std::vector<TensorInfo> outputs);

}  // namespace kserve
}  // namespace tvmsched

#endif  // TVMSCHED_KSERVE_H_
