// A model's sub-tasks (tvmsched/subtasks.h): its groups of layers, what each uses, their activation plans.
#include "tvmsched/subtasks.h"

#include <algorithm>

namespace tvmsched {

namespace {

constexpr size_t kAlign = 64;

size_t Align(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

MemoryPlan PlanMemory(const std::vector<LayerSpec>& layers, const std::map<std::string, size_t>& nbytes,
                      const std::set<std::string>& keep, int reuse_distance) {
  std::map<std::string, int> last_use;
  for (const LayerSpec& layer : layers) {
    for (const auto* ids : {&layer.outputs, &layer.inputs}) {
      for (const auto& id : *ids) last_use[id] = layer.index + reuse_distance - 1;
    }
  }
  MemoryPlan plan;
  std::vector<int> free;
  for (const LayerSpec& layer : layers) {
    for (const auto& id : layer.outputs) {
      size_t need = (nbytes.at(id) + kAlign - 1) / kAlign * kAlign;
      int block = -1;
      if (!keep.count(id) && !free.empty()) {  // smallest free block that fits, else the largest (grown)
        for (int b : free) {
          if (plan.storage_bytes[b] >= need && (block < 0 || plan.storage_bytes[b] < plan.storage_bytes[block]))
            block = b;
        }
        if (block < 0)
          block = *std::max_element(free.begin(), free.end(),
                                    [&](int a, int b) { return plan.storage_bytes[a] < plan.storage_bytes[b]; });
      }
      if (block < 0) {
        plan.storage_bytes.push_back(need);
        block = static_cast<int>(plan.storage_bytes.size()) - 1;
      } else {
        free.erase(std::find(free.begin(), free.end(), block));
        plan.storage_bytes[block] = std::max(plan.storage_bytes[block], need);
      }
      plan.assignment[id] = block;
    }
    for (const auto& [id, block] : plan.assignment) {
      if (!keep.count(id) && last_use[id] == layer.index) free.push_back(block);
    }
  }
  return plan;
}

MemoryPlan PlanMemory(const Manifest& m, int reuse_distance) {
  std::set<std::string> keep;
  for (const Binding& b : m.outputs) keep.insert(b.tensor);
  for (const IndexCheckSpec& c : m.index_checks) keep.insert(c.tensor);  // read after the run
  std::map<std::string, size_t> nbytes;
  for (const auto& [id, spec] : m.tensors) nbytes[id] = spec.nbytes();
  return PlanMemory(m.layers, nbytes, keep, reuse_distance);
}

void SubTasks::Set(const Manifest& manifest, const std::vector<std::vector<std::string>>& layer_args,
                   const std::map<std::string, size_t>& environment, std::vector<std::pair<int, int>> groups,
                   bool shared_activations, int reuse_distance) {
  manifest_ = &manifest;
  shared_activations_ = shared_activations;
  groups_ = std::move(groups);
  layer_group_.assign(manifest.layers.size(), 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (int i = groups_[g].first; i <= groups_[g].second; ++i) layer_group_[i] = static_cast<int>(g);
  }
  group_tensors_.assign(groups_.size(), {});
  tensor_groups_.clear();
  internal_.clear();
  for (const LayerSpec& layer : manifest.layers) {
    for (const auto& id : layer_args[layer.index]) {
      if (environment.count(id)) continue;
      int g = layer_group_[layer.index];
      auto& users = tensor_groups_[id];
      if (std::find(users.begin(), users.end(), g) == users.end()) {
        users.push_back(g);
        group_tensors_[g].push_back(id);
      }
    }
  }
  weight_bytes_.assign(groups_.size(), 0);
  for (auto& [id, users] : tensor_groups_) {
    bool weight = host_weights.count(id) > 0;
    if (!weight && (users.size() == 1 || shared_activations_)) internal_.insert(id);
    if (weight) {
      for (int g : users) weight_bytes_[g] += host_weights.at(id).nbytes;
    }
  }
  state_.reset(new std::atomic<int>[groups_.size()]);
  for (size_t g = 0; g < groups_.size(); ++g) state_[g].store(kAbsent);
  plans_.assign(groups_.size(), MemoryPlan());
  blocks_.assign(groups_.size(), {});
  bytes_.assign(groups_.size(), 0);
  for (int g = 0; g < size(); ++g) Plan(g, reuse_distance);
}

std::pair<int, int> SubTasks::planned_layers(int g) const {
  // shared activations: group 0 plans every layer's (every activation is internal then), the others none
  if (!shared_activations_) return groups_[g];
  return {0, g == 0 ? static_cast<int>(manifest_->layers.size()) - 1 : -1};
}

void SubTasks::Plan(int g, int reuse_distance) {
  std::vector<LayerSpec> layers;  // the group's layers, seeing only its internal activations
  std::map<std::string, size_t> nbytes;
  auto [first, last] = planned_layers(g);
  for (int i = first; i <= last; ++i) {
    LayerSpec spec;
    spec.index = i;
    for (const auto& id : manifest_->layers[i].inputs) {
      if (internal_.count(id)) spec.inputs.push_back(id);
    }
    for (const auto& id : manifest_->layers[i].outputs) {
      if (internal_.count(id)) {
        spec.outputs.push_back(id);
        nbytes[id] = manifest_->tensors.at(id).nbytes();
      }
    }
    layers.push_back(std::move(spec));
  }
  plans_[g] = PlanMemory(layers, nbytes, {}, reuse_distance);
  size_t bytes = 0;
  for (size_t b : plans_[g].storage_bytes) bytes += b;
  for (const auto& id : group_tensors_[g]) {
    if (internal_.count(id)) continue;
    bytes += TensorBytes(id);
  }
  bytes_[g] = bytes;
}

size_t SubTasks::TensorBytes(const std::string& id) const {
  auto host = host_weights.find(id);
  return host != host_weights.end() ? host->second.nbytes : Align(manifest_->tensors.at(id).nbytes());
}

size_t SubTasks::PlannedActivationBytes() const {
  size_t bytes = 0;
  for (int g = 0; g < size(); ++g) {
    for (size_t b : plans_[g].storage_bytes) bytes += b;
  }
  for (const auto& [id, users] : tensor_groups_) {  // activations crossing groups: allocated once
    if (!internal_.count(id) && !host_weights.count(id)) bytes += TensorBytes(id);
  }
  return bytes;
}

}  // namespace tvmsched
