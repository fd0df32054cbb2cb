// A served model's admission, counters and descriptions (tvmsched/serving.h), and tvmsched.engine.served_*: the same
// for `tvmsched serve` and the C++ server.
#include "tvmsched/serving.h"

#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include "tvmsched/tiering.h"

namespace tvmsched {
namespace serving {

namespace {

namespace refl = tvm::ffi::reflection;

/*! \brief JSON written in order: a value appended to `out` by each call. */
struct Writer {
  std::string out;
  Writer& Raw(std::string_view text) { return out.append(text), *this; }
  Writer& Str(std::string_view text) { return kserve::AppendString(out, text), *this; }
  Writer& Key(std::string_view key) {  // a member's key, after a comma unless first in its object
    if (!out.empty() && out.back() != '{') out += ',';
    return Str(key).Raw(":");
  }
  Writer& Int(int64_t value) { return Raw(std::to_string(value)); }
  Writer& Ints(const std::vector<int64_t>& values) {
    out += '[';
    for (size_t i = 0; i < values.size(); ++i) (i ? out += ',' : out), Int(values[i]);
    return Raw("]");
  }
  Writer& Num(double value, bool present = true);  // (below: Number) null unless present
  Writer& Duration(int64_t count, int64_t ns) { return Raw("{").Key("count").Int(count).Key("ns").Int(ns).Raw("}"); }
  Writer& Duration(const serving::Duration& d) { return Duration(d.count.load(), d.ns.load()); }
};

std::string Number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.15g", value);
  return text;
}

Writer& Writer::Num(double value, bool present) { return Raw(present ? Number(value) : "null"); }

/*! \brief A Prometheus label value's text (its three escapes). */
std::string Label(const std::string& value) {
  std::string out;
  for (char c : value) out += c == '\\' ? "\\\\" : c == '"' ? "\\\"" : c == '\n' ? "\\n" : std::string(1, c);
  return out;
}

/*! \brief A served model's streams and engine models; none once it is unloaded (a scrape racing an unload). */
std::vector<Stream> StreamsOf(const Runtime& runtime, const std::string& name) {
  try {
    return runtime->streams(name);
  } catch (const ffi::Error&) {
    return {};
  }
}
std::vector<Model> ModelsOf(const Runtime& runtime, const std::string& name) {
  try {
    return runtime->engine_models(name);
  } catch (const ffi::Error&) {
    return {};
  }
}

/*! \brief The Runtime that serves a device (several devices: its first part's, which names the device kind). */
const RuntimeObj& FirstDevice(const RuntimeObj& runtime) {
  return runtime.parts().empty() ? runtime : *runtime.parts()[0].get();
}

}  // namespace

int64_t NowNs() { return std::chrono::steady_clock::now().time_since_epoch() / std::chrono::nanoseconds(1); }

ServedObj::ServedObj(Runtime rt, ServedOptions o) : options(std::move(o)), runtime(std::move(rt)) {
  const Manifest manifest = runtime->ModelManifest(options.name);  // (a split model's: the whole one's)
  batch = options.max_batch_size > 0 ? options.max_batch_size : manifest.batch_size;
  for (auto [list, bindings] : {std::pair{&inputs, &manifest.inputs}, {&outputs, &manifest.outputs}}) {
    for (const auto& b : *bindings) {
      const TensorSpec& spec = manifest.tensors.at(b.tensor);
      std::vector<int64_t> shape = spec.shape;
      if (batch > 0 && !shape.empty()) shape[0] = -1;  // any rows up to `batch` (the engine bounds them at submit)
      list->push_back({b.name, spec.dtype, shape});
    }
  }
  const ModelStats stats = runtime->Stats()[options.name];
  warmup_executions = stats.executions, warmup_requests = stats.requests, qos_ms = stats.qos_ms;
  priority = stats.priority;
}

int64_t ServedObj::Admit() {
  int64_t now = pending.load();
  do {
    if (now >= options.max_queue) return -1;
  } while (!pending.compare_exchange_weak(now, now + 1));
  return now;
}

void ServedObj::Answered(const RequestObj* request, int64_t rows, bool error, int64_t received_ns, int64_t input_ns,
                         int64_t output_ns) {
  const int64_t total = NowNs() - received_ns;
  pending -= 1;
  const bool ran = request != nullptr && request->started_us > 0 && request->finished_us >= request->started_us;
  if (ran) {
    executions += 1;
    auto compute = static_cast<int64_t>((request->finished_us - request->started_us) * 1e3);
    int64_t old = recent_ns.load();
    recent_ns.store(old == 0 ? compute : old + (compute - old) / 5);
  }
  if (error) return fail.Add(total);
  success.Add(total);
  inferences += rows;
  last_ms = std::chrono::system_clock::now().time_since_epoch() / std::chrono::milliseconds(1);
  compute_input.Add(input_ns), compute_output.Add(output_ns);
  if (ran) {
    const double seconds = (request->finished_us - request->submitted_us) / 1e6;
    latency_ns += static_cast<int64_t>(seconds * 1e9), latency_count += 1;
    const size_t bucket =
        std::lower_bound(std::begin(kLatencyBuckets), std::end(kLatencyBuckets), seconds) - std::begin(kLatencyBuckets);
    if (bucket < std::size(kLatencyBuckets)) latency_buckets[bucket] += 1;
    queue.Add(static_cast<int64_t>(std::max(0.0, request->started_us - request->submitted_us) * 1e3));
    compute_infer.Add(static_cast<int64_t>((request->finished_us - request->started_us) * 1e3));
    qos_violations += qos_ms > 0 && request->finished_us - request->submitted_us > qos_ms * 1e3;
  }
}

void ServedObj::Refused(int64_t received_ns) { fail.Add(NowNs() - received_ns); }

std::string ServedObj::Metadata() const {
  Writer w;
  w.Raw("{").Key("name").Str(options.name).Key("versions").Raw("[").Str(options.version).Raw("]");
  w.Key("platform").Str("tvmsched");
  for (auto [key, list] : {std::pair{"inputs", &inputs}, {"outputs", &outputs}}) {
    w.Key(key).Raw("[");
    for (const kserve::TensorInfo& t : *list) {
      if (w.out.back() != '[') w.Raw(",");
      w.Raw("{").Key("name").Str(t.name).Key("datatype").Str(kserve::Datatype(t.dtype)).Key("shape").Ints(t.shape);
      w.Raw("}");
    }
    w.Raw("]");
  }
  return w.Raw("}").out;
}

std::string ServedObj::Config() const {
  const ModelStats stats = runtime->Stats()[options.name];
  const bool cpu = FirstDevice(*runtime.get()).device_name().rfind("cpu", 0) == 0;
  Writer w;
  w.Raw("{").Key("name").Str(options.name).Key("platform").Str("tvmsched").Key("backend").Str("tvmsched");
  w.Key("max_batch_size").Int(batch);
  for (auto [key, list] : {std::pair{"input", &inputs}, {"output", &outputs}}) {
    w.Key(key).Raw("[");
    for (const kserve::TensorInfo& t : *list) {
      if (w.out.back() != '[') w.Raw(",");
      std::vector<int64_t> dims(t.shape.begin() + (batch > 0 && !t.shape.empty()), t.shape.end());
      w.Raw("{").Key("name").Str(t.name).Key("data_type").Str("TYPE_" + kserve::Datatype(t.dtype));
      w.Key("dims").Ints(dims).Raw("}");
    }
    w.Raw("]");
  }
  w.Key("instance_group").Raw("[{").Key("name").Str(options.name).Key("kind").Str(cpu ? "KIND_CPU" : "KIND_GPU");
  w.Key("count").Int(options.streams);
  if (!runtime->parts().empty()) {  // several devices: the ones holding its replicas (Triton's gpus)
    std::vector<int64_t> gpus;
    for (size_t d = 0; d < runtime->parts().size(); ++d) {
      const std::vector<std::string> held = runtime->ModelsOn(static_cast<int>(d));
      if (std::find(held.begin(), held.end(), options.name) != held.end()) gpus.push_back(static_cast<int64_t>(d));
    }
    w.Key("gpus").Ints(gpus);
  }
  w.Raw("}]");
  if (batch > 0) {
    w.Key("dynamic_batching").Raw("{").Key("max_queue_delay_microseconds");
    w.Int(static_cast<int64_t>(options.max_queue_delay_us));
    if (!options.preferred_batch_sizes.empty()) w.Key("preferred_batch_size").Ints(options.preferred_batch_sizes);
    // as loaded: a request's timeout from the Runtime's model, the queue's cap the one admission holds it to
    const QueuePolicy& queue = stats.queue;
    const int64_t cap = queue.max_queue_size > 0 ? queue.max_queue_size : options.max_queue;
    w.Key("default_queue_policy").Raw("{").Key("timeout_action");
    w.Str(queue.timeout_action == TimeoutAction::kDelay ? "DELAY" : "REJECT").Key("default_timeout_microseconds");
    w.Int(static_cast<int64_t>(queue.default_timeout_us)).Key("allow_timeout_override");
    w.Raw(queue.allow_timeout_override ? "true" : "false").Key("max_queue_size").Int(cap).Raw("}");
    w.Raw("}");
  }
  w.Key("parameters").Raw("{");
  for (auto [key, value] : {std::pair<const char*, std::string>{"priority", stats.priority},
                            {"placement", stats.placement},
                            {"qos_ms", stats.qos_ms > 0 ? Number(stats.qos_ms) : ""},
                            {"max_queue", std::to_string(options.max_queue)},
                            {"streams", std::to_string(options.streams)},
                            {"policy", runtime->policy_kind()}}) {
    if (!value.empty()) w.Key(key).Raw("{").Key("string_value").Str(value).Raw("}");
  }
  return w.Raw("}}").out;
}

namespace {

/*! \brief Served models' engine counters, each Runtime's read once (its Stats walks every stream). */
class EngineCounts {
 public:
  const ModelStats& Of(const ServedObj& s) {
    auto read = read_.find(s.runtime.get());
    if (read == read_.end()) read = read_.emplace(s.runtime.get(), s.runtime->Stats()).first;
    return read->second[s.options.name];
  }
  /*! \brief Runs of the model (Triton's execution count): a batched model's launches, which run several requests at
   *  once (the engine's count, warm-up ones not); else its requests that ran. */
  int64_t Executions(const ServedObj& s) {
    return s.batch > 0 ? Of(s).executions - s.warmup_executions : s.executions.load();
  }

 private:
  std::map<const RuntimeObj*, std::map<std::string, ModelStats>> read_;
};

}  // namespace

std::string Statistics(const std::vector<Served>& models) {
  EngineCounts engine;
  Writer w;
  w.Raw("{").Key("model_stats").Raw("[");
  for (const Served& s : models) {
    const ModelStats& stats = engine.Of(*s.get());
    if (w.out.back() != '[') w.Raw(",");
    w.Raw("{").Key("name").Str(s->options.name).Key("version").Str(s->options.version);
    w.Key("last_inference").Int(s->last_ms.load()).Key("inference_count").Int(s->inferences.load());
    w.Key("execution_count").Int(engine.Executions(*s.get()));
    w.Key("inference_stats").Raw("{").Key("success").Duration(s->success).Key("fail").Duration(s->fail);
    w.Key("queue").Duration(s->queue).Key("compute_input").Duration(s->compute_input);
    w.Key("compute_infer").Duration(s->compute_infer).Key("compute_output").Duration(s->compute_output);
    w.Key("cache_hit").Duration(0, 0).Key("cache_miss").Duration(0, 0).Raw("}");
    w.Key("batch_stats").Raw("[");
    if (s->batch > 0) {  // the engine's launches by the rows they brought (their compute is inside the engine's)
      for (const auto& [rows, counted] : stats.batches) {
        auto [count, ns] = counted;
        if (w.out.back() != '[') w.Raw(",");
        w.Raw("{").Key("batch_size").Int(rows).Key("compute_input").Duration(count, 0);
        w.Key("compute_infer").Duration(count, ns).Key("compute_output").Duration(count, 0).Raw("}");
      }
    } else if (s->success.count > 0) {  // every request one row
      w.Raw("{").Key("batch_size").Int(1).Key("compute_input").Duration(s->compute_input);
      w.Key("compute_infer").Duration(s->compute_infer).Key("compute_output").Duration(s->compute_output).Raw("}");
    }
    w.Raw("]").Key("memory_usage").Raw("[]}");
  }
  return w.Raw("]}").out;
}

std::string V1Models(const std::vector<Served>& models) {
  Writer w;
  w.Raw("{");
  for (const Served& s : models) {
    w.Key(s->options.name).Raw("{").Key("qos_ms").Raw(s->qos_ms > 0 ? Number(s->qos_ms) : "null");
    w.Key("priority").Str(s->priority).Key("inputs").Raw("{");
    for (const kserve::TensorInfo& t : s->inputs) w.Key(t.name).Ints(t.shape);
    w.Raw("}}");
  }
  return w.Raw("}").out;
}

std::string V1Stats(const std::vector<Served>& models) {
  EngineCounts engine;
  Writer w;
  w.Raw("{");
  for (const Served& s : models) {
    const ModelStats& st = engine.Of(*s.get());
    const std::vector<Stream> streams = StreamsOf(s->runtime, s->options.name);
    w.Key(s->options.name).Raw("{").Key("priority").Str(st.priority).Key("placement").Str(st.placement);
    w.Key("qos_ms").Num(st.qos_ms, st.qos_ms > 0).Key("requests").Int(st.requests - s->warmup_requests);
    w.Key("errors").Int(st.errors).Key("refused").Int(st.refused).Key("timed_out").Int(st.timed_out);
    w.Key("queued").Int(st.queued).Key("qos_violations").Int(st.qos_violations);
    w.Key("p50_ms").Num(st.p50_ms, st.p50_ms >= 0).Key("p99_ms").Num(st.p99_ms, st.p99_ms >= 0);
    w.Key("executions").Int(st.executions - s->warmup_executions).Key("launches").Int(st.launches);
    w.Key("reruns").Int(st.reruns).Key("faults").Int(st.faults).Key("fault_restarts").Int(st.fault_restarts);
    std::vector<int64_t> completed;
    for (const Stream& stream : streams) completed.push_back(stream->completed.load());
    w.Key("streams").Int(static_cast<int64_t>(streams.size())).Key("stream_requests").Ints(completed);
    w.Key("devices").Raw("[");
    for (const std::string& device : st.devices) (w.out.back() != '[' ? w.Raw(",") : w).Str(device);
    w.Raw("]}");
  }
  if (models.empty()) return w.Raw("}").out;
  const Runtime runtime = models[0]->runtime;
  const RuntimeObj::DecisionReport decisions = runtime->Decisions();
  w.Key("_scheduler").Raw("{").Key("policy").Str(runtime->policy_kind()).Key("decisions").Int(decisions.decided);
  w.Key("p50_us").Num(decisions.p50_us, decisions.p50_us >= 0);
  w.Key("p99_us").Num(decisions.p99_us, decisions.p99_us >= 0).Raw("}");
  const std::shared_ptr<MemoryScope>& scope = runtime->scope();
  if (scope && scope->budget()) {  // one device's memory: each model's footprint and the resident ones
    w.Key("_memory").Raw("{").Key("budget").Int(scope->budget()).Key("in_use").Int(scope->in_use());
    w.Key("peak").Int(scope->peak()).Key("footprints").Raw("{");
    std::vector<std::string> resident;
    for (const Served& s : models) {
      const std::vector<Model> held = ModelsOf(s->runtime, s->options.name);
      if (held.empty()) continue;
      const Model& model = held[0];
      size_t bytes = model->env_bytes();
      for (int g = 0; g < model->num_groups(); ++g) bytes += model->group_bytes(g);
      w.Key(s->options.name).Int(static_cast<int64_t>(bytes));
      if (model->resident()) resident.push_back(s->options.name);
    }
    w.Raw("}").Key("resident").Raw("[");
    for (const std::string& name : resident) (w.out.back() != '[' ? w.Raw(",") : w).Str(name);
    w.Raw("]}");
  }
  // the device's fault state machine (docs/faults.md), its first model's device
  const std::vector<Model> first = ModelsOf(runtime, models[0]->options.name);
  if (!first.empty()) {
    const Device::FaultStats f = first[0]->device().faults();
    static const char* const kHealth[] = {"healthy", "faulted", "lost"};
    w.Key("_device").Raw("{").Key("health").Str(kHealth[f.health]).Key("generation").Int(f.generation);
    w.Key("faults").Int(f.faults).Key("recoveries").Int(f.recoveries).Key("last_recovery_s").Num(f.last_recovery_s);
    w.Key("lost").Str(f.lost).Raw("}");
  }
  return w.Raw("}").out;
}

std::string TritonMetrics(const std::vector<Served>& models) {
  EngineCounts engine;
  auto executions = [&engine](const ServedObj& s) { return engine.Executions(s); };
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ").append(name);
    out.append(" ").append(type).append("\n");
    for (const Served& s : models) {
      out.append(name).append("{model=\"").append(Label(s->options.name)).append("\",version=\"");
      out.append(Label(s->options.version)).append("\"");
      out.append("} ").append(std::to_string(value(*s.get()))).append("\n");
    }
  };
  family("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
         [](const ServedObj& s) { return s.success.count.load(); });
  family("nv_inference_request_failure", "counter", "Number of failed inference requests (refusals included)",
         [](const ServedObj& s) { return s.fail.count.load(); });
  family("nv_inference_count", "counter", "Number of inferences performed (the rows of the successful requests)",
         [](const ServedObj& s) { return s.inferences.load(); });
  family("nv_inference_exec_count", "counter",
         "Number of model executions performed (one launch may run several requests of a model compiled for a batch)",
         executions);
  family("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds",
         [](const ServedObj& s) { return (s.success.ns.load() + s.fail.ns.load()) / 1000; });
  family("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds",
         [](const ServedObj& s) { return s.queue.ns.load() / 1000; });
  family("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds",
         [](const ServedObj& s) { return s.compute_input.ns.load() / 1000; });
  family("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds",
         [](const ServedObj& s) { return s.compute_infer.ns.load() / 1000; });
  family("nv_inference_compute_output_duration_us", "counter", "Cumulative compute output duration in microseconds",
         [](const ServedObj& s) { return s.compute_output.ns.load() / 1000; });
  family("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution",
         [](const ServedObj& s) { return s.pending.load(); });
  return out;
}

std::string TvmschedMetrics(const std::vector<Served>& models) {
  std::ostringstream out;
  auto header = [&out](const char* name, const char* type, const char* help) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  };
  auto labels = [](const ServedObj& s) { return "{model=\"" + Label(s.options.name) + "\""; };
  // each model's streams and engine models, asked for once (none for a model unloaded since the list was taken)
  std::vector<std::pair<std::vector<Stream>, std::vector<Model>>> held;
  for (const Served& s : models)
    held.emplace_back(StreamsOf(s->runtime, s->options.name), ModelsOf(s->runtime, s->options.name));
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    header(name, type, help);
    for (size_t k = 0; k < models.size(); ++k)
      out << name << labels(*models[k].get()) << "} " << value(*models[k].get(), held[k]) << "\n";
  };
  auto streams_sum = [](auto field) {
    return [field](const ServedObj&, const auto& engine) {
      int64_t n = 0;
      for (const Stream& stream : engine.first) n += ((*stream.get()).*field).load();
      return n;
    };
  };
  family("tvmsched_requests_total", "counter", "Inference requests received, per model",
         [](const ServedObj& s, const auto&) { return s.success.count.load() + s.fail.count.load(); });
  family("tvmsched_errors_total", "counter", "Inference requests answered with an error (refusals included)",
         [](const ServedObj& s, const auto&) { return s.fail.count.load(); });
  family("tvmsched_qos_violations_total", "counter", "Requests whose latency exceeded the model's QoS target",
         [](const ServedObj& s, const auto&) { return s.qos_violations.load(); });
  family("tvmsched_preemptions_total", "counter", "Times the model's streams were preempted by real-time work",
         streams_sum(&StreamObj::preemptions));
  family("tvmsched_launches_total", "counter", "Kernel launches of the model (re-runs included)",
         streams_sum(&StreamObj::launches));
  family("tvmsched_reruns_total", "counter", "Launches run again after a preemption", streams_sum(&StreamObj::reruns));
  family("tvmsched_model_resident", "gauge", "1: the model is on the device now",
         [](const ServedObj&, const auto& engine) {
           return static_cast<int>(!engine.second.empty() && engine.second[0]->resident());
         });
  header("tvmsched_request_latency_seconds", "histogram",
         "Submit-to-finish latency of successful requests (engine clock)");
  for (const Served& s : models) {
    int64_t below = 0;
    const std::string model = labels(*s.get());
    for (size_t b = 0; b < std::size(kLatencyBuckets); ++b) {
      below += s->latency_buckets[b].load();
      out << "tvmsched_request_latency_seconds_bucket" << model << ",le=\"" << Number(kLatencyBuckets[b]) << "\"} "
          << below << "\n";
    }
    out << "tvmsched_request_latency_seconds_bucket" << model << ",le=\"+Inf\"} " << s->latency_count << "\n"
        << "tvmsched_request_latency_seconds_sum" << model << "} " << Number(s->latency_ns / 1e9) << "\n"
        << "tvmsched_request_latency_seconds_count" << model << "} " << s->latency_count << "\n";
  }
  // streamed from the host tiers: each tier's bytes of its weights, and the bytes streamed so far
  header("tvmsched_tier_bytes", "gauge", "Bytes of a tiered model's weights placed on each tier");
  std::ostringstream streamed;
  for (size_t k = 0; k < models.size(); ++k) {
    if (held[k].second.empty()) continue;
    ModelObj& model = *held[k].second[0].get();
    const StreamedLayout* layout = StreamedLayoutOf(model);
    if (layout == nullptr || !layout->store) continue;
    const std::string model_labels = labels(*models[k].get());
    for (size_t t = 0; t < layout->store->tiers().size(); ++t) {
      out << "tvmsched_tier_bytes" << model_labels << ",tier=\"" << Label(layout->store->tiers()[t].kind) << "\"} "
          << layout->store->used()[t] << "\n";
    }
    int64_t bytes = 0;
    for (const StageEvent& e : StreamerEvents(model)) bytes += e.bytes;
    streamed << "tvmsched_streamed_bytes_total" << model_labels << "} " << bytes << "\n";
  }
  header("tvmsched_streamed_bytes_total", "counter", "Bytes a tiered model streamed from its tiers");
  out << streamed.str();
  header("tvmsched_switch_stages_total", "counter", "Switching stages run (docs/switching.md)");
  if (!models.empty()) {
    std::map<std::string, int64_t> stages;
    for (const StageEvent& e : models[0]->runtime->SwitchEvents()) stages[e.stage] += 1;
    for (const auto& [stage, count] : stages) {
      out << "tvmsched_switch_stages_total{stage=\"" << Label(stage) << "\"} " << count << "\n";
    }
  }
  header("tvmsched_busy_streams", "gauge", "Model streams with requests queued or running, per device");
  std::map<std::string, int64_t> busy;  // by device name: every model's streams on it
  if (!models.empty()) {
    const Runtime& runtime = models[0]->runtime;
    for (const Runtime& device : runtime->parts().empty() ? std::vector<Runtime>{runtime} : runtime->parts()) {
      int64_t& n = busy[device->device_name()];
      for (const std::string& model : device->models()) {
        for (const Stream& stream : StreamsOf(device, model)) n += stream->busy();
      }
    }
  }
  for (const auto& [device, count] : busy) {
    out << "tvmsched_busy_streams{device=\"" << Label(device) << "\"} " << count << "\n";
  }
  return out.str();
}

namespace {

/*! \brief 'text' for an error line: control characters as '?', at most 80 characters (a name from a client). */
std::string Quoted(std::string_view text) {
  std::string out(text.substr(0, 80));
  for (char& c : out) c = static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c;
  return "'" + out + (text.size() > 80 ? "...'" : "'");
}

}  // namespace

size_t Find(const std::vector<Served>& models, std::string_view name, std::string_view version) {
  for (size_t i = 0; i < models.size(); ++i) {
    const ServedOptions& o = models[i]->options;
    if (o.name != name) continue;
    if (!version.empty() && version != o.version) {
      throw kserve::Error(
          404, "model " + Quoted(name) + " has no version " + Quoted(version) + " (it has version " + o.version + ")");
    }
    return i;
  }
  std::vector<std::string> names;
  for (const Served& s : models) names.push_back(s->options.name);
  std::sort(names.begin(), names.end());
  std::string loaded;
  for (const std::string& each : names) loaded += (loaded.empty() ? "" : ", ") + each;
  throw kserve::Error(
      404, "no model named " + Quoted(name) + " is loaded (loaded: " + (loaded.empty() ? "none" : loaded) + ")");
}

TVM_FFI_STATIC_INIT_BLOCK() {
  // tvmsched.engine.served(runtime, {name, version, max_batch_size, max_queue, streams, max_queue_delay_us,
  // preferred_batch_sizes}) -> Served; its methods as ServedObj's (times: time.monotonic_ns()).
  refl::GlobalDef()
      .def("tvmsched.engine.served",
           [](Runtime runtime, ffi::Map<ffi::String, ffi::Any> map) {
             ServedOptions o;
             o.name = map.at("name").cast<ffi::String>();
             o.version = map.at("version").cast<ffi::String>();
             o.max_batch_size = map.at("max_batch_size").cast<int64_t>();
             o.max_queue = map.at("max_queue").cast<int64_t>();
             o.streams = map.at("streams").cast<int64_t>();
             o.max_queue_delay_us = map.at("max_queue_delay_us").cast<double>();
             for (int64_t size : map.at("preferred_batch_sizes").cast<ffi::Array<int64_t>>()) {
               o.preferred_batch_sizes.push_back(size);
             }
             return Served(ffi::make_object<ServedObj>(std::move(runtime), std::move(o)));
           })
      .def("tvmsched.engine.served_statistics",
           [](ffi::Array<Served> models) { return Statistics({models.begin(), models.end()}); })
      .def("tvmsched.engine.served_v1_models",
           [](ffi::Array<Served> models) { return V1Models({models.begin(), models.end()}); })
      .def("tvmsched.engine.served_v1_stats",
           [](ffi::Array<Served> models) { return V1Stats({models.begin(), models.end()}); })
      // served_find(models, name, version) -> [0, index in models] or [404, line] (Find)
      .def("tvmsched.engine.served_find",
           [](ffi::Array<Served> models, ffi::String name, ffi::String version) {
             try {
               size_t index = Find({models.begin(), models.end()}, std::string_view(name.data(), name.size()),
                                   std::string_view(version.data(), version.size()));
               return ffi::Array<ffi::Any>{int64_t{0}, static_cast<int64_t>(index)};
             } catch (const kserve::Error& err) {
               return kserve::Refusal(err);
             }
           })
      // served_parse_message(models, ModelInferRequest: bytes) -> [0, index in models, inputs, parameters, pending]:
      // the model it names (its model_name and model_version, wherever protobuf wrote them) and the request parsed by
      // that model's codec (kserve_codec's parse_message); else [status, line, index in models or -1]: 400 not such a
      // message (-1), 404 no such model (-1), 400 a bad request for that model
      .def("tvmsched.engine.served_parse_message",
           [](ffi::Array<Served> models, ffi::Bytes message) {
             std::string_view bytes(message.data(), message.size());
             int64_t index = -1;
             try {
               auto [name, version] = kserve::InferMessageModel(bytes);
               index = static_cast<int64_t>(Find({models.begin(), models.end()}, name, version));
               const ServedObj& s = *models[index].get();
               kserve::Request request = kserve::ParseInferMessage(bytes, s.options.name, s.inputs, s.outputs);
               return ffi::Array<ffi::Any>{int64_t{0}, index, request.inputs, request.parameters,
                                           kserve::Pending(request)};
             } catch (const kserve::Error& err) {
               ffi::Array<ffi::Any> refusal = kserve::Refusal(err);
               refusal.push_back(index);
               return refusal;
             }
           })
      .def("tvmsched.engine.served_pending",  // requests admitted and not answered, over `models`
           [](ffi::Array<Served> models) {
             int64_t n = 0;
             for (const Served& s : models) n += s->pending.load();
             return n;
           })
      .def("tvmsched.engine.served_triton_metrics",
           [](ffi::Array<Served> models) { return TritonMetrics({models.begin(), models.end()}); })
      .def("tvmsched.engine.served_tvmsched_metrics",
           [](ffi::Array<Served> models) { return TvmschedMetrics({models.begin(), models.end()}); });
  refl::ObjectDef<ServedObj>()
      .def("admit", [](Served s) { return s->Admit(); })
      .def("answered",
           [](Served s, ffi::Optional<Request> request, int64_t rows, bool error, int64_t received_ns) {
             s->Answered(request ? request.value().get() : nullptr, rows, error, received_ns, 0, 0);
           })
      .def("refused", [](Served s, int64_t received_ns) { s->Refused(received_ns); })
      .def("release", [](Served s) { s->pending -= 1; })  // admitted, then not submitted (counted as refused)
      .def("recent_ns", [](Served s) { return s->recent_ns.load(); })
      .def("pending", [](Served s) { return s->pending.load(); })
      .def("qos_violations", [](Served s) { return s->qos_violations.load(); })
      .def("metadata", [](Served s) { return s->Metadata(); })
      .def("codec",  // kserve::CodecFunctions over its tensors (as its metadata shows them)
           [](Served s) { return kserve::CodecFunctions(s->options.name, s->options.version, s->inputs, s->outputs); })
      .def("config", [](Served s) { return s->Config(); });
}

}  // namespace serving
}  // namespace tvmsched
