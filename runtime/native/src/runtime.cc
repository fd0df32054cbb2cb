// The engine's multi-tenant runtime (tvmsched/runtime.h): models, placements, streams, the policy, admission.
#include "tvmsched/runtime.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <tuple>

#include "error_line.h"
#include "percentile.h"

namespace tvmsched {

namespace {

constexpr size_t kPolicyQueue = 64;  // queued requests a policy is shown

std::string Ms(double us) {
  std::ostringstream text;
  text.precision(3);
  text << std::fixed << us / 1e3;
  return text.str();
}

/*! \brief A busy stream's work still to run, into `work` (cleared; its buffer reused): its running request's layers
 *  not yet done, from its progress bitmap (a partly done layer keeps the share of its latency its remaining blocks
 *  stand for), then the layers of each request queued behind it that the snapshot holds. */
void StreamWork(const PolicyModel& model, const StreamSnapshot& state, const std::vector<int64_t>& blocks,
                std::vector<CandidateInfo>* work) {
  work->clear();
  const auto& layers = model.layers;
  const size_t n = layers.size();
  for (size_t i = 0; i < n; ++i) {
    int id = state.ids[i];
    CandidateInfo cand = layers[i][id];
    int64_t total = blocks[layers.index(i, id)];
    double left =
        1.0 - static_cast<double>(std::min(std::max<int64_t>(state.done[i], 0), total)) / static_cast<double>(total);
    if (left > 0) {
      if (left != 1.0) cand.latency_us *= left;
      work->push_back(cand);
    }
  }
  for (int q = 1; q < state.rows; ++q) {
    for (size_t i = 0; i < n; ++i) work->push_back(layers[i][state.ids[q * n + i]]);
  }
}

ffi::Map<ffi::String, ffi::Tensor> ZeroInputs(const Manifest& manifest) {
  ffi::Map<ffi::String, ffi::Tensor> inputs;
  for (const Binding& binding : manifest.inputs) {
    const TensorSpec& spec = manifest.tensors.at(binding.tensor);
    ffi::Tensor tensor = EmptyHostTensor(spec.shape, spec.dtype);
    std::memset(tensor.data_ptr(), 0, spec.nbytes());
    inputs.Set(binding.name, tensor);
  }
  return inputs;
}

}  // namespace

Runtime Runtime::Create(RuntimeOptions options) { return Runtime(ffi::make_object<RuntimeObj>(std::move(options))); }

RuntimeObj::RuntimeObj(RuntimeOptions options) : options_(std::move(options)) {
  if (options_.devices.empty()) TVM_FFI_THROW(TvmschedError) << "a runtime needs at least one device";
  for (const DeviceSpec& spec : options_.devices) {
    if (spec.kind != "cpu" && spec.kind != "cuda") {
      TVM_FFI_THROW(TvmschedError) << "unknown device '" << spec.kind << "': use cpu or cuda";
    }
  }
  if (options_.devices.size() > 1) {  // one Runtime per device, this one routes (devices.cc)
    OpenParts();
    return;
  }
  const DeviceSpec& spec = options_.devices[0];
  device_ = spec.opened ? spec.opened : OpenDevice(spec.kind, spec.index);
  total_units_ = options_.total_units > 0 ? options_.total_units : device_->total_units();
  scope_ = std::make_shared<MemoryScope>(spec.memory_budget);
  trusted_ = TrustedKeys::FromFiles(options_.trusted_keys);
  table_ = options_.colocation ? options_.colocation : std::make_shared<ColocationTable>(total_units_);
  policy_kind_ = options_.policy;
  policy_ = CreatePolicy(options_.policy, table_, total_units_);
  SwitchOptions switching = options_.switching;
  switching.budget = spec.memory_budget;
  switching.scope = scope_;
  turns_->runtime = this;
  switching.room = [board = turns_](size_t bytes) { return board->Ask(nullptr, bytes, nullptr); };
  switcher_ = Switcher::Create(device_, switching);
  group_ = PreemptionGroup::Create();
  // a switch-in waits for memory that preempted requests keep: the requests the group paused finish and pause again
  // (the priority policy's memory_blocked; nothing when the streams were paused by someone else)
  switcher_->SetBlockedCallback(
      ffi::Function::FromTyped([group = group_, finished = finished_for_memory_](ffi::Any, ffi::Array<Model> holders) {
        *finished += group->FinishStartedOf(holders);
      }));
  tier_used_.assign(options_.tiers.size(), 0);
  sweeper_ = std::thread([this] { SweepLoop(); });
}

RuntimeObj::~RuntimeObj() { Shutdown(); }

double RuntimeObj::QosOf(const ModelOptions& options, const Manifest& manifest) {
  return options.qos_ms > 0 ? options.qos_ms : options.qos_ms < 0 ? -1 : manifest.qos_ms.value_or(-1);
}

Model RuntimeObj::LoadModel(const std::string& path, const LoadOptions& options) const {
  LoadOptions on = options;
  on.device = device_;  // (one of several devices: its own, not the process's device of that kind)
  return Model::Load(path, options_.devices[0].kind, on, trusted_);
}

std::string RuntimeObj::Load(const std::string& path, const ModelOptions& options) {
  if (!parts_.empty()) return LoadReplicas(path, options);
  if (!options.devices.empty() && options.devices != std::vector<int>{0}) {
    TVM_FFI_THROW(TvmschedError) << "the runtime serves one device (" << device_name() << "): a model cannot be "
                                 << "placed on devices other than 0";
  }
  if (options.streams < 1 || options.streams > 64) {
    TVM_FFI_THROW(TvmschedError) << "streams must be a whole number from 1 to 64, not " << options.streams;
  }
  if (options.queue.max_queue_size < 0 || options.queue.default_timeout_us < 0) {
    TVM_FFI_THROW(TvmschedError) << "a queue policy's max_queue_size and default_timeout_us cannot be negative";
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
  }
  // the placement, decided here once: registered first (to measure it), then switched or streamed. Every load of it
  // takes only its layers, when it is a split model's part
  auto load_model = [&](LoadOptions o) {
    o.layers = options.layers;
    return LoadModel(path, o);
  };
  LoadOptions registered;
  registered.resident = false;
  registered.max_groups = std::max(1, options_.max_groups);
  registered.scope = scope_;
  const size_t budget = options_.devices[0].memory_budget;
  // measured first (only laid out: its manifest and kernels read, its weights not), then loaded once as what it
  // becomes: registered (switched), resident (several streams or sizes) or streamed (larger than the budget), so that
  // a model is not loaded whole into pinned host memory only to learn that (a split model's part, a fraction of the
  // artifact, is registered at once, as before)
  const bool measure_first = options.layers.first < 0;
  LoadOptions measure = registered;
  measure.measure_only = measure_first;
  measure.read_weights = !measure_first;
  Model first = load_model(measure);
  std::string name = options.name.empty() ? first->name() : options.name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.count(name)) TVM_FFI_THROW(TvmschedError) << "a model named '" << name << "' is already loaded";
  }
  size_t footprint = first->env_bytes();
  for (int g = 0; g < first->num_groups(); ++g) footprint += first->group_bytes(g);
  bool streamed = budget > 0 && footprint > budget;
  const std::vector<int64_t> sizes = BatchSizes(first->manifest());
  // compiled at several batch sizes: every size is served when the model is resident (the smaller sizes read the
  // largest one's device weights, held for good); switched (resident=false) or streamed (larger than the budget), it
  // serves its largest size alone, each launch padded up to it
  const bool several = sizes.size() > 1 && !streamed && options.resident;
  // several sizes or several streams: resident from the start, outside the switcher, every other size's and stream's
  // model reading its device weights (one copy of them, however many streams)
  const bool shared = (several || options.streams > 1) && !streamed && options.resident;
  if (measure_first && !streamed && !shared) {
    first = Model();
    first = load_model(registered);
  }
  for (int64_t preferred : options.preferred_batch_sizes) {
    if (std::find(sizes.begin(), sizes.end(), preferred) == sizes.end()) {
      std::ostringstream listed;
      for (int64_t size : sizes) listed << (listed.tellp() ? ", " : "") << size;
      TVM_FFI_THROW(TvmschedError) << "model " << name << ": preferred_batch_size " << preferred << " is not "
                                   << (sizes.empty() ? std::string("possible: the model is not compiled for a batch")
                                                     : "one of its compiled batch sizes (" + listed.str() + ")");
    }
  }
  std::vector<size_t> took(options_.tiers.size(), 0);
  if (streamed) {
    first = Model();  // (measured, or a split part registered, only to learn its size)
    if (options.streams > 1) {
      TVM_FFI_THROW(TvmschedError) << "model " << name << " is larger than the memory budget (its weights stream from "
                                   << "the host tiers): it runs on one stream, not " << options.streams;
    }
    // the device memory it streams through: its device_bytes (held for good), else all that the models holding memory
    // for good leave; such models take turns (TierOptions::make_room), so none takes another's room for ever
    const bool turns = options.device_bytes == 0;
    size_t in_use = scope_->in_use(), turn_held = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& e : order_) {
        StreamedTurn turn = TurnOf(*e->models[0].get());
        if (turn.takes_turns && turn.in_memory) turn_held += turn.bytes;
      }
    }
    size_t held = in_use > turn_held ? in_use - turn_held : 0;
    size_t room = budget > held ? budget - held : 0;
    if (options.device_bytes > 0) {
      size_t left = scope_->left();
      if (options.device_bytes > left) {
        TVM_FFI_THROW(TvmschedError) << "model " << name << " asks for " << options.device_bytes
                                     << " bytes of device memory; " << left << " are left";
      }
      room = options.device_bytes;
    }
    if (room == 0) {
      TVM_FFI_THROW(TvmschedError) << "model " << name << " is larger than the memory budget of " << budget
                                   << " bytes and no device memory is left to stream it through";
    }
    auto tiers = std::make_shared<TierOptions>();
    tiers->device_bytes = room;
    tiers->buffer_bytes = options_.tier_buffer_bytes;
    tiers->in_flight = options_.stream.max_in_flight;
    if (turns) {
      tiers->make_room = [board = turns_](ModelObj* model, size_t bytes, const std::function<bool()>& take) {
        return board->Ask(model, bytes, &take);
      };
      tiers->turn_ended = [board = turns_] { board->Ended(); };
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t t = 0; t < options_.tiers.size(); ++t) {
        TierShare share = options_.tiers[t];
        share.capacity = share.capacity > tier_used_[t] ? share.capacity - tier_used_[t] : 0;
        tiers->tiers.push_back(share);
      }
    }
    LoadOptions load;
    load.tiers = tiers;
    load.scope = scope_;
    try {
      first = load_model(load);
    } catch (const ffi::Error& err) {  // the engine's line says what streaming needs; the user set the budget
      TVM_FFI_THROW(TvmschedError) << err.message() << " (model " << name << " is larger than the runtime's memory "
                                   << "budget of " << budget << " bytes, " << room << " of them left to stream it)";
    }
    if (const StreamedLayout* layout = StreamedLayoutOf(*first.get()); layout && layout->store) {
      const TierStore& store = *layout->store;
      for (size_t t = 0; t < took.size() && t < store.used().size(); ++t) took[t] = store.used()[t];
    }
  }
  if (shared) {  // resident from the start, outside the switcher: its other sizes and streams read its weights
    first = Model();
    LoadOptions resident;
    resident.scope = scope_;
    first = load_model(resident);
  }
  first->SetName(name);  // its events and error lines say the name it is served by
  if (!streamed && !shared) {
    // its device streams get the priority now, before its switcher prepares them: set later (by its Stream), it
    // would destroy the ones a prefetch made while the switcher's memory thread may evict them (both destroyed
    // one stream: a join that never returned, stress test in the asynchronous mode)
    first->SetStreamPriority(options.realtime ? StreamPriority::kHigh : StreamPriority::kLow);
    switcher_->Add(first);
    if (options.resident) switcher_->Prefetch(first);  // false: it does not fit now; switched in on demand
  }

  auto entry = std::make_shared<Entry>();
  entry->name = name;
  entry->options = options;
  const Manifest& manifest = first->manifest();
  entry->qos_ms = QosOf(options, manifest);
  entry->models.push_back(first);
  entry->takes_turns = TurnOf(*first.get()).takes_turns;
  entry->hold_rows = first->batch_size();
  for (int64_t preferred : options.preferred_batch_sizes) entry->hold_rows = std::min(entry->hold_rows, preferred);
  std::vector<Stream> streams;
  try {
    for (int i = 1; i < options.streams; ++i) {  // its other streams: resident, reading the first one's weights
      LoadOptions copy;                          // (not prefetched: copies of their own)
      copy.scope = scope_;
      if (shared) copy.shares_weights_of = entry->models[0], copy.read_weights = false;  // (the same program)
      entry->models.push_back(load_model(copy));
      entry->models.back()->SetName(name);
    }
    for (size_t k = 0; several && k + 1 < sizes.size(); ++k) {  // each smaller size, on each slot's weights
      for (int i = 0; i < options.streams; ++i) {
        LoadOptions variant;
        variant.scope = scope_;
        variant.batch = sizes[k];
        variant.shares_weights_of = entry->models[i];
        entry->models.push_back(load_model(variant));
        entry->models.back()->SetName(name);
      }
    }
    const int count = several ? static_cast<int>(sizes.size()) : 1;
    for (int k = 0; k < count; ++k) {
      entry->sizes.push_back(std::make_unique<Size>());
      entry->sizes.back()->first_stream = k == count - 1 ? 0 : (k + 1) * options.streams;  // (the order below)
    }
    entry->slot_busy = std::make_unique<std::atomic<int>[]>(options.streams);
    entry->slot_last = std::make_unique<std::atomic<int>[]>(options.streams);
    for (int slot = 0; slot < options.streams; ++slot) entry->slot_last[slot] = slot;  // its largest size's stream
    StreamOptions stream_options = options_.stream;
    stream_options.priority = options.realtime ? StreamPriority::kHigh : StreamPriority::kLow;
    for (size_t j = 0; j < entry->models.size(); ++j) {
      const int slot = static_cast<int>(j) % options.streams,
                size = j < static_cast<size_t>(options.streams) ? count - 1 : static_cast<int>(j) / options.streams - 1;
      std::string stream_name = slot == 0 ? name : name + "#" + std::to_string(slot);
      if (size != count - 1) stream_name += "@b" + std::to_string(sizes[size]);
      streams.push_back(Stream::Create(entry->models[j], stream_name, stream_options));
      if (options_.timeline) streams.back()->RecordTimeline(true);
      entry->size_of.push_back(size);
      entry->slot_of.push_back(slot);
    }
  } catch (...) {
    for (Stream& s : streams) s->Close();
    if (!streamed && !shared) {
      for (int tries = 0; tries < 1000 && !switcher_->Remove(first); ++tries) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } else if (streamed) {
      ReleaseTiers(*first.get());
    }
    throw;
  }
  entry->streams = streams;
  // what its policy sees, per size: every candidate's units (an explicit count), isolated latency and profile key
  for (const auto& size : entry->sizes) {
    const Manifest& program = entry->models[size->first_stream]->manifest();
    std::vector<std::vector<CandidateInfo>> layers;
    for (const LayerSpec& layer : program.layers) {
      std::vector<CandidateInfo> cands;
      for (const CandidateSpec& c : layer.candidates) {
        CandidateInfo info;
        info.units = std::min(c.units > 0 ? c.units : total_units_, total_units_);
        info.latency_us = c.latency_us;
        cands.push_back(info);
        size->blocks.push_back(c.blocks);
      }
      layers.push_back(std::move(cands));
    }
    size->batch = program.batch_size;
    size->policy_model = MakePolicyModel(name, std::move(layers), entry->qos_ms);
    size->run_us = program.batch_latency_us;
  }
  entry->sizes_choose =
      std::any_of(entry->sizes.begin(), entry->sizes.end(), [](const auto& s) { return s->policy_model.choice; });
  const PolicyModel& largest = entry->sizes.back()->policy_model;
  for (size_t i = 0; i < largest.layers.size(); ++i)
    entry->fastest_us += largest.layers[i][largest.fastest[i]].latency_us;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || entries_.count(name)) {
      for (Stream& s : streams) s->Close();
      TVM_FFI_THROW(TvmschedError) << (closed_ ? std::string("the runtime is shut down")
                                               : "a model named '" + name + "' is already loaded");
    }
    for (const auto& size : entry->sizes) {
      const Manifest& program = entry->models[size->first_stream]->manifest();
      PolicyModel& model = size->policy_model;
      for (size_t i = 0; i < program.layers.size(); ++i) {
        for (size_t c = 0; c < program.layers[i].candidates.size(); ++c) {
          model.layers[i][c].key = table_->Key(name + "/" + program.layers[i].candidates[c].kernel);
        }
      }
      table_->AddCandidates(model);
    }
    if (entry->takes_turns) {
      std::lock_guard<std::mutex> turns(turns_->mu);
      turns_->streamed.push_back(first);
    }
    for (size_t t = 0; t < took.size(); ++t) tier_used_[t] += took[t];
    entries_[name] = entry;
    order_.push_back(entry);
  }
  Entry* raw = entry.get();
  for (int i = 0; i < static_cast<int>(streams.size()); ++i) {
    streams[i]->SetSource([this, raw, i] {
      std::vector<Pending> expired;
      std::vector<Request> next;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto found = entries_.find(raw->name);
        if (found != entries_.end() && found->second.get() == raw) next = Next(found->second, i, &expired);
      }
      Fail(&expired, raw->name);
      return next;
    });
  }
  if (options.warmup) WarmUp(entry);
  if (several) MeasureSizes(entry);
  if (!options.realtime) {
    for (Stream& s : streams) group_->Add(s);
  }
  return name;
}

void RuntimeObj::MeasureSizes(const std::shared_ptr<Entry>& entry) {
  // each size on its first slot's stream, the sizes in turn (a passing disturbance slows them alike), several runs
  // queued back to back as under load (the first of each turn only warms): the 25th percentile of 8 turns x 3 runs
  // (a busy machine only ever slows a run: the lower quantile is the size's own cost, what the sizes compare by)
  constexpr int kTurns = 8, kQueued = 4;
  double timeout_s = options_.stream.stall_timeout_s > 0 ? options_.stream.stall_timeout_s : 60;
  std::vector<std::vector<double>> runs(entry->sizes.size());
  std::vector<ffi::Map<ffi::String, ffi::Tensor>> inputs;
  for (const auto& size : entry->sizes) inputs.push_back(ZeroInputs(entry->models[size->first_stream]->manifest()));
  for (int turn = 0; turn < kTurns; ++turn) {
    for (size_t k = 0; k < entry->sizes.size(); ++k) {
      const Size& size = *entry->sizes[k];
      std::vector<Request> queued;
      // its stream sleeps once its turn is done: polling for new work, it would slow the next size's first runs
      entry->streams[size.first_stream]->Rest();
      for (int q = 0; q < kQueued; ++q)
        queued.push_back(entry->streams[size.first_stream]->Submit(inputs[k], size.policy_model.fastest));
      for (int q = 0; q < kQueued; ++q) {
        Request& r = queued[q];
        if (!r->Wait(timeout_s, 0)) {
          TVM_FFI_THROW(TvmschedError) << "model " << entry->name << ": measuring its batch size " << size.batch
                                       << " did not finish in " << timeout_s << " s";
        }
        if (!r->error().empty()) TVM_FFI_THROW(TvmschedError) << std::string(r->error());
        if (q > 0) runs[k].push_back(r->finished_us - r->started_us);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);  // (its requests may be launching already: RecordRun)
  for (size_t k = 0; k < entry->sizes.size(); ++k) {
    Size& size = *entry->sizes[k];
    size.runs = std::move(runs[k]);
    size.next_run = 0;
    size.run_us = Percentile(size.runs, 25);
  }
}

void RuntimeObj::RecordRun(Size& size, double us) {
  if (size.runs.size() < kRuns) {
    size.runs.push_back(us);
  } else {
    size.runs[size.next_run] = us;
    size.next_run = (size.next_run + 1) % kRuns;
  }
  size.run_us = Percentile(size.runs, 25);
}

void RuntimeObj::WarmUp(const std::shared_ptr<Entry>& entry) {
  // every candidate of every layer once (as many requests as a layer has candidates), on every stream
  double timeout_s = options_.stream.stall_timeout_s > 0 ? options_.stream.stall_timeout_s : 60;
  for (size_t j = 0; j < entry->streams.size(); ++j) {
    Stream& stream = entry->streams[j];
    ffi::Map<ffi::String, ffi::Tensor> inputs = ZeroInputs(entry->models[j]->manifest());
    const PolicyModel& model = entry->sizes[entry->size_of[j]]->policy_model;
    size_t most = 0;
    for (const auto& cands : model.layers) most = std::max(most, cands.size());
    for (size_t c = 0; c < most; ++c) {
      std::vector<int> ids;
      for (const auto& cands : model.layers) ids.push_back(std::min<int>(c, cands.size() - 1));
      Request r = stream->Submit(inputs, ids);
      if (!r->Wait(timeout_s, 0)) {
        TVM_FFI_THROW(TvmschedError) << "model " << entry->name << ": its warm-up did not finish in " << timeout_s
                                     << " s";
      }
      if (!r->error().empty()) TVM_FFI_THROW(TvmschedError) << std::string(r->error());
    }
  }
}

Request RuntimeObj::Submit(const std::string& model, ffi::Map<ffi::String, ffi::Tensor> inputs,
                           const SubmitOptions& options) {
  if (!parts_.empty()) return SubmitRouted(model, std::move(inputs), options);
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
    auto found = entries_.find(model);
    if (found == entries_.end()) {
      std::ostringstream loaded;
      for (const auto& e : order_) loaded << (loaded.tellp() ? ", " : "") << e->name;
      TVM_FFI_THROW(TvmschedError) << "no model named '" << model
                                   << "' is loaded (loaded: " << (order_.empty() ? "none" : loaded.str()) << ")";
    }
    entry = found->second;
  }
  if (options.priority < -1 || options.priority > 1) {
    TVM_FFI_THROW(TvmschedError) << "a request's priority is 1 (real-time), 0 (best-effort) or -1 (its model's)";
  }
  ModelObj* m = entry->models[0].get();
  int64_t rows = 0;
  try {  // a bad request raises here and queues nothing (an error of its model's all the same)
    m->CheckInputs(inputs, &rows);
    if (std::string quarantined = m->quarantined(); !quarantined.empty()) TVM_FFI_THROW(TvmschedError) << quarantined;
  } catch (...) {
    ++entry->rejected;
    throw;
  }
  const QueuePolicy& queue = entry->options.queue;
  double timeout_us =
      options.timeout_us >= 0 && queue.allow_timeout_override ? options.timeout_us : queue.default_timeout_us;
  auto request = ffi::make_object<RequestObj>();
  request->inputs = std::move(inputs);
  request->submitted_us = Device::NowMicros();
  Pending pending{Request(request), options.priority == 1 || (options.priority < 0 && entry->options.realtime),
                  timeout_us > 0 ? request->submitted_us + timeout_us : 0, rows};
  std::string refusal;  // thrown once the lock is let go (ThrowRefusal: no backtrace)
  {
    std::lock_guard<std::mutex> lock(mu_);
    refusal = AdmitLocked(*entry, rows);
    if (refusal.empty()) {
      if (pending.realtime) {  // real-time requests go before the best-effort ones queued on the model
        auto at = std::find_if(entry->queue.begin(), entry->queue.end(), [](const Pending& p) { return !p.realtime; });
        entry->queue.insert(at, pending);
      } else {
        entry->queue.push_back(pending);
      }
      entry->queued_rows += std::max<int64_t>(rows, 1);
      if (pending.timeout_at_us > 0) {
        if (entry->next_timeout_us == 0 || pending.timeout_at_us < entry->next_timeout_us) {
          entry->next_timeout_us = pending.timeout_at_us;
        }
        sweep_cond_.notify_all();
      }
    }
  }
  if (!refusal.empty()) ThrowRefusal(std::move(refusal));
  // its own model's streams go on. Not under a serial policy: nothing runs beside it to preempt, and pausing the
  // older requests it waits behind would stop the queue for good
  if (pending.realtime && !policy_->serial()) group_->Hold(pending.request, entry->streams);
  PokeAll(entry);
  return pending.request;
}

std::string RuntimeObj::AdmitLocked(Entry& entry, int64_t rows) {
  if (closed_) return "the runtime is shut down";
  if (entry.closing) {
    ++entry.rejected;
    return "model " + entry.name + " is being unloaded";
  }
  const QueuePolicy& queue = entry.options.queue;
  const int64_t queued = static_cast<int64_t>(entry.queue.size() + entry.delayed.size());
  std::ostringstream why;
  if (queue.max_queue_size > 0 && queued >= queue.max_queue_size) {
    ++entry.refused;
    why << "model " << entry.name << ": its queue is full (" << queued << " requests queued, max_queue_size "
        << queue.max_queue_size << ")";
    return why.str();
  }
  if (entry.qos_ms <= 0) return {};
  // admission: refuse what would finish past the latency target already. The prediction never overshoots (every
  // launch at the fastest candidates, nothing beside it), so what it refuses could not have met the target
  bool starts_now = false;
  int64_t ahead = 0;
  const double predicted_us = PredictLocked(entry, rows, &starts_now, &ahead);
  if (starts_now || predicted_us <= entry.qos_ms * 1e3) return {};
  ++entry.refused;
  why << "model " << entry.name << ": the request would finish in about " << Ms(predicted_us) << " ms (" << ahead
      << (entry.sizes.size() <= 1 ? " requests" : " rows") << " ahead of it), past its latency target of "
      << entry.qos_ms << " ms: refused";
  return why.str();
}

double RuntimeObj::PredictLocked(const Entry& entry, int64_t rows, bool* starts_now, int64_t* ahead) const {
  const int64_t streams = entry.options.streams;
  const int64_t queued = static_cast<int64_t>(entry.queue.size() + entry.delayed.size());
  int64_t busy = 0;
  if (entry.sizes.size() <= 1) {  // one request a launch: the queued ones and the running ones go first
    for (const Stream& s : entry.streams) busy += s->pending() > 0;
    *ahead = queued + std::min(busy, streams);
    *starts_now = *ahead < streams;
    return static_cast<double>(*ahead / streams + 1) * entry.fastest_us;
  }
  // several sizes: the queued rows and its own run in batches, after a launch of each busy slot
  for (int slot = 0; slot < streams; ++slot) busy += entry.slot_busy[slot].load() > 0;
  *starts_now = queued == 0 && busy < streams;
  *ahead = entry.queued_rows;
  const int64_t all_rows = entry.queued_rows + std::max<int64_t>(rows, 1);
  double predicted_us = std::numeric_limits<double>::infinity();
  for (const auto& size : entry.sizes) {  // all at one size, the slots side by side: its rounds of launches
    const int64_t per_round = size->batch * streams;
    predicted_us = std::min(predicted_us, static_cast<double>((all_rows + per_round - 1) / per_round) * size->run_us);
  }
  if (busy >= streams) predicted_us += entry.sizes.front()->run_us;  // (at least the shortest launch's run)
  return predicted_us;
}

int64_t RuntimeObj::QueuedRequests() const {
  if (!parts_.empty()) {
    int64_t all = 0;  // (a split model's parts are models of their devices' Runtimes)
    for (const Runtime& part : parts_) all += part->QueuedRequests();
    return all;
  }
  std::lock_guard<std::mutex> lock(mu_);
  int64_t queued = 0;
  for (const auto& e : order_) queued += static_cast<int64_t>(e->queue.size() + e->delayed.size());
  return queued;
}

double RuntimeObj::PredictFinishUs(const std::string& model, int64_t rows) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = entries_.find(model);
  if (closed_ || found == entries_.end() || found->second->closing) return -1;
  bool starts_now = false;
  int64_t ahead = 0;
  return PredictLocked(*found->second, rows, &starts_now, &ahead);
}

void RuntimeObj::PokeAll(const std::shared_ptr<Entry>& entry) {
  if (entry->sizes.size() <= 1) {
    for (const Stream& s : entry->streams) s->Poke();
    return;
  }
  for (int slot = 0; slot < entry->options.streams; ++slot) {  // several sizes: each free slot's latest stream
    if (entry->slot_busy[slot].load() == 0) entry->streams[entry->slot_last[slot].load()]->Poke();
  }
}

bool RuntimeObj::TurnBoard::Ask(ModelObj* model, size_t bytes, const std::function<bool()>* take) {
  RuntimeObj* asked;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!runtime) return take && (*take)();  // shut down: nobody else to wait for (a switch-in fails)
    asked = runtime;
    ++asking;
  }
  bool yes = false;
  std::exception_ptr failed;
  try {
    yes = asked->MakeRoom(model, bytes, take);
  } catch (...) {  // take's failure (not for want of room) is the model's: passed on
    failed = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (--asking == 0) done.notify_all();
  }
  if (failed) std::rethrow_exception(failed);
  return yes;
}

void RuntimeObj::TurnBoard::Ended() {
  std::vector<Model> models;
  {
    std::lock_guard<std::mutex> lock(mu);  // (a stream's lock may be held here: not the runtime's, which pokes streams)
    models = streamed;
  }
  for (Model& m : models) NudgeStreamed(*m.get());
}

bool RuntimeObj::MakeRoom(ModelObj* model, size_t bytes, const std::function<bool()>* take) {
  // the turns among streamed models: the one waiting longest goes first; the others in memory make room, the
  // least recently used first: idle ones give it back now, busy ones when their stream is next idle. A switch-in
  // (model null: the switcher asks) goes before the streamed models' turns, and waits for what the busy ones give
  const bool switch_in = model == nullptr;
  std::unique_lock<std::mutex> turn(turn_mu_, std::defer_lock);
  if (!switch_in) turn.lock();  // (a switch-in never waits for it: a turn taken may wait for the switcher's evictions)
  StreamedTurn mine = switch_in ? StreamedTurn{} : TurnOf(*model);
  double since = mine.wanting_since_us > 0 ? mine.wanting_since_us : Device::NowMicros();
  std::vector<std::pair<StreamedTurn, std::shared_ptr<Entry>>> others;
  bool others_wait = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : order_) {
      if (e->models[0].get() == model || !e->takes_turns) continue;
      StreamedTurn turn = TurnOf(*e->models[0].get());
      if (!switch_in && turn.wanting && turn.wanting_since_us < since) return false;  // an earlier one's turn first
      others_wait |= turn.wanting;
      if (turn.in_memory) others.emplace_back(turn, e);
    }
  }
  std::sort(others.begin(), others.end(),
            [](const auto& a, const auto& b) { return a.first.last_used_us < b.first.last_used_us; });
  auto free = [&] { return scope_->left(); };
  std::vector<Model> busy;
  for (auto& [turn, other] : others) {
    if (free() >= bytes) break;
    if (!ParkStreamed(*other->models[0].get())) {
      busy.push_back(other->models[0]);
    } else {
      PokeAll(other);  // requests it refused while yielding: asked for again (it waits for its next turn)
    }
  }
  if (free() < bytes && !switch_in) {  // switched models that took memory between turns: the idle ones are evicted
    std::vector<Model> staged;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& e : order_) {
        if (std::strcmp(e->models[0]->placement()->kind(), "staged") == 0) staged.push_back(e->models[0]);
      }
    }
    for (Model& other : staged) {
      if (free() >= bytes) break;
      switcher_->Evict(other, /*keep_env=*/false);
    }
  }
  size_t coming = 0;  // what the busy ones will give back
  for (Model& other : busy) {
    if (free() + coming >= bytes) break;
    YieldStreamed(*other.get());
    coming += TurnOf(*other.get()).bytes;
  }
  if (switch_in) return free() + coming >= bytes;
  bool yes = free() >= bytes && take && (*take)();
  // others wait behind it: its turn is the requests it holds now (it yields at once: one turn each, in order)
  if (yes && others_wait) YieldStreamed(*model);
  turn.unlock();
  if (yes) turns_->Ended();  // the others look again now (one that began to wait meanwhile asks it to yield)
  return yes;
}

void RuntimeObj::Expire(Entry& entry, double now, std::vector<Pending>* expired) {
  // none can be past its timeout before the earliest one queued (a bound: the request that set it may have left)
  if (entry.next_timeout_us == 0 || now <= entry.next_timeout_us) return;
  std::deque<Pending> kept;
  double next = 0;
  for (Pending& p : entry.queue) {
    if (p.timeout_at_us > 0 && now > p.timeout_at_us) {
      ++entry.timed_out;
      if (entry.options.queue.timeout_action == TimeoutAction::kDelay) {
        p.timeout_at_us = 0;  // it runs after the requests that still have time
        entry.delayed.push_back(std::move(p));
      } else {
        entry.queued_rows -= std::max<int64_t>(p.rows, 1);
        expired->push_back(std::move(p));
      }
    } else {
      if (p.timeout_at_us > 0 && (next == 0 || p.timeout_at_us < next)) next = p.timeout_at_us;
      kept.push_back(std::move(p));
    }
  }
  entry.queue.swap(kept);
  entry.next_timeout_us = next;
}

namespace {

/*! \brief A decision's predicted run against the model's at its fastest candidates, alone: its candidates' isolated
 *  latency against the fastest's, times the policy's co-location estimate against their isolated latency. */
double Slowdown(const PolicyModel& model, const PolicyDecision& d) {
  double chosen = 0, fastest = 0;
  for (size_t i = 0; i < model.layers.size() && i < model.fastest.size(); ++i) {
    const int id = i < d.candidate_ids.size() && d.candidate_ids[i] >= 0 &&
                           d.candidate_ids[i] < static_cast<int>(model.layers[i].size())
                       ? d.candidate_ids[i]
                       : model.fastest[i];
    chosen += model.layers[i][id].latency_us;
    fastest += model.layers[i][model.fastest[i]].latency_us;
  }
  const double colocated = d.estimated && chosen > 0 ? std::max(1.0, d.estimated_ms * 1e3 / chosen) : 1;
  return colocated * (chosen > 0 && fastest > 0 ? chosen / fastest : 1);
}

/*! \brief Whether a decision names every layer's candidate (a stream runs candidate 0 where it names none, which
 *  Slowdown counts as the fastest), each a fastest one, and predicts no co-location slowdown. */
bool AtFastest(const PolicyModel& model, const PolicyDecision& d) {
  return d.candidate_ids.size() >= model.layers.size() && Slowdown(model, d) <= 1 + 1e-9;
}

}  // namespace

std::vector<Request> RuntimeObj::Next(const std::shared_ptr<Entry>& entry, int stream, std::vector<Pending>* expired) {
  const int slot = entry->slot_of[stream];
  const bool several = entry->sizes.size() > 1;
  if (several && entry->slot_busy[slot] > 0) {  // another size of its slot runs: this one is poked when it ends
    entry->streams[stream]->Rest();
    return {};
  }
  double now = Device::NowMicros();
  Expire(*entry, now, expired);
  std::deque<Pending>& lane = entry->queue.empty() ? entry->delayed : entry->queue;
  if (lane.empty()) return {};
  if (entry->hold_rows > 0 && entry->options.max_queue_delay_us > 0) {  // wait a little for a fuller batch
    int64_t rows = 0;
    for (size_t i = 0; i < lane.size() && rows < entry->hold_rows; ++i) rows += lane[i].rows;
    double until = lane.front().request->submitted_us + entry->options.max_queue_delay_us;
    if (rows < entry->hold_rows && now < until) {
      if (entry->hold_until_us != until) entry->hold_until_us = until, sweep_cond_.notify_all();
      return {};
    }
    entry->hold_until_us = 0;
  }
  // a streamed model asked to end its turn takes nothing more: its stream drains, it parks, the waiting one goes
  // (its stream asks again when its request ends: it is then between turns and waits for its own)
  if (entry->takes_turns && TurnOf(*entry->models[0].get()).yielding) return {};
  if (policy_->serial()) {  // one request at a time across the models, the oldest first
    if (serial_running_ > 0) return {};
    std::shared_ptr<Entry> oldest = OldestLocked();
    if (oldest != entry) {
      if (oldest) PokeAll(oldest);
      return {};
    }
  }
  std::vector<QueuedRequest> queued;
  for (size_t i = 0; i < lane.size() && i < kPolicyQueue; ++i) {
    const Pending& p = lane[i];
    QueuedRequest q;
    q.rows = std::max<int64_t>(p.rows, 1);
    q.arrival_us = p.request->submitted_us;
    q.timeout_us = p.timeout_at_us > 0 ? p.timeout_at_us - q.arrival_us : 0;
    q.deadline_us = entry->qos_ms > 0 ? q.arrival_us + entry->qos_ms * 1e3 : 0;
    q.priority = p.realtime ? 1 : 0;
    queued.push_back(q);
  }
  int size = entry->size_of[stream];
  PolicyInput input;
  input.model = &entry->sizes[size]->policy_model;
  input.stream = entry->streams[stream]->name();
  input.queued = &queued;
  input.monitor = [this]() -> const std::vector<StreamView>& { return MonitorLocked(); };
  input.total_units = total_units_;
  input.loaded_models = static_cast<int>(entries_.size());
  PolicyDecision decision = policy_->Decide(input);
  if (several && !decision.launch.empty()) {  // the batch size, chosen with the candidates
    int chosen = ChooseSize(*entry, lane, now, PredictRuns(*entry, size, decision, input));
    if (chosen != size) {  // its slot's stream of that size launches it (it asks at once)
      for (size_t j = 0; j < entry->streams.size(); ++j) {
        if (entry->slot_of[j] == slot && entry->size_of[j] == chosen) entry->streams[j]->Poke();
      }
      entry->streams[stream]->Rest();  // (it is poked again when its slot is free)
      return {};
    }
  }
  std::vector<int> take = decision.launch;
  const int64_t batch = entry->sizes[size]->batch;
  if (batch > 0 && take == std::vector<int>{0}) {  // a batched model: the requests queued behind it that fit
    int64_t rows = lane[0].rows;
    for (int i = 1; i < static_cast<int>(lane.size()) && rows + lane[i].rows <= batch; ++i) {
      rows += lane[i].rows;
      take.push_back(i);
    }
  }
  std::sort(take.begin(), take.end());
  take.erase(std::remove_if(take.begin(), take.end(),
                            [&](int index) { return index < 0 || index >= static_cast<int>(lane.size()); }),
             take.end());
  std::vector<Request> out;
  if (batch > 0 && !take.empty() && !(take.size() == 1 && lane[take[0]].rows == batch)) {
    std::vector<Pending> members;
    for (int index : take) members.push_back(lane[index]);
    Request packed = Pack(entry, members, size);
    packed->candidate_ids = decision.candidate_ids;
    out.push_back(packed);
  } else {
    for (int index : take) {
      Request request = lane[index].request;
      request->candidate_ids = decision.candidate_ids;
      if (batch > 0) {  // a whole batch alone: counted in the batch statistics when it is done
        request->OnDone(ffi::Function::FromTyped(
            [entry, rows = lane[index].rows](Request done) { CountBatch(*entry, rows, *done.get()); }));
      }
      out.push_back(request);
    }
  }
  for (auto it = take.rbegin(); it != take.rend(); ++it) {  // (valid: checked above)
    entry->queued_rows -= std::max<int64_t>(lane[*it].rows, 1);
    lane.erase(lane.begin() + *it);
  }
  if (!out.empty()) entry->sizes[size]->launches += static_cast<int64_t>(out.size());
  if (several && !out.empty()) {  // its slot is busy until the launch ends; then its streams ask again
    ++entry->slot_busy[slot];
    entry->slot_last[slot] = stream;
    entry->sizes[size]->chosen_at = ++entry->launched;
    // its run is the size's figure's next sample when it runs at the fastest candidates with no co-location
    // slowdown predicted and is not preempted (a real-time request's pause is not the size's cost)
    const bool sample = entry->options.refresh_sizes && AtFastest(entry->sizes[size]->policy_model, decision);
    const int64_t preemptions = entry->streams[stream]->preemptions.load();
    RequestObj* launch = out.back().get();  // (alive while its hooks run; a Request here would own itself)
    launch->OnFinishing([this, entry, slot, stream, size, sample, preemptions, launch] {
      {
        std::lock_guard<std::mutex> lock(mu_);
        --entry->slot_busy[slot];
        if (sample && launch->started_us > 0 && entry->streams[stream]->preemptions.load() == preemptions) {
          RecordRun(*entry->sizes[size], Device::NowMicros() - launch->started_us);
        }
      }
      entry->streams[stream]->Poke();  // the finishing stream asks next (it is awake: no hand-off)
    });
  }
  if (policy_->serial() && !out.empty()) {
    serial_running_ += static_cast<int64_t>(out.size());
    for (Request& request : out) {
      request->OnFinishing([this] {
        std::shared_ptr<Entry> oldest;
        {
          std::lock_guard<std::mutex> lock(mu_);
          --serial_running_;
          oldest = OldestLocked();
        }
        if (oldest) PokeAll(oldest);
      });
    }
  }
  if (!lane.empty()) {  // more queued: the model's other free streams take them
    for (size_t i = 0; i < entry->streams.size(); ++i) {
      const int other = entry->slot_of[i];
      if (static_cast<int>(i) != stream && other != slot &&
          (!several ||
           (entry->slot_busy[other].load() == 0 && entry->slot_last[other].load() == static_cast<int>(i)))) {
        entry->streams[i]->Poke();
      }
    }
  }
  return out;
}

const std::vector<double>& RuntimeObj::PredictRuns(Entry& entry, int size, const PolicyDecision& decision,
                                                   PolicyInput input) {
  const double own = Slowdown(entry.sizes[size]->policy_model, decision);
  std::vector<double>& runs = entry.predicted;  // (its buffer is kept between launches)
  runs.resize(entry.sizes.size());
  if (!entry.sizes_choose) {  // no size has a choice of candidates: the current size's slowdown is every size's
    for (size_t k = 0; k < runs.size(); ++k) runs[k] = entry.sizes[k]->run_us * own;
    return runs;
  }
  const std::vector<StreamView>* seen = nullptr;  // the monitor, read once for the sizes' decisions
  auto read = input.monitor;
  if (read)
    input.monitor = [&seen, &read]() -> const std::vector<StreamView>& { return *(seen ? seen : seen = &read()); };
  for (size_t k = 0; k < runs.size(); ++k) {
    const PolicyModel& model = entry.sizes[k]->policy_model;
    double f = own;
    if (static_cast<int>(k) != size) {
      input.model = &model;
      f = Slowdown(model, policy_->Decide(input));
    }
    runs[k] = entry.sizes[k]->run_us * f;
  }
  return runs;
}

int RuntimeObj::ChooseSize(const Entry& entry, const std::deque<Pending>& lane, double now,
                           const std::vector<double>& runs) const {
  const auto& sizes = entry.sizes;
  const int n = static_cast<int>(sizes.size());
  int64_t rows = 0;
  for (size_t i = 0; i < lane.size() && rows < sizes.back()->batch; ++i) rows += std::max<int64_t>(lane[i].rows, 1);
  auto run = [&](int k) { return runs[k]; };
  auto covering = [&](int64_t want) {  // the smallest size that holds `want` rows
    for (int k = 0; k < n; ++k) {
      if (sizes[k]->batch >= want) return k;
    }
    return n - 1;
  };
  const double deadline = entry.qos_ms > 0 ? lane.front().request->submitted_us + entry.qos_ms * 1e3 : 0;
  auto meets = [&](int k) { return deadline == 0 || now + run(k) <= deadline; };
  int64_t least = std::max<int64_t>(lane.front().rows, 1);  // the front request's rows fit
  if (!entry.options.preferred_batch_sizes.empty() && entry.options.max_queue_delay_us > 0 && rows >= entry.hold_rows) {
    least = std::max(least, entry.hold_rows);  // a preferred batch the queue reached launches whole (as Triton's)
  }
  const int low = covering(least);
  // of the sizes the rows fill, the least time per row that meets the deadline; a larger size only when it gains at
  // least kMinGain per row: a larger launch makes its first rows wait for the others, and within the noise of the
  // load-time profile (bert-tiny on a CPU: 1.6% per row at 4 rows) that wait is all it brings
  constexpr double kMinGain = 0.05;
  int best = -1;
  for (int k = low; k < n && sizes[k]->batch <= rows; ++k) {
    if (!meets(k)) continue;
    if (best < 0 || run(k) / sizes[k]->batch < (1 - kMinGain) * run(best) / sizes[best]->batch) best = k;
  }
  if (best < 0) best = low;           // the rows fill none (padded), or none meets the deadline: the soonest to finish
  if (entry.options.refresh_sizes) {  // a size no launch chose for long runs this one, so that it is measured again
    int stale = -1;
    for (int k = low; k < n; ++k) {
      if (entry.launched - sizes[k]->chosen_at >= kStaleRuns && meets(k) &&
          (stale < 0 || sizes[k]->chosen_at < sizes[stale]->chosen_at)) {
        stale = k;
      }
    }
    if (stale >= 0) return stale;
  }
  // padded up: one launch of a larger size that holds every queued row, when it finishes sooner than this size and
  // the rest's cheapest way (one launch that holds the rest, or several of a smaller size). With no rest, a larger
  // size that runs faster outright: mlp's size 2 beside its size 1 on a CPU, whose batch-1 program runs its first
  // layer without a parallel loop
  if (sizes.back()->batch >= rows) {
    const int64_t rest = std::max<int64_t>(rows - sizes[best]->batch, 0);
    double remainder = rest > 0 ? std::numeric_limits<double>::infinity() : 0;
    for (int k = 0; rest > 0 && k < n; ++k) {
      remainder = std::min(remainder, run(k) * static_cast<double>((rest + sizes[k]->batch - 1) / sizes[k]->batch));
    }
    int up = -1;
    for (int k = std::max(covering(rows), best + 1); k < n; ++k) {
      if (meets(k) && (up < 0 || run(k) < run(up))) up = k;
    }
    if (up >= 0 && run(up) < (1 - kMinGain) * (run(best) + remainder)) return up;  // (the same margin)
  }
  return best;
}

Request RuntimeObj::Pack(const std::shared_ptr<Entry>& entry, const std::vector<Pending>& members, int size) {
  const int64_t batch = entry->sizes[size]->batch;
  const Manifest& manifest = entry->models[entry->sizes[size]->first_stream]->manifest();
  auto packed = ffi::make_object<RequestObj>();
  packed->submitted_us = members[0].request->submitted_us;  // (its latency in the stream's stats: the oldest's)
  for (const Binding& binding : manifest.inputs) {
    const TensorSpec& spec = manifest.tensors.at(binding.tensor);
    ffi::Tensor tensor = EmptyHostTensor(spec.shape, spec.dtype);
    const size_t row_bytes = spec.nbytes() / static_cast<size_t>(batch);
    auto* out = static_cast<char*>(tensor.data_ptr());
    size_t at = 0;
    for (const Pending& p : members) {
      const size_t bytes = row_bytes * static_cast<size_t>(p.rows);
      std::memcpy(out + at, p.request->inputs[binding.name].data_ptr(), bytes);
      at += bytes;
    }
    std::memset(out + at, 0, spec.nbytes() - at);  // the rows no request brought
    packed->inputs.Set(binding.name, tensor);
  }
  std::vector<std::pair<Request, int64_t>> split;
  for (const Pending& p : members) split.emplace_back(p.request, p.rows);
  std::vector<std::pair<ffi::String, size_t>> outputs;  // each output's name and the bytes of one of its rows
  for (const Binding& binding : manifest.outputs) {
    outputs.emplace_back(binding.name, manifest.tensors.at(binding.tensor).nbytes() / static_cast<size_t>(batch));
  }
  // when the launch is done, on the stream's thread: each member gets its rows of every output, or the launch's error
  packed->OnDone(ffi::Function::FromTyped([entry, split, outputs](Request done) {
    std::string error = done->error();
    ffi::Map<ffi::String, ffi::Tensor> all = done->outputs();
    // counted before any member is seen done: a caller that waited for its requests reads stats that include them.
    // The stream counted one request; these are the others it ran
    (error.empty() ? entry->packed_done : entry->packed_failed) += static_cast<int64_t>(split.size()) - 1;
    int64_t rows_run = 0;
    for (const auto& [member, rows] : split) rows_run += rows;
    CountBatch(*entry, rows_run, *done.get());
    int64_t at = 0;
    for (const auto& [member, rows] : split) {
      ffi::Map<ffi::String, ffi::Tensor> mine;
      for (size_t o = 0; error.empty() && o < outputs.size(); ++o) {
        const auto& [name, row_bytes] = outputs[o];
        ffi::Tensor whole = all[name];
        const DLTensor* t = whole.GetDLTensorPtr();
        std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
        shape[0] = rows;
        ffi::Tensor part = EmptyHostTensor(shape, t->dtype);
        std::memcpy(part.data_ptr(), static_cast<const char*>(whole.data_ptr()) + row_bytes * at, row_bytes * rows);
        mine.Set(name, part);
      }
      at += rows;
      member->started_us = done->started_us;
      member->Finish(mine, ffi::String(error), done->finished_us);
    }
  }));
  return Request(packed);
}

void RuntimeObj::CountBatch(Entry& entry, int64_t rows, const RequestObj& done) {
  if (!done.error().empty() || done.started_us <= 0) return;  // (Triton counts the executions that succeeded)
  auto ns = static_cast<int64_t>((done.finished_us - done.started_us) * 1e3);
  std::lock_guard<std::mutex> lock(entry.batches_mu);
  auto& [count, total_ns] = entry.batches[rows];
  ++count;
  total_ns += ns;
}

std::shared_ptr<RuntimeObj::Entry> RuntimeObj::OldestLocked() const {
  std::shared_ptr<Entry> oldest;
  double oldest_us = 0;
  for (const auto& e : order_) {
    const std::deque<Pending>& lane = e->queue.empty() ? e->delayed : e->queue;
    if (!lane.empty() && (!oldest || lane.front().request->submitted_us < oldest_us)) {
      oldest = e, oldest_us = lane.front().request->submitted_us;
    }
  }
  return oldest;
}

bool RuntimeObj::Drained(const Entry& entry) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!entry.queue.empty() || !entry.delayed.empty()) return false;
  }
  for (const Stream& s : entry.streams) {
    if (s->pending() > 0) return false;
  }
  return true;
}

void RuntimeObj::Fail(std::vector<Pending>* expired, const std::string& model) {
  double now = Device::NowMicros();
  for (Pending& p : *expired) {
    std::ostringstream text;  // (the stream's words for its own deadline: servers answer both with 504)
    text << "model " << model << ": the request did not start within its deadline (queued "
         << static_cast<int64_t>(now - p.request->submitted_us) << " us, "
         << static_cast<int64_t>(now - p.timeout_at_us) << " us past it)";
    p.request->Finish({}, ffi::String(text.str()), now);
  }
  expired->clear();
}

void RuntimeObj::SweepLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!closed_) {
    double earliest = 0;
    for (const auto& e : order_) {
      if (e->next_timeout_us > 0 && (earliest == 0 || e->next_timeout_us < earliest)) earliest = e->next_timeout_us;
      if (e->hold_until_us > 0 && (earliest == 0 || e->hold_until_us < earliest)) earliest = e->hold_until_us;
    }
    double wait_us = earliest > 0 ? std::max(0.0, earliest - Device::NowMicros()) + 50 : 100000;
    sweep_cond_.wait_for(lock, std::chrono::duration<double, std::micro>(std::min(wait_us, 100000.0)));
    if (closed_) break;
    double now = Device::NowMicros();
    std::vector<std::pair<std::string, std::vector<Pending>>> failed;
    std::vector<std::shared_ptr<Entry>> delayed;  // (and models whose streams waited for a fuller batch long enough)
    for (const auto& e : order_) {
      std::vector<Pending> expired;
      size_t before = e->delayed.size();
      Expire(*e, now, &expired);
      if (!expired.empty()) failed.emplace_back(e->name, std::move(expired));
      bool held = e->hold_until_us > 0 && now >= e->hold_until_us;
      if (held) e->hold_until_us = 0;  // (its stream launches when poked: the oldest has waited long enough)
      if (e->delayed.size() > before || held) delayed.push_back(e);
    }
    if (failed.empty() && delayed.empty()) continue;
    lock.unlock();
    for (auto& [name, expired] : failed) Fail(&expired, name);
    for (auto& e : delayed) PokeAll(e);
    lock.lock();
  }
}

const std::vector<StreamView>& RuntimeObj::MonitorLocked() {
  size_t k = 0;
  for (const auto& entry : order_) {
    for (size_t j = 0; j < entry->streams.size(); ++j) {
      const Stream& stream = entry->streams[j];
      if (k == monitor_views_.size()) monitor_views_.emplace_back(), monitor_reads_.emplace_back();
      StreamView& view = monitor_views_[k];
      if (view.name != stream->name()) view.name = stream->name();
      if (stream->ReadState(&monitor_reads_[k])) {
        const auto& size = *entry->sizes[entry->size_of[j]];
        StreamWork(size.policy_model, monitor_reads_[k], size.blocks, &view.remaining);
      } else {
        view.remaining.clear();
      }
      ++k;
    }
  }
  monitor_views_.resize(k);  // (fewer only after an unload)
  monitor_reads_.resize(k);
  return monitor_views_;
}

std::vector<StreamView> RuntimeObj::Monitor() {
  if (!parts_.empty()) return Gather<StreamView>([](const Runtime& part) { return part->Monitor(); });
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StreamView> busy;
  for (const StreamView& view : MonitorLocked()) {
    if (!view.remaining.empty()) busy.push_back(view);
  }
  return busy;
}

std::map<std::string, ModelStats> RuntimeObj::Stats() {
  if (!parts_.empty()) return MergedStats();
  std::vector<std::shared_ptr<Entry>> entries;
  std::map<std::string, std::pair<int64_t, int64_t>> counts;  // refused, timed out; queued below
  std::map<std::string, int64_t> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries = order_;
    for (const auto& e : entries) {
      counts[e->name] = {e->refused, e->timed_out};
      queued[e->name] = static_cast<int64_t>(e->queue.size() + e->delayed.size());
    }
  }
  std::map<std::string, ModelStats> out;
  for (const auto& e : entries) {
    ModelStats s;
    s.priority = e->options.realtime ? "realtime" : "best_effort";
    s.qos_ms = e->qos_ms;
    std::vector<double> latencies_ms;
    for (const Stream& stream : e->streams) {
      s.requests += stream->completed.load();
      s.errors += stream->failed.load();
      s.launches += stream->launches.load();
      s.reruns += stream->reruns.load();
      s.faults += stream->faults.load();
      s.fault_restarts += stream->fault_restarts.load();
      for (double us : stream->Latencies()) latencies_ms.push_back(us / 1e3);
    }
    s.executions = s.requests + s.errors;  // a packed launch runs several requests: count those (Triton's counts)
    {
      std::lock_guard<std::mutex> lock(e->batches_mu);
      s.batches = e->batches;
    }
    s.requests += e->packed_done.load();
    s.errors += e->packed_failed.load();
    s.refused = counts[e->name].first;
    s.timed_out = counts[e->name].second;
    s.queued = queued[e->name];
    s.rejected = e->rejected.load();
    s.errors += s.refused + s.rejected + (e->options.queue.timeout_action == TimeoutAction::kReject ? s.timed_out : 0);
    if (s.qos_ms > 0) {
      for (double ms : latencies_ms) s.qos_violations += ms > s.qos_ms;
    }
    s.p50_ms = Percentile(latencies_ms, 50);
    s.p99_ms = Percentile(std::move(latencies_ms), 99);
    s.placement = e->models[0]->placement()->kind();
    s.queue = e->options.queue;
    if (e->sizes.size() > 1) {
      for (const auto& size : e->sizes) s.sizes[size->batch] = {size->run_us, size->launches.load()};
    }
    out[e->name] = s;
  }
  return out;
}

RuntimeObj::DecisionTimes RuntimeObj::DecisionSamples() {
  DecisionTimes all;
  if (!parts_.empty()) {  // every device's policy decides apart: their decisions pooled
    for (const Runtime& part : parts_) {
      DecisionTimes mine = part->DecisionSamples();
      all.decided += mine.decided;
      all.wall.insert(all.wall.end(), mine.wall.begin(), mine.wall.end());
      all.monitor.insert(all.monitor.end(), mine.monitor.begin(), mine.monitor.end());
      all.cpu.insert(all.cpu.end(), mine.cpu.begin(), mine.cpu.end());
    }
    return all;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (LayerScheduler* scheduler = SchedulerOf(*policy_)) {
    all.decided = scheduler->decided();
    all.wall = scheduler->decision_us();
    all.monitor = scheduler->monitor_us();
    all.cpu = scheduler->cpu_us();
  }
  return all;
}

RuntimeObj::DecisionReport RuntimeObj::Decisions() {
  DecisionTimes times = DecisionSamples();
  DecisionReport out;
  out.decided = times.decided;
  std::tie(out.p50_us, out.p99_us) = Percentiles(times.wall);
  std::tie(out.monitor_p50_us, out.monitor_p99_us) = Percentiles(times.monitor);
  if (times.cpu.empty()) return out;
  std::tie(out.cpu_p50_us, out.cpu_p99_us) = Percentiles(times.cpu);
  std::vector<double> undisturbed;
  for (size_t i = 0; i < times.wall.size(); ++i) {
    if (times.wall[i] - times.cpu[i] <= 1.0) undisturbed.push_back(times.wall[i]);
  }
  out.disturbed_share = 1.0 - static_cast<double>(undisturbed.size()) / static_cast<double>(times.wall.size());
  out.undisturbed_p99_us = Percentile(std::move(undisturbed), 99);
  return out;
}

std::vector<std::string> RuntimeObj::models() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& e : order_) names.push_back(e->name);
  for (const auto& [name, devices] : replicas_) names.push_back(name);
  return names;
}

int64_t RuntimeObj::finished_for_memory() const {
  int64_t all = finished_for_memory_->load();
  for (const Runtime& part : parts_) all += part->finished_for_memory();
  return all;
}

std::vector<StageEvent> RuntimeObj::SwitchEvents() const {
  if (parts_.empty()) return switcher_->Events();
  return Gather<StageEvent>([](const Runtime& part) { return part->SwitchEvents(); });
}

std::vector<Stream> RuntimeObj::streams(const std::string& model) const {
  if (!parts_.empty()) {  // its replicas' streams, by device (a split model has none: its requests run in turn)
    if (std::shared_ptr<SplitChain> split = SplitOf(model)) return SplitStreams(*split);  // its parts', in order
    return Gather<Stream>([&](const Runtime& part) { return part->streams(model); }, ReplicasOf(model));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto found = entries_.find(model);
  if (found == entries_.end()) TVM_FFI_THROW(TvmschedError) << "no model named '" << model << "' is loaded";
  return found->second->streams;
}

std::vector<Model> RuntimeObj::engine_models(const std::string& model) const {
  if (!parts_.empty()) {
    if (std::shared_ptr<SplitChain> split = SplitOf(model)) return SplitModels(*split);  // its parts, in order
    return Gather<Model>([&](const Runtime& part) { return part->engine_models(model); }, ReplicasOf(model));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto found = entries_.find(model);
  if (found == entries_.end()) TVM_FFI_THROW(TvmschedError) << "no model named '" << model << "' is loaded";
  return found->second->models;
}

bool RuntimeObj::Evict(const std::string& name, bool keep_environment) {
  if (!parts_.empty()) {  // every replica that is idle and switched (a split model's parts stay prepared)
    if (SplitOf(name)) return false;
    bool any = false;
    for (int d : ReplicasOf(name)) any |= parts_[d]->Evict(name, keep_environment);
    return any;
  }
  Model first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = entries_.find(name);
    if (found == entries_.end()) TVM_FFI_THROW(TvmschedError) << "no model named '" << name << "' is loaded";
    first = found->second->models[0];
  }
  if (first->tiered()) {  // every other model's first stream is its switcher's (Load)
    TVM_FFI_THROW(TvmschedError) << "model " << name << " streams its weights from the host tiers: only a switched "
                                 << "model is evicted";
  }
  if (std::strcmp(first->placement()->kind(), "resident") == 0) return false;  // (several sizes or streams: held)
  return switcher_->Evict(first, keep_environment);
}

void RuntimeObj::Unload(const std::string& name, double timeout_s) {
  if (!parts_.empty()) return UnloadReplicas(name, timeout_s);
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) TVM_FFI_THROW(TvmschedError) << "the runtime is shut down";
    auto found = entries_.find(name);
    if (found == entries_.end() || found->second->closing) {
      TVM_FFI_THROW(TvmschedError) << "model '" << name << "' is not loaded";
    }
    entry = found->second;
    entry->closing = true;  // new requests are refused from now on
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (Stream& s : entry->streams) {
    group_->Remove(s);
    s->Resume();  // a paused stream would keep its queued requests for ever
  }
  while (!Drained(*entry)) {  // its queued and running requests finish first
    if (std::chrono::steady_clock::now() > deadline) {
      TVM_FFI_THROW(TvmschedError) << "model " << name << ": its requests did not finish within " << timeout_s << " s";
    }
    PokeAll(entry);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.erase(name);
    order_.erase(std::remove(order_.begin(), order_.end(), entry), order_.end());
  }
  for (Stream& s : entry->streams) s->Close();
  Model& first = entry->models[0];
  {
    std::lock_guard<std::mutex> lock(turns_->mu);
    auto& streamed = turns_->streamed;
    streamed.erase(std::remove(streamed.begin(), streamed.end(), first), streamed.end());
  }
  if (first->tiered()) {
    if (const StreamedLayout* layout = StreamedLayoutOf(*first.get()); layout && layout->store) {
      std::lock_guard<std::mutex> lock(mu_);
      const TierStore& store = *layout->store;
      for (size_t t = 0; t < tier_used_.size() && t < store.used().size(); ++t) {
        tier_used_[t] -= std::min(tier_used_[t], store.used()[t]);
      }
    }
    ReleaseTiers(*first.get());
  } else if (std::strcmp(first->placement()->kind(), "resident") != 0) {
    while (!switcher_->Remove(first)) {  // its switch-in or last clean may still be under way
      if (std::chrono::steady_clock::now() > deadline) {
        TVM_FFI_THROW(TvmschedError) << "model " << name << ": its switcher did not let go of it within " << timeout_s
                                     << " s";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // what it holds for good (several streams or sizes) goes now, not when its last reference does (a caller may still
  // hold one): the models reading another's weights first, their owner last
  for (size_t k = entry->models.size(); k-- > 0;) {
    if (std::strcmp(entry->models[k]->placement()->kind(), "resident") == 0) entry->models[k]->TryFreeDeviceMemory();
  }
}

void RuntimeObj::Shutdown() {
  if (!parts_.empty()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    WaitSplit(nullptr, options_.stream.stall_timeout_s > 0 ? options_.stream.stall_timeout_s : 60);
    for (const Runtime& part : parts_) part->Shutdown();
    return;
  }
  std::vector<std::shared_ptr<Entry>> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ && !sweeper_.joinable()) return;
    entries = order_;
  }
  for (const auto& e : entries) {  // what is queued runs first (a paused stream would hold it up)
    for (Stream& s : e->streams) s->Resume();
  }
  double timeout_s = options_.stream.stall_timeout_s > 0 ? options_.stream.stall_timeout_s : 60;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (const auto& e : entries) {
    while (std::chrono::steady_clock::now() < deadline && !Drained(*e)) {
      PokeAll(e);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  {  // its streamed models' turns are not asked of it any more: after the drain, in which a streamed model's request
     // may still need its turn (an idle switched model evicted for it), as it would before the shutdown
    std::unique_lock<std::mutex> lock(turns_->mu);
    turns_->runtime = nullptr;
    turns_->done.wait(lock, [&] { return turns_->asking == 0; });
    turns_->streamed.clear();
  }
  std::vector<std::pair<std::string, std::vector<Pending>>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    for (const auto& e : entries) {  // past the deadline: what is still queued fails with one line
      std::vector<Pending> pending(e->queue.begin(), e->queue.end());
      pending.insert(pending.end(), e->delayed.begin(), e->delayed.end());
      e->queue.clear();
      e->delayed.clear();
      e->queued_rows = 0;
      if (!pending.empty()) left.emplace_back(e->name, std::move(pending));
    }
  }
  sweep_cond_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  double now = Device::NowMicros();
  for (auto& [name, pending] : left) {
    for (Pending& p : pending) p.request->Finish({}, ffi::String("model " + name + ": the runtime shut down"), now);
  }
  for (const auto& e : entries) {
    for (Stream& s : e->streams) s->Close();
    if (e->models[0]->tiered()) ReleaseTiers(*e->models[0].get());
  }
  if (switcher_.defined()) switcher_->Close();
}

}  // namespace tvmsched
