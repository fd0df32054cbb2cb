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

/*! \brief A split model serving requests (tvmsched/split.h): in arrival order, one at a time (a request's groups run
 *  one after the other on their devices), on a thread of its own; each layer at candidate 0 (its all-unit kernel).
 *  Time limits as a stream's model's: a request still queued past its timeout fails under kReject and runs under
 *  kDelay; `max_queue_size` caps the queue. Its requests are best-effort: nothing preempts them. */
class SplitServing {
 public:
  SplitServing(std::string name, SplitModel model, std::vector<int> devices, const ModelOptions& options)
      : name_(std::move(name)), model_(std::move(model)), devices_(std::move(devices)), options_(options) {
    worker_ = std::thread([this] { Loop(); });
  }
  ~SplitServing() { Close(0, "the runtime shut down"); }
  const SplitModel& model() const { return model_; }
  const std::vector<int>& devices() const { return devices_; }

  /*! \brief Queue a request (its inputs checked now: a bad one raises and queues nothing; so does a refused one). */
  Request Submit(ffi::Map<ffi::String, ffi::Tensor> inputs, const SubmitOptions& options) {
    model_->parts()[0]->CheckInputs(inputs);
    const QueuePolicy& queue = options_.queue;
    const double timeout_us =
        options.timeout_us >= 0 && queue.allow_timeout_override ? options.timeout_us : queue.default_timeout_us;
    auto request = ffi::make_object<RequestObj>();
    request->inputs = std::move(inputs);
    request->submitted_us = Device::NowMicros();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) ThrowRefusal("model '" + name_ + "' is being unloaded");
      if (queue.max_queue_size > 0 && static_cast<int64_t>(queue_.size()) >= queue.max_queue_size) {
        ++refused_;
        ThrowRefusal("model " + name_ + ": the queue is full (" + std::to_string(queue.max_queue_size) + " requests)");
      }
      queue_.push_back({Request(request), timeout_us > 0 ? request->submitted_us + timeout_us : 0});
    }
    cond_.notify_one();
    return Request(request);
  }

  /*! \brief Refuse new requests and answer the queued ones within `timeout_s`; past it, what is still queued fails
   *  with "model NAME: `why`". Whether it drained in time. */
  bool Close(double timeout_s, const std::string& why) {
    std::deque<Queued> left;
    bool drained;
    {
      std::unique_lock<std::mutex> lock(mu_);
      closing_ = true;
      cond_.notify_all();
      drained =
          idle_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return queue_.empty() && !running_; });
      left.swap(queue_);
      stop_ = true;
    }
    cond_.notify_all();
    if (worker_.joinable()) worker_.join();
    const double now = Device::NowMicros();
    for (Queued& q : left) q.request->Finish({}, ffi::String("model " + name_ + ": " + why), now);
    return drained;
  }

  ModelStats Stats() const {
    ModelStats s;
    std::lock_guard<std::mutex> lock(mu_);
    s.priority = "best_effort";
    s.qos_ms = options_.qos_ms > 0 ? options_.qos_ms : -1;
    // (as a stream's model counts: requests answered, errors failed or refused or timed out under kReject)
    s.requests = requests_, s.refused = refused_, s.timed_out = timed_out_;
    s.errors = errors_ + refused_ + (options_.queue.timeout_action == TimeoutAction::kReject ? timed_out_ : 0);
    s.qos_violations = qos_violations_, s.queued = static_cast<int64_t>(queue_.size());
    s.executions = s.launches = requests_ + errors_;
    std::tie(s.p50_ms, s.p99_ms) = Percentiles(latencies_ms_);
    s.placement = "split";
    return s;
  }

  int64_t queued() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(queue_.size());
  }

 private:
  struct Queued {
    Request request;
    double timeout_at_us = 0;  // 0: none
  };
  static constexpr size_t kLatencies = 8192;

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (queue_.empty()) idle_.notify_all();
      cond_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // (stopping)
      Queued next = std::move(queue_.front());
      queue_.pop_front();
      RequestObj& r = *next.request.get();
      double now = Device::NowMicros();
      if (next.timeout_at_us > 0 && now > next.timeout_at_us &&
          options_.queue.timeout_action == TimeoutAction::kReject) {
        ++timed_out_;
        std::ostringstream text;  // (the runtime's words for it: servers answer 504)
        text << "model " << name_ << ": the request did not start within its deadline (queued "
             << static_cast<int64_t>(now - r.submitted_us) << " us, " << static_cast<int64_t>(now - next.timeout_at_us)
             << " us past it)";
        r.Finish({}, ffi::String(text.str()), now);
        continue;
      }
      running_ = true;
      lock.unlock();
      r.started_us = now;
      ffi::Map<ffi::String, ffi::Tensor> outputs;
      std::string error;
      try {
        outputs = model_->Run(r.inputs, {});
      } catch (const std::exception& err) {
        error = ErrorLine(err);
      }
      const double finished = Device::NowMicros();
      lock.lock();
      running_ = false;
      if (!error.empty()) {
        ++errors_;
      } else {
        ++requests_;
        if (latencies_ms_.size() >= kLatencies) latencies_ms_.pop_front();
        latencies_ms_.push_back((finished - r.submitted_us) / 1e3);
        if (options_.qos_ms > 0 && finished - r.submitted_us > options_.qos_ms * 1e3) ++qos_violations_;
      }
      lock.unlock();
      r.Finish(outputs, ffi::String(error), finished);
      lock.lock();
    }
  }

  const std::string name_;
  const SplitModel model_;
  const std::vector<int> devices_;  // its parts' devices (the router's indices), in the order its groups run
  const ModelOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cond_, idle_;
  std::deque<Queued> queue_;
  bool closing_ = false, stop_ = false, running_ = false;
  int64_t requests_ = 0, errors_ = 0, refused_ = 0, timed_out_ = 0, qos_violations_ = 0;  // errors_: failed runs
  std::deque<double> latencies_ms_;
  std::thread worker_;
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
  for (int d : devices) {
    if (parts_[d]->device_lost()) {
      TVM_FFI_THROW(TvmschedError) << "device " << parts_[d]->device_name()
                                   << " is out of service: " << parts_[d]->device_->faults().lost;
    }
  }
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
  LoadOptions registered;  // (as a device's Runtime measures a model: registered, its environment and groups)
  registered.resident = false;
  registered.max_groups = std::max(1, options_.max_groups);
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
  if (!options.split_layers.empty() && options.split_layers.size() != devices.size()) {
    TVM_FFI_THROW(TvmschedError) << "a split model has one group of layers per device: " << options.split_layers.size()
                                 << " groups for " << devices.size() << " devices";
  }
  if (options.streams != 1 || options.realtime || !options.preferred_batch_sizes.empty()) {
    TVM_FFI_THROW(TvmschedError) << "a split model runs its requests one at a time, best-effort, at one batch size: "
                                 << "it takes no streams, realtime priority or preferred_batch_sizes";
  }
  std::vector<std::shared_ptr<Device>> on;
  SplitOptions split;
  split.groups = options.split_layers;
  for (int d : devices) {
    if (parts_[d]->device_lost()) {
      TVM_FFI_THROW(TvmschedError) << "device " << parts_[d]->device_name()
                                   << " is out of service: " << parts_[d]->device_->faults().lost;
    }
    on.push_back(parts_[d]->device_);
    split.scopes.push_back(parts_[d]->scope());
  }
  auto model = ffi::make_object<SplitModelObj>(path, on, parts_[0]->trusted_, split);
  const Manifest& manifest = model->parts()[0]->manifest();
  if (BatchSizes(manifest).size() > 1) {
    TVM_FFI_THROW(TvmschedError) << "model " << manifest.model_name << " is compiled at several batch sizes: a split "
                                 << "model serves one";
  }
  const std::string name = options.name.empty() ? model->parts()[0]->name() : options.name;
  std::vector<int> used(devices.begin(), devices.begin() + static_cast<long>(model->parts().size()));
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
  if (replicas_.count(name)) TVM_FFI_THROW(TvmschedError) << "a model named '" << name << "' is already loaded";
  replicas_[name] = used;
  split_[name] = std::make_shared<SplitServing>(name, SplitModel(model), used, options);
  return name;
}

std::shared_ptr<SplitServing> RuntimeObj::SplitOf(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = split_.find(model);
  return found == split_.end() ? nullptr : found->second;
}

std::vector<Model> RuntimeObj::SplitParts(const SplitServing& split) { return split.model()->parts(); }

int64_t RuntimeObj::SplitQueued() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t queued = 0;
  for (const auto& [name, serving] : split_) queued += serving->queued();
  return queued;
}

std::vector<std::string> RuntimeObj::ModelsOn(int part) const {
  std::vector<std::string> names = parts_.at(part)->models();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, serving] : split_) {
    const std::vector<int>& on = serving->devices();
    if (std::find(on.begin(), on.end(), part) != on.end()) names.push_back(name);
  }
  return names;
}

void RuntimeObj::CloseSplit() {
  std::map<std::string, std::shared_ptr<SplitServing>> split;
  {
    std::lock_guard<std::mutex> lock(mu_);
    split.swap(split_);
  }
  const double timeout_s = options_.stream.stall_timeout_s > 0 ? options_.stream.stall_timeout_s : 60;
  for (auto& [name, serving] : split) serving->Close(timeout_s, "the runtime shut down");
}

Request RuntimeObj::SubmitRouted(const std::string& model, ffi::Map<ffi::String, ffi::Tensor> inputs,
                                 const SubmitOptions& options) {
  std::shared_ptr<SplitServing> split;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
    auto found = split_.find(model);
    if (found != split_.end()) split = found->second;
  }
  if (split) {  // a split model: every device holding a part must be in service
    for (int d : split->devices()) {
      if (parts_[d]->device_lost()) {
        ThrowRefusal("model " + model + " is split across " + DeviceNames(split->devices()) + ", and " +
                     parts_[d]->device_name() + " is out of service: " + parts_[d]->device_->faults().lost);
      }
    }
    return split->Submit(std::move(inputs), options);
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
  // device is lost (it never ran there: EnterLaunch refused its launch) runs again on another replica in service; the
  // request whose launch faulted keeps its own failure (it may be the cause, and would fault there too)
  inner->OnDone(ffi::Function::FromTyped([this, outer, model, options, tried](Request done) {
    const int d = tried.back();
    if (!done->error().empty() && std::string(done->error()) == parts_[d]->device_->LostLine()) {
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

void RuntimeObj::UnloadReplicas(const std::string& name, double timeout_s) {
  const std::vector<int> replicas = ReplicasOf(name);
  if (std::shared_ptr<SplitServing> split = SplitOf(name)) {  // its queued requests are answered first
    const bool drained = split->Close(timeout_s, "unloaded before the request started");
    std::lock_guard<std::mutex> lock(mu_);
    split_.erase(name);
    replicas_.erase(name);
    if (!drained) {
      TVM_FFI_THROW(TvmschedError) << "model " << name << " did not drain within " << timeout_s << " s: its queued "
                                   << "requests failed";
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
  std::map<std::string, std::shared_ptr<SplitServing>> split;
  {
    std::lock_guard<std::mutex> lock(mu_);
    replicas = replicas_;
    split = split_;
  }
  std::vector<std::map<std::string, ModelStats>> per_device;
  for (const Runtime& part : parts_) per_device.push_back(part->Stats());
  std::map<std::string, ModelStats> out;
  for (const auto& [name, serving] : split) {
    out[name] = serving->Stats();
    for (int d : serving->devices()) out[name].devices.push_back(parts_[d]->device_name());
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
