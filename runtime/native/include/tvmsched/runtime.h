/*!
 * \file tvmsched/runtime.h
 * \brief The multi-tenant runtime, in the engine: many models on a device, each on one or more streams, the
 *        placement of each model's memory, the policy that decides what each stream launches, admission (queue caps,
 *        time limits, latency targets), real-time preemption, stats. C++ servers embed it as Python's Runtime does
 *        (docs/runtime.md states the rules):
 *
 *   tvmsched::RuntimeOptions options;             // devices (one, with its memory budget), policy, ...
 *   auto rt = tvmsched::Runtime::Create(options);
 *   rt->Load("resnet.tvms", {.qos_ms = 20, .realtime = true});
 *   tvmsched::Request r = rt->Submit("resnet", inputs, {});   // queued on the model; r->Wait(-1, 0)
 *
 * Requests queue on their model, not on a stream: a stream with nothing queued asks the runtime for its next
 * request, and the policy decides then — which queued requests launch, at which batch size, with which candidate
 * ids — reading every stream's state (the resource monitor). No Python runs on a request's path.
 *
 * Time limits: a request's `timeout` (Triton's parameter, else its model's default) is the longest it may stay
 * queued; past it, kReject fails it ("... did not start within its deadline") and kDelay lets it run after the requests
 * that still have time. A model's latency target (`qos_ms`) bounds its finish: a request whose predicted finish already
 * exceeds it is refused at submit, when others are queued ahead of it (alone on an idle stream, it runs).
 *
 * Thread-safe. Lock order: the runtime's lock, then a stream's (a stream asks its source without its own lock).
 */
#ifndef TVMSCHED_RUNTIME_H_
#define TVMSCHED_RUNTIME_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tvmsched/artifact.h"
#include "tvmsched/model.h"
#include "tvmsched/policy.h"
#include "tvmsched/preemption.h"
#include "tvmsched/stream.h"
#include "tvmsched/switching.h"
#include "tvmsched/tiering.h"

namespace tvmsched {

/*! \brief A device the runtime serves on, and the device memory its models may take (0: no budget of its own). */
struct DeviceSpec {
  std::string kind = "cpu";
  int index = 0;  ///< its ordinal (cuda:1); of several cpu devices, its share of the cores (OpenCpuShare)
  size_t memory_budget = 0;
  std::shared_ptr<Device> opened;  ///< the device itself, when already open (null: opened by kind and index)
  /*! \brief Its shares of the host tiers, where its models larger than its budget (a split model's parts too) keep
   *  their streamed weights: the memory plan's for this GPU (none: RuntimeOptions::tiers). */
  std::optional<std::vector<TierShare>> tiers;
};

/*! \brief "cpu", "cpu:N", "cuda" or "cuda:N" as a DeviceSpec (one TvmschedError line otherwise). */
DeviceSpec ParseDeviceSpec(const std::string& text);

/*! \brief Several devices of one kind, each listed once, opened (CPU devices: shares of the cores, OpenCpuShare; a
 *  spec already `opened`: that one); one TvmschedError line otherwise. */
std::vector<std::shared_ptr<Device>> OpenDevices(const std::vector<DeviceSpec>& specs);

/*! \brief The compute units of each of these devices as a Runtime over them opens them (a colocation table's). */
int DeviceUnits(const std::vector<DeviceSpec>& specs);

struct RuntimeOptions {
  /*! \brief The devices. Several: the Runtime places each model whole on one of them, or a replica on each of those
   *  its ModelOptions::devices name, and routes each request to the replica predicted to finish it first; each
   *  device keeps its own policy, switcher, memory budget and fault state (docs/multi-device.md). */
  std::vector<DeviceSpec> devices{DeviceSpec{}};
  std::string policy = "colocation";
  std::shared_ptr<ColocationTable> colocation;  ///< the colocation profile (null: the fallback rule for every pair)
  int total_units = 0;                          ///< the device's compute units (0: its own count)
  StreamOptions stream;                         ///< every stream's (its priority is set per model)
  std::vector<std::string> trusted_keys;        ///< load only artifacts one of these keys signed (none: any)
  SwitchOptions switching;                      ///< the switcher of models that do not fit beside the resident ones
  int max_groups = 4;                           ///< sub-tasks per switched model
  std::vector<TierShare> tiers;                 ///< where models larger than the budget keep their streamed weights
  size_t tier_buffer_bytes = 0;                 ///< each stream buffer of a streamed model (0: its own rule)
  bool timeline = false;                        ///< every stream records its launches from its start (warm-up too)
};

enum class TimeoutAction : int { kReject = 0, kDelay = 1 };

/*! \brief Triton's default_queue_policy, per model. */
struct QueuePolicy {
  TimeoutAction timeout_action = TimeoutAction::kReject;
  double default_timeout_us = 0;  ///< a request's longest stay in the queue when it gives none (0: no limit)
  bool allow_timeout_override = true;
  int64_t max_queue_size = 0;  ///< requests queued at most (0: no cap); more are refused at submit
};

struct ModelOptions {
  std::string name;       ///< "" = the artifact's model name
  double qos_ms = 0;      ///< its latency target (0: the artifact's, if any; < 0: none)
  bool realtime = false;  ///< real-time: its requests preempt the best-effort streams while they run
  /*! \brief Made resident now if it fits (else switched in by its first request). A model compiled at several batch
   *  sizes is served at every size only when resident (held for good, beside the switcher); with false, or when it
   *  is larger than the budget (streamed), it serves its largest size alone, each launch padded up to it. */
  bool resident = true;
  size_t device_bytes = 0;  ///< larger than the budget: the device memory it streams through (0: all that is left)
  int streams = 1;          ///< streams serving it (each a resident copy); each request goes to the first free one
  QueuePolicy queue;
  bool warmup = false;  ///< run every candidate kernel once before it takes requests
  /*! \brief A model compiled for a batch: a free stream waits at most this long after the oldest queued request
   *  arrived for the queued rows to fill the batch (Triton's dynamic_batching.max_queue_delay_microseconds; 0: it
   *  launches what is queued at once). */
  double max_queue_delay_us = 0;
  /*! \brief Triton's dynamic_batching.preferred_batch_size: each one of the model's compiled batch sizes (else one
   *  error line at load). A free stream holds the queued rows (within max_queue_delay_us) only while they are fewer
   *  than the smallest of these (none: the largest compiled size). */
  std::vector<int64_t> preferred_batch_sizes;
  /*! \brief A model compiled at several batch sizes: each size's run figure (what the batcher and admission predict
   *  from) follows its launches, as Clockwork's profiles do: the 25th percentile of its last 32 runs at its fastest
   *  candidates, not preempted (at first the runs measured at load); a size no launch of the model has chosen for 128
   *  launches runs the next launch it can take (it holds the oldest request and meets its latency target), so that
   *  a size measured slow once is measured again. false (the default): the figures measured at load, for the
   *  model's life (docs/batching.md: on a 2-core CPU, following the launches measured no better). */
  bool refresh_sizes = false;
  /*! \brief A Runtime over several devices: a replica on each of these (indices into RuntimeOptions::devices, each at
   *  most once; Triton's instance_group gpus). Empty: one, on the device with the most memory left (the fewest models
   *  where no budget is set). */
  std::vector<int> devices;
  /*! \brief Only these layers of the artifact (first, last), as a model of their own: a split model's part, which
   *  its Runtime over several devices loads on one device's Runtime (LoadOptions::layers; first < 0: every layer). */
  std::pair<int, int> layers{-1, -1};
  /*! \brief A Runtime over several devices: split the model across them (mechanism D; tvmsched/split.h), one group of
   *  layers per device in the order `devices` lists them (none: every device in service). A model is split only when
   *  asked to, or when it is larger than every device's memory budget and each part can be placed on its device
   *  (resident, switched or streamed there; else it goes whole to one device) (docs/multi-device.md). */
  bool split = false;
  /*! \brief Split so: each device's layers, first and last (the memory planner's sub-tasks, one per device named in
   *  `devices`; none: BalancedLayers, the planner's own rule). */
  std::vector<std::pair<int, int>> split_layers;
};

struct SubmitOptions {
  int priority = -1;       ///< 1: real-time, 0: best-effort, -1: the model's
  double timeout_us = -1;  ///< its longest stay in the queue (-1: the model's default; 0: none)
};

/*! \brief A model's counters (the percentiles over its latest 8192 to 16384 requests). */
struct ModelStats {
  std::string priority;
  double qos_ms = -1;
  /*! \brief requests: finished; errors: every submitted request that failed, whether while running, refused at
   *  submit (admission, a full queue, bad inputs, an unloading model) or past its timeout under REJECT; refused: the
   *  refusals by admission and queue cap among them; timed_out: past their timeout (REJECT or DELAY). */
  int64_t requests = 0, errors = 0, refused = 0, timed_out = 0, qos_violations = 0, queued = 0;
  int64_t rejected = 0;    ///< of the errors, refused at submit for the request itself or an unloading model
  int64_t executions = 0;  ///< runs of the model: a batched model runs several requests at once (Triton's count)
  /*! \brief A model compiled for a batch: per count of rows its launches brought (1 to the batch size; the rest is
   *  padding), the launches and their compute time (ns, start to finish; Triton's batch_stats). */
  std::map<int64_t, std::pair<int64_t, int64_t>> batches;
  /*! \brief A model compiled at several batch sizes: per size, its run at the fastest candidates as the runtime
   *  measured it at load (µs; what its batcher predicts from) and the launches it ran at that size. */
  std::map<int64_t, std::pair<double, int64_t>> sizes;
  double p50_ms = -1, p99_ms = -1;
  int64_t launches = 0, reruns = 0, faults = 0, fault_restarts = 0;
  std::string placement;  ///< resident, staged, streamed; split (across several devices)
  QueuePolicy queue;      ///< its queue policy as loaded (Triton's default_queue_policy)
  /*! \brief A Runtime over several devices: the devices holding its replicas ("cpu:0", ...; the counters above are
   *  their sums, p50 and p99 the largest replica's). */
  std::vector<std::string> devices;
};

class Runtime;
struct SplitChain;  // a split model: its parts on their devices' Runtimes (devices.cc)

class RuntimeObj : public ffi::Object {
 public:
  explicit RuntimeObj(RuntimeOptions options);
  ~RuntimeObj();

  /*! \brief Load an artifact as a new model; returns its name. The placement is decided here, once: resident if it
   *  fits beside the resident models, else registered and switched in by its requests, or streamed from the host
   *  tiers when it is larger than the whole budget. One-line TvmschedError on failure (nothing stays loaded). */
  std::string Load(const std::string& path, const ModelOptions& options);
  /*! \brief New requests for it are refused at once; its queued and running ones finish first (within `timeout_s`),
   *  then its memory and its name are given back. */
  void Unload(const std::string& name, double timeout_s = 60);
  /*! \brief Evict an idle switched model now (its environment too unless `keep_environment`): an operator's lever
   *  and the tests'; false when it is busy or not in memory. One line for a streamed model. */
  bool Evict(const std::string& name, bool keep_environment);
  /*! \brief Queue one request (inputs checked now: a bad request raises and queues nothing; so does a refused one). */
  Request Submit(const std::string& model, ffi::Map<ffi::String, ffi::Tensor> inputs, const SubmitOptions& options);
  /*! \brief Every busy stream's work still to run (the resource monitor), by stream name. */
  std::vector<StreamView> Monitor();
  std::map<std::string, ModelStats> Stats();
  /*! \brief The colocation policy's latest decisions (every device's pooled), in µs (-1: none): how many, the p50 /
   *  p99 of their times, of the part spent reading the monitor, and of their threads' CPU time; the p99 of the
   *  decisions whose thread stayed on its core throughout (time within 1 µs of its CPU time) and the share of those
   *  that did not. Where the whole p99 is above the undisturbed one, the tail is the machine's scheduling, not the
   *  code. One call reads the recorded times once. */
  struct DecisionReport {
    int64_t decided = 0;
    double p50_us = -1, p99_us = -1;
    double monitor_p50_us = -1, monitor_p99_us = -1;
    double cpu_p50_us = -1, cpu_p99_us = -1, undisturbed_p99_us = -1, disturbed_share = -1;
  };
  DecisionReport Decisions();
  /*! \brief How often a switch-in waited for memory that paused best-effort requests held, and the preemption group
   *  let them finish (and pause again) to free it. */
  int64_t finished_for_memory() const;
  std::vector<std::string> models() const;
  /*! \brief The streams of a model (its first one first; the others are NAME#1 ...). */
  std::vector<Stream> streams(const std::string& model) const;
  /*! \brief The engine models its streams serve, in the same order (the first is the switched or streamed one). */
  std::vector<Model> engine_models(const std::string& model) const;
  /*! \brief A model's manifest as its requests see it (a split model's whole manifest, not a part's). */
  Manifest ModelManifest(const std::string& model) const;
  /*! \brief The switcher's recorded stages (stage1, stage2, exec, clean, evict). */
  std::vector<StageEvent> SwitchEvents() const;
  const std::string& policy_kind() const { return policy_kind_; }
  int total_units() const { return total_units_; }
  const std::shared_ptr<MemoryScope>& scope() const { return scope_; }
  /*! \brief Finish what is queued, then stop every stream. */
  void Shutdown();
  /*! \brief A Runtime over several devices: one Runtime per device (empty: this one serves its only device). */
  const std::vector<Runtime>& parts() const { return parts_; }
  /*! \brief The device it serves ("cpu", "cpu:1", "cuda:0") and whether that device is lost (out of service). */
  std::string device_name() const;
  bool device_lost() const { return device_->health() == Device::kLost; }
  /*! \brief A request of `rows` rows of `model`, submitted now: its predicted finish from now (µs; each launch at the
   *  fastest candidates, nothing beside it), as admission predicts it (-1: no such model, or it is being unloaded). */
  double PredictFinishUs(const std::string& model, int64_t rows) const;
  /*! \brief Several devices: the models device `part` holds (whole, a replica, or a split model's part). */
  std::vector<std::string> ModelsOn(int part) const;
  /*! \brief Requests of its models waiting for a stream. */
  int64_t QueuedRequests() const;

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.Runtime", RuntimeObj, ffi::Object);

 private:
  struct Pending {
    Request request;
    bool realtime = false;
    double timeout_at_us = 0;  // 0: none
    int64_t rows = 0;          // a batched model's request: its rows (0: the model is not batched)
  };
  /*! \brief A batch size a model was compiled at (a model compiled at one size, or none, has one). */
  struct Size {
    int64_t batch = 0;            // its rows (0: a model not compiled for a batch)
    int first_stream = 0;         // its stream on slot 0 (Entry::streams; its model's manifest is this size's program)
    PolicyModel policy_model;     // its layers' candidates
    std::vector<int64_t> blocks;  // each candidate's blocks, at policy_model.layers.index(layer, candidate)
    // its run at the fastest candidates: with several sizes, the 25th percentile of `runs` (read by stats() without
    // the lock); `runs`: the runs measured at load, then its launches' (ModelOptions::refresh_sizes), the oldest
    // replaced first at `next_run` once there are kRuns (under the lock)
    std::atomic<double> run_us{0};
    std::vector<double> runs;
    size_t next_run = 0;
    int64_t chosen_at = 0;  // Entry::launched when it last launched (under the lock)
    std::atomic<int64_t> launches{0};
  };
  static constexpr size_t kRuns = 32;         // the runs a size's figure is taken from
  static constexpr int64_t kStaleRuns = 128;  // launches of a model after which a size none chose runs once
  struct Entry {
    std::string name;
    ModelOptions options;
    double qos_ms = -1;
    // one per stream: first the largest size's streams (slot 0, 1, ...; the first may be registered or streamed, the
    // others resident), then each smaller size's streams by slot (resident, reading the weights of their slot's)
    std::vector<Model> models;
    std::vector<Stream> streams;
    std::vector<std::unique_ptr<Size>> sizes;  // smallest first (the last: the largest, its first streams')
    std::vector<int> size_of, slot_of;         // per stream: its size (index into sizes) and its slot
    // per slot (several sizes): launches given to one of its streams, not yet finished, and the stream that launched
    // last (written under the lock; read without it by PokeAll, which wakes only that stream of each free slot: it
    // asks, the batcher chooses the size, and the stream of that size is woken if it is another)
    std::unique_ptr<std::atomic<int>[]> slot_busy, slot_last;
    int64_t hold_rows = 0;               // a free stream holds fewer queued rows than this (max_queue_delay_us)
    std::deque<Pending> queue, delayed;  // delayed: past their timeout under kDelay (they run after the others)
    int64_t queued_rows = 0;             // their requests' rows (at least 1 each), kept as they come and go
    double next_timeout_us = 0;          // no queued request's timeout comes before it (a bound; 0: none has a timeout)
    double fastest_us = 0;               // its fastest candidates' isolated latency, summed
    bool sizes_choose = false;           // some size has a choice of candidates (PredictRuns decides per size)
    std::vector<double> predicted;       // PredictRuns' answer (under the lock; its buffer kept between launches)
    int64_t launched = 0;                // launches of all its sizes (under the lock; Size::chosen_at)
    bool closing = false;
    bool takes_turns = false;  // a streamed model taking turns for its memory (TierOptions::make_room)
    double hold_until_us = 0;  // its free streams wait for a fuller batch until then (the sweeper pokes them; 0: no)
    // its packed launches' requests beyond the one their stream counts, finished and failed (stats count requests)
    std::atomic<int64_t> packed_done{0}, packed_failed{0};
    std::mutex batches_mu;                                   // guards batches (written on the streams' threads)
    std::map<int64_t, std::pair<int64_t, int64_t>> batches;  // ModelStats::batches
    int64_t refused = 0, timed_out = 0, inflight = 0;        // inflight: taken by a stream, not finished
    std::atomic<int64_t> rejected{0};  // refused at submit for the request itself (bad inputs) or an unloading model
  };
  /*! \brief A stream's source: what it runs next (under the runtime's lock; expired requests collected to fail). */
  std::vector<Request> Next(const std::shared_ptr<Entry>& entry, int stream, std::vector<Pending>* expired);
  void Expire(Entry& entry, double now, std::vector<Pending>* expired);
  /*! \brief Why a request of `rows` rows is refused now (shutting down, a full queue, or admission: it would finish
   *  past the model's latency target), counted; empty: it is admitted (under the lock). */
  std::string AdmitLocked(Entry& entry, int64_t rows);
  /*! \brief The predicted finish of a request of `rows` rows submitted now (AdmitLocked's rule): `starts_now` when a
   *  stream is free for it with nothing queued, `ahead` the requests (one size) or rows (several) before it. */
  double PredictLocked(const Entry& entry, int64_t rows, bool* starts_now, int64_t* ahead) const;
  /*! \brief The colocation decisions' recorded times (LayerScheduler's): this Runtime's policy's, or, over several
   *  devices, every device's pooled (the stats above are their percentiles). */
  struct DecisionTimes {
    int64_t decided = 0;
    std::deque<double> wall, monitor, cpu;  // µs, decision by decision
  };
  DecisionTimes DecisionSamples();
  // ---- several devices (devices.cc): this Runtime routes to its parts ----
  void OpenParts();
  std::string LoadReplicas(const std::string& path, const ModelOptions& options);
  /*! \brief Load `path` split across `devices` (its groups in that order), each part a model of its own on its
   *  device's Runtime; one TvmschedError line when it cannot be (nothing stays loaded). */
  std::string LoadSplit(const std::string& path, const ModelOptions& options, const std::vector<int>& devices);
  /*! \brief Whether a model is larger than every device's memory budget (each in service has one): measured as a
   *  device's Runtime measures it, registered, by its environment and groups. */
  bool LargerThanEveryBudget(const std::string& path) const;
  /*! \brief One TvmschedError line naming the first of these parts whose device is lost. */
  void CheckInService(const std::vector<int>& devices) const;
  /*! \brief These parts' devices' names ("cpu:0,cpu:1"). */
  std::string DeviceNames(const std::vector<int>& devices) const;
  /*! \brief The split model of that name, or null. */
  std::shared_ptr<SplitChain> SplitOf(const std::string& model) const;
  /*! \brief A split model's request: its part `k` (`inner`, on its device's Runtime) is done; the next part takes it,
   *  `have` holding the model's inputs and the earlier parts' outputs, or `outer` (what the caller holds) finishes. */
  void FollowSplit(std::shared_ptr<SplitChain> chain, Request outer, Request inner, size_t k,
                   ffi::Map<ffi::String, ffi::Tensor> have, int priority);
  /*! \brief A split model's engine models (each part's, in order) or streams. */
  std::vector<Model> SplitModels(const SplitChain& chain) const;
  std::vector<Stream> SplitStreams(const SplitChain& chain) const;
  /*! \brief Wait (at most `timeout_s`) for a split model's requests under way (every split model's: null); whether
   *  none is left. */
  bool WaitSplit(const std::shared_ptr<SplitChain>& chain, double timeout_s);
  Request SubmitRouted(const std::string& model, ffi::Map<ffi::String, ffi::Tensor> inputs,
                       const SubmitOptions& options);
  /*! \brief `outer` (what the caller holds) finishes as `inner` (its run on the last of the `tried` devices) does, or
   *  runs again on another replica when `inner` failed because its device was lost. */
  void FollowRouted(Request outer, Request inner, const std::string& model, const SubmitOptions& options,
                    std::vector<int> tried);
  void UnloadReplicas(const std::string& name, double timeout_s);
  std::map<std::string, ModelStats> MergedStats();
  /*! \brief Several devices: `each(part)`'s answers of the parts `which` (every part when empty), in order. */
  template <class T, class F>
  std::vector<T> Gather(F each, const std::vector<int>& which = {}) const {
    std::vector<T> all;
    for (size_t k = 0; k < (which.empty() ? parts_.size() : which.size()); ++k) {
      for (T& item : each(parts_[which.empty() ? k : static_cast<size_t>(which[k])])) all.push_back(std::move(item));
    }
    return all;
  }
  /*! \brief Where a model goes whole (several devices; under the lock): by measured load, then memory left. */
  int PlaceLocked();
  /*! \brief The work its models did so far (µs: their streams' requests' start-to-end times): a device's load. */
  double WorkUs() const;
  /*! \brief The parts holding a model's replicas (one TvmschedError line when none is loaded under that name). */
  std::vector<int> ReplicasOf(const std::string& model) const;
  /*! \brief The model whose first queued request came first (serial policies), or null (under the lock). */
  std::shared_ptr<Entry> OldestLocked() const;
  /*! \brief Nothing of the model queued or running (takes the lock). */
  bool Drained(const Entry& entry) const;
  /*! \brief Every stream's work still to run (an idle stream's is empty), read without the streams' locks into
   *  buffers kept between decisions (under the runtime's lock). */
  const std::vector<StreamView>& MonitorLocked();
  void Fail(std::vector<Pending>* expired, const std::string& model);
  void PokeAll(const std::shared_ptr<Entry>& entry);
  void SweepLoop();
  /*! \brief A turn-taking streamed model asks for `bytes` of device memory (TierOptions::make_room): whether it is
   *  its turn, after parking (or asking to yield) the others in memory; if it is, `take` runs under turn_mu_ (one turn
   *  decided and taken at a time) and its answer is returned. Null `model` and `take`: the switcher asks for a
   *  switch-in (SwitchOptions::room): whether the room is there or coming. */
  bool MakeRoom(ModelObj* model, size_t bytes, const std::function<bool()>* take);
  void WarmUp(const std::shared_ptr<Entry>& entry);
  /*! \brief One launch of a batched model for `members` (its queued requests, in order, `rows` each): their inputs
   *  packed into the compiled batch (the rows left zero), their outputs split back when it is done. */
  Request Pack(const std::shared_ptr<Entry>& entry, const std::vector<Pending>& members, int size);
  /*! \brief Each size's predicted run (several sizes; under the lock), the batch size chosen with the candidates: its
   *  figure (Size::run_us, at its fastest candidates) scaled by the candidates the policy chooses at that size (their
   *  isolated time against the fastest's: fewer units may run slower) and by the policy's co-location estimate
   *  against their isolated time. When some size has a choice of candidates every size gets a decision of its own
   *  (`input` as for `decision`, the current size's); else the current size's co-location slowdown is every size's. */
  const std::vector<double>& PredictRuns(Entry& entry, int size, const PolicyDecision& decision, PolicyInput input);
  /*! \brief The size a launch of `entry`'s `lane` runs at (several sizes; under the lock): of the sizes the queued
   *  rows fill (at least the front request's, and a preferred batch the queue reached, held for with a queue delay),
   *  the one with the least predicted time per row (`runs`, PredictRuns) whose predicted finish meets the
   *  front request's latency target (none meets it: the smallest); padded up to a larger size holding every queued
   *  row when that finishes sooner than this size and the rest's cheapest way (one launch that holds it, or several
   *  of a smaller size; with no rest: a larger size faster outright). With ModelOptions::refresh_sizes, a size that
   *  holds the front request, meets its target and no launch chose for kStaleRuns launches is chosen instead (the
   *  longest unchosen first), so that its figure is measured again. */
  int ChooseSize(const Entry& entry, const std::deque<Pending>& lane, double now,
                 const std::vector<double>& runs) const;
  /*! \brief A model compiled at several sizes: each size's run at its fastest candidates, measured on its streams. */
  void MeasureSizes(const std::shared_ptr<Entry>& entry);
  /*! \brief A size's launch ran `us` at its fastest candidates, not preempted: its figure follows (under the lock). */
  static void RecordRun(Size& size, double us);
  /*! \brief Count a finished launch of a batched model that brought `rows` rows (its batch statistics). */
  static void CountBatch(Entry& entry, int64_t rows, const RequestObj& done);
  Model LoadModel(const std::string& path, const LoadOptions& options) const;
  /*! \brief A model's latency target (ms; -1: none): its options' (0: its artifact's). */
  static double QosOf(const ModelOptions& options, const Manifest& manifest);

  RuntimeOptions options_;
  std::string policy_kind_;
  std::shared_ptr<Device> device_;
  std::shared_ptr<MemoryScope> scope_;
  int total_units_ = 1;
  TrustedKeys trusted_;
  Switcher switcher_;
  PreemptionGroup group_;
  std::shared_ptr<ColocationTable> table_;

  std::vector<Runtime> parts_;                                // several devices: one Runtime each (its index)
  std::map<std::string, std::vector<int>> replicas_;          // several devices: each model's parts (under mu_)
  std::map<std::string, std::shared_ptr<SplitChain>> split_;  // several devices: the split models (under mu_)
  std::vector<std::pair<double, double>>
      load_samples_;  // several devices: per part, (when, WorkUs) at the last placement
  mutable std::mutex mu_;
  std::condition_variable sweep_cond_;
  std::unique_ptr<Policy> policy_;
  std::map<std::string, std::shared_ptr<Entry>> entries_;
  std::vector<std::shared_ptr<Entry>> order_;  // loaded models in load order (the monitor's order)
  std::vector<StreamView> monitor_views_;      // MonitorLocked's answer, per stream of order_ (its buffers reused)
  std::vector<StreamSnapshot> monitor_reads_;  // and each stream's snapshot
  int64_t serial_running_ = 0;                 // serial policies: requests running (0 or 1)
  bool closed_ = false;
  std::vector<size_t> tier_used_;  // per tier share: bytes the streamed models took
  std::thread sweeper_;            // fails requests whose timeout passed while every stream was busy
  std::shared_ptr<std::atomic<int64_t>> finished_for_memory_ = std::make_shared<std::atomic<int64_t>>(0);
  /*! \brief What its streamed models' make_room asks (null once it shuts down: a model may outlive it; Shutdown
   *  waits for the questions under way). */
  struct TurnBoard {
    std::mutex mu;
    std::condition_variable done;
    RuntimeObj* runtime = nullptr;
    int asking = 0;
    std::vector<Model> streamed;  // the turn-taking models (Ended nudges them without the runtime's lock)
    /*! \brief MakeRoom of its runtime, if it still runs (else: yes for a streamed model, no for a switch-in). */
    bool Ask(ModelObj* model, size_t bytes, const std::function<bool()>* take);
    /*! \brief A turn ended: its runtime's waiting streamed models look again (NudgeStreamed). */
    void Ended();
  };
  std::shared_ptr<TurnBoard> turns_ = std::make_shared<TurnBoard>();
  std::mutex turn_mu_;  // held while a streamed model's turn is decided and taken (MakeRoom; never by a switch-in)
};

class Runtime : public ffi::ObjectRef {
 public:
  static Runtime Create(RuntimeOptions options);
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(Runtime, ffi::ObjectRef, RuntimeObj);
};

}  // namespace tvmsched

#endif  // TVMSCHED_RUNTIME_H_
