// A model split across devices (tvmsched/split.h, docs/multi-device.md): each device prepares only its own group of
// layers; the activations crossing devices go through the devices' copies, behind an event.
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

SplitModelObj::SplitModelObj(const std::string& path, std::vector<std::shared_ptr<Device>> devices,
                             const TrustedKeys& trusted, const SplitOptions& split) {
  if (devices.size() < 2) TVM_FFI_THROW(TvmschedError) << "a split model needs at least two devices";
  if (!split.scopes.empty() && split.scopes.size() != devices.size()) {
    TVM_FFI_THROW(TvmschedError) << "internal: a split model's memory scopes are one per device";
  }
  const int n = static_cast<int>(devices.size());
  std::vector<std::pair<int, int>> groups = split.groups;
  if (!groups.empty() && static_cast<int>(groups.size()) != n) {
    TVM_FFI_THROW(TvmschedError) << path << ": a split model has a group of layers per device: " << groups.size()
                                 << " groups for " << n << " devices";
  }
  for (int d = 0; d < n; ++d) {
    LoadOptions options;
    options.resident = false;  // registered: its groups are prepared below, this device's only
    options.device = devices[d];
    options.scope = split.scopes.empty() ? nullptr : split.scopes[d];
    options.groups = groups;  // (none given: the first device's load lays them out from its manifest)
    Model m = Model::Load(path, devices[d]->kind(), options, trusted);
    if (groups.empty()) {
      groups = BalancedLayers(m->manifest(), n);
      m->SetGroups(groups);
    }
    if (d >= static_cast<int>(groups.size())) break;  // fewer layers than devices: the last ones idle
    parts_.push_back(m);
  }
  if (parts_.size() < 2) {
    TVM_FFI_THROW(TvmschedError) << "model " << parts_[0]->name() << " has one layer: it cannot be split";
  }
  const Manifest& manifest = parts_[0]->manifest();
  std::vector<int> part_of(manifest.layers.size(), 0);
  std::map<std::string, int> written_by;  // tensor -> the part whose layer writes it
  for (int k = 0; k < static_cast<int>(parts_.size()); ++k) {
    Model& m = parts_[k];
    auto [first, last] = m->group_layers(k);
    layers_.emplace_back(first, last);
    m->PrepareEnvironment();
    m->PrepareGroup(k, nullptr);
    m->SetGroupState(k, kReady);
    for (int i = first; i <= last; ++i) {
      part_of[i] = k;
      for (const std::string& out : manifest.layers[i].outputs) written_by[out] = k;
    }
  }
  needs_.resize(parts_.size());
  size_t largest = 0;
  for (int k = 1; k < static_cast<int>(parts_.size()); ++k) {
    for (int i = layers_[k].first; i <= layers_[k].second; ++i) {
      for (const std::string& in : manifest.layers[i].inputs) {
        auto writer = written_by.find(in);
        if (writer == written_by.end() || writer->second == k) continue;  // a weight, an input, or its own
        auto& needs = needs_[k];
        if (std::any_of(needs.begin(), needs.end(), [&](const Crossing& c) { return c.tensor == in; })) continue;
        if (!parts_[writer->second]->TensorData(in) || !parts_[k]->TensorData(in)) {
          TVM_FFI_THROW(TvmschedError) << "internal: the activation " << in << " crossing devices has no memory";
        }
        needs.push_back({in, writer->second, manifest.tensors.at(in).nbytes()});
        largest = std::max(largest, needs.back().nbytes);
      }
    }
  }
  host_.resize(largest);
  for (const Binding& b : manifest.outputs) {
    auto writer = written_by.find(b.tensor);
    output_from_.push_back(writer == written_by.end() ? 0 : writer->second);
  }
}

size_t SplitModelObj::crossing_bytes() const {
  size_t all = 0;
  for (const auto& needs : needs_) {
    for (const Crossing& c : needs) all += c.nbytes;
  }
  return all;
}

ffi::Map<ffi::String, ffi::Tensor> SplitModelObj::Run(const ffi::Map<ffi::String, ffi::Tensor>& inputs,
                                                      const std::vector<int>& ids) {
  parts_[0]->CheckInputs(inputs);
  if (!ids.empty()) parts_[0]->CheckCandidates(ids);
  std::lock_guard<std::mutex> lock(run_mu_);
  for (size_t k = 0; k < parts_.size(); ++k) {
    ModelObj& m = *parts_[k].get();
    m.CopyInputs(inputs);                  // (a later group may read an input too)
    for (const Crossing& c : needs_[k]) {  // the earlier devices' activations, through the host
      parts_[c.from]->device().CopyToHost(host_.data(), parts_[c.from]->TensorData(c.tensor), c.nbytes, nullptr);
      m.device().CopyToDevice(m.TensorData(c.tensor), host_.data(), c.nbytes, nullptr);
    }
    // the device's fault state machine, as a stream's launch goes through it (docs/faults.md): a lost device refuses
    // in one line; a fault here is recovered from, or the device is lost, and the request fails with its line
    Device& device = m.device();
    device.EnterLaunch(kFaultWaitS);
    try {
      for (int i = layers_[k].first; i <= layers_[k].second; ++i) m.RunLayer(i, ids.empty() ? 0 : ids[i]);
      if (EventHandle done = m.RecordEvent()) {  // the next device copies once this one's launches are done
        device.WaitEvent(done);
        device.FreeEvent(done);
      }
      m.Synchronize();
    } catch (const ffi::Error& err) {
      device.ExitLaunch();
      std::string lost = device.health() == Device::kFaulted ? device.Recover(kFaultWaitS) : "";
      if (lost.empty()) throw;
      TVM_FFI_THROW(TvmschedError) << err.message() << "; the device is lost: " << lost;
    }
    device.ExitLaunch();
  }
  std::vector<ffi::Map<ffi::String, ffi::Tensor>> outputs;
  for (Model& m : parts_) outputs.push_back(m->GetOutputs());  // (each device's index checks too)
  ffi::Map<ffi::String, ffi::Tensor> out;
  const Manifest& manifest = parts_[0]->manifest();
  for (size_t o = 0; o < manifest.outputs.size(); ++o) {
    const std::string& name = manifest.outputs[o].name;
    out.Set(name, outputs[output_from_[o]][ffi::String(name)]);
  }
  return out;
}

}  // namespace tvmsched
