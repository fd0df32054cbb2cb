// The engine Runtime's Python surface (tvmsched.engine.create_runtime and tvmsched.Runtime's methods): options
// travel as one map each, checked key by key (an unknown key is one error line naming the known ones).
#include <sys/prctl.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "memory_scope_ref.h"
#include "tvmsched/runtime.h"
#include "tvmsched/split.h"

namespace tvmsched {

namespace {

namespace refl = tvm::ffi::reflection;

/*! \brief A map of options read key by key; Done() refuses the keys nobody read. */
class OptionMap {
 public:
  OptionMap(ffi::Map<ffi::String, ffi::Any> map, std::string what) : map_(std::move(map)), what_(std::move(what)) {}

  template <typename T>
  T Get(const std::string& key, T fallback) {
    read_.insert(key);
    auto found = map_.find(key);
    if (found == map_.end() || (*found).second == nullptr) return fallback;
    auto value = (*found).second.try_cast<T>();
    if (!value.has_value()) TVM_FFI_THROW(TvmschedError) << what_ << ": option '" << key << "' has the wrong type";
    return *value;
  }
  double Number(const std::string& key, double fallback) {
    read_.insert(key);
    auto found = map_.find(key);
    if (found == map_.end() || (*found).second == nullptr) return fallback;
    if (auto i = (*found).second.try_cast<int64_t>()) return static_cast<double>(*i);
    return Get<double>(key, fallback);
  }
  void Done() const {
    for (const auto& [key, value] : map_) {
      if (!read_.count(std::string(key))) {
        std::ostringstream known;
        for (const auto& k : read_) known << (known.tellp() ? ", " : "") << k;
        TVM_FFI_THROW(TvmschedError) << what_ << ": unknown option '" << std::string(key) << "' (known: " << known.str()
                                     << ")";
      }
    }
  }

 private:
  ffi::Map<ffi::String, ffi::Any> map_;
  std::string what_;
  std::set<std::string> read_;
};

ffi::Map<ffi::String, ffi::Any> StatsMap(const ModelStats& s) {
  ffi::Map<ffi::String, ffi::Any> out;
  out.Set("priority", s.priority);
  out.Set("qos_ms", s.qos_ms);
  out.Set("requests", s.requests);
  out.Set("executions", s.executions);
  ffi::Array<ffi::Array<int64_t>> batches;  // [[rows, launches, compute ns], ...]
  for (const auto& [rows, counted] : s.batches) batches.push_back({rows, counted.first, counted.second});
  out.Set("batches", batches);
  ffi::Array<ffi::Array<double>> sizes;  // [[batch size, measured run us, launches], ...]
  for (const auto& [batch, measured] : s.sizes) {
    sizes.push_back({static_cast<double>(batch), measured.first, static_cast<double>(measured.second)});
  }
  out.Set("sizes", sizes);
  out.Set("errors", s.errors);
  out.Set("refused", s.refused);
  out.Set("timed_out", s.timed_out);
  out.Set("qos_violations", s.qos_violations);
  out.Set("queued", s.queued);
  out.Set("p50_ms", s.p50_ms);
  out.Set("p99_ms", s.p99_ms);
  out.Set("launches", s.launches);
  out.Set("reruns", s.reruns);
  out.Set("faults", s.faults);
  out.Set("fault_restarts", s.fault_restarts);
  out.Set("placement", s.placement);
  if (!s.devices.empty()) {
    ffi::Array<ffi::String> devices;
    for (const std::string& d : s.devices) devices.push_back(d);
    out.Set("devices", devices);
  }
  return out;
}

/*! \brief The Runtime of each device it serves (itself when it serves one). */
std::vector<Runtime> PerDevice(const Runtime& rt) {
  return rt->parts().empty() ? std::vector<Runtime>{rt} : rt->parts();
}

/*! \brief An open-loop load (bench/batching.py): requests of several models submitted at Poisson arrival times, each
 *  model `rates[i]` per second with `inputs[i]`, for `seconds`, from this thread (no Python between requests; the
 *  models' arrivals merged: one Poisson process of the rates' sum, each arrival a model drawn by its share). Each
 *  request's latency runs from its scheduled arrival, not from when it was submitted, so a generator that falls
 *  behind does not hide the queueing. Returns, per model, {latencies_us: its finished requests' latencies, failed,
 *  refused}, and under "" {late_us: the generator's p99 lag}.
 */
ffi::Map<ffi::String, ffi::Any> OpenLoopMix(Runtime rt, const ffi::Array<ffi::String>& models,
                                            const ffi::Array<ffi::Map<ffi::String, ffi::Tensor>>& inputs,
                                            const ffi::Array<double>& rates, double seconds, int64_t seed) {
  if (models.empty() || models.size() != inputs.size() || models.size() != rates.size() ||
      std::any_of(rates.begin(), rates.end(), [](double rate) { return !(rate > 0); }) || !(seconds > 0) ||
      seconds > 3600) {
    TVM_FFI_THROW(TvmschedError) << "an open loop needs, per model, inputs and a positive rate, and 0 to 3600 seconds";
  }
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  std::exponential_distribution<double> gap(std::accumulate(rates.begin(), rates.end(), 0.0) / 1e6);  // µs apart
  std::discrete_distribution<size_t> which(rates.begin(), rates.end());
  struct Sent {
    size_t model;
    double at;
    Request request;
  };
  std::vector<Sent> sent;
  std::vector<double> lags;
  std::vector<int64_t> refused(models.size(), 0), failed(models.size(), 0);
  const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
  struct Restore {
    int slack;
    ~Restore() { prctl(PR_SET_TIMERSLACK, slack > 0 ? slack : 50000, 0, 0, 0); }
  } restore{slack};
  const double start = Device::NowMicros() + 1000, end = start + seconds * 1e6;
  for (double at = start + gap(rng); at < end; at += gap(rng)) {
    const size_t m = which(rng);
    // it sleeps until each arrival (a timer slack of 1 ns: the kernel wakes it within a few µs) instead of spinning,
    // which would take a whole core from the Runtime it loads on a small machine
    for (double now = Device::NowMicros(); now < at; now = Device::NowMicros()) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(at - now));
    }
    lags.push_back(Device::NowMicros() - at);
    try {
      sent.push_back({m, at, rt->Submit(models[m], inputs[m], {})});
    } catch (const ffi::Error&) {
      ++refused[m];
    }
  }
  std::vector<ffi::Array<double>> latencies(models.size());
  for (Sent& s : sent) {
    if (!s.request->Wait(seconds * 10 + 60, 0)) TVM_FFI_THROW(TvmschedError) << "an open loop's request never finished";
    if (!s.request->error().empty()) {
      ++failed[s.model];
    } else {
      latencies[s.model].push_back(s.request->finished_us - s.at);
    }
  }
  std::sort(lags.begin(), lags.end());
  ffi::Map<ffi::String, ffi::Any> out;
  for (size_t m = 0; m < models.size(); ++m) {
    ffi::Map<ffi::String, ffi::Any> one;
    one.Set("latencies_us", latencies[m]);
    one.Set("failed", failed[m]);
    one.Set("refused", refused[m]);
    out.Set(models[m], one);
  }
  ffi::Map<ffi::String, ffi::Any> generator;
  generator.Set("late_us", lags.empty() ? 0.0 : lags[lags.size() * 99 / 100]);
  out.Set("", generator);
  return out;
}

/*! \brief OpenLoopMix of one model: {latencies_us, failed, refused, late_us}. */
ffi::Map<ffi::String, ffi::Any> OpenLoop(Runtime rt, const std::string& model,
                                         ffi::Map<ffi::String, ffi::Tensor> inputs, double rate, double seconds,
                                         int64_t seed) {
  if (!(rate > 0) || !(seconds > 0) || seconds > 3600)
    TVM_FFI_THROW(TvmschedError) << "an open loop needs a positive rate and 0 to 3600 seconds";
  ffi::Map<ffi::String, ffi::Any> all = OpenLoopMix(rt, {ffi::String(model)}, {inputs}, {rate}, seconds, seed);
  ffi::Map<ffi::String, ffi::Any> out = all[ffi::String(model)].cast<ffi::Map<ffi::String, ffi::Any>>();
  out.Set("late_us", all[ffi::String("")].cast<ffi::Map<ffi::String, ffi::Any>>()["late_us"]);
  return out;
}

TVM_FFI_STATIC_INIT_BLOCK() {
  refl::GlobalDef()
      .def("tvmsched.engine.open_loop", OpenLoop)
      .def("tvmsched.engine.open_loop_mix", OpenLoopMix)
      .def("tvmsched.engine.split_load",  // a model split across devices (tvmsched/split.h): path, ["cpu:0", ...]
           [](const std::string& path, const ffi::Array<ffi::String>& devices, const ffi::Array<ffi::String>& keys) {
             std::vector<DeviceSpec> specs;
             for (const ffi::String& text : devices) specs.push_back(ParseDeviceSpec(text));
             if (specs.size() < 2) TVM_FFI_THROW(TvmschedError) << "a split model needs at least two devices";
             std::vector<std::string> trusted(keys.begin(), keys.end());
             return SplitModel(
                 ffi::make_object<SplitModelObj>(path, OpenDevices(specs), TrustedKeys::FromFiles(trusted)));
           })
      // options: device, devices (["cpu:0", "cpu:1"]: several), memory_budget (each device's), policy, total_units,
      // colocation ([first, second, value] rows), max_in_flight, idle_spin_us, progress_interval_ms, stall_timeout_s,
      // trusted_keys, max_groups, threshold1, threshold2, preset_count, retain, tiers ([{kind, capacity_bytes,
      // numa_node, path}]), tier_buffer_bytes
      .def("tvmsched.engine.create_runtime", [](ffi::Map<ffi::String, ffi::Any> map) {
        OptionMap o(std::move(map), "a runtime");
        RuntimeOptions options;
        DeviceSpec device;
        device.kind = o.Get<ffi::String>("device", "cpu");
        int64_t budget = o.Get<int64_t>("memory_budget", 0);
        if (budget < 0) TVM_FFI_THROW(TvmschedError) << "a memory budget cannot be negative";
        device.memory_budget = static_cast<size_t>(budget);
        options.devices = {device};
        auto listed = o.Get<ffi::Array<ffi::String>>("devices", {});  // several: each with the memory budget
        if (!listed.empty()) options.devices.clear();
        for (const ffi::String& text : listed) {
          options.devices.push_back(ParseDeviceSpec(text));
          options.devices.back().memory_budget = device.memory_budget;
        }
        options.policy = o.Get<ffi::String>("policy", "colocation");
        options.total_units = static_cast<int>(o.Get<int64_t>("total_units", 0));
        auto rows = o.Get<ffi::Array<ffi::Array<ffi::Any>>>("colocation", {});
        options.stream.max_in_flight = static_cast<int>(o.Get<int64_t>("max_in_flight", kDefaultInFlight));
        options.stream.idle_spin_us = o.Number("idle_spin_us", options.stream.idle_spin_us);
        options.stream.progress_interval_ms = o.Number("progress_interval_ms", options.stream.progress_interval_ms);
        options.stream.stall_timeout_s = o.Number("stall_timeout_s", options.stream.stall_timeout_s);
        for (const auto& key : o.Get<ffi::Array<ffi::String>>("trusted_keys", {})) options.trusted_keys.push_back(key);
        options.max_groups = static_cast<int>(o.Get<int64_t>("max_groups", options.max_groups));
        options.switching.threshold1 = static_cast<size_t>(o.Get<int64_t>("threshold1", 0));
        options.switching.threshold2 = static_cast<size_t>(o.Get<int64_t>("threshold2", 0));
        options.switching.preset_count = static_cast<int>(o.Get<int64_t>("preset_count", 2));
        options.switching.retain = o.Get<bool>("retain", true);
        auto shares = [](const ffi::Array<ffi::Map<ffi::String, ffi::Any>>& listed) {
          std::vector<TierShare> out;
          for (const auto& tier : listed) {
            TierShare share;
            share.kind = tier.at("kind").cast<ffi::String>();
            share.capacity = static_cast<size_t>(tier.at("capacity_bytes").cast<int64_t>());
            share.numa_node = static_cast<int>(tier.at("numa_node").cast<int64_t>());
            share.path = tier.at("path").cast<ffi::String>();
            out.push_back(share);
          }
          return out;
        };
        options.tiers = shares(o.Get<ffi::Array<ffi::Map<ffi::String, ffi::Any>>>("tiers", {}));
        // several devices: each one's own shares (a memory plan's per GPU), in the devices' order
        auto per_device = o.Get<ffi::Array<ffi::Array<ffi::Map<ffi::String, ffi::Any>>>>("device_tiers", {});
        if (!per_device.empty() && per_device.size() != options.devices.size()) {
          TVM_FFI_THROW(TvmschedError) << "device_tiers lists each device's shares: " << per_device.size()
                                       << " lists for " << options.devices.size() << " devices";
        }
        for (size_t d = 0; d < per_device.size(); ++d) options.devices[d].tiers = shares(per_device[d]);
        options.tier_buffer_bytes = static_cast<size_t>(o.Get<int64_t>("tier_buffer_bytes", 0));
        options.timeline = o.Get<bool>("timeline", false);
        o.Done();
        if (!rows.empty()) {  // the table needs the device's unit count: resolved as the runtime will
          int units = options.total_units > 0 ? options.total_units : DeviceUnits(options.devices);
          options.colocation = std::make_shared<ColocationTable>(units);
          std::vector<ColocationTable::Measured> pairs;
          for (const auto& row : rows) {
            if (row.size() != 3) TVM_FFI_THROW(TvmschedError) << "a colocation row is [first, second, value]";
            auto value = row[2].try_cast<double>();
            if (!value) TVM_FFI_THROW(TvmschedError) << "a colocation row's value is a number";
            pairs.push_back({row[0].cast<ffi::String>(), row[1].cast<ffi::String>(), *value});
          }
          options.colocation->AddMeasured(pairs);
        }
        return Runtime::Create(std::move(options));
      });

  refl::ObjectDef<SplitModelObj>()
      .def("run",
           [](SplitModel m, const ffi::Map<ffi::String, ffi::Tensor>& inputs, const ffi::Array<int64_t>& ids) {
             return m->Run(inputs, std::vector<int>(ids.begin(), ids.end()));
           })
      .def("parts", [](SplitModel m) { return ffi::Array<Model>(m->parts()); })
      .def("layers",
           [](SplitModel m) {  // per device: [first layer, last layer]
             ffi::Array<ffi::Array<int64_t>> out;
             for (size_t k = 0; k < m->parts().size(); ++k) {
               auto [first, last] = m->layers_of(static_cast<int>(k));
               out.push_back({first, last});
             }
             return out;
           })
      .def("crossing_bytes", [](SplitModel m) { return static_cast<int64_t>(m->crossing_bytes()); })
      .def("memory",
           [](SplitModel m) {  // per device: [device memory in use, its group's weight bytes]
             ffi::Array<ffi::Array<int64_t>> out;
             for (size_t k = 0; k < m->parts().size(); ++k) {
               const Model& part = m->parts()[k];
               out.push_back({static_cast<int64_t>(part->device().memory().in_use),
                              static_cast<int64_t>(part->group_weight_bytes(0))});  // (resident: one group)
             }
             return out;
           });

  // model options: name, qos_ms, realtime, resident, device_bytes, streams, warmup, timeout_action ("reject" or
  // "delay"), default_timeout_us, allow_timeout_override, max_queue_size, max_queue_delay_us, preferred_batch_sizes,
  // refresh_sizes, devices (several devices: a replica on each of these device numbers)
  refl::ObjectDef<RuntimeObj>()
      .def("load",
           [](Runtime rt, const std::string& path, ffi::Map<ffi::String, ffi::Any> map) {
             OptionMap o(std::move(map), "a model");
             ModelOptions options;
             options.name = o.Get<ffi::String>("name", "");
             options.qos_ms = o.Number("qos_ms", 0);
             options.realtime = o.Get<bool>("realtime", false);
             options.resident = o.Get<bool>("resident", true);
             options.device_bytes = static_cast<size_t>(o.Get<int64_t>("device_bytes", 0));
             options.streams = static_cast<int>(o.Get<int64_t>("streams", 1));
             options.warmup = o.Get<bool>("warmup", false);
             std::string action = o.Get<ffi::String>("timeout_action", "reject");
             if (action != "reject" && action != "delay")
               TVM_FFI_THROW(TvmschedError) << "timeout_action is reject or delay, not " << action;
             options.queue.timeout_action = action == "delay" ? TimeoutAction::kDelay : TimeoutAction::kReject;
             options.queue.default_timeout_us = o.Number("default_timeout_us", 0);
             options.queue.allow_timeout_override = o.Get<bool>("allow_timeout_override", true);
             options.queue.max_queue_size = o.Get<int64_t>("max_queue_size", 0);
             options.max_queue_delay_us = o.Number("max_queue_delay_us", 0);
             if (!(options.max_queue_delay_us >= 0 && options.max_queue_delay_us <= 60e6))
               TVM_FFI_THROW(TvmschedError) << "max_queue_delay_us is 0 to 60000000 microseconds";
             for (const ffi::Any& size : o.Get<ffi::Array<ffi::Any>>("preferred_batch_sizes", {})) {
               auto rows = size.try_cast<int64_t>();
               if (!rows || *rows < 1) TVM_FFI_THROW(TvmschedError) << "preferred_batch_sizes are positive row counts";
               options.preferred_batch_sizes.push_back(*rows);
             }
             for (const ffi::Any& d : o.Get<ffi::Array<ffi::Any>>("devices", {})) {
               auto index = d.try_cast<int64_t>();
               if (!index) TVM_FFI_THROW(TvmschedError) << "a model's devices are device numbers";
               options.devices.push_back(static_cast<int>(*index));
             }
             options.refresh_sizes = o.Get<bool>("refresh_sizes", false);
             options.split = o.Get<bool>("split", false);
             for (const ffi::Any& group : o.Get<ffi::Array<ffi::Any>>("split_layers", {})) {
               auto pair = group.try_cast<ffi::Array<int64_t>>();  // [first layer, last layer] per device
               if (!pair || pair->size() != 2) {
                 TVM_FFI_THROW(TvmschedError) << "split_layers are [first layer, last layer] pairs, one per device";
               }
               options.split_layers.emplace_back(static_cast<int>((*pair)[0]), static_cast<int>((*pair)[1]));
             }
             o.Done();
             return rt->Load(path, options);
           })
      .def("unload", [](Runtime rt, const std::string& name, double timeout_s) { rt->Unload(name, timeout_s); })
      .def("submit",
           [](Runtime rt, const std::string& model, ffi::Map<ffi::String, ffi::Tensor> inputs, int64_t priority,
              double timeout_us) {
             SubmitOptions options;
             options.priority = static_cast<int>(priority);
             options.timeout_us = timeout_us;
             return rt->Submit(model, std::move(inputs), options);
           })
      .def("monitor",
           [](Runtime rt) {
             // [[stream name, [[units, latency_us], ...]], ...]
             ffi::Array<ffi::Array<ffi::Any>> out;
             for (const StreamView& view : rt->Monitor()) {
               ffi::Array<ffi::Array<double>> work;
               for (const CandidateInfo& c : view.remaining)
                 work.push_back({static_cast<double>(c.units), c.latency_us});
               out.push_back({view.name, work});
             }
             return out;
           })
      .def("stats",
           [](Runtime rt) {
             ffi::Map<ffi::String, ffi::Map<ffi::String, ffi::Any>> out;
             for (const auto& [name, s] : rt->Stats()) out.Set(name, StatsMap(s));
             return out;
           })
      .def("decisions",  // RuntimeObj::DecisionReport as a map (µs; -1: none)
           [](Runtime rt) {
             RuntimeObj::DecisionReport r = rt->Decisions();
             return ffi::Map<ffi::String, ffi::Any>{{"decided", r.decided},
                                                    {"p50_us", r.p50_us},
                                                    {"p99_us", r.p99_us},
                                                    {"monitor_p50_us", r.monitor_p50_us},
                                                    {"monitor_p99_us", r.monitor_p99_us},
                                                    {"cpu_p50_us", r.cpu_p50_us},
                                                    {"cpu_p99_us", r.cpu_p99_us},
                                                    {"undisturbed_p99_us", r.undisturbed_p99_us},
                                                    {"disturbed_share", r.disturbed_share}};
           })
      .def("models",
           [](Runtime rt) {
             ffi::Array<ffi::String> out;
             for (const auto& name : rt->models()) out.push_back(name);
             return out;
           })
      .def("streams", [](Runtime rt, const std::string& model) { return ffi::Array<Stream>(rt->streams(model)); })
      .def("engine_models",
           [](Runtime rt, const std::string& model) { return ffi::Array<Model>(rt->engine_models(model)); })
      .def("switch_events",
           [](Runtime rt) {  // [model, stage, group, start_us, end_us, bytes, held]
             ffi::Array<ffi::Array<ffi::Any>> out;
             for (const StageEvent& e : rt->SwitchEvents())
               out.push_back({e.model, e.stage, e.group, e.start_us, e.end_us, e.bytes, e.held});
             return out;
           })
      .def("policy", [](Runtime rt) { return rt->policy_kind(); })
      .def("total_units", [](Runtime rt) { return static_cast<int64_t>(rt->total_units()); })
      .def("memory",
           [](Runtime rt) {  // several devices: their sums (the peak: of each device's peak)
             int64_t in_use = 0, peak = 0, budget = 0;
             for (const Runtime& one : PerDevice(rt)) {
               in_use += static_cast<int64_t>(one->scope()->in_use());
               peak += static_cast<int64_t>(one->scope()->peak());
               budget += static_cast<int64_t>(one->scope()->budget());
             }
             ffi::Map<ffi::String, int64_t> out;
             out.Set("in_use", in_use);
             out.Set("peak", peak);
             out.Set("budget", budget);
             return out;
           })
      .def("devices",
           [](Runtime rt) {  // per device: {name, units, lost, in_use, peak, budget, models, queued}
             ffi::Array<ffi::Map<ffi::String, ffi::Any>> out;
             const std::vector<Runtime> each = PerDevice(rt);
             for (size_t k = 0; k < each.size(); ++k) {
               const Runtime& one = each[k];
               ffi::Map<ffi::String, ffi::Any> d;
               d.Set("name", one->device_name());
               d.Set("units", static_cast<int64_t>(one->total_units()));
               d.Set("lost", one->device_lost());
               d.Set("in_use", static_cast<int64_t>(one->scope()->in_use()));
               d.Set("peak", static_cast<int64_t>(one->scope()->peak()));
               d.Set("budget", static_cast<int64_t>(one->scope()->budget()));
               ffi::Array<ffi::String> models;
               for (const std::string& m : rt->parts().empty() ? one->models() : rt->ModelsOn(static_cast<int>(k))) {
                 models.push_back(m);
               }
               d.Set("models", models);
               d.Set("queued", one->QueuedRequests());
               out.push_back(d);
             }
             return out;
           })
      .def("memory_scope",
           [](Runtime rt) {  // a plain Executor loaded into it counts against this runtime's budget
             auto obj = ffi::make_object<MemoryScopeObj>();
             obj->scope = rt->scope();
             return MemoryScopeRef(obj);
           })
      .def("evict",
           [](Runtime rt, const std::string& name, bool keep_environment) { return rt->Evict(name, keep_environment); })
      .def("finished_for_memory", [](Runtime rt) { return rt->finished_for_memory(); })
      .def("shutdown", [](Runtime rt) { rt->Shutdown(); });
}

}  // namespace

}  // namespace tvmsched
