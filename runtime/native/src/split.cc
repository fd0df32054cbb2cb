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

void CheckSplitLayers(const std::vector<std::pair<int, int>>& groups, int layers, const std::string& path) {
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

ffi::Map<ffi::String, ffi::Tensor> PartInputs(const Model& part, const ffi::Map<ffi::String, ffi::Tensor>& have) {
  ffi::Map<ffi::String, ffi::Tensor> inputs;
  for (const Binding& b : part->manifest().inputs) {
    auto found = have.find(ffi::String(b.name));  // (one missing: the part's CheckInputs names it)
    if (found != have.end()) inputs.Set((*found).first, (*found).second);
  }
  return inputs;
}

SplitModelObj::SplitModelObj(const std::string& path, std::vector<std::shared_ptr<Device>> devices,
                             const TrustedKeys& trusted, const SplitOptions& split) {
  if (devices.size() < 2) TVM_FFI_THROW(TvmschedError) << "a split model needs at least two devices";
  if (!split.scopes.empty() && split.scopes.size() != devices.size()) {
    TVM_FFI_THROW(TvmschedError) << "internal: a split model's memory scopes are one per device";
  }
  const int n = static_cast<int>(devices.size());
  whole_ = ReadArtifact(path, trusted, /*for_loading=*/false).manifest;  // (its code is loaded by the parts below)
  std::vector<std::pair<int, int>> groups = split.groups.empty() ? BalancedLayers(whole_, n) : split.groups;
  if (!split.groups.empty() && static_cast<int>(groups.size()) != n) {
    TVM_FFI_THROW(TvmschedError) << path << ": a split model has a group of layers per device: " << groups.size()
                                 << " groups for " << n << " devices";
  }
  CheckSplitLayers(groups, static_cast<int>(whole_.layers.size()), path);
  if (groups.size() < 2) {
    TVM_FFI_THROW(TvmschedError) << "model " << whole_.model_name << " has one layer: it cannot be split";
  }
  for (size_t d = 0; d < groups.size(); ++d) {  // (fewer layers than devices: the last devices idle)
    LoadOptions options;
    options.device = devices[d];
    options.scope = split.scopes.empty() ? nullptr : split.scopes[d];
    options.layers = groups[d];
    parts_.push_back(Model::Load(path, devices[d]->kind(), options, trusted));
    layers_.push_back(groups[d]);
  }
}

ffi::Map<ffi::String, ffi::Tensor> SplitModelObj::Run(const ffi::Map<ffi::String, ffi::Tensor>& inputs,
                                                      const std::vector<int>& ids) {
  if (!ids.empty() && ids.size() != whole_.layers.size()) {
    TVM_FFI_THROW(TvmschedError) << "a candidate-ID list has one ID per layer: " << ids.size() << " IDs for "
                                 << whole_.layers.size() << " layers";
  }
  for (const auto& [name, tensor] : inputs) {
    if (std::none_of(whole_.inputs.begin(), whole_.inputs.end(), [&](const Binding& b) { return b.name == name; })) {
      TVM_FFI_THROW(TvmschedError) << "model " << whole_.model_name << " has no input named '" << name << "'";
    }
  }
  std::lock_guard<std::mutex> lock(run_mu_);
  ffi::Map<ffi::String, ffi::Tensor> have = inputs;  // the model's inputs, then each part's outputs
  for (size_t k = 0; k < parts_.size(); ++k) {
    ModelObj& m = *parts_[k].get();
    ffi::Map<ffi::String, ffi::Tensor> in = PartInputs(parts_[k], have);
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
  ffi::Map<ffi::String, ffi::Tensor> out;
  for (const Binding& b : whole_.outputs) out.Set(b.name, have[ffi::String(b.name)]);
  return out;
}

}  // namespace tvmsched
