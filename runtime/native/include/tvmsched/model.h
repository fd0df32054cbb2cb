/*!
 * \file tvmsched/model.h
 * \brief A loaded artifact on a device: kernels, weights, activations (the liveness plan), the
 *        preempt flag array and the progress counters. Runs layers; decides nothing.
 *
 * Not thread-safe: one request at a time (a Stream owns it while serving). The model owns all
 * its device memory and frees it when the last reference goes.
 */
#ifndef TVMSCHED_MODEL_H_
#define TVMSCHED_MODEL_H_

#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/object.h>
#include <tvm/ffi/string.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tvmsched/artifact.h"
#include "tvmsched/device.h"

namespace tvmsched {

namespace ffi = tvm::ffi;

/*! \brief Storage blocks and which block each activation lives in (greedy best fit over layer order). */
struct MemoryPlan {
  std::vector<size_t> storage_bytes;
  std::map<std::string, int> assignment;
};

/*!
 * \brief Plan the layers' outputs so that any `reuse_distance` consecutive layers can run again (no
 *  block is reused within that window); tensors in `keep` (the model outputs) get blocks of their own.
 */
MemoryPlan PlanMemory(const std::vector<LayerSpec>& layers, const std::map<std::string, size_t>& nbytes,
                      const std::set<std::string>& keep, int reuse_distance);
/*! \brief The plan of a manifest's activations (outputs kept). */
MemoryPlan PlanMemory(const Manifest& manifest, int reuse_distance);

class ModelObj : public ffi::Object {
 public:
  explicit ModelObj(std::shared_ptr<Device> device);
  /*! \brief Load a read and verified artifact (Model::Load calls it; `path` names it in errors). */
  void Init(const std::string& path, ArtifactContents contents, FlagMemory flag_memory);
  ~ModelObj();

  const Manifest& manifest() const { return manifest_; }
  Device& device() const { return *device_; }
  const std::string& name() const { return manifest_.model_name; }
  int num_layers() const { return static_cast<int>(manifest_.layers.size()); }
  int reuse_distance() const { return reuse_distance_; }
  /*! \brief manifest.json as the loader verified it. */
  const std::string& manifest_json() const { return manifest_json_; }

  /*! \brief Re-allocate activations for a new reuse distance (no request may be running). */
  void Replan(int reuse_distance);
  /*! \brief Check names, shapes and dtypes (one-line errors) without copying. */
  void CheckInputs(const ffi::Map<ffi::String, ffi::Tensor>& inputs) const;
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

  bool instrumented() const { return flags_.length > 0; }
  /*! \brief Set or clear the preempt flag's slots (every slot but the started mark). */
  void SetPreemptFlag(bool on);
  bool preempt_flag_set() const;
  /*! \brief CPU non-idempotent kernels mark the started slot once past their entry check. */
  void ClearStarted();
  bool started() const;

  bool counts_progress() const { return counters_ != nullptr; }
  void ResetProgress();
  /*! \brief Raw per-layer counters, read without waiting for running kernels. */
  std::vector<int32_t> ReadCounters() const;
  /*! \brief Per layer, the blocks completed since the last reset (counters / threads per block). */
  std::vector<int64_t> CompletedBlocks(const std::vector<int>& ids) const;

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.Model", ModelObj, ffi::Object);

 private:
  struct Candidate {
    ffi::Function kernel;
    int units = 0;            // its compute units, an explicit count (all units: the device's total)
  };
  void Allocate();
  /*! \brief Device memory for `what` (a tensor, named in the error when the device has not enough). */
  void* AllocFor(const std::string& what, size_t nbytes);
  void FreeActivations();
  StreamHandle StreamFor(int units);

  Manifest manifest_;
  std::string manifest_json_;
  std::shared_ptr<Device> device_;
  ffi::Optional<ffi::Module> library_;
  std::vector<std::vector<Candidate>> candidates_;
  std::map<int, StreamHandle> streams_;  // units -> this model's stream (tenants overlap)
  StreamHandle current_stream_ = nullptr;
  std::map<std::string, void*> weights_;  // device memory of each weight
  std::map<std::string, void*> inputs_;   // device memory of each model input
  std::vector<void*> storage_;            // activation blocks
  std::map<std::string, void*> tensor_data_;  // every tensor id -> its data pointer
  std::vector<std::vector<DLTensor>> layer_args_;  // per layer: inputs, outputs, flags, counter
  std::vector<std::vector<ffi::AnyView>> layer_views_;  // per layer: views of layer_args_ (what CallPacked takes)
  FlagArray flags_;
  int32_t* counters_ = nullptr;
  int reuse_distance_ = 1;
};

class Model : public ffi::ObjectRef {
 public:
  /*! \brief Load an artifact file onto `device` ("cpu"/"cuda"; "" = the artifact's own); with
   *  `trusted` keys, only an artifact one of them signed (checked before anything is loaded). */
  static Model Load(const std::string& path, const std::string& device = "",
                    FlagMemory flag_memory = FlagMemory::kAuto, const TrustedKeys& trusted = TrustedKeys());
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(Model, ffi::ObjectRef, ModelObj);
};

/*! \brief Numpy-style name of a dtype ("float32"). */
std::string DTypeName(DLDataType dtype);

/*! \brief A new host (CPU) tensor. */
ffi::Tensor EmptyHostTensor(const std::vector<int64_t>& shape, DLDataType dtype);

}  // namespace tvmsched

#endif  // TVMSCHED_MODEL_H_
