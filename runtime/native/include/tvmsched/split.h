/*!
 * \file tvmsched/split.h
 * \brief A model split across devices (mechanism D executed over several GPUs, docs/multi-device.md): its layers in
 *        consecutive groups, each group prepared on one device, a request running the groups in order.
 *
 * Each device loads the artifact registered (its weights pinned on the host) and prepares only its environment and
 * its own groups, so it holds its groups' weights and activations and no others'. The activations a group reads from
 * an earlier device's groups are copied out with that device's copy after an event recorded behind its launches, then
 * in with the reading device's copy: no memory is shared between devices. The outputs are the bits a single device's
 * run gives (the same kernels, in the same order, on the same inputs).
 */
#ifndef TVMSCHED_SPLIT_H_
#define TVMSCHED_SPLIT_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tvmsched/model.h"

namespace tvmsched {

/*! \brief `parts` groups of consecutive layers balancing their bytes (each layer's: the weights it is the first to
 *  read plus its outputs), as the memory planner splits a task into sub-tasks (runtime/tiering.py's split_layers over
 *  layer_bytes, the same groups): group i ends where the running sum comes closest to total·(i+1)/parts. With fewer
 *  layers than parts, one layer each (fewer groups). */
std::vector<std::pair<int, int>> BalancedLayers(const Manifest& manifest, int parts);

struct SplitOptions {
  /*! \brief Each device's layers, first and last (a plan's sub-tasks; one group per device, consecutive from the first
   *  layer to the last). Empty: BalancedLayers (a model with fewer layers than devices leaves the last ones idle). */
  std::vector<std::pair<int, int>> groups;
  /*! \brief Per device, the budget its part's memory counts against (a Runtime's; empty: none). */
  std::vector<std::shared_ptr<MemoryScope>> scopes;
};

class SplitModelObj : public ffi::Object {
 public:
  /*! \brief `path` split over `devices` (in order: the first runs the first layers), one group of layers each. */
  SplitModelObj(const std::string& path, std::vector<std::shared_ptr<Device>> devices, const TrustedKeys& trusted,
                const SplitOptions& options = {});
  /*! \brief Run a request: `ids` one candidate per layer (empty: candidate 0); the outputs on the host. One-line
   *  TvmschedError when a device fails (a lost device's line). Thread-safe: requests run one at a time. */
  ffi::Map<ffi::String, ffi::Tensor> Run(const ffi::Map<ffi::String, ffi::Tensor>& inputs, const std::vector<int>& ids);
  /*! \brief Per device: its model (the artifact, registered, with only its groups prepared) and its layers. */
  const std::vector<Model>& parts() const { return parts_; }
  std::pair<int, int> layers_of(int part) const { return layers_[part]; }
  /*! \brief The bytes copied between devices per request (the crossing activations). */
  size_t crossing_bytes() const;
  /*! \brief Each part's device memory (its environment and its group), as it was prepared. */
  size_t part_bytes(int part) const { return parts_[part]->env_bytes() + parts_[part]->group_bytes(part); }

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.SplitModel", SplitModelObj, ffi::Object);

 private:
  struct Crossing {
    std::string tensor;
    int from = 0;  // the part whose layer writes it
    size_t nbytes = 0;
  };
  std::vector<Model> parts_;
  std::vector<std::pair<int, int>> layers_;   // per part: first and last layer (first > last: none)
  std::vector<std::vector<Crossing>> needs_;  // per part: what it reads from earlier parts
  std::vector<int> output_from_;              // per model output: the part whose layer writes it
  std::vector<char> host_;                    // the copies' staging buffer (the largest crossing)
  std::mutex run_mu_;                         // one request at a time (the parts' buffers, host_)
};

class SplitModel : public ffi::ObjectRef {
 public:
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(SplitModel, ffi::ObjectRef, SplitModelObj);
};

}  // namespace tvmsched

#endif  // TVMSCHED_SPLIT_H_
