// tvmsched_server: the C++ twin of examples/server.py, an HTTP inference server over the engine, speaking both the
// JSON contract of examples/server.py (/v1) and the Open Inference Protocol (KServe v2, /v2) with Triton's binary
// tensor data extension, so that tritonclient.http and other KServe clients can use it (docs/cpp-server.md).
//
//   tvmsched_server --model mlp=mlp.tvms:20 --model bert=bert.tvms:200:best_effort --port 8080
//   curl -X POST localhost:8080/v1/models/mlp/infer -d '{"inputs": {"input": [[...]]}}'
//   curl -X POST localhost:8080/v2/models/mlp/infer
//        -d '{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": [...]}]}'
//   curl localhost:8080/metrics
//
// Each --model is NAME=ARTIFACT[:QOS_MS[:PRIORITY]] (priority realtime or best_effort, the default):
// one tvmsched::Stream per model; HTTP handler threads submit requests and wait on them. While a
// real-time request runs, busy best-effort streams are preempted (resumed when none runs any more).
//
// --memory-budget BYTES (or 512MiB, 8GiB, 1.5GB): the models' device memory never passes BYTES (the engine checks every
// allocation): each model is registered with the engine's switcher (tvmsched/switching.h, docs/switching.md), made
// resident at start while it fits beside the others, else switched in by its requests (the least recently used idle
// models evicted), as runtime/runtime.py's Runtime(memory_budget=...) does. A model larger than the whole budget is
// refused at start (this server does not stream weights from host tiers).
// --max-queue N: a model with N requests queued or running answers more with 503 (default 64, as `tvmsched serve`;
// 0: no limit but the HTTP server's 64 threads).
//
// Routes, /v1 (the JSON contract of examples/server.py):
//   POST /v1/models/{name}/infer  {"inputs": {NAME: nested list | number}} -> {"outputs": {NAME: nested list}}
//                                 404 {"detail": "no model named 'x'"}; 400 {"detail": "<engine error>"};
//                                 422 {"detail": [...]} for a body that is not {"inputs": {...}}; 400 for one
//                                 nested deeper than 64 levels. NaN and infinities in outputs are the strings
//                                 "NaN", "Infinity", "-Infinity" (JSON has no such numbers), as on /v2
//   GET  /v1/models, GET /v1/stats  as in examples/server.py (/v1/stats adds "_memory" with --memory-budget)
// Routes, /v2 (Open Inference Protocol; every error is {"error": "<one line>"}: 400 bad request, 404 unknown model
// or version, 503 queue full or model not ready):
//   GET  /v2/health/live, /v2/health/ready, /v2 (server metadata)
//   GET  /v2/models/{name}[/versions/1]                model metadata; .../ready; .../config (Triton's model
//                                                       configuration); .../stats and /v2/models/stats (Triton's
//                                                       statistics)
//   POST /v2/models/{name}[/versions/1]/infer          JSON tensors (flat row-major "data") or binary tensor data
//                                                       (Inference-Header-Content-Length; binary outputs on request)
// GET /metrics: Prometheus text format (prometheus-cpp core + TextSerializer): the tvmsched_* series and Triton's
//   nv_inference_* series (labels model, version).
//   A body over --max-body-bytes (default 16 MiB) is answered 413 without being read.
//   A request's X-Request-Id header comes back on its answer; JSON answers are never compressed.
//   SIGTERM/SIGINT: no new connections, the requests in flight are answered, exit status 0.
//
// --trust KEY.pub (repeatable): load only artifacts signed by one of these keys (README, "Trust model").
// Without it an artifact's kernels.so runs unverified (TVMSCHED_REQUIRE_SIGNATURE=1 in the environment refuses that).
//
// HTTP: cpp-httplib; JSON: nlohmann-json; both from Debian (libcpp-httplib-dev, nlohmann-json3-dev).
#include <httplib.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <pthread.h>
#include <signal.h>
#include <tvmsched/engine.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kserve.h"

#ifndef TVMSCHED_VERSION
#define TVMSCHED_VERSION "unknown"
#endif

namespace {

namespace ffi = tvm::ffi;
using json = nlohmann::json;

constexpr const char* kUsage =
    "usage: tvmsched_server --model NAME=ARTIFACT[:QOS_MS[:PRIORITY]] [--model ...] [--port N] "
    "[--host 127.0.0.1] [--device cpu|cuda] [--trust KEY.pub ...] [--max-body-bytes N] [--memory-budget BYTES] "
    "[--max-queue N]";

/*! \brief A request the client got wrong: HTTP `status` with {"detail": detail}. */
struct HttpError : std::runtime_error {
  int status;
  json detail;
  HttpError(int status, json detail)
      : std::runtime_error(detail.is_string() ? detail.get<std::string>() : detail.dump()),
        status(status),
        detail(std::move(detail)) {}
};

/*! \brief A count and a total duration (Triton's statistics: {"count", "ns"}). */
struct Duration {
  std::atomic<int64_t> count{0}, ns{0};
  void Add(int64_t nanoseconds) {
    count.fetch_add(1);
    ns.fetch_add(nanoseconds);
  }
  json Json() const { return {{"count", count.load()}, {"ns", ns.load()}}; }
};

/*! \brief Where one request's time went, in ns (Triton's statistics and nv_inference_*_duration_us). */
struct Timing {
  int64_t request = 0, input = 0, queue = 0, infer = 0, output = 0;
};

/*! \brief One served model: its stream and its metrics. */
struct Served {
  std::string name, priority, path;
  std::string version = "1";  // one version per model
  std::optional<double> qos_ms;
  tvmsched::Model model;
  tvmsched::Stream stream;
  std::map<std::string, DLDataType> input_dtypes;
  std::vector<kserve::TensorInfo> inputs, outputs;  // as the manifest declares them, in its order
  size_t footprint = 0;                             // --memory-budget: bytes it holds when resident
  std::atomic<int64_t> rejected{0};                 // requests the engine refused at submit (bad inputs)
  std::atomic<int64_t> pending{0};                  // requests submitted and not finished (--max-queue)
  // Triton's statistics (GET /v2/models/{name}/stats)
  Duration success, fail, queue, compute_input, compute_infer, compute_output;
  std::atomic<int64_t> last_inference_ms{0};
  prometheus::Counter *requests, *errors, *qos_violations, *preemptions;
  prometheus::Histogram* latency;
  // Triton's metrics
  prometheus::Counter *nv_success, *nv_failure, *nv_count, *nv_exec, *nv_request_us, *nv_queue_us, *nv_input_us,
      *nv_infer_us, *nv_output_us;
  prometheus::Gauge* nv_pending;
};

/*! \brief Real-time over best-effort (the policy of runtime/policies/priority.py): which requests are real-time and
 *  which streams best-effort; the engine's preemption group preempts and resumes them. */
class Priorities {
 public:
  void AddBestEffort(Served* served) {
    best_effort_.push_back(served);
    group_->Add(served->stream);
  }
  /*! \brief A real-time request was queued on `own`: the first one preempts every best-effort stream but `own`
   *  without waiting for their kernels to stop (each stream's own thread drains them); they resume when the last is
   *  done, in the engine. */
  void Hold(const tvmsched::Request& request, const tvmsched::Stream& own) {
    for (const tvmsched::Stream& stopped : group_->Hold(request, own)) {
      for (Served* s : best_effort_) {
        if (s->stream.same_as(stopped)) s->preemptions->Increment();
      }
    }
  }
  /*! \brief The switcher: a switch-in waits for memory that the started requests of the paused models `holders`
   *  keep. Those paused for real-time work finish their request and pause again (runtime/policies/priority.py). */
  void MemoryBlocked(const ffi::Array<tvmsched::Model>& holders) { group_->FinishStartedOf(holders); }

 private:
  tvmsched::PreemptionGroup group_ = tvmsched::PreemptionGroup::Create();
  std::vector<Served*> best_effort_;  // added before serving starts (read without a lock after): their counters
};

// ---- tensors <-> JSON ------------------------------------------------------------------------

/*! \brief Call `f(T{})` with the C++ type of `dtype` (bool as bool, stored as one byte). */
template <typename F>
void Dispatch(DLDataType dtype, F&& f) {
  int bits = dtype.bits;
  if (dtype.lanes == 1) {
    if (dtype.code == kDLFloat && bits == 32) return f(float{});
    if (dtype.code == kDLFloat && bits == 64) return f(double{});
    if (dtype.code == kDLInt && bits == 8) return f(int8_t{});
    if (dtype.code == kDLInt && bits == 16) return f(int16_t{});
    if (dtype.code == kDLInt && bits == 32) return f(int32_t{});
    if (dtype.code == kDLInt && bits == 64) return f(int64_t{});
    if (dtype.code == kDLUInt && bits == 8) return f(uint8_t{});
    if (dtype.code == kDLUInt && bits == 16) return f(uint16_t{});
    if (dtype.code == kDLUInt && bits == 32) return f(uint32_t{});
    if (dtype.code == kDLUInt && bits == 64) return f(uint64_t{});
    if (dtype.code == kDLBool && bits == 8) return f(bool{});
  }
  throw HttpError(400, "dtype " + tvmsched::DTypeName(dtype) + " is not supported by this server");
}

template <typename T>
T Element(const json& v, const std::string& name) {
  if constexpr (std::is_floating_point_v<T>) {  // non-finite values as JSON outputs carry them (kserve::FloatJson)
    if (v.is_string()) {
      const std::string& text = v.get_ref<const std::string&>();
      if (text == "NaN") return std::numeric_limits<T>::quiet_NaN();
      if (text == "Infinity") return std::numeric_limits<T>::infinity();
      if (text == "-Infinity") return -std::numeric_limits<T>::infinity();
    }
  }
  if (!v.is_number() && !v.is_boolean()) {
    throw HttpError(400, "input '" + name + "' holds " + v.dump() + ", not a number");
  }
  if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean() ? v.get<bool>() : v.get<double>() != 0;
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>());
  } else {
    if (v.is_boolean()) return static_cast<T>(v.get<bool>());
    if (v.is_number_unsigned()) return static_cast<T>(v.get<uint64_t>());
    if (v.is_number_integer()) return static_cast<T>(v.get<int64_t>());
    return static_cast<T>(v.get<double>());  // numpy truncates floats cast to integers
  }
}

template <typename T>
void Fill(const json& v, const std::vector<int64_t>& shape, size_t dim, T*& out, const std::string& name) {
  if (dim == shape.size()) {
    if (v.is_array()) throw HttpError(400, "input '" + name + "' is not a rectangular array (inhomogeneous shape)");
    *out++ = Element<T>(v, name);
    return;
  }
  if (!v.is_array() || static_cast<int64_t>(v.size()) != shape[dim]) {
    throw HttpError(400, "input '" + name + "' is not a rectangular array (inhomogeneous shape after " +
                             std::to_string(dim) + " dimensions)");
  }
  for (const json& item : v) Fill(item, shape, dim + 1, out, name);
}

/*! \brief np.asarray(value, dtype): a nested list (or a number) as a host tensor. */
ffi::Tensor ToTensor(const json& value, DLDataType dtype, const std::string& name) {
  std::vector<int64_t> shape;
  for (const json* v = &value; v->is_array(); v = &(*v)[0]) {
    shape.push_back(static_cast<int64_t>(v->size()));
    if (v->empty()) break;
  }
  ffi::Tensor tensor;
  Dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    tensor = tvmsched::EmptyHostTensor(shape, dtype);
    T* out = static_cast<T*>(tensor.data_ptr());
    Fill<T>(value, shape, 0, out, name);
  });
  return tensor;
}

template <typename T>
json Nested(const T*& data, const int64_t* shape, int ndim) {
  if (ndim == 0) {
    T v = *data++;
    if constexpr (std::is_floating_point_v<T>)
      return kserve::FloatJson(static_cast<double>(v));  // NaN and infinities as strings: JSON has no such numbers
    else if constexpr (std::is_same_v<T, bool>)
      return v;
    else if constexpr (std::is_signed_v<T>)
      return static_cast<int64_t>(v);
    else
      return static_cast<uint64_t>(v);
  }
  json out = json::array();
  for (int64_t i = 0; i < shape[0]; ++i) out.push_back(Nested<T>(data, shape + 1, ndim - 1));
  return out;
}

/*! \brief tensor.tolist() */
json ToJson(const ffi::Tensor& tensor) {
  const DLTensor* t = tensor.GetDLTensorPtr();
  json out;
  Dispatch(t->dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* data = reinterpret_cast<const T*>(static_cast<const char*>(t->data) + t->byte_offset);
    out = Nested<T>(data, t->shape, t->ndim);
  });
  return out;
}

// ---- the server -------------------------------------------------------------------------------

json ValidationError(const std::string& type, json loc, const std::string& msg) {
  return json::array({{{"type", type}, {"loc", std::move(loc)}, {"msg", msg}}});
}

/*! \brief The body as examples/server.py's InferRequest: {"inputs": {NAME: list | float | int}} (else 422). */
json ParseInferBody(const std::string& body) {
  try {  // nlohmann's parser and destructor recurse per level: 100000 '[' would overflow the stack
    tvmsched::CheckJsonDepth(body, "the body", tvmsched::kMaxJsonDepth);
  } catch (const std::invalid_argument& err) {
    throw HttpError(400, err.what());  // "the body nests deeper than 64 levels", as tvmsched serve's /v1 answers
  }
  json parsed;
  try {
    parsed = json::parse(body);
  } catch (const json::parse_error& err) {
    throw HttpError(422,
                    ValidationError("json_invalid", {"body", static_cast<int64_t>(err.byte)}, "JSON decode error"));
  }
  if (!parsed.is_object()) {
    throw HttpError(422, ValidationError("model_attributes_type", {"body"},
                                         "Input should be a valid dictionary or object to extract fields from"));
  }
  auto inputs = parsed.find("inputs");
  if (inputs == parsed.end()) throw HttpError(422, ValidationError("missing", {"body", "inputs"}, "Field required"));
  if (!inputs->is_object())
    throw HttpError(422, ValidationError("dict_type", {"body", "inputs"}, "Input should be a valid dictionary"));
  for (const auto& [key, value] : inputs->items()) {
    if (!value.is_array() && !value.is_number() && !value.is_boolean()) {
      throw HttpError(422, ValidationError("list_type", {"body", "inputs", key},
                                           "Input should be a valid list, number or integer"));
    }
  }
  return *inputs;
}

/*! \brief numpy's percentile (linear interpolation) of sorted `values`. */
double Percentile(const std::vector<double>& sorted, double q) {
  double at = (sorted.size() - 1) * q / 100.0;
  size_t lo = static_cast<size_t>(std::floor(at)), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo);
}

json OrNull(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/*! \brief The options of Server (flags of Main). */
struct ServerOptions {
  size_t memory_budget = 0;  // 0: no budget, every model resident
  int64_t max_queue = 64;    // 0: no limit
};

class Server {
 public:
  Server(const std::string& device, ServerOptions options)
      : registry_(std::make_shared<prometheus::Registry>()), options_(options) {
    requests_ = &prometheus::BuildCounter()
                     .Name("tvmsched_requests_total")
                     .Help("Inference requests received, per model")
                     .Register(*registry_);
    errors_ = &prometheus::BuildCounter()
                   .Name("tvmsched_errors_total")
                   .Help("Inference requests answered with an error, per model")
                   .Register(*registry_);
    qos_violations_ = &prometheus::BuildCounter()
                           .Name("tvmsched_qos_violations_total")
                           .Help("Requests whose latency exceeded the model's QoS target")
                           .Register(*registry_);
    preemptions_ = &prometheus::BuildCounter()
                        .Name("tvmsched_preemptions_total")
                        .Help("Times the model's stream was preempted by a real-time request")
                        .Register(*registry_);
    latency_ = &prometheus::BuildHistogram()
                    .Name("tvmsched_request_latency_seconds")
                    .Help("Submit-to-finish latency of completed requests (engine clock)")
                    .Register(*registry_);
    busy_ = &prometheus::BuildGauge()
                 .Name("tvmsched_busy_streams")
                 .Help("Model streams with requests queued or running, per device")
                 .Register(*registry_);
    // Triton's names (https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/
    // metrics.html); one inference per request (no batching): inference and execution counts are the successes
    auto counter = [&](const char* name, const char* help) {
      return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
    };
    nv_success_ = counter("nv_inference_request_success", "Number of successful inference requests, all batch sizes");
    nv_failure_ = counter("nv_inference_request_failure", "Number of failed inference requests, all batch sizes");
    nv_count_ = counter("nv_inference_count", "Number of inferences performed (does not include cached requests)");
    nv_exec_ = counter("nv_inference_exec_count",
                       "Number of model executions performed (does not include cached "
                       "requests)");
    nv_request_us_ = counter("nv_inference_request_duration_us",
                             "Cumulative inference request duration in "
                             "microseconds (includes cached requests)");
    nv_queue_us_ = counter("nv_inference_queue_duration_us",
                           "Cumulative inference queuing duration in microseconds "
                           "(includes cached requests)");
    nv_input_us_ = counter("nv_inference_compute_input_duration_us",
                           "Cumulative compute input duration in "
                           "microseconds (does not include cached requests)");
    nv_infer_us_ = counter("nv_inference_compute_infer_duration_us",
                           "Cumulative compute inference duration in "
                           "microseconds (does not include cached requests)");
    nv_output_us_ = counter("nv_inference_compute_output_duration_us",
                            "Cumulative inference compute output duration in microseconds (does not include cached "
                            "requests)");
    nv_pending_ = &prometheus::BuildGauge()
                       .Name("nv_inference_pending_request_count")
                       .Help("Instantaneous number of pending requests awaiting execution per-model.")
                       .Register(*registry_);
    if (options_.memory_budget) {  // runtime/runtime.py's Runtime(memory_budget=...): a scope and its switcher
      scope_ = std::make_shared<tvmsched::MemoryScope>(options_.memory_budget);
      tvmsched::SwitchOptions switching;
      switching.budget = options_.memory_budget;
      switching.scope = scope_;
      switcher_ = tvmsched::Switcher::Create(tvmsched::OpenDevice(device), switching);
      switcher_->SetBlockedCallback(ffi::Function::FromTyped(
          [this](tvmsched::Model, ffi::Array<tvmsched::Model> holders) { priorities_.MemoryBlocked(holders); }));
    }
  }

  void Load(const std::string& name, const std::string& path, std::optional<double> qos_ms, const std::string& priority,
            const std::string& device, const tvmsched::TrustedKeys& trusted) {
    if (models_.count(name)) throw std::runtime_error("a model named '" + name + "' is already loaded");
    auto served = std::make_unique<Served>();
    served->name = name;
    served->priority = priority;
    served->path = path;
    if (switcher_.defined()) {
      // registered: its weights wait in pinned host memory; the switcher makes it resident (runtime/runtime.py)
      tvmsched::LoadOptions options;
      options.resident = false;
      options.max_groups = kSwitchGroups;
      options.scope = scope_;
      served->model = tvmsched::Model::Load(path, device, options, trusted);
      served->footprint = served->model->env_bytes();
      for (int g = 0; g < served->model->num_groups(); ++g) served->footprint += served->model->group_bytes(g);
      if (served->footprint > options_.memory_budget) {
        throw std::runtime_error("model '" + name + "' needs " + std::to_string(served->footprint) +
                                 " bytes of device memory when resident, more than --memory-budget " +
                                 std::to_string(options_.memory_budget) +
                                 " (this server does not stream weights from host tiers)");
      }
      switcher_->Add(served->model);
    } else {
      served->model = tvmsched::Model::Load(path, device, tvmsched::FlagMemory::kAuto, trusted);
    }
    served->qos_ms = qos_ms ? qos_ms : served->model->manifest().qos_ms;
    served->stream = tvmsched::Stream::Create(served->model, name);
    const tvmsched::Manifest& manifest = served->model->manifest();
    for (const auto& b : manifest.inputs) {
      const tvmsched::TensorSpec& spec = manifest.tensors.at(b.tensor);
      served->input_dtypes[b.name] = spec.dtype;
      served->inputs.push_back({b.name, spec.dtype, spec.shape});
    }
    for (const auto& b : manifest.outputs) {
      const tvmsched::TensorSpec& spec = manifest.tensors.at(b.tensor);
      served->outputs.push_back({b.name, spec.dtype, spec.shape});
    }
    prometheus::Labels labels{{"model", name}};
    served->requests = &requests_->Add(labels);
    served->errors = &errors_->Add(labels);
    served->qos_violations = &qos_violations_->Add(labels);
    served->preemptions = &preemptions_->Add(labels);
    served->latency =
        &latency_->Add(labels, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                                       0.1, 0.25, 0.5, 1, 2.5, 5, 10});
    prometheus::Labels nv{{"model", name}, {"version", served->version}};
    served->nv_success = &nv_success_->Add(nv);
    served->nv_failure = &nv_failure_->Add(nv);
    served->nv_count = &nv_count_->Add(nv);
    served->nv_exec = &nv_exec_->Add(nv);
    served->nv_request_us = &nv_request_us_->Add(nv);
    served->nv_queue_us = &nv_queue_us_->Add(nv);
    served->nv_input_us = &nv_input_us_->Add(nv);
    served->nv_infer_us = &nv_infer_us_->Add(nv);
    served->nv_output_us = &nv_output_us_->Add(nv);
    served->nv_pending = &nv_pending_->Add(nv);
    device_kind_ = served->model->device().kind();
    if (priority == "best_effort") priorities_.AddBestEffort(served.get());
    order_.push_back(name);
    Served* loaded = served.get();
    models_.emplace(name, std::move(served));
    if (switcher_.defined()) {  // resident now if it fits beside the others, else switched in by its requests
      bool resident = switcher_->Prefetch(loaded->model);
      std::cout << "tvmsched_server: model " << name << " (" << loaded->footprint << " bytes) "
                << (resident ? "resident" : "registered, switched in on demand") << std::endl;
    }
  }

  json Infer(const std::string& name, const std::string& body) {
    int64_t start = NowNs();
    json inputs = ParseInferBody(body);  // FastAPI validates the body before the route runs
    auto found = models_.find(name);
    if (found == models_.end()) throw HttpError(404, "no model named '" + name + "'");
    Served& s = *found->second;
    s.requests->Increment();
    try {
      Timing timing;
      ffi::Map<ffi::String, ffi::Tensor> tensors;
      for (const auto& [key, value] : inputs.items()) {
        auto dtype = s.input_dtypes.find(key);  // unknown names: float32, and the engine names the mismatch
        tensors.Set(ffi::String(key),
                    ToTensor(value, dtype != s.input_dtypes.end() ? dtype->second : DLDataType{kDLFloat, 32, 1}, key));
      }
      timing.input = NowNs() - start;
      tvmsched::Request request = Execute(s, tensors, &timing);
      int64_t encode = NowNs();
      json outputs = json::object();
      for (const auto& kv : request->outputs()) outputs[std::string(kv.first)] = ToJson(kv.second);
      timing.output = NowNs() - encode;
      timing.request = NowNs() - start;
      Succeeded(s, timing);
      return {{"outputs", outputs}};
    } catch (const HttpError&) {
      Failed(s, NowNs() - start);
      throw;
    }
  }

  // ---- the Open Inference Protocol (/v2) ----------------------------------------------------------

  /*! \brief POST /v2/models/{name}[/versions/{version}]/infer */
  kserve::Response InferV2(const std::string& name, const std::string& version, const std::string& body,
                           bool has_header_length, const std::string& header_length) {
    int64_t start = NowNs();
    Served& s = Find(name, version);
    s.requests->Increment();
    try {
      std::string why = NotReady(s);
      if (!why.empty()) throw HttpError(503, why);
      Timing timing;
      kserve::Request parsed;
      try {
        parsed = kserve::ParseRequest(body, kserve::HeaderLength(header_length, has_header_length, body.size()), name,
                                      s.inputs, s.outputs);
      } catch (const kserve::Error& err) {
        throw HttpError(err.status, err.what());
      }
      timing.input = NowNs() - start;
      tvmsched::Request request = Execute(s, parsed.inputs, &timing);
      int64_t encode = NowNs();
      kserve::Response response;
      try {
        response = kserve::EncodeResponse(name, s.version, parsed, request->outputs());
      } catch (const kserve::Error& err) {
        throw HttpError(err.status, err.what());
      }
      timing.output = NowNs() - encode;
      timing.request = NowNs() - start;
      Succeeded(s, timing);
      return response;
    } catch (const HttpError&) {
      Failed(s, NowNs() - start);
      throw;
    }
  }

  /*! \brief GET /v2/health/ready: every model loaded (they are before the server listens), the device not lost. */
  std::string ServerNotReady() const {
    if (stopping_.load()) return "the server is shutting down";
    if (order_.empty()) return "";
    std::string lost = models_.at(order_.front())->model->device().faults().lost;
    return lost.empty() ? "" : "the device is lost (docs/faults.md): " + lost;
  }

  json ServerMetadata() const {
    return {{"name", "tvmsched"},
            {"version", TVMSCHED_VERSION},
            {"extensions", {"binary_tensor_data", "model_configuration", "statistics", "parameters"}}};
  }

  /*! \brief GET /v2/models/{name}[/versions/{version}] */
  json ModelMetadata(const std::string& name, const std::string& version) {
    const Served& s = Find(name, version);
    json inputs = json::array(), outputs = json::array();
    for (const auto& t : s.inputs) inputs.push_back(kserve::Metadata(t));
    for (const auto& t : s.outputs) outputs.push_back(kserve::Metadata(t));
    return {{"name", s.name},
            {"versions", {s.version}},
            {"platform", "tvmsched"},
            {"inputs", inputs},
            {"outputs", outputs}};
  }

  /*! \brief GET /v2/models/{name}[/versions/{version}]/ready: empty when ready, else why not. */
  std::string ModelNotReady(const std::string& name, const std::string& version) {
    return NotReady(Find(name, version));
  }

  /*! \brief GET /v2/models/{name}[/versions/{version}]/config: Triton's model configuration of the model. */
  json ModelConfig(const std::string& name, const std::string& version) {
    const Served& s = Find(name, version);
    json inputs = json::array(), outputs = json::array();
    for (const auto& t : s.inputs) {
      inputs.push_back({{"name", t.name},
                        {"data_type", kserve::ConfigDatatype(t.dtype)},
                        {"format", "FORMAT_NONE"},
                        {"dims", t.shape},
                        {"is_shape_tensor", false},
                        {"allow_ragged_batch", false},
                        {"optional", false}});
    }
    for (const auto& t : s.outputs) {
      outputs.push_back({{"name", t.name},
                         {"data_type", kserve::ConfigDatatype(t.dtype)},
                         {"dims", t.shape},
                         {"label_filename", ""},
                         {"is_shape_tensor", false}});
    }
    bool gpu = device_kind_ != "cpu";
    json parameters = {{"priority", {{"string_value", s.priority}}},
                       {"placement", {{"string_value", s.model->placement()->kind()}}}};
    if (s.qos_ms) parameters["qos_ms"] = {{"string_value", json(*s.qos_ms).dump()}};
    if (options_.max_queue) parameters["max_queue"] = {{"string_value", std::to_string(options_.max_queue)}};
    std::string file = s.path.substr(s.path.find_last_of('/') == std::string::npos ? 0 : s.path.find_last_of('/') + 1);
    return {{"name", s.name},
            {"platform", "tvmsched"},
            {"backend", "tvmsched"},
            {"version_policy", {{"specific", {{"versions", {std::stoll(s.version)}}}}}},
            {"max_batch_size", 0},
            {"input", inputs},
            {"output", outputs},
            {"instance_group",
             {{{"name", s.name},
               {"kind", gpu ? "KIND_GPU" : "KIND_CPU"},
               {"count", 1},
               {"gpus", gpu ? json::array({0}) : json::array()}}}},
            {"default_model_filename", file},
            {"parameters", parameters},
            {"model_transaction_policy", {{"decoupled", false}}}};
  }

  /*! \brief GET /v2/models[/{name}[/versions/{version}]]/stats: Triton's statistics (all models without a name). */
  json ModelStats(const std::optional<std::string>& name, const std::string& version) {
    json list = json::array();
    if (name) {
      list.push_back(StatsOf(Find(*name, version)));
    } else {
      for (const auto& each : order_) list.push_back(StatsOf(*models_.at(each)));
    }
    return {{"model_stats", list}};
  }

  // ---- /v1 ----------------------------------------------------------------------------------------

  json Models() const {
    json out = json::object();
    for (const auto& name : order_) {
      const Served& s = *models_.at(name);
      json shapes = json::object();
      for (const auto& b : s.model->manifest().inputs) shapes[b.name] = s.model->manifest().tensors.at(b.tensor).shape;
      out[name] = {{"qos_ms", OrNull(s.qos_ms)}, {"priority", s.priority}, {"inputs", shapes}};
    }
    return out;
  }

  json Stats() const {
    json out = json::object();
    for (const auto& name : order_) {
      const Served& s = *models_.at(name);
      std::vector<double> ms;
      for (double us : s.stream->Latencies()) ms.push_back(us / 1e3);  // the latest 8192 to 16384 requests
      int64_t violations = s.qos_ms ? std::count_if(ms.begin(), ms.end(), [&](double v) { return v > *s.qos_ms; }) : 0;
      std::sort(ms.begin(), ms.end());
      out[name] = {{"priority", s.priority},
                   {"qos_ms", OrNull(s.qos_ms)},
                   {"requests", s.stream->completed.load()},
                   {"errors", s.stream->failed.load() + s.rejected.load()},
                   {"qos_violations", violations},
                   {"p50_ms", ms.empty() ? json(nullptr) : json(Percentile(ms, 50))},
                   {"p99_ms", ms.empty() ? json(nullptr) : json(Percentile(ms, 99))},
                   {"launches", s.stream->launches.load()},
                   {"reruns", s.stream->reruns.load()},
                   {"faults", s.stream->faults.load()},
                   {"fault_restarts", s.stream->fault_restarts.load()}};
    }
    if (!order_.empty()) {  // the device's fault state machine (docs/faults.md)
      tvmsched::Device::FaultStats faults = models_.at(order_.front())->model->device().faults();
      static const char* const kHealth[] = {"healthy", "faulted", "lost"};
      out["_device"] = {
          {"health", kHealth[faults.health]}, {"generation", faults.generation},           {"faults", faults.faults},
          {"recoveries", faults.recoveries},  {"last_recovery_s", faults.last_recovery_s}, {"lost", faults.lost}};
    }
    out["_scheduler"] = {{"decisions", 0}, {"p50_us", nullptr}, {"p99_us", nullptr}};  // no layer scheduler here
    if (switcher_.defined()) {  // --memory-budget: the scope's accounting and the switcher's recorded stages
      json stages = json::object(), resident = json::array(), footprints = json::object();
      for (const char* stage : {"stage1", "stage2", "exec", "clean", "evict"}) stages[stage] = 0;
      for (const tvmsched::StageEvent& e : switcher_->Events()) stages[e.stage] = stages.value(e.stage, 0) + 1;
      for (const auto& name : order_) {
        const Served& s = *models_.at(name);
        footprints[name] = s.footprint;
        if (s.model->resident()) resident.push_back(name);
      }
      out["_memory"] = {{"budget", scope_->budget()}, {"in_use", scope_->in_use()}, {"peak", scope_->peak()},
                        {"footprints", footprints},   {"resident", resident},       {"switch_stages", stages}};
    }
    return out;
  }

  std::string Metrics() {
    int64_t busy = 0;
    for (const auto& [name, s] : models_) busy += s->stream->busy() ? 1 : 0;
    busy_->Add({{"device", device_kind_}}).Set(static_cast<double>(busy));
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }

  void Stopping() { stopping_.store(true); }

  void Close() {
    for (const auto& [name, s] : models_) s->stream->Close();  // finish queued requests, stop the submitters
    if (switcher_.defined()) switcher_->Close();
  }

 private:
  static constexpr int kSwitchGroups = 8;  // sub-tasks per model (runtime/switching.py's SwitchSettings.max_groups)

  /*! \brief The model `name` at `version` ("" or "1"), else 404. */
  Served& Find(const std::string& name, const std::string& version) {
    auto found = models_.find(name);
    if (found == models_.end()) throw HttpError(404, "no model named '" + name + "'");
    if (!version.empty() && version != found->second->version) {
      throw HttpError(
          404, "model '" + name + "' has no version '" + version + "' (it has version " + found->second->version + ")");
    }
    return *found->second;
  }

  /*! \brief Why `s` takes no requests now (503), else empty. */
  std::string NotReady(const Served& s) const {
    std::string why = ServerNotReady();
    if (!why.empty()) return why;
    if (std::string q = s.model->quarantined(); !q.empty()) return "model '" + s.name + "' is quarantined: " + q;
    if (std::string p = s.model->placement_error(); !p.empty()) return "model '" + s.name + "' cannot be placed: " + p;
    return "";
  }

  json StatsOf(const Served& s) const {
    json inference = {{"success", s.success.Json()},
                      {"fail", s.fail.Json()},
                      {"queue", s.queue.Json()},
                      {"compute_input", s.compute_input.Json()},
                      {"compute_infer", s.compute_infer.Json()},
                      {"compute_output", s.compute_output.Json()},
                      {"cache_hit", {{"count", 0}, {"ns", 0}}},
                      {"cache_miss", {{"count", 0}, {"ns", 0}}}};
    json batches = json::array();
    if (s.success.count.load()) {
      batches.push_back({{"batch_size", 1},
                         {"compute_input", s.compute_input.Json()},
                         {"compute_infer", s.compute_infer.Json()},
                         {"compute_output", s.compute_output.Json()}});
    }
    return {{"name", s.name},
            {"version", s.version},
            {"last_inference", s.last_inference_ms.load()},
            {"inference_count", s.success.count.load()},
            {"execution_count", s.success.count.load()},
            {"inference_stats", inference},
            {"batch_stats", batches},
            {"memory_usage", json::array()}};
  }

  /*! \brief Submit `tensors` to `s` and wait: the finished request (its queue and compute times in `timing`), or
   *  HttpError 503 (--max-queue) or 400 (the engine's one line). */
  tvmsched::Request Execute(Served& s, const ffi::Map<ffi::String, ffi::Tensor>& tensors, Timing* timing) {
    struct Pending {  // queued or running: counted until it is done
      Served& s;
      int64_t now;
      explicit Pending(Served& s) : s(s), now(s.pending.fetch_add(1) + 1) { s.nv_pending->Increment(); }
      ~Pending() {
        s.pending.fetch_sub(1);
        s.nv_pending->Decrement();
      }
    } pending(s);
    if (options_.max_queue && pending.now > options_.max_queue) {
      throw HttpError(503, "model '" + s.name + "' has " + std::to_string(options_.max_queue) +
                               " requests queued or running, the limit of --max-queue: try again later");
    }
    bool realtime = s.priority == "realtime";
    tvmsched::Request request;
    try {
      request = s.stream->Submit(tensors, {});
    } catch (const ffi::Error& err) {
      s.rejected.fetch_add(1);
      throw HttpError(400, err.message());
    }
    if (realtime) priorities_.Hold(request, s.stream);  // queued first: it starts on its own stream while others stop
    request->Wait(-1, 50);
    if (!request->error().empty()) throw HttpError(400, std::string(request->error()));
    double ms = (request->finished_us - request->submitted_us) / 1e3;
    s.latency->Observe(ms / 1e3);
    if (s.qos_ms && ms > *s.qos_ms) s.qos_violations->Increment();
    timing->queue = static_cast<int64_t>(std::max(0.0, request->started_us - request->submitted_us) * 1e3);
    timing->infer = static_cast<int64_t>(std::max(0.0, request->finished_us - request->started_us) * 1e3);
    return request;
  }

  void Succeeded(Served& s, const Timing& t) {
    s.success.Add(t.request);
    s.queue.Add(t.queue);
    s.compute_input.Add(t.input);
    s.compute_infer.Add(t.infer);
    s.compute_output.Add(t.output);
    s.last_inference_ms.store(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
    s.nv_success->Increment();
    s.nv_count->Increment();
    s.nv_exec->Increment();
    s.nv_request_us->Increment(t.request / 1e3);
    s.nv_queue_us->Increment(t.queue / 1e3);
    s.nv_input_us->Increment(t.input / 1e3);
    s.nv_infer_us->Increment(t.infer / 1e3);
    s.nv_output_us->Increment(t.output / 1e3);
  }

  void Failed(Served& s, int64_t ns) {
    s.errors->Increment();
    s.fail.Add(ns);
    s.nv_failure->Increment();
  }

  std::shared_ptr<prometheus::Registry> registry_;
  ServerOptions options_;
  prometheus::Family<prometheus::Counter>*requests_, *errors_, *qos_violations_, *preemptions_;
  prometheus::Family<prometheus::Histogram>* latency_;
  prometheus::Family<prometheus::Gauge>* busy_;
  prometheus::Family<prometheus::Counter>*nv_success_, *nv_failure_, *nv_count_, *nv_exec_, *nv_request_us_,
      *nv_queue_us_, *nv_input_us_, *nv_infer_us_, *nv_output_us_;
  prometheus::Family<prometheus::Gauge>* nv_pending_;
  std::map<std::string, std::unique_ptr<Served>> models_;  // loaded before serving; read-only after
  std::vector<std::string> order_;
  std::string device_kind_ = "cpu";
  Priorities priorities_;
  std::shared_ptr<tvmsched::MemoryScope> scope_;  // --memory-budget: the models' budget and its switcher
  tvmsched::Switcher switcher_;
  std::atomic<bool> stopping_{false};
};

struct ModelSpec {
  std::string name, path, priority = "best_effort";
  std::optional<double> qos_ms;
};

ModelSpec ParseModel(const std::string& spec) {
  auto bad = [&] { return std::runtime_error("--model '" + spec + "' is not NAME=ARTIFACT[:QOS_MS[:PRIORITY]]"); };
  size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) throw bad();
  ModelSpec out;
  out.name = spec.substr(0, eq);
  std::vector<std::string> parts;
  std::string rest = spec.substr(eq + 1);
  for (size_t at = 0;;) {
    size_t colon = rest.find(':', at);
    parts.push_back(rest.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  if (parts.size() > 3 || parts[0].empty()) throw bad();
  out.path = parts[0];
  if (parts.size() > 1 && !parts[1].empty()) {
    char* end = nullptr;
    double qos = std::strtod(parts[1].c_str(), &end);
    if (*end != '\0' || !(qos > 0)) throw bad();
    out.qos_ms = qos;
  }
  if (parts.size() > 2 && !parts[2].empty()) {
    if (parts[2] != "realtime" && parts[2] != "best_effort") {
      throw std::runtime_error("priority must be realtime or best_effort, not '" + parts[2] + "'");
    }
    out.priority = parts[2];
  }
  return out;
}

void Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  // with a charset, cpp-httplib never compresses the answer (it compresses only exact content types): a client
  // sending "Accept-Encoding: br" (browsers, locust, httpx with brotli installed) got every answer brotli'd at
  // quality 11, ~1 s of a core for bert-tiny's 320 kB; examples/server.py never compresses either.
  // Invalid UTF-8 (a model name in the URL) is replaced, never thrown.
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json; charset=utf-8");
}

std::string OneLine(std::string text) {
  for (char& c : text) c = c == '\n' || c == '\r' ? ' ' : c;
  return text;
}

/*! \brief An Open Inference Protocol error: {"error": one line}. */
void ReplyError(httplib::Response& res, int status, const std::string& message) {
  Reply(res, status, {{"error", OneLine(message)}});
}

/*! \brief A /v2 handler: every exception answered {"error": ...} (HttpError's status; engine errors 400). */
template <typename F>
httplib::Server::Handler V2(F handler) {
  return [handler](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(req, res);
    } catch (const HttpError& err) {
      ReplyError(res, err.status, err.what());
    } catch (const kserve::Error& err) {
      ReplyError(res, err.status, err.what());
    } catch (const ffi::Error& err) {
      ReplyError(res, 400, err.message());
    } catch (const std::exception& err) {
      ReplyError(res, 500, err.what());
    }
  };
}

/*! \brief Bytes from "1048576", "512MiB", "2GiB" or "1.5GB" (runtime/tiering.py's parse_bytes: units B, KB..TB
 *  decimal, KiB..TiB binary, case-insensitive; a fraction of a byte dropped); at least 1. */
size_t ParseBytes(const std::string& flag, const std::string& text) {
  auto bad = [&] {
    return std::runtime_error(flag +
                              " must be a number of bytes, optionally with a unit (B, KB, MB, GB, TB, KiB, MiB, " +
                              "GiB, TiB), of at least 1 byte, not '" + text + "'");
  };
  size_t at = 0, end = text.size();
  while (at < end && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
  while (end > at && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  size_t number = at;
  while (number < end && (std::isdigit(static_cast<unsigned char>(text[number])) || text[number] == '.')) ++number;
  std::string digits = text.substr(at, number - at), unit;
  size_t unit_at = number;
  while (unit_at < end && std::isspace(static_cast<unsigned char>(text[unit_at]))) ++unit_at;
  for (size_t i = unit_at; i < end; ++i) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  static const std::map<std::string, long double> kUnits = {{"", 1},
                                                            {"b", 1},
                                                            {"kb", 1e3},
                                                            {"mb", 1e6},
                                                            {"gb", 1e9},
                                                            {"tb", 1e12},
                                                            {"kib", 1024.0L},
                                                            {"mib", 1048576.0L},
                                                            {"gib", 1073741824.0L},
                                                            {"tib", 1099511627776.0L}};
  auto scale = kUnits.find(unit);
  if (digits.empty() || digits == "." || std::count(digits.begin(), digits.end(), '.') > 1 || scale == kUnits.end())
    throw bad();
  long double bytes = std::strtold(digits.c_str(), nullptr) * scale->second;
  if (!(bytes >= 1) || bytes > 1e18L) throw bad();
  return static_cast<size_t>(bytes);
}

/*! \brief A non-negative integer flag's value. */
long long ParseCount(const std::string& flag, const std::string& text, long long min) {
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || n < min) {
    throw std::runtime_error(flag + " must be an integer of at least " + std::to_string(min) + ", not '" + text + "'");
  }
  return n;
}

int Fail(const std::string& message) {
  std::string line = message;
  for (char& c : line) c = c == '\n' ? ' ' : c;
  std::cerr << "error: " << line << std::endl;
  return 2;
}

int Main(int argc, char** argv) {
  std::vector<ModelSpec> specs;
  std::string host = "127.0.0.1", device = "cpu";
  std::vector<std::string> trusted;
  int port = 8080;
  size_t max_body_bytes = 16 << 20;  // a request body larger than this is refused (413) before it is read
  ServerOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (arg.rfind(flag + "=", 0) == 0) return arg.substr(flag.size() + 1);
      if (i + 1 >= argc) throw std::runtime_error(flag + " needs a value (" + kUsage + ")");
      return argv[++i];
    };
    auto is = [&](const std::string& flag) { return arg == flag || arg.rfind(flag + "=", 0) == 0; };
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage << "\n";
      return 0;
    } else if (is("--model")) {
      specs.push_back(ParseModel(value("--model")));
    } else if (is("--port")) {
      std::string text = value("--port");
      char* end = nullptr;
      long p = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || p < 0 || p > 65535)
        throw std::runtime_error("--port must be 0..65535, not '" + text + "'");
      port = static_cast<int>(p);
    } else if (is("--trust")) {
      trusted.push_back(value("--trust"));
    } else if (is("--max-body-bytes")) {
      std::string text = value("--max-body-bytes");
      char* end = nullptr;
      long long n = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || n < 1)
        throw std::runtime_error("--max-body-bytes must be a positive integer, not '" + text + "'");
      max_body_bytes = static_cast<size_t>(n);
    } else if (is("--memory-budget")) {
      options.memory_budget = ParseBytes("--memory-budget", value("--memory-budget"));
    } else if (is("--max-queue")) {
      options.max_queue = ParseCount("--max-queue", value("--max-queue"), 0);
    } else if (is("--host")) {
      host = value("--host");
    } else if (is("--device")) {
      device = value("--device");
      if (device != "cpu" && device != "cuda")
        throw std::runtime_error("--device must be cpu or cuda, not '" + device + "'");
    } else {
      throw std::runtime_error("unknown argument " + arg + " (" + kUsage + ")");
    }
  }
  if (specs.empty()) throw std::runtime_error(std::string("at least one --model is required (") + kUsage + ")");

  // SIGINT/SIGTERM stop the server from a thread of their own; every thread started below inherits the mask
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Server server(device, options);
  tvmsched::TrustedKeys keys = tvmsched::TrustedKeys::FromFiles(trusted);
  for (const ModelSpec& spec : specs) server.Load(spec.name, spec.path, spec.qos_ms, spec.priority, device, keys);

  httplib::Server http;
  // small JSON answers on kept-alive connections: without TCP_NODELAY each one waits ~40 ms for the
  // client's delayed ACK (Nagle); keep connections for many requests, one pool thread per connection
  http.set_tcp_nodelay(true);
  http.set_payload_max_length(max_body_bytes);  // 413 Payload Too Large, the body never buffered
  http.set_keep_alive_max_count(100000);
  http.new_task_queue = [] { return new httplib::ThreadPool(64); };
  http.Post(R"(/v1/models/([^/]+)/infer)", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      Reply(res, 200, server.Infer(req.matches[1], req.body));
    } catch (const HttpError& err) {
      Reply(res, err.status, {{"detail", err.detail}});
    } catch (const ffi::Error& err) {
      Reply(res, 400, {{"detail", err.message()}});
    } catch (const std::exception& err) {
      Reply(res, 500, {{"detail", err.what()}});
    }
  });
  http.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) { Reply(res, 200, server.Models()); });
  http.Get("/v1/stats", [&](const httplib::Request&, httplib::Response& res) { Reply(res, 200, server.Stats()); });
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(server.Metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });

  // the Open Inference Protocol (KServe v2); a model's routes take an optional /versions/{version}
  const std::string model = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";
  http.Get("/v2/health/live",
           [](const httplib::Request&, httplib::Response& res) { Reply(res, 200, {{"live", true}}); });
  http.Get("/v2/health/ready", V2([&](const httplib::Request&, httplib::Response& res) {
             std::string why = server.ServerNotReady();
             Reply(res, why.empty() ? 200 : 503,
                   why.empty() ? json{{"ready", true}} : json{{"ready", false}, {"error", why}});
           }));
  http.Get("/v2",
           V2([&](const httplib::Request&, httplib::Response& res) { Reply(res, 200, server.ServerMetadata()); }));
  http.Get("/v2/models/stats", V2([&](const httplib::Request&, httplib::Response& res) {
             Reply(res, 200, server.ModelStats(std::nullopt, ""));
           }));
  http.Get(model, V2([&](const httplib::Request& req, httplib::Response& res) {
             Reply(res, 200, server.ModelMetadata(req.matches[1], req.matches[2]));
           }));
  http.Get(model + "/ready", V2([&](const httplib::Request& req, httplib::Response& res) {
             std::string why = server.ModelNotReady(req.matches[1], req.matches[2]);
             json body = {{"name", std::string(req.matches[1])}, {"ready", why.empty()}};
             if (!why.empty()) body["error"] = OneLine(why);
             Reply(res, why.empty() ? 200 : 503, body);
           }));
  http.Get(model + "/config", V2([&](const httplib::Request& req, httplib::Response& res) {
             Reply(res, 200, server.ModelConfig(req.matches[1], req.matches[2]));
           }));
  http.Get(model + "/stats", V2([&](const httplib::Request& req, httplib::Response& res) {
             Reply(res, 200, server.ModelStats(std::string(req.matches[1]), req.matches[2]));
           }));
  http.Post(model + "/infer", V2([&](const httplib::Request& req, httplib::Response& res) {
              const char* header = "Inference-Header-Content-Length";
              kserve::Response out = server.InferV2(req.matches[1], req.matches[2], req.body, req.has_header(header),
                                                    req.get_header_value(header));
              res.status = 200;
              if (out.header_length) {  // binary outputs follow the JSON header
                res.set_header(header, std::to_string(*out.header_length));
                res.set_content(std::move(out.body), "application/octet-stream");
              } else {
                res.set_content(std::move(out.body), "application/json; charset=utf-8");
              }
            }));
  // a request's X-Request-Id comes back on its answer (errors included): clients match answers to requests
  http.set_post_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.has_header("X-Request-Id")) res.set_header("X-Request-Id", req.get_header_value("X-Request-Id"));
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // our own {"detail"/"error": ...}
    const char* text = res.status == 404   ? "Not Found"
                       : res.status == 405 ? "Method Not Allowed"
                       : res.status == 413 ? "Payload Too Large"
                       : res.status < 500  ? "Bad Request"
                                           : "Internal Server Error";
    if (req.path == "/v2" || req.path.rfind("/v2/", 0) == 0)
      ReplyError(res, res.status, text);  // the Open Inference Protocol's errors
    else
      Reply(res, res.status, {{"detail", text}});
    return httplib::Server::HandlerResponse::Handled;
  }));

  if (port == 0) {
    port = http.bind_to_any_port(host);
    if (port < 0) throw std::runtime_error("cannot listen on " + host);
  } else if (!http.bind_to_port(host, port)) {
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port));
  }
  std::thread([&http, &server, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    server.Stopping();
    http.stop();
  }).detach();
  std::string names;
  for (const ModelSpec& spec : specs) names += (names.empty() ? "" : ", ") + spec.name;
  std::cout << "tvmsched_server: serving " << names << " on http://" << host << ":" << port << std::endl;
  http.listen_after_bind();
  server.Close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const tvm::ffi::Error& err) {
    return Fail(err.message());
  } catch (const std::exception& err) {
    return Fail(err.what());
  }
}
