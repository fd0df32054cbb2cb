/*!
 * \file tvmsched/model.h
 * \brief A loaded artifact on a device: the program (kernels, candidates, inputs and outputs, the preempt flag
 *        array, the progress counters) and the binding of its layers' arguments to memory (weights, activations
 *        by the liveness plan). Runs layers; decides nothing.
 *
 * Not thread-safe: one request at a time (a Stream owns it while serving). Its sub-tasks (tvmsched/subtasks.h) are
 * laid out by its placement (placement.h), which owns whatever memory it adds (a streamer's tiers and buffers); the
 * model owns the rest of its device memory and frees it when the last reference goes.
 */
#ifndef TVMSCHED_MODEL_H_
#define TVMSCHED_MODEL_H_

#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/object.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tvmsched/artifact.h"
#include "tvmsched/device.h"
#include "tvmsched/placement.h"
#include "tvmsched/subtasks.h"

namespace tvmsched {

namespace ffi = tvm::ffi;

/*! \brief Launches a stream keeps in flight on an asynchronous device unless told otherwise (StreamOptions). */
constexpr int kDefaultInFlight = 8;

class ModelObj;
struct TierOptions;  // tvmsched/tiering.h

/*! \brief How a model is loaded. */
struct LoadOptions {
  FlagMemory flag_memory = FlagMemory::kAuto;
  /*! \brief Prepare everything now. false: registered only: the weights wait in pinned host memory and
   *  a switcher (tvmsched/switching.h) prepares the environment and the sub-tasks when requests come. */
  bool resident = true;
  /*! \brief Sub-tasks (groups of consecutive layers) at most; 1: the whole model is one. */
  int max_groups = 1;
  /*! \brief A model larger than its device memory: weights streamed from host tiers (tvmsched/tiering.h).
   *  Everything else is prepared now; `resident` and `max_groups` are ignored. */
  std::shared_ptr<const TierOptions> tiers;
  /*! \brief The budget its memory counts against (its Runtime's); null: none but the device's. */
  std::shared_ptr<MemoryScope> scope;
  /*! \brief An artifact compiled at several batch sizes: the size to load (0: its largest, the manifest's own). */
  int64_t batch = 0;
  /*! \brief A resident model of the same artifact whose device weights this one reads instead of copies of its own
   *  (another batch size: the weights stored once in memory too); it is kept alive and must stay resident. */
  ffi::ObjectRef shares_weights_of;
  /*! \brief The device to load it on (one of a Runtime's several; null: OpenDevice of the artifact's kind). */
  std::shared_ptr<Device> device;
  /*! \brief Only these layers (first, last) of its program, as a model of their own: a split model's part
   *  (CutLayers, tvmsched/split.h; first < 0: every layer). */
  std::pair<int, int> layers{-1, -1};
  /*! \brief Only lay it out, as registered (`max_groups` sub-tasks): its environment's and sub-tasks' bytes, for a
   *  footprint; no host copy of its weights, no kernels loaded, nothing allocated (it cannot run). */
  bool measure_only = false;
  /*! \brief Read (and verify) its weights; false for a model that reads all of another's device weights
   *  (`shares_weights_of`, the same program: a model's other stream) or is only measured. */
  bool read_weights = true;
};

/*! \brief Lay out and load a model larger than its device memory (LoadOptions::tiers): its streamer (the streamed
 *  placement, tiering.cc) chooses the weights that stream, owns their tiers and buffers, and becomes the model's
 *  placement. ModelObj::Init calls it once the model's program is loaded; declared here so that model.cc need not
 *  include tvmsched/tiering.h. */
void InitStreamed(ModelObj& model, const std::string& path, ArtifactContents& contents, const TierOptions& options);

class ModelObj : public ffi::Object {
 public:
  explicit ModelObj(std::shared_ptr<Device> device);
  /*! \brief Load a read and verified artifact (Model::Load calls it; `path` names it in errors). */
  void Init(const std::string& path, ArtifactContents contents, const LoadOptions& options);
  ~ModelObj();

  const Manifest& manifest() const { return manifest_; }
  Device& device() const { return *device_; }
  const std::shared_ptr<Device>& shared_device() const { return device_; }
  /*! \brief The budget its memory counts against (null: none but the device's). */
  const std::shared_ptr<MemoryScope>& scope() const { return scope_; }
  /*! \brief The name it is served by: the artifact's model name, or its runtime's name for it (SetName). */
  const std::string& name() const { return name_; }
  /*! \brief Serve it as `name` (its runtime's: in events and error lines). Before any thread of its runs. */
  void SetName(std::string name) { name_ = std::move(name); }
  int num_layers() const { return static_cast<int>(manifest_.layers.size()); }
  int reuse_distance() const { return reuse_distance_; }
  /*! \brief manifest.json as the loader verified it. */
  const std::string& manifest_json() const { return manifest_json_; }

  /*! \brief The priority of the streams its kernels launch on (a stream sets it for its tenant; streams made before
   *  are made again). No request may be running. */
  void SetStreamPriority(StreamPriority priority);
  StreamPriority stream_priority() const { return stream_priority_; }
  /*! \brief Re-allocate activations for a new reuse distance (no request may be running; before its groups are set:
   *  the distance they will be planned for). */
  void Replan(int reuse_distance);
  /*! \brief Check names, shapes and dtypes (one-line errors) without copying. With `rows` (a model compiled for a
   *  batch), each input may bring 1 to batch_size() rows, the same for every input, and its other dimensions as
   *  compiled: `*rows` is set to that count. */
  void CheckInputs(const ffi::Map<ffi::String, ffi::Tensor>& inputs, int64_t* rows = nullptr) const;
  /*! \brief Rows every input's first dimension holds (0: not compiled for a batch). */
  int64_t batch_size() const { return manifest_.batch_size; }
  /*! \brief Check a candidate-ID list (one id per layer, each in range). */
  void CheckCandidates(const std::vector<int>& ids) const;
  void SetInputs(const ffi::Map<ffi::String, ffi::Tensor>& inputs);
  /*! \brief SetInputs for inputs CheckInputs already accepted (a stream checks them at submit). */
  void CopyInputs(const ffi::Map<ffi::String, ffi::Tensor>& inputs);
  /*! \brief Launch layer `index` with candidate `candidate` (asynchronous on a GPU). */
  void RunLayer(int index, int candidate);
  /*! \brief Launch every layer in order with candidates `ids` (checked; empty: candidate 0 everywhere). */
  void RunLayers(const std::vector<int>& ids);
  /*! \brief Wait for every launched layer; fail if an index check saw an out-of-range index (one-line
   *  TvmschedError); then copy the outputs into new host tensors. */
  ffi::Map<ffi::String, ffi::Tensor> GetOutputs();
  void Synchronize();
  /*! \brief CUDA: an event after the last launch (nullptr on CPU). */
  EventHandle RecordEvent();

  bool instrumented() const { return manifest_.preempt_flags > 1; }
  /*! \brief Set or clear the preempt flag's slots (every slot but the started mark). */
  void SetPreemptFlag(bool on);
  bool preempt_flag_set() const;
  /*! \brief Where its preempt flag is now: "host_mapped" (CPU: host memory), "device", or "none" (not instrumented,
   *  or its environment is not on the device). */
  const char* flag_memory() const {
    if (flags_.length == 0) return "none";
    return flags_.memory == FlagMemory::kDevice ? "device" : "host_mapped";
  }
  /*! \brief Where it asks its device to put the flag: "auto" (the device measures), "host_mapped" or "device". */
  const char* flag_memory_wanted() const {
    FlagMemory wanted = FlagMemoryFor();
    return wanted == FlagMemory::kAuto ? "auto" : wanted == FlagMemory::kDevice ? "device" : "host_mapped";
  }
  /*! \brief CPU non-idempotent kernels mark the started slot once past their entry check. */
  void ClearStarted();
  bool started() const;

  // ---- faults (docs/faults.md) ----
  /*! \brief Test hook: the next run of `layer` reports a fault to the device and fails, as a kernel that faults. */
  void InjectFault(int layer) { inject_fault_layer_.store(layer, std::memory_order_release); }
  /*! \brief One of its launches faulted: past `limit` faults within `window_s` the model is quarantined (its
   *  requests fail at once until it is loaded again). Returns the quarantine line, else empty. */
  std::string RecordFault(int limit, double window_s);
  /*! \brief Why its requests fail at once (empty: they run). */
  std::string quarantined() const;

  bool counts_progress() const { return manifest_.progress_counters; }
  void ResetProgress();
  /*! \brief Raw per-layer counters, read without waiting for running kernels. */
  std::vector<int32_t> ReadCounters() const;
  /*! \brief Per layer, the blocks completed since the last reset (counters / threads per block). */
  std::vector<int64_t> CompletedBlocks(const std::vector<int>& ids) const;

  // ---- staging (mechanism C, docs/switching.md): the environment (stage 1) and the sub-tasks
  // (stage 2: memory and weights of a group of consecutive layers). A resident model has all of
  // them from Init; a registered one gets them from a switcher, whose thread alone calls Prepare*/Clean*.
  /*! \brief Its sub-tasks (tvmsched/subtasks.h); the calls below read them for the stream and the placements. */
  const SubTasks& subtasks() const { return subtasks_; }
  int num_groups() const { return subtasks_.size(); }
  int group_of(int layer) const { return subtasks_.group_of(layer); }
  /*! \brief First and last layer of group `g`. */
  std::pair<int, int> group_layers(int g) const { return subtasks_.layers(g); }
  /*! \brief Bytes group `g` holds when prepared: the weights and activations its layers use. */
  size_t group_bytes(int g) const { return subtasks_.bytes(g); }
  /*! \brief Bytes PrepareGroup(g) would allocate now (what other prepared groups share is not counted). */
  size_t GroupNeed(int g) const;
  /*! \brief Weight bytes of group `g` (what its stage 2 copies from host memory). */
  size_t group_weight_bytes(int g) const { return subtasks_.weight_bytes(g); }
  /*! \brief Bytes of the environment: input and output buffers, index-check words, progress counters. */
  size_t env_bytes() const { return env_bytes_; }
  bool env_ready() const { return env_ready_.load(std::memory_order_acquire); }
  GroupState group_state(int g) const { return subtasks_.state(g); }
  bool CasGroup(int g, GroupState from, GroupState to) { return subtasks_.Cas(g, from, to); }
  void SetGroupState(int g, GroupState state) { subtasks_.SetState(g, state); }
  /*! \brief The environment and every group are prepared. */
  bool resident() const;
  /*! \brief Stage 1: load the kernel library, look up every candidate, create the streams, allocate
   *  the environment. One-line TvmschedError on failure (nothing is left allocated). */
  void PrepareEnvironment();
  /*! \brief Free the environment (every group must be absent). */
  void CleanEnvironment();
  /*! \brief Stage 2 of group `g`: allocate what its layers use and copy their weights from pinned host
   *  memory on `copy_stream` (0: synchronous), then wait for the copy. Leaves the state to the caller. */
  void PrepareGroup(int g, StreamHandle copy_stream);
  /*! \brief Free what group `g` alone holds: weights no other prepared group uses; activations no
   *  prepared group uses and no group in `pending` still reads (a running request's later groups). */
  void CleanGroup(int g, const std::vector<bool>& pending);
  /*! \brief The device memory of tensor `id` (an environment tensor, or a weight or crossing activation of a prepared
   *  group); null when it has none here (an activation inside a group's storage blocks is not looked up). */
  void* TensorData(const std::string& id) const;
  /*! \brief Where its memory is (never null): resident from Init, a switcher's (staged) or a streamer's. */
  Placement* placement() const { return placement_.get(); }
  void SetPlacement(std::shared_ptr<Placement> placement) { placement_ = std::move(placement); }
  /*! \brief Why it cannot be prepared (stage 1 failed): its requests fail with this line. */
  std::string placement_error() const;
  void SetPlacementError(const std::string& error);
  /*! \brief The stream serving it: woken when a switcher made progress (nullptr: none). */
  void SetWaker(std::function<void()> waker);
  void Wake();
  /*! \brief Loaded with LoadOptions::resident = false (its weights stay in pinned host memory). */
  bool registered() const { return registered_; }
  /*! \brief Each weight's pinned host copy (registered models; empty data for resident ones). */
  std::vector<std::pair<const void*, size_t>> host_weights() const {
    std::vector<std::pair<const void*, size_t>> out;
    for (const auto& [id, host] : subtasks_.host_weights) out.emplace_back(host.data, host.nbytes);
    return out;
  }
  /*! \brief Its placement is a streamer (mechanism D, tvmsched/tiering.h): a model larger than its device memory,
   *  whose groups without streamed weights are kReady from Init and whose streamer owns the rest of its layout. */
  bool tiered() const { return std::string(placement_->kind()) == "streamed"; }

  // ---- the layout a placement lays out and binds (groups, their plans, its tensors' memory). The switcher's and the
  // streamer's threads call these; no request may be running while a layout is set.
  /*! \brief Lay its sub-tasks out (SubTasks::Set) from `groups` (first and last layer of each), planned for its reuse
   *  distance; `shared_activations`: one activation plan over all layers (a streamed model). Allocates nothing. */
  void SetGroups(std::vector<std::pair<int, int>> groups, bool shared_activations = false);
  /*! \brief Device memory for `what` in its scope (one line naming the model and `what` when it cannot be had). */
  void* AllocFor(const std::string& what, size_t nbytes);
  /*! \brief Allocate tensor `id`'s memory (`what` names it in the error); freed with the model's memory. */
  void* AllocTensor(const std::string& id, const std::string& what, size_t nbytes);
  /*! \brief Tensors whose memory its placement provides and binds (a streamer's streamed weights): the model never
   *  allocates them, and its layers keep what BindLayers bound them to last. */
  void SetPlacedTensors(std::set<std::string> ids) { placed_ = std::move(ids); }
  /*! \brief Bind layers `first`..`last` again, the placed tensors in `placed` to the memory given there. */
  void BindLayers(int first, int last, const std::vector<std::pair<std::string, void*>>& placed);
  /*! \brief Free every allocation the model made: activations, weights, the environment (a placement's own memory,
   *  as a streamer's buffers, is its own to free). */
  void FreeDeviceMemory();
  /*! \brief Requests queued or running on a stream (a switcher never evicts a model in use). */
  std::atomic<int> users{0};
  /*! \brief A stream took a request (waits while a switcher is cleaning the environment). */
  void AddUser();
  /*! \brief Clean the environment if nobody uses the model and every group is absent (the switcher). */
  bool TryCleanEnvironment();
  /*! \brief Free all its device memory (FreeDeviceMemory, every group made absent) if nobody uses the model: a
   *  streamed model's turn ending (tvmsched/tiering.h). */
  bool TryFreeDeviceMemory();

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.Model", ModelObj, ffi::Object);

 private:
  /*! \brief Where its preempt flag goes: as loaded, but device memory for "auto" when a kernel checks the flag
   *  inside its loops (a read at every check: across PCIe from host-mapped memory it cost 54-190x on an H100). */
  FlagMemory FlagMemoryFor() const;
  std::atomic<int> inject_fault_layer_{-1};
  mutable std::mutex fault_mu_;
  std::deque<double> fault_us_;  // when its latest faults were reported
  std::string quarantined_;
  struct Candidate {
    ffi::Function kernel;
    int units = 0;  // its compute units, an explicit count (all units: the device's total)
  };
  void FreeGroupBlocks(int g);
  void BindLayer(int layer, const std::map<std::string, void*>* placed = nullptr);
  StreamHandle StreamFor(int units);

  Manifest manifest_;
  std::string name_;
  std::string manifest_json_;
  std::shared_ptr<Device> device_;
  std::shared_ptr<MemoryScope> scope_;
  ffi::Optional<ffi::Module> library_;
  std::vector<std::vector<Candidate>> candidates_;
  std::map<int, StreamHandle> streams_;  // units -> this model's stream (tenants overlap)
  StreamHandle current_stream_ = nullptr;
  StreamPriority stream_priority_ = StreamPriority::kNormal;
  std::string kernels_;      // kernels.so, kept for stage 1
  SubTasks subtasks_;        // its groups and host weights; bound to memory below (tensor_data_, layer_args_)
  bool registered_ = false;  // loaded with resident = false: host weights kept
  std::map<std::string, size_t> env_tensors_;  // model inputs, outputs and index-check words -> bytes
  std::map<std::string, void*> env_data_;      // their device memory (stage 1)
  /*! \brief Bind the layers whose arguments group g's memory holds (its own; every layer for shared group 0). */
  void BindGroup(int g);
  size_t env_bytes_ = 0;
  std::atomic<bool> env_ready_{false};
  FlagMemory flag_memory_ = FlagMemory::kAuto;
  std::shared_ptr<Placement> placement_;
  std::mutex env_mu_;            // orders AddUser against TryCleanEnvironment
  mutable std::mutex error_mu_;  // guards placement_error_ (a leaf: streams take it under their locks)
  std::mutex waker_mu_;          // guards waker_ (held while it runs: it takes the stream's lock)
  std::string placement_error_;
  std::function<void()> waker_;
  std::map<std::string, void*> tensor_data_;  // allocated tensor id -> its data pointer (switcher thread only)
  std::set<std::string> placed_;              // tensors its placement provides and binds (SetPlacedTensors)
  std::set<std::string> borrowed_;            // weights read from LoadOptions::shares_weights_of (never freed here)
  ffi::ObjectRef weights_owner_;              // that model
  std::vector<std::vector<std::string>> layer_arg_ids_;  // per layer: the tensor of each of its first args
  std::vector<std::vector<DLTensor>> layer_args_;        // per layer: inputs, outputs, flags, counter
  std::vector<std::vector<ffi::AnyView>> layer_views_;   // per layer: views of layer_args_ (what CallPacked takes)
  FlagArray flags_;
  int32_t* counters_ = nullptr;
  int reuse_distance_ = 1;
};

class Model : public ffi::ObjectRef {
 public:
  /*! \brief Load an artifact file onto `device` ("cpu"/"cuda"; "" = the artifact's own); with
   *  `trusted` keys, only an artifact one of them signed (checked before anything is loaded). */
  static Model Load(const std::string& path, const std::string& device = "", FlagMemory flag_memory = FlagMemory::kAuto,
                    const TrustedKeys& trusted = TrustedKeys());
  static Model Load(const std::string& path, const std::string& device, const LoadOptions& options,
                    const TrustedKeys& trusted);
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(Model, ffi::ObjectRef, ModelObj);
};

/*! \brief Numpy-style name of a dtype ("float32"). */
std::string DTypeName(DLDataType dtype);

/*! \brief A new host (CPU) tensor. */
ffi::Tensor EmptyHostTensor(const std::vector<int64_t>& shape, DLDataType dtype);

}  // namespace tvmsched

#endif  // TVMSCHED_MODEL_H_
