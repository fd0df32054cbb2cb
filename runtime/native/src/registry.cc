// The engine's Python surface: tvm-ffi reflection, no second binding layer. Python sees
// tvmsched.Model / tvmsched.Stream / tvmsched.Request objects with these methods, and the
// tvmsched.engine.* global functions.
#include <tvm/ffi/reflection/registry.h>

#include "memory_scope_ref.h"
#include "tvm_runtime.h"
#include "tvmsched/engine.h"
#include "tvmsched/sm_windows.h"

namespace tvmsched {

/*! \brief A policy with the models it was told of, as Python holds it (tvmsched.engine.create_policy): for replaying
 *  recorded decisions and for experiments; the engine's Runtime holds its policy directly. */
class PolicyObj : public ffi::Object {
 public:
  std::shared_ptr<ColocationTable> table;
  std::unique_ptr<Policy> policy;
  std::map<std::string, PolicyModel> models;

  std::vector<CandidateInfo> Candidates(const ffi::Array<int64_t>& units, const ffi::Array<double>& latency,
                                        const ffi::Array<ffi::String>& keys) {
    if (units.size() != latency.size() || units.size() != keys.size())
      TVM_FFI_THROW(TvmschedError) << "a candidate list needs as many units, latencies and keys";
    std::vector<CandidateInfo> out(units.size());
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].units = static_cast<int>(units[i]);
      out[i].latency_us = latency[i];
      out[i].key = table->Key(keys[i]);
    }
    return out;
  }

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.Policy", PolicyObj, ffi::Object);
};

class PolicyRef : public ffi::ObjectRef {
 public:
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(PolicyRef, ffi::ObjectRef, PolicyObj);
};

namespace {

namespace refl = tvm::ffi::reflection;

std::shared_ptr<MemoryScope> ScopeOf(const MemoryScopeRef& ref) { return ref.defined() ? ref->scope : nullptr; }

std::vector<int> Ids(const ffi::Array<int64_t>& ids) {
  std::vector<int> out;
  for (int64_t id : ids) {
    if (id < 0 || id > 1 << 20) TVM_FFI_THROW(TvmschedError) << "candidate id " << id << " is out of range";
    out.push_back(static_cast<int>(id));
  }
  return out;
}

template <typename T>
ffi::Array<int64_t> ToArray(const std::vector<T>& values) {
  ffi::Array<int64_t> out;
  for (const T& v : values) out.push_back(static_cast<int64_t>(v));
  return out;
}

ffi::Array<ffi::Array<ffi::Any>> EventRows(
    const std::vector<StageEvent>& events) {  // [model, stage, group, start_us, end_us, bytes, held]
  ffi::Array<ffi::Array<ffi::Any>> out;
  for (const StageEvent& e : events) out.push_back({e.model, e.stage, e.group, e.start_us, e.end_us, e.bytes, e.held});
  return out;
}

int64_t NonNegative(int64_t bytes, const char* what) {
  if (bytes < 0) TVM_FFI_THROW(TvmschedError) << what << " cannot be negative";
  return bytes;
}

ffi::Array<ffi::Array<int64_t>> Launches(const std::vector<Launch>& launches) {
  ffi::Array<ffi::Array<int64_t>> out;
  for (const Launch& l : launches) out.push_back({l.request, l.layer, l.candidate});
  return out;
}

FlagMemory ParseFlagMemory(const std::string& name) {
  if (name == "auto") return FlagMemory::kAuto;
  if (name == "host_mapped") return FlagMemory::kHostMapped;
  if (name == "device") return FlagMemory::kDevice;
  TVM_FFI_THROW(TvmschedError) << "flag memory must be auto, host_mapped or device, not " << name;
  return FlagMemory::kAuto;  // not reached
}

TVM_FFI_STATIC_INIT_BLOCK() {
  refl::GlobalDef()
      .def("tvmsched.engine.set_tvm_libdir", [](const std::string& dir) { SetTvmLibDir(dir); })
      .def("tvmsched.engine.tvm_libdir_candidates",
           [] {
             ffi::Array<ffi::String> out;
             for (const auto& dir : TvmLibDirCandidates()) out.push_back(dir);
             return out;
           })
      .def("tvmsched.engine.now_us", []() { return Device::NowMicros(); })
      .def("tvmsched.engine.device_faults",
           [](const std::string& kind) {  // the device's fault state machine (docs/faults.md)
             Device::FaultStats stats = OpenDevice(kind)->faults();
             static const char* const kHealth[] = {"healthy", "faulted", "lost"};
             ffi::Map<ffi::String, ffi::Any> out;
             out.Set("health", ffi::String(kHealth[stats.health]));
             out.Set("generation", static_cast<int64_t>(stats.generation));
             out.Set("faults", stats.faults);
             out.Set("recoveries", stats.recoveries);
             out.Set("last_recovery_s", stats.last_recovery_s);
             out.Set("lost", ffi::String(stats.lost));
             return out;
           })
      .def("tvmsched.engine.inject_fault",
           [](Model m, int64_t layer, bool fail_recreate) {  // test hook: the next run of `layer` faults
             if (layer < 0 || layer >= m->num_layers()) TVM_FFI_THROW(TvmschedError) << "no layer " << layer;
             if (fail_recreate) m->device().FailNextRecreate();
             m->InjectFault(static_cast<int>(layer));
           })
      .def("tvmsched.engine.device_memory",
           [](const std::string& kind) {  // the accounting of what models allocated: in_use, peak, budget (0: none)
             Device::MemoryStats stats = OpenDevice(kind)->memory();
             ffi::Map<ffi::String, int64_t> out;
             out.Set("in_use", static_cast<int64_t>(stats.in_use));
             out.Set("peak", static_cast<int64_t>(stats.peak));
             out.Set("budget", static_cast<int64_t>(stats.budget));
             return out;
           })
      .def("tvmsched.engine.set_memory_budget",
           [](const std::string& kind, int64_t bytes) {
             if (bytes < 0) TVM_FFI_THROW(TvmschedError) << "a memory budget cannot be negative";
             OpenDevice(kind)->SetBudget(static_cast<size_t>(bytes));
           })
      .def("tvmsched.engine.reset_memory_peak", [](const std::string& kind) { OpenDevice(kind)->ResetPeak(); })
      .def("tvmsched.engine.device_count",
           [](const std::string& kind) -> int64_t {  // the GPUs this process sees (cpu: one device)
             if (kind == "cuda") return CudaDeviceCount();
             if (kind != "cpu") TVM_FFI_THROW(TvmschedError) << "unknown device " << kind << ": use cpu or cuda";
             return 1;
           })
      .def("tvmsched.engine.device_info",
           [](const std::string& kind) {
             auto device = OpenDevice(kind);
             ffi::Map<ffi::String, ffi::Any> out;
             out.Set("name", device->name());
             out.Set("total_units", device->total_units());
             out.Set("granularity", device->unit_granularity());
             out.Set("launches_async", device->launches_async());
             out.Set("host_memory", device->host_memory());
             return out;
           })
      .def("tvmsched.engine.time_kernel",
           [](const std::string& kind, ffi::Function func, ffi::Array<ffi::Any> args, int units, int repeat,
              double min_batch_us) {
             std::vector<ffi::Any> values(args.begin(), args.end());
             KernelTiming timing = TimeKernel(*OpenDevice(kind), func, values, units, repeat, min_batch_us);
             ffi::Map<ffi::String, ffi::Any> out;
             out.Set("granted_units", timing.granted_units);
             out.Set("us_per_call", ffi::Array<double>(timing.us_per_call));
             return out;
           })
      .def("tvmsched.engine.create_memory_scope",
           [](int64_t budget) {  // a Runtime's budget: its models count against it (0: none, still counted)
             auto obj = ffi::make_object<MemoryScopeObj>();
             obj->scope = std::make_shared<MemoryScope>(static_cast<size_t>(NonNegative(budget, "a memory budget")));
             return MemoryScopeRef(obj);
           })
      .def("tvmsched.engine.memory_scope_stats",
           [](MemoryScopeRef ref) {
             ffi::Map<ffi::String, int64_t> out;
             out.Set("in_use", static_cast<int64_t>(ref->scope->in_use()));
             out.Set("peak", static_cast<int64_t>(ref->scope->peak()));
             out.Set("budget", static_cast<int64_t>(ref->scope->budget()));
             return out;
           })
      .def("tvmsched.engine.load_model",
           [](const std::string& path, const std::string& device, const std::string& flag_memory,
              ffi::Array<ffi::String> trusted_key_files, MemoryScopeRef scope, int64_t batch) {
             std::vector<std::string> files(trusted_key_files.begin(), trusted_key_files.end());
             LoadOptions options;
             options.flag_memory = ParseFlagMemory(flag_memory);
             options.scope = ScopeOf(scope);
             options.batch = batch;
             return Model::Load(path, device, options, TrustedKeys::FromFiles(files));
           })
      .def("tvmsched.engine.register_model",
           [](const std::string& path, const std::string& device, const std::string& flag_memory,
              ffi::Array<ffi::String> trusted_key_files, int max_groups, MemoryScopeRef scope) {
             // read and verified; the weights wait in pinned host memory for a switcher (switching.h)
             std::vector<std::string> files(trusted_key_files.begin(), trusted_key_files.end());
             if (max_groups < 1)
               TVM_FFI_THROW(TvmschedError) << "a model needs at least 1 sub-task, not " << max_groups;
             LoadOptions options;
             options.flag_memory = ParseFlagMemory(flag_memory);
             options.resident = false;
             options.max_groups = max_groups;
             options.scope = ScopeOf(scope);
             return Model::Load(path, device, options, TrustedKeys::FromFiles(files));
           })
      .def("tvmsched.engine.measure_model",
           [](const std::string& path, const std::string& device, int max_groups, int64_t batch) {
             // the bytes it holds when resident as registered with `max_groups` sub-tasks, read and laid out only
             if (max_groups < 1)
               TVM_FFI_THROW(TvmschedError) << "a model needs at least 1 sub-task, not " << max_groups;
             LoadOptions options;
             options.resident = false;
             options.max_groups = max_groups;
             options.batch = batch;
             options.measure_only = true;
             options.read_weights = false;
             Model m = Model::Load(path, device, options, TrustedKeys());
             int64_t bytes = static_cast<int64_t>(m->env_bytes());
             for (int g = 0; g < m->num_groups(); ++g) bytes += static_cast<int64_t>(m->group_bytes(g));
             return bytes;
           })
      .def("tvmsched.engine.create_switcher",
           [](const std::string& kind, int64_t budget, int64_t threshold1, int64_t threshold2, int preset_count,
              bool retain, MemoryScopeRef scope) {
             if (budget < 0 || threshold1 < 0 || threshold2 < 0)
               TVM_FFI_THROW(TvmschedError) << "memory sizes cannot be negative";
             SwitchOptions options;
             options.budget = static_cast<size_t>(budget);
             options.threshold1 = static_cast<size_t>(threshold1);
             options.threshold2 = static_cast<size_t>(threshold2);
             options.preset_count = preset_count;
             options.retain = retain;
             options.scope = ScopeOf(scope);
             return Switcher::Create(OpenDevice(kind), options);
           })
      .def("tvmsched.engine.load_tiered",
           [](const std::string& path, const std::string& device, const std::string& flag_memory,
              ffi::Array<ffi::String> trusted_key_files, int64_t device_bytes, int64_t buffer_bytes,
              ffi::Array<ffi::Map<ffi::String, ffi::Any>> tiers, int in_flight, MemoryScopeRef scope) {
             // a model larger than its device memory: weights streamed from this device's tier shares (tiering.h);
             // tiers: [{"kind", "capacity_bytes", "numa_node" (-1: none), "path"}] in priority order
             auto options = std::make_shared<TierOptions>();
             options->device_bytes = static_cast<size_t>(NonNegative(device_bytes, "device memory"));
             options->buffer_bytes = static_cast<size_t>(NonNegative(buffer_bytes, "a stream buffer"));
             options->in_flight = in_flight;
             for (const auto& tier : tiers) {
               TierShare share;
               share.kind = tier.at("kind").cast<ffi::String>();
               share.capacity =
                   static_cast<size_t>(NonNegative(tier.at("capacity_bytes").cast<int64_t>(), "a tier's capacity"));
               share.numa_node = static_cast<int>(tier.at("numa_node").cast<int64_t>());
               share.path = tier.at("path").cast<ffi::String>();
               options->tiers.push_back(share);
             }
             std::vector<std::string> files(trusted_key_files.begin(), trusted_key_files.end());
             LoadOptions load;
             load.flag_memory = ParseFlagMemory(flag_memory);
             load.tiers = options;
             load.scope = ScopeOf(scope);
             return Model::Load(path, device, load, TrustedKeys::FromFiles(files));
           })
      .def("tvmsched.engine.tiering_info",
           [](Model m) {
             ffi::Map<ffi::String, ffi::Any> out;
             const StreamedLayout* layout = StreamedLayoutOf(*m.get());
             if (!layout) TVM_FFI_THROW(TvmschedError) << "model " << m->name() << " is not tiered";
             const TierStore* store = layout->store.get();
             out.Set("resident_weight_bytes", static_cast<int64_t>(layout->resident_weight_bytes));
             out.Set("buffer_bytes", static_cast<int64_t>(layout->buffer_bytes));
             out.Set("buffers", layout->num_buffers);
             out.Set("groups", m->num_groups());
             ffi::Array<int64_t> streamed;
             for (int g : layout->groups) streamed.push_back(static_cast<int64_t>(layout->stream_bytes[g]));
             out.Set("streamed_group_bytes", streamed);
             ffi::Array<ffi::Map<ffi::String, ffi::Any>> tiers;
             for (size_t t = 0; t < store->tiers().size(); ++t) {
               ffi::Map<ffi::String, ffi::Any> tier;
               tier.Set("kind", store->tiers()[t].kind);
               tier.Set("capacity_bytes", static_cast<int64_t>(store->tiers()[t].capacity));
               tier.Set("used_bytes", static_cast<int64_t>(store->used()[t]));
               tiers.push_back(tier);
             }
             out.Set("tiers", tiers);
             out.Set("direct_io", store->direct_io());
             StreamedTurn turn = TurnOf(*m.get());  // turns: whether its device memory is held now, and how much
             out.Set("takes_turns", turn.takes_turns);
             out.Set("in_memory", turn.in_memory);
             out.Set("device_bytes", static_cast<int64_t>(turn.bytes));
             return out;
           })
      .def("tvmsched.engine.release_tiers", [](Model m) { ReleaseTiers(*m.get()); })
      .def("tvmsched.engine.flag_memory", [](Model m) { return std::string(m->flag_memory()); })
      .def("tvmsched.engine.flag_memory_wanted", [](Model m) { return std::string(m->flag_memory_wanted()); })
      .def("tvmsched.engine.tiering_events", [](Model m) { return EventRows(StreamerEvents(*m.get())); })
      .def("tvmsched.engine.tier_copy_floor",
           [](Model m, int repeat) {  // kind -> [seconds, bytes]
             ffi::Map<ffi::String, ffi::Array<double>> out;
             for (const auto& [kind, floor] : TierCopyFloor(*m.get(), repeat)) {
               out.Set(kind, ffi::Array<double>{floor.first, static_cast<double>(floor.second)});
             }
             return out;
           })
      .def("tvmsched.engine.copy_floor", [](Model m, int repeat) { return CopyFloorSeconds(*m.get(), repeat); })
      .def("tvmsched.engine.verify_artifact",
           [](const std::string& path, ffi::Array<ffi::String> trusted_key_files) {
             // everything ReadArtifact checks (the signature first, with keys), without loading the kernels:
             // {"manifest_json": the verified manifest, "signer": key id or ""}
             std::vector<std::string> files(trusted_key_files.begin(), trusted_key_files.end());
             ArtifactContents contents = ReadArtifact(path, TrustedKeys::FromFiles(files), /*for_loading=*/false);
             ffi::Map<ffi::String, ffi::String> out;
             out.Set("manifest_json", contents.manifest_json);
             out.Set("signer", contents.signer);
             return out;
           })
      .def("tvmsched.engine.cpu_features",
           []() {  // {"checked": features the engine checks, "host": those this CPU has, "levels": {level: features}}
             ffi::Map<ffi::String, ffi::Any> out;
             auto strings = [](const std::vector<std::string>& items) {
               ffi::Array<ffi::String> array;
               for (const std::string& item : items) array.push_back(ffi::String(item));
               return array;
             };
             out.Set("checked", strings(CheckedCpuFeatures()));
             const std::set<std::string>& host = HostCpuFeatures();
             out.Set("host", strings(std::vector<std::string>(host.begin(), host.end())));
             ffi::Map<ffi::String, ffi::Array<ffi::String>> levels;
             for (const auto& [name, features] : CpuLevels()) levels.Set(name, strings(features));
             out.Set("levels", levels);
             return out;
           })
      .def("tvmsched.engine.check_cpu_features",
           [](ffi::String cpu, ffi::Array<ffi::String> features, ffi::String what) {
             std::vector<std::string> names(features.begin(), features.end());
             CheckCpuFeatures(std::string(cpu), names, std::string(what));
           })
      .def("tvmsched.engine.plan_memory",
           [](ffi::Array<ffi::Array<ffi::Array<ffi::String>>> layers, ffi::Map<ffi::String, int64_t> nbytes,
              ffi::Array<ffi::String> keep, int reuse_distance) {
             // layers[i] = [inputs, outputs]; returns [storage bytes per block, {tensor: block}]
             std::vector<LayerSpec> specs;
             for (size_t i = 0; i < layers.size(); ++i) {
               LayerSpec spec;
               spec.index = static_cast<int>(i);
               for (const auto& id : layers[i][0]) spec.inputs.emplace_back(id);
               for (const auto& id : layers[i][1]) spec.outputs.emplace_back(id);
               specs.push_back(std::move(spec));
             }
             std::map<std::string, size_t> sizes;
             for (const auto& kv : nbytes) sizes[std::string(kv.first)] = static_cast<size_t>(kv.second);
             std::set<std::string> kept(keep.begin(), keep.end());
             MemoryPlan plan = PlanMemory(specs, sizes, kept, reuse_distance);
             ffi::Map<ffi::String, int64_t> assignment;
             for (const auto& [id, block] : plan.assignment) assignment.Set(ffi::String(id), block);
             return ffi::Array<ffi::Any>{ToArray(plan.storage_bytes), assignment};
           })
      .def("tvmsched.engine.place_sm_windows",
           [](int groups, const ffi::Array<int64_t>& needs, bool prefix) {  // needs: n > 0 takes n groups,
             SmWindows windows(groups, prefix);                             // -i gives back the i-th window taken
             ffi::Array<int64_t> firsts;
             std::vector<std::pair<int, int>> taken;
             for (int64_t need : needs) {
               if (need > 0) {
                 taken.emplace_back(windows.Take(static_cast<int>(need)), static_cast<int>(need));
                 firsts.push_back(taken.back().first);
               } else if (need < 0 && -need <= static_cast<int64_t>(taken.size())) {
                 windows.Give(taken[-need - 1].first, taken[-need - 1].second);
               } else {
                 TVM_FFI_THROW(TvmschedError) << "no window " << -need << " to give back";
               }
             }
             return firsts;
           })
      .def("tvmsched.engine.create_stream",
           [](Model model, const std::string& name, int max_in_flight, double idle_spin_us, double progress_interval_ms,
              double stall_timeout_s, int priority) {
             if (stall_timeout_s < 0) TVM_FFI_THROW(TvmschedError) << "a stall timeout cannot be negative";
             if (priority < -1 || priority > 1) TVM_FFI_THROW(TvmschedError) << "a stream priority is -1, 0 or 1";
             StreamOptions options;
             options.priority = static_cast<StreamPriority>(priority);
             options.stall_timeout_s = stall_timeout_s;
             options.max_in_flight = max_in_flight;
             options.idle_spin_us = idle_spin_us;
             options.progress_interval_ms = progress_interval_ms;
             return Stream::Create(std::move(model), name, options);
           })
      .def("tvmsched.engine.create_preemption_group", [] { return PreemptionGroup::Create(); })
      // a policy (policy.h); `firsts`, `seconds`, `values`: the colocation profile's pairs in their order
      .def("tvmsched.engine.create_policy",
           [](const std::string& kind, int64_t total_units, ffi::Array<ffi::String> firsts,
              ffi::Array<ffi::String> seconds, ffi::Array<double> values) {
             if (total_units < 1) TVM_FFI_THROW(TvmschedError) << "a device has at least one compute unit";
             if (firsts.size() != seconds.size() || firsts.size() != values.size())
               TVM_FFI_THROW(TvmschedError) << "a colocation profile needs as many firsts, seconds and values";
             auto obj = ffi::make_object<PolicyObj>();
             obj->table = std::make_shared<ColocationTable>(static_cast<int>(total_units));
             std::vector<ColocationTable::Measured> pairs;
             for (size_t i = 0; i < firsts.size(); ++i) pairs.push_back({firsts[i], seconds[i], values[i]});
             obj->table->AddMeasured(pairs);
             obj->policy = CreatePolicy(kind, obj->table, static_cast<int>(total_units));
             return PolicyRef(obj);
           })
      // a model's candidates, per layer (units, isolated latency in µs, profile key); qos_ms < 0: none
      .def("tvmsched.engine.policy_add_model",
           [](PolicyRef p, const std::string& name, ffi::Array<ffi::Array<int64_t>> units,
              ffi::Array<ffi::Array<double>> latency, ffi::Array<ffi::Array<ffi::String>> keys, double qos_ms) {
             if (units.size() != latency.size() || units.size() != keys.size())
               TVM_FFI_THROW(TvmschedError) << "model " << name << ": as many layers of units, latencies and keys";
             std::vector<std::vector<CandidateInfo>> layers;
             for (size_t i = 0; i < units.size(); ++i) {
               layers.push_back(p->Candidates(units[i], latency[i], keys[i]));
               if (layers.back().empty()) TVM_FFI_THROW(TvmschedError) << "layer " << i << " has no candidate";
             }
             PolicyModel model = MakePolicyModel(name, std::move(layers), qos_ms);
             p->table->AddCandidates(model);
             p->models[name] = std::move(model);
           })
      // one decision for a request of `model` to stream `stream` (its oldest queued request); `views`: the monitor,
      // [[name, units, latencies, keys], ...]. Returns [candidate ids, estimated ms, meets QoS, other streams,
      // estimated (the colocation policy's estimate is in the two before), seconds]
      .def("tvmsched.engine.policy_decide",
           [](PolicyRef p, const std::string& model, const std::string& stream, int64_t loaded_models,
              ffi::Array<ffi::Array<ffi::Any>> views) {
             auto found = p->models.find(model);
             if (found == p->models.end()) TVM_FFI_THROW(TvmschedError) << "the policy knows no model " << model;
             std::vector<StreamView> monitor;
             for (const auto& row : views) {
               if (row.size() != 4) TVM_FFI_THROW(TvmschedError) << "a monitor view is [name, units, latencies, keys]";
               monitor.push_back({row[0].cast<ffi::String>(),
                                  p->Candidates(row[1].cast<ffi::Array<int64_t>>(), row[2].cast<ffi::Array<double>>(),
                                                row[3].cast<ffi::Array<ffi::String>>())});
             }
             std::vector<QueuedRequest> queued(1);
             PolicyInput input;
             input.model = &found->second;
             input.stream = stream;
             input.queued = &queued;
             input.monitor = [&monitor]() -> const std::vector<StreamView>& { return monitor; };
             input.total_units = p->table->total_units();
             input.loaded_models = static_cast<int>(loaded_models);
             PolicyDecision d = p->policy->Decide(input);
             return ffi::Array<ffi::Any>{ToArray(d.candidate_ids),        d.estimated_ms, d.meets_qos,
                                         static_cast<int64_t>(d.streams), d.estimated,    d.seconds};
           })
      .def("tvmsched.engine.stop_deferred_callbacks",
           [](double timeout_s) { return StopDeferredCallbacks(timeout_s); });

  refl::ObjectDef<ModelObj>()
      .def("name", [](Model m) { return m->name(); })
      .def("device_kind", [](Model m) { return std::string(m->device().kind()); })
      .def("total_units", [](Model m) { return m->device().total_units(); })
      .def("num_layers", [](Model m) { return m->num_layers(); })
      .def("reuse_distance", [](Model m) { return m->reuse_distance(); })
      .def("manifest_json", [](Model m) { return m->manifest_json(); })
      .def("batch_size", [](Model m) { return m->batch_size(); })
      .def("resident", [](Model m) { return m->resident(); })
      .def("placement", [](Model m) { return std::string(m->placement()->kind()); })
      .def("env_bytes", [](Model m) { return static_cast<int64_t>(m->env_bytes()); })
      .def("groups",
           [](Model m) {  // per sub-task: [first layer, last layer, bytes, weight bytes, state]
             ffi::Array<ffi::Array<int64_t>> out;
             for (int g = 0; g < m->num_groups(); ++g) {
               auto [first, last] = m->group_layers(g);
               out.push_back({first, last, static_cast<int64_t>(m->group_bytes(g)),
                              static_cast<int64_t>(m->group_weight_bytes(g)), static_cast<int64_t>(m->group_state(g))});
             }
             return out;
           })
      .def("replan", [](Model m, int distance) { m->Replan(distance); })
      .def("set_inputs", [](Model m, ffi::Map<ffi::String, ffi::Tensor> inputs) { m->SetInputs(inputs); })
      .def("run_layer", [](Model m, int index, int candidate) { m->RunLayer(index, candidate); })
      .def("run_layers", [](Model m, ffi::Array<int64_t> ids) { m->RunLayers(Ids(ids)); })
      .def("run",
           [](Model m, ffi::Map<ffi::String, ffi::Tensor> inputs, ffi::Array<int64_t> ids) {
             std::vector<int> candidates = Ids(ids);
             if (!candidates.empty()) m->CheckCandidates(candidates);  // before the inputs are copied
             m->SetInputs(inputs);
             m->RunLayers(candidates);
             return m->GetOutputs();
           })
      .def("get_outputs", [](Model m) { return m->GetOutputs(); })
      .def("synchronize", [](Model m) { m->Synchronize(); })
      .def("time_runs",
           [](Model m, int repeat, int warmup) {
             ffi::Array<double> seconds;
             for (int i = 0; i < warmup + repeat; ++i) {
               double start = Device::NowMicros();
               m->RunLayers({});
               m->Synchronize();
               if (i >= warmup) seconds.push_back((Device::NowMicros() - start) / 1e6);
             }
             return seconds;
           })
      .def("set_preempt_flag", [](Model m, bool on) { m->SetPreemptFlag(on); })
      .def("counts_progress", [](Model m) { return m->counts_progress(); })
      .def("reset_progress", [](Model m) { m->ResetProgress(); })
      .def("read_counters", [](Model m) { return ToArray(m->ReadCounters()); })
      .def("completed_blocks", [](Model m, ffi::Array<int64_t> ids) { return ToArray(m->CompletedBlocks(Ids(ids))); });

  refl::ObjectDef<MemoryScopeObj>();
  refl::ObjectDef<PolicyObj>()
      .def("kind", [](PolicyRef p) { return std::string(p->policy->kind()); })
      .def("serial", [](PolicyRef p) { return p->policy->serial(); })
      .def("decided", [](PolicyRef p) {
        LayerScheduler* scheduler = SchedulerOf(*p->policy);
        return scheduler ? scheduler->decided() : int64_t{0};
      });
  refl::ObjectDef<SwitcherObj>()
      .def("add", [](Switcher s, Model m) { s->Add(std::move(m)); })
      .def("prefetch", [](Switcher s, Model m) { return s->Prefetch(std::move(m)); })
      .def("evict", [](Switcher s, Model m, bool keep_env) { return s->Evict(std::move(m), keep_env); })
      .def("remove", [](Switcher s, Model m) { return s->Remove(std::move(m)); })
      .def("set_blocked_callback",
           [](Switcher s, ffi::Function callback) { s->SetBlockedCallback(std::move(callback)); })
      .def("events", [](Switcher s) { return EventRows(s->Events()); })
      .def("options",
           [](Switcher s) {
             const SwitchOptions& o = s->options();
             ffi::Map<ffi::String, int64_t> out;
             out.Set("budget", static_cast<int64_t>(o.budget));
             out.Set("threshold1", static_cast<int64_t>(o.threshold1));
             out.Set("threshold2", static_cast<int64_t>(o.threshold2));
             out.Set("preset_count", o.preset_count);
             out.Set("retain", o.retain);
             return out;
           })
      .def("close", [](Switcher s) { s->Close(); });

  refl::ObjectDef<RequestObj>()
      .def_ro("id", &RequestObj::id)
      .def_ro("submitted_us", &RequestObj::submitted_us)
      .def_ro("started_us", &RequestObj::started_us)
      .def_ro("finished_us", &RequestObj::finished_us)
      .def("wait", [](Request r, double timeout_s, double spin_us) { return r->Wait(timeout_s, spin_us); })
      .def("done", [](Request r) { return r->done(); })
      .def("outputs", [](Request r) { return r->outputs(); })
      .def("error", [](Request r) { return r->error(); })
      .def("candidate_ids", [](Request r) { return ToArray(r->candidate_ids); })
      // a Python callable waits for the GIL: on the engine's callback thread, never on the stream's submitter
      .def("on_done", [](Request r, ffi::Function callback) { r->OnDone(std::move(callback), true); });

  refl::ObjectDef<PreemptionGroupObj>()
      .def("add", [](PreemptionGroup g, Stream s) { g->Add(std::move(s)); })
      .def("remove", [](PreemptionGroup g, Stream s) { g->Remove(std::move(s)); })
      .def("hold", [](PreemptionGroup g, Request r,
                      Stream own) { return static_cast<int64_t>(g->Hold(std::move(r), std::move(own)).size()); })
      .def("active", [](PreemptionGroup g) { return g->active(); })
      .def("finish_started_of",
           [](PreemptionGroup g, ffi::Array<Model> holders) {
             return static_cast<int64_t>(g->FinishStartedOf(holders));
           })
      .def("preempted", [](PreemptionGroup g) { return g->preempted.load(); });

  refl::ObjectDef<StreamObj>()
      .def("name", [](Stream s) { return s->name(); })
      .def("submit", [](Stream s, ffi::Map<ffi::String, ffi::Tensor> inputs,
                        ffi::Array<int64_t> ids) { return s->Submit(std::move(inputs), Ids(ids)); })
      .def("submit_by", [](Stream s, ffi::Map<ffi::String, ffi::Tensor> inputs, ffi::Array<int64_t> ids,
                           double deadline_us) { return s->SubmitBy(std::move(inputs), Ids(ids), deadline_us); })
      .def("preempt",
           [](Stream s, bool abort, bool wait) {
             PreemptReport report = s->Preempt(abort, wait);
             ffi::Map<ffi::String, ffi::Any> out;
             out.Set("seconds", report.seconds);
             out.Set("rerun", Launches(report.rerun));
             out.Set("finished", Launches(report.finished));
             return out;
           })
      .def("resume", [](Stream s, bool wait) { s->Resume(wait); })
      .def("finish_started", [](Stream s) { return s->FinishStarted(); })
      .def("paused", [](Stream s) { return s->paused(); })
      .def("busy", [](Stream s) { return s->busy(); })
      .def("pending", [](Stream s) { return s->pending(); })
      .def("state",
           [](Stream s) -> ffi::Optional<ffi::Map<ffi::String, ffi::Any>> {
             auto state = s->State();
             if (!state) return std::nullopt;
             ffi::Map<ffi::String, ffi::Any> out;
             out.Set("done", ToArray(state->done));
             out.Set("blocks", ToArray(state->blocks));
             out.Set("ids", ToArray(state->ids));
             ffi::Array<ffi::Array<int64_t>> queued;
             for (const auto& ids : state->queued) queued.push_back(ToArray(ids));
             out.Set("queued", queued);
             return out;
           })
      .def("sync_progress", [](Stream s) { s->SyncProgress(); })
      .def("record_timeline", [](Stream s, bool on) { s->RecordTimeline(on); })
      .def("timeline",
           [](Stream s) {
             ffi::Array<ffi::Array<double>> out;
             for (const LaunchRecord& r : s->Timeline()) {
               out.push_back({static_cast<double>(r.request), static_cast<double>(r.layer),
                              static_cast<double>(r.candidate), r.start_us, r.end_us});
             }
             return out;
           })
      .def("counts",
           [](Stream s) {
             ffi::Map<ffi::String, int64_t> out;
             out.Set("launches", s->launches.load());
             out.Set("reruns", s->reruns.load());
             out.Set("completed", s->completed.load());
             out.Set("failed", s->failed.load());
             out.Set("preemptions", s->preemptions.load());
             out.Set("faults", s->faults.load());
             out.Set("fault_restarts", s->fault_restarts.load());
             return out;
           })
      .def("latencies_us", [](Stream s) { return ffi::Array<double>(s->Latencies()); })
      .def("close", [](Stream s) { s->Close(); });
}

}  // namespace
}  // namespace tvmsched
