/*!
 * \file tvmsched/subtasks.h
 * \brief A model's sub-tasks (docs/switching.md): groups of consecutive layers, the tensors each uses, each group's
 *        activation plan and storage blocks, its bytes and its state; and the model's host weights.
 *
 * The model holds one (ModelObj::subtasks) and binds its layers' arguments to what it allocates for them; its
 * placement lays it out (ModelObj::SetGroups: one group when resident, a switcher's doubling groups, a streamer's
 * buffer-sized ones) and moves the groups' states. Nothing here touches a device.
 *
 * This header sits below model.h (which includes it): it knows the manifest (artifact.h) and the group states
 * (placement.h), never a model.
 */
#ifndef TVMSCHED_SUBTASKS_H_
#define TVMSCHED_SUBTASKS_H_

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tvmsched/artifact.h"
#include "tvmsched/placement.h"

namespace tvmsched {

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

class SubTasks {
 public:
  /*! \brief A weight's host copy: pinned host memory for a registered model (the switcher copies from it); no data
   *  for a resident or streamed one, whose weights are copied from the artifact's bytes at load. */
  struct HostWeight {
    void* data = nullptr;
    size_t nbytes = 0;
  };
  /*! \brief Every weight of the model, by tensor id. */
  std::map<std::string, HostWeight> host_weights;

  /*! \brief Lay the groups out: `groups` (first and last layer of each) over `manifest`'s layers, whose arguments are
   *  `layer_args` (tensor ids per layer); tensors in `environment` belong to no group. `shared_activations`: one
   *  activation plan over all layers (group 0's; the other groups' are empty), for a model whose groups run one after
   *  another and whose activations live as long as it does. Plans every group for `reuse_distance`; every state
   *  kAbsent, no block allocated. `manifest` must outlive this layout. */
  void Set(const Manifest& manifest, const std::vector<std::vector<std::string>>& layer_args,
           const std::map<std::string, size_t>& environment, std::vector<std::pair<int, int>> groups,
           bool shared_activations, int reuse_distance);
  /*! \brief Plan group `g`'s activations again for `reuse_distance` (its blocks must have been freed). */
  void Plan(int g, int reuse_distance);

  int size() const { return static_cast<int>(groups_.size()); }
  int group_of(int layer) const { return layer_group_[layer]; }
  /*! \brief First and last layer of group `g`. */
  std::pair<int, int> layers(int g) const { return groups_[g]; }
  /*! \brief The layers group `g`'s activation blocks hold the activations of (every layer for shared group 0). */
  std::pair<int, int> planned_layers(int g) const;
  /*! \brief Non-environment tensors group `g`'s layers use (weights and activations), in the order they read them. */
  const std::vector<std::string>& tensors(int g) const { return group_tensors_[g]; }
  /*! \brief The groups using tensor `id`. */
  const std::vector<int>& users(const std::string& id) const { return tensor_groups_.at(id); }
  /*! \brief An activation that lives in its group's storage blocks (not allocated on its own). */
  bool internal(const std::string& id) const { return internal_.count(id) > 0; }
  bool is_weight(const std::string& id) const { return host_weights.count(id) > 0; }
  /*! \brief One activation plan over all layers (group 0's). */
  bool shared_activations() const { return shared_activations_; }
  const MemoryPlan& plan(int g) const { return plans_[g]; }
  /*! \brief The storage blocks allocated for plan(g) (the model allocates and frees them). */
  std::vector<void*>& blocks(int g) { return blocks_[g]; }
  const std::vector<void*>& blocks(int g) const { return blocks_[g]; }
  /*! \brief Bytes group `g` holds when prepared: the weights and activations its layers use. */
  size_t bytes(int g) const { return bytes_[g]; }
  /*! \brief Weight bytes of group `g` (what its stage 2 copies from host memory). */
  size_t weight_bytes(int g) const { return weight_bytes_[g]; }
  /*! \brief Bytes a weight or crossing activation is allocated with (weights exact, activations aligned). */
  size_t TensorBytes(const std::string& id) const;
  /*! \brief Bytes of every group's storage blocks and of the activations crossing groups (allocated once). */
  size_t PlannedActivationBytes() const;

  GroupState state(int g) const { return static_cast<GroupState>(state_[g].load(std::memory_order_acquire)); }
  bool Cas(int g, GroupState from, GroupState to) {
    int expected = from;
    return state_[g].compare_exchange_strong(expected, to, std::memory_order_acq_rel);
  }
  void SetState(int g, GroupState state) { state_[g].store(state, std::memory_order_release); }

 private:
  const Manifest* manifest_ = nullptr;
  std::vector<std::pair<int, int>> groups_;  // first and last layer
  std::vector<int> layer_group_;
  std::vector<std::vector<std::string>> group_tensors_;    // non-environment tensors each group uses
  std::map<std::string, std::vector<int>> tensor_groups_;  // ... and the groups using each
  std::set<std::string> internal_;                         // activations used by one group only: its storage blocks
  // one activation plan over all layers: a streamed model whose activations take less so, as one plan may share
  // storage the groups' own plans sum (44 of resnet50's 54 MB at 1/4 of its footprint on 2026-11-26)
  bool shared_activations_ = false;
  std::vector<MemoryPlan> plans_;
  std::vector<std::vector<void*>> blocks_;
  std::vector<size_t> bytes_, weight_bytes_;
  std::unique_ptr<std::atomic<int>[]> state_;
};

}  // namespace tvmsched

#endif  // TVMSCHED_SUBTASKS_H_
