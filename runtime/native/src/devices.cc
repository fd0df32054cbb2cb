// A Runtime over several devices (tvmsched/runtime.h, docs/multi-device.md): one Runtime per device, each with its own
// policy, switcher, memory budget and fault state; this one places each model (whole on one device, or a replica on
// each device its options name) and routes each request to the replica predicted to finish it first. The placement
// and the routing are decisions (a policy's part); the devices' Runtimes are the mechanisms that run them.
#include <tvm/ffi/error.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "error_line.h"
#include "percentile.h"
#include "tvmsched/runtime.h"
#include "tvmsched/split.h"

namespace tvmsched {

/*! \brief A split model in the Runtime (tvmsched/split.h): each part a model of its own, NAME/k, on its device's
 *  Runtime, which places, schedules and preempts it like any model; a request runs part 0, then each next part on its
 *  outputs. */
struct SplitChain {
  std::string name;
  Manifest whole;                               // the model's manifest (a request's inputs and outputs)
  std::vector<int> devices;                     // each part's device (an index into parts_), in order
  std::vector<std::string> parts;               // each part's name on that device's Runtime
  std::vector<std::vector<std::string>> reads;  // each part's InputNames (the model's inputs, then crossing ones)
  double qos_ms = -1;
  bool realtime = false;
  std::mutex mu;
  std::condition_variable idle;
  bool closing = false;
  int64_t requests = 0, errors = 0, qos_violations = 0, inflight = 0;
  std::atomic<int64_t> rejected{0};  // refused at submit (a device out of service, bad inputs, unloading)
  std::deque<double> latencies_ms;   // the latest 8192
};

namespace {

/*! \brief A request's rows as its first input's leading dimension says (1 for a scalar input): what the prediction
 *  counts. The device's Runtime checks the inputs. */
int64_t RowsOf(const ffi::Map<ffi::String, ffi::Tensor>& inputs) {
  for (const auto& [name, tensor] : inputs) return tensor.ndim() > 0 ? std::max<int64_t>(tensor.size(0), 1) : 1;
  return 1;
}

}  // namespace

DeviceSpec ParseDeviceSpec(const std::string& text) {
  DeviceSpec spec;
  const size_t colon = text.find(':');
  spec.kind = text.substr(0, colon);
  bool ok = spec.kind == "cpu" || spec.kind == "cuda";
  if (ok && colon != std::string::npos) {
    const std::string number = text.substr(colon + 1);
    ok = !number.empty() && number.size() <= 4 &&
         std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (ok) spec.index = std::stoi(number);
  }
  if (!ok) TVM_FFI_THROW(TvmschedError) << "a device is cpu, cpu:N, cuda or cuda:N, not '" << text << "'";
  return spec;
}

void RuntimeObj::CheckInService(const std::vector<int>& devices) const {
  for (int d : devices) {
    if (parts_[d]->device_lost()) {
      TVM_FFI_THROW(TvmschedError) << "device " << parts_[d]->device_name()
                                   << " is out of service: " << parts_[d]->device_->faults().lost;
    }
  }
}

std::string RuntimeObj::DeviceNames(const std::vector<int>& devices) const {
  std::string names;
  for (int d : devices) names += (names.empty() ? "" : ",") + parts_[d]->device_name();
  return names;
}

int DeviceUnits(const std::vector<DeviceSpec>& specs) {
  const DeviceSpec& first = specs.at(0);
  if (specs.size() > 1 && first.kind == "cpu") {  // a share of the cores
    return OpenCpuShare(0, static_cast<int>(specs.size()))->total_units();
  }
  return OpenDevice(first.kind, first.index)->total_units();
}

std::string RuntimeObj::device_name() const {
  if (!parts_.empty()) {
    std::string all;
    for (const Runtime& part : parts_) all += (all.empty() ? "" : ",") + part->device_name();
    return all;
  }
  const DeviceSpec& spec = options_.devices[0];
  return spec.kind == "cuda" || spec.opened ? spec.kind + ":" + std::to_string(spec.index) : spec.kind;
}

std::vector<std::shared_ptr<Device>> OpenDevices(const std::vector<DeviceSpec>& specs) {
  const std::string& kind = specs.at(0).kind;
  const int n = static_cast<int>(specs.size());
  std::set<int> seen;
  for (const DeviceSpec& spec : specs) {
    if (spec.kind != kind) {
      TVM_FFI_THROW(TvmschedError) << "a runtime's devices are all of one kind, not " << kind << " and " << spec.kind;
    }
    if (spec.index < 0 || !seen.insert(spec.index).second) {
      TVM_FFI_THROW(TvmschedError) << "device " << spec.kind << ":" << spec.index << " is listed twice or is not a "
                                   << "device number";
    }
  }
  std::vector<std::shared_ptr<Device>> devices;
  for (const DeviceSpec& spec : specs) {  // CPU devices stand for GPUs: each its share of the cores, its own memory
    devices.push_back(spec.opened          ? spec.opened
                      : spec.kind == "cpu" ? OpenCpuShare(spec.index, n)
                                           : OpenDevice(spec.kind, spec.index));
  }
  return devices;
}

void RuntimeObj::OpenParts() {
  std::vector<std::shared_ptr<Device>> devices = OpenDevices(options_.devices);
  for (size_t d = 0; d < devices.size(); ++d) {
    RuntimeOptions one = options_;
    DeviceSpec spec = options_.devices[d];
    spec.opened = devices[d];
    one.devices = {spec};
    if (spec.tiers) one.tiers = *spec.tiers;  // (the plan's shares for this GPU; else the host tiers, as given)
    // each device's policy adds its models' candidates to its table (not thread-safe, so not shared)
    if (options_.colocation) one.colocation = std::make_shared<ColocationTable>(*options_.colocation);
    parts_.push_back(Runtime::Create(std::move(one)));
  }
  device_ = parts_[0]->device_;
  total_units_ = parts_[0]->total_units();
  policy_kind_ = options_.policy;
  scope_ = parts_[0]->scope();
}

std::vector<int> RuntimeObj::ReplicasOf(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = replicas_.find(model);
  if (found == replicas_.end()) {
    std::ostringstream loaded;
    for (const auto& [name, devices] : replicas_) loaded << (loaded.tellp() ? ", " : "") << name;
    TVM_FFI_THROW(TvmschedError) << "no model named '" << model
                                 << "' is loaded (loaded: " << (replicas_.empty() ? "none" : loaded.str()) << ")";
  }
  return found->second;
}

int RuntimeObj::PlaceLocked() {
  // by measured load and footprint, among the devices in service: the least busy since the last placement (its
  // streams' requests' start-to-end times over the time passed), when the busy shares differ by more than 10
  // points; else the most memory left (no budget: as good as any); else the fewest models
  const int n = static_cast<int>(parts_.size());
  const double now = Device::NowMicros();
  std::vector<int> models(n, 0);
  for (const auto& [name, on] : replicas_) {
    for (int d : on) ++models[d];
  }
  load_samples_.resize(n, {0, 0});
  std::vector<double> busy(n, 0);
  for (int d = 0; d < n; ++d) {
    const double work = parts_[d]->WorkUs();
    const auto [at, before] = load_samples_[d];
    busy[d] = at > 0 && now > at ? (work - before) / (now - at) : 0;
    load_samples_[d] = {now, work};
  }
  auto left = [&](int d) {
    return parts_[d]->scope()->budget() > 0 ? parts_[d]->scope()->left() : std::numeric_limits<size_t>::max();
  };
  double least = std::numeric_limits<double>::infinity();
  for (int d = 0; d < n; ++d) {
    if (!parts_[d]->device_lost()) least = std::min(least, busy[d]);
  }
  int best = -1;
  for (int d = 0; d < n; ++d) {  // of the least busy (within 10 points): the most memory left, then the fewest models
    if (parts_[d]->device_lost() || busy[d] > least + 0.10) continue;
    if (best < 0 || left(d) > left(best) || (left(d) == left(best) && models[d] < models[best])) best = d;
  }
  if (best < 0) TVM_FFI_THROW(TvmschedError) << "every device is out of service (" << device_name() << ")";
  return best;
}

double RuntimeObj::WorkUs() const {
  std::lock_guard<std::mutex> lock(mu_);
  double work = 0;
  for (const auto& e : order_) {
    for (const Stream& s : e->streams) work += static_cast<double>(s->busy_us.load(std::memory_order_relaxed));
  }
  return work;
}

std::string RuntimeObj::LoadReplicas(const std::string& path, const ModelOptions& options) {
  const int n = static_cast<int>(parts_.size());
  std::vector<int> devices = options.devices;
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= n) {
      TVM_FFI_THROW(TvmschedError) << "device " << d << " is not one of the runtime's devices (0 to " << n - 1 << ": "
                                   << device_name() << ")";
    }
    if (!seen.insert(d).second) TVM_FFI_THROW(TvmschedError) << "device " << d << " is named twice for one model";
  }
  std::vector<int> in_service;
  for (int d = 0; d < n; ++d) {
    if (!parts_[d]->device_lost()) in_service.push_back(d);
  }
  // split or replicated, one rule: split when asked to (the planner's plan), or when larger than every device's
  // budget and its parts fit (else whole on one device, where it streams); otherwise whole, replicas as named
  if (options.split || !options.split_layers.empty())
    return LoadSplit(path, options, devices.empty() ? in_service : devices);
  if (devices.empty() && in_service.size() > 1 && LargerThanEveryBudget(path)) {
    try {
      return LoadSplit(path, options, in_service);
    } catch (const ffi::Error&) {  // (its parts do not fit: whole, streamed on one device, below)
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
    if (devices.empty()) devices = {PlaceLocked()};  // whole, on one device
  }
  CheckInService(devices);
  ModelOptions one = options;
  one.devices.clear();
  std::string name;
  std::vector<int> loaded;
  try {
    for (int d : devices) {
      name = parts_[d]->Load(path, one);
      loaded.push_back(d);
      one.name = name;  // every replica under the first one's name
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
    if (replicas_.count(name)) TVM_FFI_THROW(TvmschedError) << "a model named '" << name << "' is already loaded";
    replicas_[name] = devices;
  } catch (...) {  // nothing stays loaded
    for (int d : loaded) {
      try {
        parts_[d]->Unload(name, 60);
      } catch (const ffi::Error&) {  // (it answers its requests, if any came, then goes; the load's error is the news)
      }
    }
    throw;
  }
  return name;
}

bool RuntimeObj::LargerThanEveryBudget(const std::string& path) const {
  const Runtime* first = nullptr;
  size_t largest = 0;
  for (const Runtime& part : parts_) {
    if (part->device_lost()) continue;
    if (part->scope()->budget() == 0) return false;  // (no budget: it fits)
    largest = std::max(largest, part->scope()->budget());
    if (!first) first = &part;
  }
  if (!first) return false;
  LoadOptions registered;       // (as a device's Runtime measures a model: registered, its environment and groups; only
  registered.resident = false;  // laid out: no pinned copy of a model larger than every device's memory)
  registered.max_groups = std::max(1, options_.max_groups);
  registered.measure_only = true;
  registered.read_weights = false;
  Model m = (*first)->LoadModel(path, registered);
  size_t footprint = m->env_bytes();
  for (int g = 0; g < m->num_groups(); ++g) footprint += m->group_bytes(g);
  return footprint > largest;
}

std::string RuntimeObj::LoadSplit(const std::string& path, const ModelOptions& options,
                                  const std::vector<int>& devices) {
  if (devices.size() < 2) {
    TVM_FFI_THROW(TvmschedError) << "a split model needs at least two devices in service, not " << devices.size();
  }
  if (!options.preferred_batch_sizes.empty() || options.max_queue_delay_us > 0) {
    TVM_FFI_THROW(TvmschedError) << "a split model runs at one batch size: it takes no preferred_batch_sizes or "
                                 << "max_queue_delay_us";
  }
  CheckInService(devices);
  auto chain = std::make_shared<SplitChain>();
  chain->whole = ReadArtifact(path, parts_[0]->trusted_, /*for_loading=*/false, /*with_weights=*/false).manifest;
  if (BatchSizes(chain->whole).size() > 1) {
    TVM_FFI_THROW(TvmschedError) << "model " << chain->whole.model_name << " is compiled at several batch sizes: a "
                                 << "split model serves one";
  }
  const std::vector<std::pair<int, int>> groups = SplitGroups(chain->whole, options.split_layers, devices.size(), path);
  chain->name = options.name.empty() ? chain->whole.model_name : options.name;
  chain->qos_ms = QosOf(options, chain->whole);
  chain->realtime = options.realtime;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
    if (replicas_.count(chain->name)) {
      TVM_FFI_THROW(TvmschedError) << "a model named '" << chain->name << "' is already loaded";
    }
  }
  // each part a model of its own on its device's Runtime (placed there as any model: resident, switched or streamed
  // from that device's tiers); the first keeps the model's queue policy, the later ones take every request handed on
  try {
    for (size_t k = 0; k < groups.size(); ++k) {
      ModelOptions part = options;
      part.name = chain->name + "/" + std::to_string(k);
      part.devices.clear();
      part.split = false;
      part.split_layers.clear();
      part.layers = groups[k];
      part.qos_ms = -1;  // (the model's target bounds the whole request: its stats count it)
      if (k > 0) part.queue = QueuePolicy{};
      const int d = devices[k];
      chain->parts.push_back(parts_[d]->Load(path, part));
      chain->devices.push_back(d);
      chain->reads.push_back(InputNames(parts_[d]->engine_models(chain->parts.back()).at(0)->manifest()));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
    if (replicas_.count(chain->name)) {
      TVM_FFI_THROW(TvmschedError) << "a model named '" << chain->name << "' is already loaded";
    }
    replicas_[chain->name] = chain->devices;
    split_[chain->name] = chain;
  } catch (...) {  // nothing stays loaded
    for (size_t k = 0; k < chain->parts.size(); ++k) {
      try {
        parts_[chain->devices[k]]->Unload(chain->parts[k], 60);
      } catch (const ffi::Error&) {  // (the load's error is the news)
      }
    }
    throw;
  }
  return chain->name;
}

std::shared_ptr<SplitChain> RuntimeObj::SplitOf(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = split_.find(model);
  return found == split_.end() ? nullptr : found->second;
}

Manifest RuntimeObj::ModelManifest(const std::string& model) const {
  if (std::shared_ptr<SplitChain> chain = SplitOf(model)) return chain->whole;
  return engine_models(model).at(0)->manifest();
}

std::vector<Model> RuntimeObj::SplitModels(const SplitChain& chain) const {
  std::vector<Model> models;
  for (size_t k = 0; k < chain.parts.size(); ++k) {
    for (Model& m : parts_[chain.devices[k]]->engine_models(chain.parts[k])) models.push_back(m);
  }
  return models;
}

std::vector<Stream> RuntimeObj::SplitStreams(const SplitChain& chain) const {
  std::vector<Stream> streams;
  for (size_t k = 0; k < chain.parts.size(); ++k) {
    for (Stream& s : parts_[chain.devices[k]]->streams(chain.parts[k])) streams.push_back(s);
  }
  return streams;
}

bool RuntimeObj::WaitSplit(const std::shared_ptr<SplitChain>& chain, double timeout_s) {
  std::vector<std::shared_ptr<SplitChain>> chains;
  if (chain) {
    chains.push_back(chain);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, each] : split_) chains.push_back(each);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool all = true;
  for (const auto& c : chains) {
    std::unique_lock<std::mutex> lock(c->mu);
    c->closing = true;
    all &= c->idle.wait_until(lock, deadline, [&] { return c->inflight == 0; });
  }
  return all;
}

std::vector<std::string> RuntimeObj::ModelsOn(int part) const {
  std::vector<std::string> names = parts_.at(part)->models();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, chain] : split_) {  // a split model's part goes by the model's name
    for (size_t k = 0; k < chain->parts.size(); ++k) {
      auto at = std::find(names.begin(), names.end(), chain->parts[k]);
      if (chain->devices[k] == part && at != names.end()) *at = name;
    }
  }
  return names;
}

Request RuntimeObj::SubmitRouted(const std::string& model, ffi::Map<ffi::String, ffi::Tensor> inputs,
                                 const SubmitOptions& options) {
  std::shared_ptr<SplitChain> chain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
    auto found = split_.find(model);
    if (found != split_.end()) chain = found->second;
  }
  if (chain) {  // a split model: part 0 first, on its device; every device holding a part must be in service
    try {       // (refused here: an error of the split model's, as part 0's own refusals are)
      for (int d : chain->devices) {
        if (parts_[d]->device_lost()) {
          ThrowRefusal("model " + model + " is split across " + DeviceNames(chain->devices) + ", and " +
                       parts_[d]->device_name() + " is out of service: " + parts_[d]->device_->faults().lost);
        }
      }
      CheckInputNames(chain->whole, inputs);
      std::lock_guard<std::mutex> lock(chain->mu);
      if (chain->closing) ThrowRefusal("model '" + model + "' is being unloaded");
      ++chain->inflight;
    } catch (...) {
      ++chain->rejected;
      throw;
    }
    Request inner;
    try {
      inner = parts_[chain->devices[0]]->Submit(chain->parts[0], PartInputs(chain->reads[0], inputs), options);
    } catch (...) {
      std::lock_guard<std::mutex> lock(chain->mu);
      if (--chain->inflight == 0) chain->idle.notify_all();
      throw;
    }
    auto outer = ffi::make_object<RequestObj>();  // what the caller holds: done when the last part is
    outer->inputs = inputs;
    outer->submitted_us = inner->submitted_us;
    Request request(outer);
    FollowSplit(chain, request, inner, 0, inputs, options.priority);
    return request;
  }
  const std::vector<int> replicas = ReplicasOf(model);
  const int64_t rows = RowsOf(inputs);
  std::vector<std::pair<double, int>> order;  // (predicted finish, device), the soonest first
  std::string out_of_service;
  for (int d : replicas) {
    if (parts_[d]->device_lost()) {
      out_of_service += (out_of_service.empty() ? "" : ", ") + parts_[d]->device_name();
      continue;
    }
    double us = parts_[d]->PredictFinishUs(model, rows);
    if (us >= 0) order.emplace_back(us, d);
  }
  if (order.empty()) {
    TVM_FFI_THROW(TvmschedError) << "model " << model << ": every device holding it is out of service ("
                                 << out_of_service << ")";
  }
  std::stable_sort(order.begin(), order.end());
  // the soonest replica; when it refuses (its queue full, its latency target, its device lost meanwhile), the next.
  // A request every replica refuses gets the soonest one's line
  std::optional<ffi::Error> first;
  for (const auto& [us, d] : order) {
    Request inner;
    try {
      inner = parts_[d]->Submit(model, inputs, options);
    } catch (const ffi::Error& err) {
      if (!first) first = err;
      continue;
    }
    if (replicas.size() == 1) return inner;       // nowhere else to go if its device is lost
    auto outer = ffi::make_object<RequestObj>();  // what the caller holds: it may be run again on another device
    outer->inputs = inputs;
    outer->submitted_us = inner->submitted_us;
    Request request(outer);
    FollowRouted(request, inner, model, options, {d});
    return request;
  }
  throw *first;
}

void RuntimeObj::FollowRouted(Request outer, Request inner, const std::string& model, const SubmitOptions& options,
                              std::vector<int> tried) {
  // on the finishing stream's thread (short: at most one Submit, which queues). A request that fails because its
  // device is lost (RequestObj::device_lost: EnterLaunch refused its next launch) runs again from its first layer on
  // another replica in service; the request whose launch faulted keeps its own failure (it may be the cause, and
  // would fault there too)
  inner->OnDone(ffi::Function::FromTyped([this, outer, model, options, tried](Request done) {
    if (done->device_lost) {
      std::vector<int> replicas;
      try {
        replicas = ReplicasOf(model);
      } catch (const ffi::Error&) {  // (unloaded meanwhile: its own failure)
      }
      for (int e : replicas) {
        if (std::find(tried.begin(), tried.end(), e) != tried.end() || parts_[e]->device_lost()) continue;
        try {
          std::vector<int> next = tried;
          next.push_back(e);
          FollowRouted(outer, parts_[e]->Submit(model, outer->inputs, options), model, options, next);
          return;
        } catch (const ffi::Error&) {  // (refused there too: the next, else its own failure)
        }
      }
    }
    outer->id = done->id;
    outer->restarts = done->restarts;
    outer->candidate_ids = done->candidate_ids;
    outer->started_us = done->started_us;
    outer->Finish(done->outputs(), done->error(), done->finished_us);
  }));
}

void RuntimeObj::FollowSplit(std::shared_ptr<SplitChain> chain, Request outer, Request inner, size_t k,
                             ffi::Map<ffi::String, ffi::Tensor> have, int priority) {
  // on the finishing stream's thread (short: at most one Submit, which queues)
  inner->OnDone(ffi::Function::FromTyped([this, chain, outer, k, have, priority](Request done) {
    if (k == 0) outer->id = done->id, outer->started_us = done->started_us;
    outer->restarts += done->restarts;
    outer->candidate_ids.insert(outer->candidate_ids.end(), done->candidate_ids.begin(), done->candidate_ids.end());
    std::string error = done->error();
    ffi::Map<ffi::String, ffi::Tensor> next = have;
    if (error.empty()) {
      for (const auto& [name, tensor] : done->outputs()) next.Set(name, tensor);
      if (k + 1 < chain->parts.size()) {  // the next part, on its device: every request handed on is taken
        SubmitOptions later;
        later.priority = priority;
        later.timeout_us = 0;
        try {
          const int d = chain->devices[k + 1];
          FollowSplit(chain, outer,
                      parts_[d]->Submit(chain->parts[k + 1], PartInputs(chain->reads[k + 1], next), later), k + 1, next,
                      priority);
          return;
        } catch (const std::exception& err) {
          error = ErrorLine(err);
        }
      }
    }
    ffi::Map<ffi::String, ffi::Tensor> outputs;
    if (error.empty()) outputs = ModelOutputs(chain->whole, next);
    const double finished = done->finished_us;
    {
      std::lock_guard<std::mutex> lock(chain->mu);
      if (error.empty()) {
        ++chain->requests;
        const double ms = (finished - outer->submitted_us) / 1e3;
        if (chain->latencies_ms.size() >= 8192) chain->latencies_ms.pop_front();
        chain->latencies_ms.push_back(ms);
        if (chain->qos_ms > 0 && ms > chain->qos_ms) ++chain->qos_violations;
      } else {
        ++chain->errors;
      }
      if (--chain->inflight == 0) chain->idle.notify_all();
    }
    outer->Finish(outputs, ffi::String(error), finished);
  }));
}

void RuntimeObj::UnloadReplicas(const std::string& name, double timeout_s) {
  const std::vector<int> replicas = ReplicasOf(name);
  if (std::shared_ptr<SplitChain> chain = SplitOf(name)) {  // its requests under way finish first, then its parts go
    const bool drained = WaitSplit(chain, timeout_s);
    std::optional<ffi::Error> failed;
    for (size_t k = 0; k < chain->parts.size(); ++k) {
      try {
        parts_[chain->devices[k]]->Unload(chain->parts[k], timeout_s);
      } catch (const ffi::Error& err) {
        if (!failed) failed = err;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      split_.erase(name);
      replicas_.erase(name);
    }
    if (failed) throw *failed;
    if (!drained) {
      TVM_FFI_THROW(TvmschedError) << "model " << name << ": requests were still under way after " << timeout_s << " s";
    }
    return;
  }
  std::optional<ffi::Error> failed;
  std::vector<int> left;
  for (int d : replicas) {  // each drains its queued and running requests first
    try {
      parts_[d]->Unload(name, timeout_s);
    } catch (const ffi::Error& err) {
      if (!failed) failed = err;
      left.push_back(d);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (left.empty()) {
      replicas_.erase(name);
    } else {
      replicas_[name] = left;
    }
  }
  if (failed) throw *failed;
}

std::map<std::string, ModelStats> RuntimeObj::MergedStats() {
  std::map<std::string, std::vector<int>> replicas;
  std::map<std::string, std::shared_ptr<SplitChain>> split;
  {
    std::lock_guard<std::mutex> lock(mu_);
    replicas = replicas_;
    split = split_;
  }
  std::vector<std::map<std::string, ModelStats>> per_device;
  for (const Runtime& part : parts_) per_device.push_back(part->Stats());
  std::map<std::string, ModelStats> out;
  for (const auto& [name, chain] : split) {  // its requests as a whole; refusals, queues and launches: its parts'
    ModelStats s;
    s.priority = chain->realtime ? "realtime" : "best_effort";
    s.qos_ms = chain->qos_ms;
    s.placement = "split";
    for (size_t k = 0; k < chain->parts.size(); ++k) {
      s.devices.push_back(parts_[chain->devices[k]]->device_name());
      auto found = per_device[chain->devices[k]].find(chain->parts[k]);
      if (found == per_device[chain->devices[k]].end()) continue;  // (being unloaded)
      const ModelStats& part = found->second;
      if (k == 0)
        s.refused = part.refused, s.rejected = part.rejected, s.timed_out = part.timed_out, s.queue = part.queue;
      s.queued += part.queued, s.launches += part.launches, s.reruns += part.reruns, s.faults += part.faults;
      s.fault_restarts += part.fault_restarts;
    }
    std::lock_guard<std::mutex> lock(chain->mu);
    s.requests = chain->requests, s.qos_violations = chain->qos_violations;
    s.rejected += chain->rejected;
    s.errors = chain->errors + s.refused + s.rejected;  // (a part's timeout fails its request: among the chain's)
    s.executions = chain->requests + chain->errors;
    std::tie(s.p50_ms, s.p99_ms) = Percentiles(chain->latencies_ms);
    out[name] = s;
  }
  for (const auto& [name, devices] : replicas) {
    if (split.count(name)) continue;
    ModelStats all;
    bool first = true;
    for (int d : devices) {
      auto found = per_device[d].find(name);
      if (found == per_device[d].end()) continue;  // (being unloaded)
      const ModelStats& s = found->second;
      if (first) {
        all = s;  // its priority, target, placement and sizes' runs: the first replica's
        all.devices.clear();
        for (auto& [size, run] : all.sizes) run.second = 0;
        all.batches.clear();
        all.requests = all.errors = all.refused = all.timed_out = all.qos_violations = all.queued = 0;
        all.executions = all.launches = all.reruns = all.faults = all.fault_restarts = 0;
        first = false;
      }
      all.devices.push_back(parts_[d]->device_name());
      all.requests += s.requests, all.errors += s.errors, all.refused += s.refused, all.timed_out += s.timed_out;
      all.qos_violations += s.qos_violations, all.queued += s.queued, all.executions += s.executions;
      all.launches += s.launches, all.reruns += s.reruns, all.faults += s.faults;
      all.fault_restarts += s.fault_restarts;
      all.p50_ms = std::max(all.p50_ms, s.p50_ms);
      all.p99_ms = std::max(all.p99_ms, s.p99_ms);
      for (const auto& [rows, counts] : s.batches) {
        all.batches[rows].first += counts.first;
        all.batches[rows].second += counts.second;
      }
      for (const auto& [size, run] : s.sizes) all.sizes[size].second += run.second;
    }
    if (!first) out[name] = all;
  }
  return out;
}

}  // namespace tvmsched
