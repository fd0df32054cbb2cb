// tvmsched_server: an HTTP adapter over the engine's multi-tenant runtime (tvmsched::Runtime, tvmsched/runtime.h):
// the Open Inference Protocol (KServe v2) over REST with Triton's binary tensor data, model configuration and
// statistics extensions, as `tvmsched serve` speaks it, with no Python in the request path (docs/cpp-server.md).
//
//   tvmsched_server --model mlp=mlp.tvms:20:realtime --model-repository models/ --policy colocation --port 8000
//
// The Runtime does the multi-tenant work: placement under --memory-budget (switched, or streamed from the host when
// larger than the budget), each model on its `streams`, requests queued on the model and the policy (--policy
// colocation, fastest, partition or fcfs) deciding when a stream takes one, real-time requests preempting best-effort
// streams, Triton's queue policy (max_queue, per-request timeout), admission by latency target. This file maps
// flags, model-repository configs and request parameters onto it, and the protocol's messages onto Submit.
// /v1 (examples/server.py's JSON contract) is a thin front of the same path: its inputs become the same tensors, go
// to the same Submit and are counted in the same statistics.
// Request bodies are read and answers written by the engine's codec (tvmsched/kserve.h), the one `tvmsched serve`
// uses too; each model's admission, Triton's counters and the JSON of its metadata, configuration and statistics are
// the engine's too (tvmsched/serving.h), and so is the reading of a model repository (tvmsched/repository.h, which
// hands config.pbtxt and config.toml to config_json.cc). HTTP: cpp-httplib; JSON of the other routes: nlohmann-json;
// both from Debian (libcpp-httplib-dev, nlohmann-json3-dev).
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <tvmsched/engine.h>
#include <tvmsched/repository.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef TVMSCHED_VERSION
#define TVMSCHED_VERSION "unknown"
#endif

tvmsched::serving::ToJson ConfigToJson();  // config_json.cc

namespace {

namespace ffi = tvm::ffi;
namespace fs = std::filesystem;
using json = nlohmann::json;
namespace kserve = tvmsched::kserve;
using tvmsched::serving::NowNs;
using Spec = tvmsched::serving::ModelSpec;

constexpr const char* kUsage =
    "usage: tvmsched_server [--model NAME=ARTIFACT[:QOS_MS[:PRIORITY]] ...] [--model-repository DIR] [--policy "
    "colocation|fastest|partition|fcfs] [--colocation PROFILE.json] [--memory-budget BYTES] [--max-queue N] "
    "[--device cpu|cuda] [--devices cuda:0,cuda:1|all] [--trust KEY.pub ...] [--host 127.0.0.1] [--port N] "
    "[--max-body-bytes N] [--no-warmup]";

struct HttpError : std::runtime_error {
  int status;
  HttpError(int status, const std::string& message) : std::runtime_error(message), status(status) {}
};

/*! \brief A loaded model: the engine's record of it as served (tvmsched/serving.h: admission, Triton's and
 *  tvmsched's counters, its descriptions; `tvmsched serve` keeps the same). */
struct Served {
  tvmsched::serving::Served book;  // (its options: the name and version it is served by)
  tvmsched::Model model;           // its first engine model (a split model's first part)
};

/*! \brief What a request got to: admitted (and how many rows), submitted, and the server's parse and encode times. */
struct Attempt {
  tvmsched::Request request;
  int64_t rows = 1, input_ns = 0, output_ns = 0;
  bool admitted = false;
};

constexpr double kMaxSpinUs = 2000;  // a handler polls for its request at most this long before it sleeps

std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  return text;
}

/*! \brief `parameters.priority` and `.timeout` (µs, Triton's) as Runtime::Submit takes them (the engine's reading,
 *  kserve::ReadScheduling, which tvmsched serve uses too). */
tvmsched::SubmitOptions Scheduling(const ffi::Map<ffi::Any, ffi::Any>& parameters) {
  kserve::Scheduling read = kserve::ReadScheduling(parameters);
  tvmsched::SubmitOptions options;
  options.priority = read.priority;
  if (read.timeout_us > 0) options.timeout_us = static_cast<double>(read.timeout_us);
  return options;
}

class Server {
 public:
  Server(tvmsched::RuntimeOptions options, int64_t max_queue)
      : runtime_(tvmsched::Runtime::Create(options)), max_queue_(max_queue) {}

  void Load(const Spec& spec) {
    if (models_.count(spec.name)) throw std::runtime_error("two models are named '" + spec.name + "'");
    tvmsched::ModelOptions options;
    options.name = spec.name;
    options.qos_ms = spec.qos_ms;
    options.realtime = spec.priority == "realtime";
    options.streams = spec.streams;
    options.devices = spec.devices;
    options.warmup = spec.warmup;
    options.refresh_sizes = spec.refresh_sizes;
    options.max_queue_delay_us = spec.max_queue_delay_us;
    options.preferred_batch_sizes = spec.preferred_batch_sizes;
    if (spec.queue) options.queue = *spec.queue;
    auto s = std::make_unique<Served>();
    options.queue.max_queue_size = spec.max_queue >= 0 ? spec.max_queue : max_queue_;
    runtime_->Load(spec.path, options);
    s->model = runtime_->engine_models(spec.name).at(0);
    s->book = tvmsched::serving::Served(ffi::make_object<tvmsched::serving::ServedObj>(
        runtime_, tvmsched::serving::ServedOptions{spec.name, spec.version, std::max<int64_t>(spec.max_batch_size, 0),
                                                   options.queue.max_queue_size, spec.streams, spec.max_queue_delay_us,
                                                   spec.preferred_batch_sizes}));
    books_.push_back(s->book);
    models_[spec.name] = std::move(s);
  }

  /*! \brief POST /v2/models/{name}[/versions/{version}]/infer */
  kserve::Response InferV2(const std::string& name, const std::string& version, const httplib::Request& req) {
    int64_t start = NowNs();
    Served& s = Find(name, version);
    return Counted(s, start, [&](Attempt& a) {
      const char* header = "Inference-Header-Content-Length";
      kserve::Request parsed = kserve::ParseRequest(
          req.body, kserve::HeaderLength(req.get_header_value(header), req.has_header(header), req.body.size()), name,
          s.book->inputs, s.book->outputs);
      a.input_ns = NowNs() - start;
      Execute(s, parsed.inputs, Scheduling(parsed.parameters), a);
      int64_t encode = NowNs();
      kserve::Response response = kserve::EncodeResponse(name, s.book->options.version, parsed, a.request->outputs());
      a.output_ns = NowNs() - encode;
      return response;
    });
  }

  /*! \brief POST /v1/models/{name}/infer: {"inputs": {NAME: nested list}} -> {"outputs": {NAME: nested list}}. */
  std::string InferV1(const std::string& name, const std::string& body) {
    int64_t start = NowNs();
    Served& s = Find(name, "");
    // a body of another form is not a request (422 before it is counted, as FastAPI's validation in examples/server.py)
    ffi::Map<ffi::String, ffi::Tensor> inputs = kserve::ParseV1(body, s.book->inputs);
    return Counted(s, start, [&](Attempt& a) {
      a.input_ns = NowNs() - start;
      Execute(s, inputs, {}, a);
      int64_t encode = NowNs();
      std::string out = kserve::EncodeV1(a.request->outputs());
      a.output_ns = NowNs() - encode;
      return out;
    });
  }

  /*! \brief Why the server (or model `name`) takes no requests now (503), else empty. `in_flight`: for a request that
   *  reached its handler: one that came before a SIGTERM is still answered (only the probes say it is shutting down).
   */
  std::string NotReady(const std::string& name = "", const std::string& version = "", bool in_flight = false) {
    if (stopping_ && !in_flight) return "the server is shutting down";
    if (name.empty()) {
      std::string lost = books_.empty() ? "" : models_[books_[0]->options.name]->model->device().faults().lost;
      return lost.empty() ? "" : "the device is lost (docs/faults.md): " + lost;
    }
    const tvmsched::Model& model = Find(name, version).model;
    if (std::string q = model->quarantined(); !q.empty()) return "model '" + name + "' is quarantined: " + q;
    if (std::string p = model->placement_error(); !p.empty()) return "model '" + name + "' cannot be placed: " + p;
    return NotReady("", "", in_flight);
  }

  std::string ModelMetadata(const std::string& name, const std::string& version) {
    return Find(name, version).book->Metadata();
  }
  /*! \brief Triton's model configuration (the engine's, as `tvmsched serve` answers it). */
  std::string ModelConfig(const std::string& name, const std::string& version) {
    return Find(name, version).book->Config();
  }
  /*! \brief Triton's statistics of one model or, without a name, of all. */
  std::string Statistics(const std::string& name, const std::string& version) {
    if (name.empty()) return tvmsched::serving::Statistics(books_);
    return tvmsched::serving::Statistics({Find(name, version).book});
  }

  /*! \brief GET /v1/models (the engine's, as `tvmsched serve` answers it). */
  std::string ModelsV1() { return tvmsched::serving::V1Models(books_); }

  /*! \brief GET /v1/stats (the engine's, as `tvmsched serve` answers it). */
  std::string StatsV1() { return tvmsched::serving::V1Stats(books_); }

  /*! \brief Prometheus text: Triton's nv_inference_* series (the engine's, as `tvmsched serve` writes them) and the
   *  tvmsched_* series of examples/server.py. */
  /*! \brief GET /metrics: Triton's families and tvmsched's, the engine's as `tvmsched serve` writes them. */
  std::string Metrics() {
    return tvmsched::serving::TritonMetrics(books_) + tvmsched::serving::TvmschedMetrics(books_);
  }

  void Stopping() { stopping_ = true; }
  void Close() { runtime_->Shutdown(); }
  const std::vector<tvmsched::serving::Served>& books() const { return books_; }

 private:
  /*! \brief The model a request names (the engine's lookup and 404 line, as `tvmsched serve`'s). */
  Served& Find(const std::string& name, const std::string& version) {
    return *models_.at(books_[tvmsched::serving::Find(books_, name, version)]->options.name);
  }

  /*! \brief Run `handle` (parse, Execute, encode) for model `s` and count it in its book: answered (admitted and run,
   *  or failed after admission), or refused before admission; errors rethrown. */
  template <typename F>
  auto Counted(Served& s, int64_t start, F handle) -> decltype(handle(std::declval<Attempt&>())) {
    Attempt a;
    try {
      if (std::string why = NotReady(s.book->options.name, "", true); !why.empty()) throw HttpError(503, why);
      auto answer = handle(a);
      s.book->Answered(a.request.get(), a.rows, false, start, a.input_ns, a.output_ns);
      return answer;
    } catch (...) {
      a.admitted ? s.book->Answered(a.request.get(), a.rows, true, start, 0, 0) : s.book->Refused(start);
      throw;
    }
  }

  /*! \brief Admit, submit to the Runtime and wait. Refused at admission or submit (the queue full, the latency target
   *  out of reach, the runtime closing): 503; timed out in the queue: 504, as `tvmsched serve`; another engine error:
   *  400. */
  void Execute(Served& s, const ffi::Map<ffi::String, ffi::Tensor>& inputs, tvmsched::SubmitOptions o, Attempt& a) {
    const int64_t batch = s.book->batch;
    if (batch > 0 && inputs.size() > 0) {  // (a Triton config's max_batch_size may be below the compiled size)
      auto [name, first] = *inputs.begin();
      a.rows = first.ndim() > 0 ? first.shape()[0] : 1;
      if (a.rows > batch)
        throw HttpError(400, "input '" + std::string(name) + "' has " + std::to_string(a.rows) +
                                 " rows: the model takes 1 to " + std::to_string(batch) +
                                 " rows per request (max_batch_size)");
    }
    const int64_t limit = s.book->options.max_queue;
    if (s.book->Admit() < 0)
      throw HttpError(
          503, "model '" + s.book->options.name + "' has " + std::to_string(limit) +
                   " requests queued or running, its limit: try again later (--max-queue, the model's max_queue)");
    a.admitted = true;
    try {
      a.request = runtime_->Submit(s.book->options.name, inputs, o);
    } catch (const ffi::Error& err) {
      std::string line = err.message();
      bool full = line.find("its queue is full") != std::string::npos;
      bool refused = full || line.find("refused") != std::string::npos || line.find("shut down") != std::string::npos;
      throw HttpError(refused ? 503 : 400,
                      full ? line + ": try again later (--max-queue, the model's max_queue)" : line);
    }
    // the handler polls (yielding its core) for about the model's recent compute time, then sleeps: a request of a
    // few hundred µs is seen done at once instead of after a condition variable's wake-up
    double recent_us = static_cast<double>(s.book->recent_ns.load()) / 1e3;
    a.request->Wait(-1, std::clamp(1.5 * recent_us, 50.0, kMaxSpinUs));
    std::string error = a.request->error();
    bool late = error.find("timed out in the queue") != std::string::npos ||
                error.find("within its deadline") != std::string::npos;
    if (!error.empty()) throw HttpError(late ? 504 : 400, error);
  }

  tvmsched::Runtime runtime_;
  int64_t max_queue_;
  std::map<std::string, std::unique_ptr<Served>> models_;  // loaded before serving; read-only after
  std::vector<tvmsched::serving::Served> books_;           // in the order loaded
  std::atomic<bool> stopping_{false};
};

// ---- flags and the model repository -------------------------------------------------------------------------------

/*! \brief Bytes from "1048576", "512MiB", "2GiB" or "1.5GB" (runtime/tiering.py's parse_bytes); at least 1. */
size_t ParseBytes(const std::string& flag, const std::string& text) {
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
  std::string trimmed = text;
  trimmed.erase(0, trimmed.find_first_not_of(" \t"));
  trimmed.erase(trimmed.find_last_not_of(" \t") + 1);
  size_t digits = trimmed.find_first_not_of("0123456789.");
  std::string number = trimmed.substr(0, digits), unit = digits == std::string::npos ? "" : trimmed.substr(digits);
  unit.erase(0, unit.find_first_not_of(" \t"));
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  auto scale = kUnits.find(unit);
  long double bytes =
      number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1 || scale == kUnits.end()
          ? 0
          : std::strtold(number.c_str(), nullptr) * scale->second;
  if (!(bytes >= 1) || bytes > 1e18L) {
    throw std::runtime_error(flag +
                             " must be a number of bytes, optionally with a unit (B, KB, MB, GB, TB, KiB, MiB, "
                             "GiB, TiB), of at least 1 byte, not '" +
                             text + "'");
  }
  return static_cast<size_t>(bytes);
}

long long ParseCount(const std::string& flag, const std::string& text, long long min, long long max) {
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || n < min || n > max) {
    throw std::runtime_error(flag + " must be an integer of at least " + std::to_string(min) + ", not '" + text + "'");
  }
  return n;
}

// ---- HTTP -----------------------------------------------------------------------------------------------------------

void Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;  // with a charset cpp-httplib never compresses the answer (~1 s of brotli for a large one)
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json; charset=utf-8");
}

/*! \brief A handler whose errors are one line: {"error": ...} on /v2, {"detail": ...} on /v1 (engine errors 400). */
template <typename F>
httplib::Server::Handler Handle(const char* key, F handler) {
  return [key, handler](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(req, res);
    } catch (const HttpError& err) {
      Reply(res, err.status, {{key, OneLine(err.what())}});
    } catch (const kserve::Error& err) {
      Reply(res, err.status, {{key, OneLine(err.what())}});
    } catch (const ffi::Error& err) {
      Reply(res, 400, {{key, OneLine(err.message())}});
    } catch (const std::exception& err) {
      Reply(res, 500, {{key, OneLine(err.what())}});
    }
  };
}

int Main(int argc, char** argv) {
  std::vector<Spec> specs;
  std::string host = "127.0.0.1", repository, colocation, devices;
  tvmsched::RuntimeOptions options;
  options.max_groups = 8;  // sub-tasks per switched model, as runtime/switching.py's SwitchSettings
  int64_t max_queue = 64;
  int port = 8080;
  size_t max_body_bytes = 16 << 20;
  bool warmup = true;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto is = [&](const std::string& flag) { return arg == flag || arg.rfind(flag + "=", 0) == 0; };
    auto value = [&]() -> std::string {
      if (arg.find('=') != std::string::npos) return arg.substr(arg.find('=') + 1);
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value (" + kUsage + ")");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage << "\n";
      return 0;
    } else if (is("--model")) {
      specs.push_back(tvmsched::serving::ModelFlag(value()));
    } else if (is("--model-repository")) {
      repository = value();
    } else if (is("--policy")) {
      options.policy = value();
    } else if (is("--colocation")) {
      colocation = value();
    } else if (is("--port")) {
      port = static_cast<int>(ParseCount("--port", value(), 0, 65535));
    } else if (is("--trust")) {
      options.trusted_keys.push_back(value());
    } else if (is("--max-body-bytes")) {
      max_body_bytes = static_cast<size_t>(ParseCount("--max-body-bytes", value(), 1, 1LL << 40));
    } else if (is("--memory-budget")) {
      options.devices[0].memory_budget = ParseBytes("--memory-budget", value());
    } else if (is("--max-queue")) {
      max_queue = ParseCount("--max-queue", value(), 0, 1 << 20);
    } else if (arg == "--warmup" || arg == "--no-warmup") {
      warmup = arg == "--warmup";
    } else if (is("--host")) {
      host = value();
    } else if (is("--device")) {
      options.devices[0].kind = value();
    } else if (is("--devices")) {  // several (docs/multi-device.md): "cuda:0,cuda:1", or CPU shares "cpu:0,cpu:1"
      devices = value();
    } else {
      throw std::runtime_error("unknown argument " + arg + " (" + kUsage + ")");
    }
  }
  for (Spec& spec : specs) spec.warmup = warmup;
  std::vector<std::string> device_names{options.devices[0].kind};
  if (devices == "all") {  // every GPU this process sees
    int count = 0;
    try {
      count = tvmsched::CudaDeviceCount();
    } catch (const std::exception& err) {
      throw std::runtime_error("--devices all: " + OneLine(err.what()));
    }
    if (count == 0) throw std::runtime_error("--devices all: the CUDA driver sees no GPU");
    devices.clear();
    for (int i = 0; i < count; ++i) devices += (i ? ",cuda:" : "cuda:") + std::to_string(i);
  }
  if (!devices.empty()) {
    const size_t budget = options.devices[0].memory_budget;  // (each device's)
    options.devices.clear();
    device_names.clear();
    for (size_t at = 0; at <= devices.size();) {
      size_t comma = std::min(devices.find(',', at), devices.size());
      device_names.push_back(devices.substr(at, comma - at));
      options.devices.push_back(tvmsched::ParseDeviceSpec(device_names.back()));
      options.devices.back().memory_budget = budget;
      at = comma + 1;
    }
  }
  if (!repository.empty()) {
    for (const std::string& name : tvmsched::serving::RepositoryNames(repository))
      specs.push_back(tvmsched::serving::ReadModelFolder(repository, name, device_names, ConfigToJson()));
  }
  if (specs.empty())
    throw std::runtime_error(std::string("nothing to serve: give --model and/or --model-repository (") + kUsage + ")");
  if (!colocation.empty()) {  // `tvmsched profile-coloc --out` rows: {"first", "second", "overhead_per_unit_time"}
    std::ifstream file(colocation);
    json rows = file ? json::parse(file, nullptr, false) : json();
    if (!rows.is_array()) throw std::runtime_error("--colocation " + colocation + ": not a JSON list of profile rows");
    const int units = tvmsched::DeviceUnits(options.devices);  // (several CPU devices: a share's)
    options.colocation = std::make_shared<tvmsched::ColocationTable>(units);
    std::vector<tvmsched::ColocationTable::Measured> pairs;
    for (const json& row : rows) pairs.push_back({row.at("first"), row.at("second"), row.at("overhead_per_unit_time")});
    options.colocation->AddMeasured(pairs);
  }

  sigset_t signals;  // SIGINT/SIGTERM stop the server from a thread of their own; every thread inherits the mask
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Server server(options, max_queue);
  for (const Spec& spec : specs) server.Load(spec);

  httplib::Server http;
  http.set_tcp_nodelay(true);  // small answers on kept-alive connections: no 40 ms wait for a delayed ACK
  http.set_payload_max_length(max_body_bytes);  // 413, the body never buffered
  http.set_keep_alive_max_count(100000);
  http.new_task_queue = [] { return new httplib::ThreadPool(64); };
  const std::string model = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";
  auto get = [&](const std::string& route, auto answer) {
    http.Get(route, Handle("error", [answer](const httplib::Request& req, httplib::Response& res) {
               Reply(res, 200, answer(req));
             }));
  };
  get("/v2/health/live", [](const httplib::Request&) { return json{{"live", true}}; });
  http.Get("/v2/health/ready", Handle("error", [&](const httplib::Request&, httplib::Response& res) {
             std::string why = server.NotReady();
             Reply(res, why.empty() ? 200 : 503,
                   why.empty() ? json{{"ready", true}} : json{{"ready", false}, {"error", why}});
           }));
  get("/v2", [](const httplib::Request&) {
    return json{
        {"name", "tvmsched"},
        {"version", TVMSCHED_VERSION},
        {"extensions", {"binary_tensor_data", "model_configuration", "statistics", "parameters", "schedule_policy"}}};
  });
  auto text = [&](const std::string& route, auto answer) {  // (JSON written by the engine)
    http.Get(route, Handle("error", [answer](const httplib::Request& req, httplib::Response& res) {
               res.set_content(answer(std::string(req.matches[1]), std::string(req.matches[2])),
                               "application/json; charset=utf-8");
             }));
  };
  http.Get("/v2/models/stats", Handle("error", [&](const httplib::Request&, httplib::Response& res) {
             res.set_content(server.Statistics("", ""), "application/json; charset=utf-8");
           }));
  text(model, [&](const std::string& name, const std::string& version) { return server.ModelMetadata(name, version); });
  text(model + "/config",
       [&](const std::string& name, const std::string& version) { return server.ModelConfig(name, version); });
  text(model + "/stats",
       [&](const std::string& name, const std::string& version) { return server.Statistics(name, version); });
  http.Get(model + "/ready", Handle("error", [&](const httplib::Request& req, httplib::Response& res) {
             std::string why = server.NotReady(req.matches[1], req.matches[2]);
             json body = {{"name", std::string(req.matches[1])}, {"ready", why.empty()}};
             if (!why.empty()) body["error"] = OneLine(why);
             Reply(res, why.empty() ? 200 : 503, body);
           }));
  http.Post(model + "/infer", Handle("error", [&](const httplib::Request& req, httplib::Response& res) {
              kserve::Response out = server.InferV2(req.matches[1], req.matches[2], req);
              if (out.header_length)
                res.set_header("Inference-Header-Content-Length", std::to_string(*out.header_length));
              res.set_content(std::move(out.body),
                              out.header_length ? "application/octet-stream" : "application/json; charset=utf-8");
            }));
  http.Post(R"(/v1/models/([^/]+)/infer)", Handle("detail", [&](const httplib::Request& req, httplib::Response& res) {
              res.set_content(server.InferV1(req.matches[1], req.body), "application/json; charset=utf-8");
            }));
  http.Get("/v1/models", Handle("detail", [&](const httplib::Request&, httplib::Response& res) {
             res.set_content(server.ModelsV1(), "application/json; charset=utf-8");
           }));
  http.Get("/v1/stats", Handle("detail", [&](const httplib::Request&, httplib::Response& res) {
             res.set_content(server.StatsV1(), "application/json; charset=utf-8");
           }));
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(server.Metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.set_post_routing_handler([](const httplib::Request& req, httplib::Response& res) {  // matched by clients
    if (req.has_header("X-Request-Id")) res.set_header("X-Request-Id", req.get_header_value("X-Request-Id"));
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // our own {"error"/"detail": ...}
    const char* text = res.status == 404   ? "Not Found"
                       : res.status == 405 ? "Method Not Allowed"
                       : res.status == 413 ? "Payload Too Large"
                       : res.status < 500  ? "Bad Request"
                                           : "Internal Server Error";
    Reply(res, res.status, {{req.path == "/v2" || req.path.rfind("/v2/", 0) == 0 ? "error" : "detail", text}});
    return httplib::Server::HandlerResponse::Handled;
  }));

  if (port == 0 ? (port = http.bind_to_any_port(host)) < 0 : !http.bind_to_port(host, port))
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port));
  std::thread([&http, &server, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    server.Stopping();
    http.stop();
  }).detach();
  std::string names;
  for (const auto& book : server.books()) names += (names.empty() ? "" : ", ") + book->options.name;
  std::cout << "tvmsched_server: serving " << names << " on http://" << host << ":" << port << " (policy "
            << options.policy << ")" << std::endl;
  http.listen_after_bind();
  server.Close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const tvm::ffi::Error& err) {
    std::cerr << "error: " << OneLine(err.message()) << std::endl;
  } catch (const std::exception& err) {
    std::cerr << "error: " << OneLine(err.what()) << std::endl;
  }
  return 2;
}
