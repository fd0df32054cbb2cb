/*!
 * \file tvmsched/split.h
 * \brief A model split across devices (mechanism D executed over several GPUs, docs/multi-device.md): its layers in
 *        consecutive groups, each group a model of its own on one device (CutLayers), a request running the groups in
 *        order.
 *
 * A part's model holds only its group's weights, its activations, and its environment: the model's inputs its layers
 * read and the activations they read from earlier groups (its inputs), the model's outputs its layers write and the
 * activations later groups read (its outputs). Those activations cross devices as a part's outputs copied out with its
 * device's copy, once its launches are done, and a later part's inputs copied in with that device's copy: no memory is
 * shared between devices. The outputs are the bits a single device's run gives (the same kernels, in the same order,
 * on the same inputs). The engine Runtime serves such parts as models of their own on each device's Runtime
 * (runtime.h: RuntimeObj::LoadSplit), so each part is placed, streamed, scheduled and preempted there like any model.
 */
#ifndef TVMSCHED_SPLIT_H_
#define TVMSCHED_SPLIT_H_

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tvmsched/model.h"

namespace tvmsched {

/*! \brief `parts` groups of consecutive layers balancing their bytes (each layer's: the weights it is the first to
 *  read plus its outputs), as the memory planner splits a task into sub-tasks (runtime/tiering.py's split_layers over
 *  layer_bytes, the same groups): group i ends where the running sum comes closest to total·(i+1)/parts. With fewer
 *  layers than parts, one layer each (fewer groups). */
std::vector<std::pair<int, int>> BalancedLayers(const Manifest& manifest, int parts);

/*! \brief The groups of layers (first and last each) a model split across `devices` devices runs, one per device:
 *  `given` (a plan's sub-tasks: one per device, consecutive from the first layer to the last, none empty), or else
 *  BalancedLayers. One TvmschedError line naming `path` when `given` is not so, or the model has one layer. */
std::vector<std::pair<int, int>> SplitGroups(const Manifest& whole, const std::vector<std::pair<int, int>>& given,
                                             size_t devices, const std::string& path);

/*! \brief One TvmschedError line for an input that `whole` (the model a request is for) does not have. */
void CheckInputNames(const Manifest& whole, const ffi::Map<ffi::String, ffi::Tensor>& inputs);

/*! \brief A manifest's input names, in order (a part's: what PartInputs takes from a request). */
std::vector<std::string> InputNames(const Manifest& manifest);

/*! \brief The bytes a request copies between devices: the inputs of the parts' models that are not `whole`'s inputs
 *  (the activations crossing from earlier parts). */
size_t CrossingBytes(const Manifest& whole, const std::vector<Model>& parts);

/*! \brief A part's inputs (`names`, its InputNames) out of `have`: the request's inputs and the outputs of the parts
 *  before it. One missing is left out, for the part's own input check to name. */
ffi::Map<ffi::String, ffi::Tensor> PartInputs(const std::vector<std::string>& names,
                                              const ffi::Map<ffi::String, ffi::Tensor>& have);

/*! \brief The model's outputs out of `have`, once every part has run. */
ffi::Map<ffi::String, ffi::Tensor> ModelOutputs(const Manifest& whole, const ffi::Map<ffi::String, ffi::Tensor>& have);

/*! \brief A split model run directly, one request at a time (SplitExecutor in Python; bench/split.py): each part a
 *  resident model on its device. */
class SplitModelObj : public ffi::Object {
 public:
  /*! \brief `path` split over `devices` (in order: the first runs the first layers), one group of layers each
   *  (BalancedLayers; a model with fewer layers than devices leaves the last ones idle). */
  SplitModelObj(const std::string& path, std::vector<std::shared_ptr<Device>> devices, const TrustedKeys& trusted);
  /*! \brief Run a request: `ids` one candidate per layer of the model (empty: candidate 0); the model's outputs on the
   *  host. One-line TvmschedError when a device fails (a lost device's line). Thread-safe: one request at a time. */
  ffi::Map<ffi::String, ffi::Tensor> Run(const ffi::Map<ffi::String, ffi::Tensor>& inputs, const std::vector<int>& ids);
  /*! \brief Per device: its part's model and the model's layers it runs. */
  const std::vector<Model>& parts() const { return parts_; }
  std::pair<int, int> layers_of(int part) const { return layers_[part]; }
  /*! \brief The bytes copied between devices per request (the crossing activations). */
  size_t crossing_bytes() const { return CrossingBytes(whole_, parts_); }
  /*! \brief The whole model's manifest (its inputs and outputs: a request's). */
  const Manifest& manifest() const { return whole_; }

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.SplitModel", SplitModelObj, ffi::Object);

 private:
  Manifest whole_;
  std::vector<Model> parts_;
  std::vector<std::pair<int, int>> layers_;      // per part: its first and last layer in the model
  std::vector<std::vector<std::string>> reads_;  // per part: its input names
  std::mutex run_mu_;                            // one request at a time (the parts' buffers)
};

class SplitModel : public ffi::ObjectRef {
 public:
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(SplitModel, ffi::ObjectRef, SplitModelObj);
};

}  // namespace tvmsched

#endif  // TVMSCHED_SPLIT_H_
