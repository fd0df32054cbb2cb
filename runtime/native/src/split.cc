// A model split across devices (tvmsched/split.h, docs/multi-device.md): each device holds its own group of layers as
// a model of its own; the activations crossing devices go through the devices' copies as its outputs and inputs.
#include "tvmsched/split.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

namespace tvmsched {

namespace {

constexpr double kFaultWaitS = 30;  // a faulted device's recovery, waited for at most

/*! \brief One line unless `groups` run consecutively from layer 0 to layer `layers` - 1, none empty. */
void CheckGroups(const std::vector<std::pair<int, int>>& groups, int layers, const std::string& path) {
  int next = 0;
  for (const auto& [first, last] : groups) {
    if (first != next || last < first || last >= layers) {
      TVM_FFI_THROW(TvmschedError) << path << ": groups of layers run consecutively from layer 0 to layer "
                                   << layers - 1 << ", none empty: group [" << first << ", " << last
                                   << "] should start at layer " << next << " and end by layer " << layers - 1;
    }
    next = last + 1;
  }
  if (next != layers) {
    TVM_FFI_THROW(TvmschedError) << path << ": groups of layers run consecutively from layer 0 to layer " << layers - 1
                                 << ": the last given ends at layer " << next - 1;
  }
}

}  // namespace

std::vector<std::pair<int, int>> BalancedLayers(const Manifest& manifest, int parts) {
  const int count = static_cast<int>(manifest.layers.size());
  std::vector<std::pair<int, int>> groups;
  if (count <= parts) {
    for (int i = 0; i < count; ++i) groups.emplace_back(i, i);
    return groups;
  }
  std::vector<int64_t> prefix{0};  // the layers' bytes, summed
  std::set<std::string> seen;
  for (const LayerSpec& layer : manifest.layers) {
    int64_t bytes = 0;
    for (const std::string& in : layer.inputs) {
      const TensorSpec& spec = manifest.tensors.at(in);
      if (spec.kind == "weight" && seen.insert(in).second) bytes += static_cast<int64_t>(spec.nbytes());
    }
    for (const std::string& out : layer.outputs) bytes += static_cast<int64_t>(manifest.tensors.at(out).nbytes());
    prefix.push_back(prefix.back() + bytes);
  }
  int start = 0;
  for (int i = 0; i < parts - 1; ++i) {
    const double target = static_cast<double>(prefix.back() * (i + 1)) / parts;
    int stop = start + 1;  // the first end closest to the target, leaving a layer for each group after it
    for (int end = start + 1; end < count - (parts - 2 - i); ++end) {
      if (std::abs(static_cast<double>(prefix[end]) - target) < std::abs(static_cast<double>(prefix[stop]) - target)) {
        stop = end;
      }
    }
    groups.emplace_back(start, stop - 1);
    start = stop;
  }
  groups.emplace_back(start, count - 1);
  return groups;
}

size_t CrossingBytes(const Manifest& whole, const std::vector<Model>& parts) {
  std::set<std::string> model_inputs;
  for (const Binding& b : whole.inputs) model_inputs.insert(b.name);
  size_t all = 0;
  for (const Model& part : parts) {
    const Manifest& m = part->manifest();
    for (const Binding& b : m.inputs) {
      if (!model_inputs.count(b.name)) all += m.tensors.at(b.tensor).nbytes();
    }
  }
  return all;
}

std::vector<std::pair<int, int>> SplitGroups(const Manifest& whole, const std::vector<std::pair<int, int>>& given,
                                             size_t devices, const std::string& path) {
  if (!given.empty() && given.size() != devices) {
    TVM_FFI_THROW(TvmschedError) << "a split model has one group of layers per device: " << given.size()
                                 << " groups for " << devices << " devices";
  }
  std::vector<std::pair<int, int>> groups = given.empty() ? BalancedLayers(whole, static_cast<int>(devices)) : given;
  CheckGroups(groups, static_cast<int>(whole.layers.size()), path);
  if (groups.size() < 2)
    TVM_FFI_THROW(TvmschedError) << "model " << whole.model_name << " has one layer: it cannot be split";
  return groups;
}

void CheckInputNames(const Manifest& whole, const ffi::Map<ffi::String, ffi::Tensor>& inputs) {
  for (const auto& [name, tensor] : inputs) {
    if (std::none_of(whole.inputs.begin(), whole.inputs.end(), [&](const Binding& b) { return b.name == name; })) {
      TVM_FFI_THROW(TvmschedError) << "model " << whole.model_name << " has no input named '" << name << "'";
    }
  }
}

std::vector<std::string> InputNames(const Manifest& manifest) {
  std::vector<std::string> names;
  for (const Binding& b : manifest.inputs) names.push_back(b.name);
  return names;
}

ffi::Map<ffi::String, ffi::Tensor> PartInputs(const std::vector<std::string>& names,
                                              const ffi::Map<ffi::String, ffi::Tensor>& have) {
  ffi::Map<ffi::String, ffi::Tensor> inputs;
  for (const std::string& name : names) {
    auto found = have.find(ffi::String(name));
    if (found != have.end()) inputs.Set((*found).first, (*found).second);
  }
  return inputs;
}

ffi::Map<ffi::String, ffi::Tensor> ModelOutputs(const Manifest& whole, const ffi::Map<ffi::String, ffi::Tensor>& have) {
  ffi::Map<ffi::String, ffi::Tensor> out;
  for (const Binding& b : whole.outputs) out.Set(b.name, have[ffi::String(b.name)]);
  return out;
}

SplitModelObj::SplitModelObj(const std::string& path, std::vector<std::shared_ptr<Device>> devices,
                             const TrustedKeys& trusted) {
  if (devices.size() < 2) TVM_FFI_THROW(TvmschedError) << "a split model needs at least two devices";
  // (its code and weights are loaded by the parts below)
  whole_ = ReadArtifact(path, trusted, /*for_loading=*/false, /*with_weights=*/false).manifest;
  const std::vector<std::pair<int, int>> groups = SplitGroups(whole_, {}, devices.size(), path);
  for (size_t d = 0; d < groups.size(); ++d) {  // (fewer layers than devices: the last devices idle)
    LoadOptions options;
    options.device = devices[d];
    options.layers = groups[d];
    parts_.push_back(Model::Load(path, devices[d]->kind(), options, trusted));
    layers_.push_back(groups[d]);
    reads_.push_back(InputNames(parts_.back()->manifest()));
  }
}

ffi::Map<ffi::String, ffi::Tensor> SplitModelObj::Run(const ffi::Map<ffi::String, ffi::Tensor>& inputs,
                                                      const std::vector<int>& ids) {
  if (!ids.empty() && ids.size() != whole_.layers.size()) {
    TVM_FFI_THROW(TvmschedError) << "a candidate-ID list has one ID per layer: " << ids.size() << " IDs for "
                                 << whole_.layers.size() << " layers";
  }
  CheckInputNames(whole_, inputs);
  std::lock_guard<std::mutex> lock(run_mu_);
  ffi::Map<ffi::String, ffi::Tensor> have = inputs;  // the model's inputs, then each part's outputs
  for (size_t k = 0; k < parts_.size(); ++k) {
    ModelObj& m = *parts_[k].get();
    ffi::Map<ffi::String, ffi::Tensor> in = PartInputs(reads_[k], have);
    m.CheckInputs(in);
    std::vector<int> part_ids;
    if (!ids.empty()) part_ids.assign(ids.begin() + layers_[k].first, ids.begin() + layers_[k].second + 1);
    if (!part_ids.empty()) m.CheckCandidates(part_ids);
    // the device's fault state machine, as a stream's launch goes through it (docs/faults.md): a lost device refuses
    // in one line; a fault here is recovered from, or the device is lost, and the request fails with its line
    Device& device = m.device();
    device.EnterLaunch(kFaultWaitS);
    try {
      m.CopyInputs(in);
      for (int i = 0; i < m.num_layers(); ++i) m.RunLayer(i, part_ids.empty() ? 0 : part_ids[i]);
      m.Synchronize();
    } catch (const ffi::Error& err) {
      device.ExitLaunch();
      std::string lost = device.health() == Device::kFaulted ? device.Recover(kFaultWaitS) : "";
      if (lost.empty()) throw;
      TVM_FFI_THROW(TvmschedError) << err.message() << "; the device is lost: " << lost;
    }
    device.ExitLaunch();
    for (const auto& [name, tensor] : m.GetOutputs()) have.Set(name, tensor);  // (its index checks read too)
  }
  return ModelOutputs(whole_, have);
}

}  // namespace tvmsched
