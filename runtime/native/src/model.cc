#include "tvmsched/model.h"

#include <tvm/ffi/error.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace tvmsched {

namespace {

constexpr size_t kAlign = 64;

std::string ShapeText(const int64_t* shape, int ndim) {
  std::ostringstream out;
  out << "(";
  for (int i = 0; i < ndim; ++i) out << (i ? ", " : "") << shape[i];
  out << (ndim == 1 ? ",)" : ")");
  return out.str();
}

/*! \brief An ELF shared object whose headers lie inside the file (a truncated library would SIGBUS). */
void CheckElf(const std::string& bytes) {
  auto fail = [](const char* why) {
    TVM_FFI_THROW(TvmschedError) << "the artifact's kernel library is not loadable: " << why;
  };
  if (bytes.size() < 64 || bytes.compare(0, 4,
                                         "\x7f"
                                         "ELF") != 0)
    fail("not an ELF file");
  if (bytes[4] != 2 || bytes[5] != 1) fail("not a 64-bit little-endian ELF file");
  uint64_t phoff, shoff;
  uint16_t phentsize, phnum, shentsize, shnum;
  std::memcpy(&phoff, bytes.data() + 32, 8);
  std::memcpy(&shoff, bytes.data() + 40, 8);
  std::memcpy(&phentsize, bytes.data() + 54, 2);
  std::memcpy(&phnum, bytes.data() + 56, 2);
  std::memcpy(&shentsize, bytes.data() + 58, 2);
  std::memcpy(&shnum, bytes.data() + 60, 2);
  if (phoff + uint64_t(phentsize) * phnum > bytes.size() || shoff + uint64_t(shentsize) * shnum > bytes.size()) {
    fail("truncated (its headers point past the end of the file)");
  }
  for (uint16_t i = 0; i < phnum; ++i) {  // every loadable segment's file range
    const char* ph = bytes.data() + phoff + uint64_t(i) * phentsize;
    uint32_t type;
    uint64_t offset, filesz;
    std::memcpy(&type, ph, 4);
    std::memcpy(&offset, ph + 8, 8);
    std::memcpy(&filesz, ph + 32, 8);
    if (type == 1 && offset + filesz > bytes.size()) fail("truncated (a segment runs past the end of the file)");
  }
}

/*! \brief Load the kernel library from a private temporary file (dlopen needs a path). */
ffi::Module LoadLibrary(const std::string& bytes) {
  CheckElf(bytes);
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/tvmsched-kernels-XXXXXX.so";
  int fd = mkstemps(path.data(), 3);
  if (fd < 0) TVM_FFI_THROW(TvmschedError) << "cannot write the kernel library to " << path;
  bool written = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  ::close(fd);
  if (!written) {
    ::unlink(path.c_str());
    TVM_FFI_THROW(TvmschedError) << "cannot write the kernel library to " << path;
  }
  try {
    ffi::Module module = ffi::Module::LoadFromFile(path);
    ::unlink(path.c_str());
    return module;
  } catch (const ffi::Error& err) {
    ::unlink(path.c_str());
    std::string text = err.message();
    TVM_FFI_THROW(TvmschedError) << "cannot load the artifact's kernel library: " << text.substr(0, text.find('\n'));
  }
  return ffi::Module(ffi::UnsafeInit{});  // not reached
}

}  // namespace

std::string DTypeName(DLDataType dtype) {
  if (dtype.code == kDLBool) return "bool";
  const char* base = dtype.code == kDLFloat  ? "float"
                     : dtype.code == kDLInt  ? "int"
                     : dtype.code == kDLUInt ? "uint"
                                             : "bfloat";
  return base + std::to_string(dtype.bits);
}

ffi::Tensor EmptyHostTensor(const std::vector<int64_t>& shape, DLDataType dtype) {
  struct HostAlloc {
    void AllocData(DLTensor* t) {
      size_t n = DTypeBytes(t->dtype);
      for (int i = 0; i < t->ndim; ++i) n *= static_cast<size_t>(t->shape[i]);
      t->data = std::aligned_alloc(kAlign, (n + kAlign - 1) / kAlign * kAlign + kAlign);
      if (!t->data) TVM_FFI_THROW(TvmschedError) << "out of host memory";
    }
    void FreeData(DLTensor* t) { std::free(t->data); }
  };
  return ffi::Tensor::FromNDAlloc(HostAlloc(), ffi::ShapeView(shape.data(), shape.size()), dtype, DLDevice{kDLCPU, 0});
}

namespace {

/*! \brief Call a layer's kernel; a kernel refusing its arguments (the manifest does not match the library) is
 *  one TvmschedError line. */
void CallKernel(const ffi::Function& kernel, const std::vector<ffi::AnyView>& views, int index,
                const std::string& func) {
  ffi::Any result;
  try {
    kernel.CallPacked(views.data(), static_cast<int32_t>(views.size()), &result);
  } catch (const ffi::Error& err) {
    if (err.kind() == "TvmschedError") throw;
    std::string message = err.message();
    message = message.substr(0, message.find('\n'));
    TVM_FFI_THROW(TvmschedError) << "layer " << index << " (" << func << ") failed: " << err.kind() << ": "
                                 << message.substr(0, 300)
                                 << " (a manifest that does not match its kernels: corrupt artifact?)";
  }
}

}  // namespace

// ---- Placement: the stream's side, the same for every placement --------------------------------------------------

bool Placement::Acquire(ModelObj* m, int group) {
  if (group < 0) {
    if (m->env_ready()) return true;
  } else {
    GroupState state = m->group_state(group);
    if (state == kLeased) return true;
    if ((state == kReady || state == kFinished) && m->CasGroup(group, state, kLeased)) {
      GroupStarted(m, group);
      return true;
    }
  }
  Demand(m, group);
  return false;
}

void Placement::Release(ModelObj* m, int group, double end_us) {
  if (m->CasGroup(group, kLeased, kFinished)) GroupFinished(m, group, end_us);
}

void Placement::EndRequest(ModelObj* m) {
  for (int g = 0; g < m->num_groups(); ++g) m->CasGroup(g, kLeased, kFinished);  // a failed request's leases
  RequestFinished(m);
}

namespace {

/*! \brief A resident model's placement: everything prepared at load (ModelObj::Init) stays until it is unloaded. */
class Resident final : public Placement {
 public:
  const char* kind() const override { return "resident"; }
  bool on_demand() const override { return false; }
};

}  // namespace

ModelObj::ModelObj(std::shared_ptr<Device> device)
    : device_(std::move(device)), placement_(std::make_shared<Resident>()) {}

namespace {

size_t Align(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

/*! \brief Sub-tasks: consecutive layers grouped by the weight bytes they first read, each group about
 *  twice the one before (docs/switching.md: a small first group starts execution early; doubling keeps
 *  the count logarithmic, so per-group costs stay small). */
std::vector<std::pair<int, int>> GroupLayers(const std::vector<size_t>& layer_weights, int max_groups) {
  int n = static_cast<int>(layer_weights.size());
  max_groups = std::max(1, std::min(max_groups, n));
  size_t total = 0;
  for (size_t w : layer_weights) total += w;
  std::vector<std::pair<int, int>> groups;
  if (max_groups == 1 || total == 0) return {{0, n - 1}};
  double target = static_cast<double>(total) / static_cast<double>((size_t(1) << max_groups) - 1);
  int first = 0;
  size_t acc = 0;
  for (int i = 0; i < n; ++i) {
    acc += layer_weights[i];
    bool last_group = static_cast<int>(groups.size()) == max_groups - 1;
    if (!last_group && i < n - 1 && static_cast<double>(acc) >= target) {
      groups.emplace_back(first, i);
      first = i + 1;
      acc = 0;
      target *= 2;
    }
  }
  groups.emplace_back(first, n - 1);
  return groups;
}

}  // namespace

void ModelObj::Init(const std::string& path, ArtifactContents contents, const LoadOptions& options) {
  manifest_ = std::move(contents.manifest);
  name_ = manifest_.model_name;
  manifest_json_ = std::move(contents.manifest_json);
  kernels_ = std::move(contents.kernels);
  flag_memory_ = options.flag_memory;
  scope_ = options.scope;
  // an asynchronous device's stream keeps launches in flight and re-runs preempted ones: their inputs must outlive
  // that many layers (a stream re-plans a model planned for fewer). Planned so from the start, what a model reports
  // it holds before any stream exists (footprints, memory budgets) is what it holds once served
  if (device_->launches_async() && manifest_.preempt_flags > 1) reuse_distance_ = kDefaultInFlight;
  const int n = num_layers();
  if (n == 0) TVM_FFI_THROW(TvmschedError) << path << " is corrupt: the model has no layers";
  registered_ = !options.resident;
  for (const Binding& b : manifest_.inputs) env_tensors_[b.tensor] = 0;
  for (const Binding& b : manifest_.outputs) env_tensors_[b.tensor] = 0;
  for (const IndexCheckSpec& c : manifest_.index_checks) env_tensors_[c.tensor] = 0;
  for (auto& [id, bytes] : env_tensors_) {  // inputs as they are; outputs and flag words in aligned blocks
    const TensorSpec& spec = manifest_.tensors.at(id);
    bytes = spec.kind == "input" ? spec.nbytes() : Align(spec.nbytes());
    env_bytes_ += bytes;
  }
  if (manifest_.progress_counters) env_bytes_ += sizeof(int32_t) * n;
  // its weights' bytes: the arrays read, or (not read: it reads another model's, or is only measured) the manifest's
  std::map<std::string, size_t> weight_bytes;
  for (const auto& [id, array] : contents.weights) weight_bytes[id] = array.data.size();
  if (!options.read_weights) {
    for (const auto& [id, spec] : manifest_.tensors) {
      if (spec.kind == "weight") weight_bytes[id] = spec.nbytes();
    }
  }
  // sub-tasks: by the weight bytes each layer reads first
  std::vector<size_t> layer_weights(n, 0);
  std::set<std::string> seen;
  for (const LayerSpec& layer : manifest_.layers) {
    for (const auto& id : layer.inputs) {
      if (weight_bytes.count(id) && seen.insert(id).second) layer_weights[layer.index] += weight_bytes.at(id);
    }
  }
  for (const LayerSpec& layer : manifest_.layers) {
    std::vector<std::string> args;
    for (const auto* ids : {&layer.inputs, &layer.outputs}) {
      for (const auto& id : *ids) {
        if (!manifest_.tensors.count(id))
          TVM_FFI_THROW(TvmschedError) << "tensor " << id << " has no storage (corrupt manifest)";
        args.push_back(id);
      }
    }
    layer_arg_ids_.push_back(std::move(args));
  }
  for (const auto& [id, bytes] : weight_bytes) subtasks_.host_weights[id].nbytes = bytes;
  for (auto& [id, array] : contents.weights) {  // resident: copied from here; registered: kept pinned
    SubTasks::HostWeight& host = subtasks_.host_weights[id];
    if (!options.resident && !options.tiers && !options.measure_only) {
      host.data = device_->AllocHost(host.nbytes);
      std::memcpy(host.data, array.data.data(), host.nbytes);
      array.data.clear();
      array.data.shrink_to_fit();
    }
  }
  if (options.measure_only) {  // laid out as registered: its footprint, nothing held
    SetGroups(GroupLayers(layer_weights, std::max(1, options.max_groups)));
    return;
  }
  if (!options.tiers) SetGroups(GroupLayers(layer_weights, options.resident ? 1 : options.max_groups));
  // the layers' packed arguments (data pointers bound as tensors are allocated), built once
  DLDevice dev = device_->dl_device();
  layer_args_.clear();
  for (int i = 0; i < n; ++i) {
    std::vector<DLTensor> args;
    for (const auto& id : layer_arg_ids_[i]) {
      const TensorSpec& spec = manifest_.tensors.at(id);
      args.push_back(DLTensor{nullptr, dev, static_cast<int32_t>(spec.shape.size()), spec.dtype,
                              const_cast<int64_t*>(spec.shape.data()), nullptr, 0});
    }
    static int64_t one = 1;
    if (manifest_.preempt_flags > 1) {
      args.push_back(
          DLTensor{nullptr, dev, 1, DLDataType{kDLInt, 32, 1}, const_cast<int64_t*>(&flags_.length), nullptr, 0});
    }
    if (manifest_.progress_counters)
      args.push_back(DLTensor{nullptr, dev, 1, DLDataType{kDLInt, 32, 1}, &one, nullptr, 0});
    layer_args_.push_back(std::move(args));
  }
  for (std::vector<DLTensor>& args : layer_args_) {
    std::vector<ffi::AnyView>& views = layer_views_.emplace_back();
    for (DLTensor& arg : args) views.emplace_back(&arg);
  }
  if (options.tiers) return InitStreamed(*this, path, contents, *options.tiers);
  if (!options.resident) return;
  const ModelObj* owner = options.shares_weights_of.as<ModelObj>();
  if (owner && (registered_ || !owner->resident() || owner->registered_ || owner->tiered())) {
    TVM_FFI_THROW(TvmschedError) << "internal: weights are shared only between resident models";
  }
  if (owner) weights_owner_ = options.shares_weights_of;
  PrepareEnvironment();
  try {
    for (int g = 0; g < num_groups(); ++g) {
      for (const auto& id : subtasks_.tensors(g)) {  // copy straight from the artifact's bytes
        if (!subtasks_.is_weight(id) || tensor_data_.count(id)) continue;
        if (owner) {  // another stream's or batch size's model of the artifact holds it: read there
          auto held = owner->tensor_data_.find(id);
          auto host = owner->subtasks_.host_weights.find(id);
          if (held != owner->tensor_data_.end() && host != owner->subtasks_.host_weights.end() &&
              host->second.nbytes == weight_bytes.at(id)) {
            tensor_data_[id] = held->second;
            borrowed_.insert(id);
            continue;
          }
        }
        auto read = contents.weights.find(id);
        if (read == contents.weights.end()) {
          TVM_FFI_THROW(TvmschedError) << "internal: weight " << id << " is neither read nor held by the model whose "
                                       << "weights this one reads";
        }
        const std::string& bytes = read->second.data;
        void* data = AllocFor("weight " + id, bytes.size());
        tensor_data_[id] = data;
        device_->CopyToDevice(data, bytes.data(), bytes.size(), nullptr);
      }
      PrepareGroup(g, nullptr);
      SetGroupState(g, kReady);
    }
  } catch (...) {
    FreeDeviceMemory();
    throw;
  }
}

void ModelObj::FreeDeviceMemory() {
  for (int g = 0; g < num_groups(); ++g) FreeGroupBlocks(g);
  for (auto& [id, data] : tensor_data_) {
    if (!borrowed_.count(id)) device_->Release(data);
  }
  tensor_data_.clear();
  borrowed_.clear();
  CleanEnvironment();
}

void ModelObj::SetGroups(std::vector<std::pair<int, int>> groups, bool shared_activations) {
  subtasks_.Set(manifest_, layer_arg_ids_, env_tensors_, std::move(groups), shared_activations, reuse_distance_);
}

ModelObj::~ModelObj() {
  placement_->Detach();  // a streamer stops before what it copies into goes
  try {
    Synchronize();
  } catch (...) {  // a failed device: free what can be freed
  }
  FreeDeviceMemory();
  for (auto& [id, host] : subtasks_.host_weights) {
    if (host.data) device_->FreeHost(host.data);
  }
}

FlagMemory ModelObj::FlagMemoryFor() const {
  if (flag_memory_ != FlagMemory::kAuto) return flag_memory_;
  for (const LayerSpec& layer : manifest_.layers) {
    for (const CandidateSpec& spec : layer.candidates) {
      if (spec.loop_checks) return FlagMemory::kDevice;
    }
  }
  return FlagMemory::kAuto;
}

Model Model::Load(const std::string& path, const std::string& device, FlagMemory flag_memory,
                  const TrustedKeys& trusted) {
  LoadOptions options;
  options.flag_memory = flag_memory;
  return Load(path, device, options, trusted);
}

Model Model::Load(const std::string& path, const std::string& device, const LoadOptions& options,
                  const TrustedKeys& trusted) {
  // (a split model's part, of the program's one size: only the weights of its layers are parsed)
  ArtifactContents contents =
      ReadArtifact(path, trusted, /*for_loading=*/!options.measure_only,
                   /*with_weights=*/options.read_weights, options.batch > 0 ? std::pair{-1, -1} : options.layers);
  if (options.batch > 0) SelectBatch(&contents, options.batch, path);
  if (options.layers.first >= 0) CutLayers(&contents, options.layers.first, options.layers.second, path);
  const std::string& compiled_for = contents.manifest.device;
  if (!device.empty() && device != compiled_for) {
    TVM_FFI_THROW(TvmschedError) << "the artifact was compiled for " << compiled_for << ", not " << device;
  }
  CheckCpuFeatures(contents.manifest, path);  // before its kernels.so (host code included) is loaded
  if (options.device && compiled_for != options.device->kind()) {
    TVM_FFI_THROW(TvmschedError) << "the artifact was compiled for " << compiled_for << ", not "
                                 << options.device->kind();
  }
  auto obj = ffi::make_object<ModelObj>(options.device ? options.device : OpenDevice(compiled_for));
  obj->Init(path, std::move(contents), options);
  return Model(obj);
}

void* ModelObj::AllocFor(const std::string& what, size_t nbytes) {
  return device_->Allocate(nbytes, "cannot load model " + name_ + ": " + what, scope_);
}

void* ModelObj::AllocTensor(const std::string& id, const std::string& what, size_t nbytes) {
  void* data = AllocFor(what, nbytes);
  tensor_data_[id] = data;
  return data;
}

bool ModelObj::resident() const {
  if (!env_ready()) return false;
  for (int g = 0; g < num_groups(); ++g) {
    if (group_state(g) < kReady) return false;
  }
  return true;
}

void ModelObj::PrepareEnvironment() {
  if (env_ready()) return;
  device_->SetThreadUnits(0);
  try {
    library_ = LoadLibrary(kernels_);
    std::set<int> units;
    for (const LayerSpec& layer : manifest_.layers) {
      std::vector<Candidate> cands;
      for (const CandidateSpec& spec : layer.candidates) {
        auto kernel = library_.value()->GetFunction(ffi::String(spec.kernel), true);
        if (!kernel.has_value())
          TVM_FFI_THROW(TvmschedError) << "model " << name() << " is corrupt: kernel " << spec.kernel << " is missing";
        Candidate cand;
        cand.kernel = *kernel;
        // one encoding: an explicit unit count; all units where the manifest says none (0) and for
        // grid-limited kernels, which restrict themselves
        int all = device_->total_units();
        cand.units = spec.mechanism == "grid_limit" || spec.units <= 0 ? all : std::min(spec.units, all);
        units.insert(cand.units);
        cands.push_back(std::move(cand));
      }
      candidates_.push_back(std::move(cands));
    }
    for (int u : units) StreamFor(u);  // every stream a launch may use, created before any launch
    for (const auto& [id, bytes] : env_tensors_) {
      env_data_[id] = AllocFor((manifest_.tensors.at(id).kind == "input" ? "input " : "output ") + id, bytes);
    }
    if (manifest_.preempt_flags > 1) flags_ = device_->AllocFlags(manifest_.preempt_flags, FlagMemoryFor());
    if (manifest_.progress_counters) {
      counters_ = static_cast<int32_t*>(AllocFor("progress counters", sizeof(int32_t) * num_layers()));
      ResetProgress();
    }
  } catch (...) {
    CleanEnvironment();
    throw;
  }
  for (int i = 0; i < num_layers(); ++i) {
    size_t k = layer_arg_ids_[i].size();
    for (size_t a = 0; a < k; ++a) {
      auto found = env_data_.find(layer_arg_ids_[i][a]);
      if (found != env_data_.end()) layer_args_[i][a].data = found->second;
    }
    if (flags_.length) layer_args_[i][k++].data = flags_.device_ptr;
    if (counters_) layer_args_[i][k].data = counters_ + i;
  }
  env_ready_.store(true, std::memory_order_release);
}

void ModelObj::CleanEnvironment() {
  env_ready_.store(false, std::memory_order_release);
  for (auto& [id, data] : env_data_) device_->Release(data);
  env_data_.clear();
  if (flags_.length) device_->FreeFlags(flags_);
  flags_ = FlagArray();
  if (counters_) device_->Release(counters_);
  counters_ = nullptr;
  for (auto& [units, stream] : streams_) device_->DestroyStream(stream);
  streams_.clear();
  current_stream_ = nullptr;
  candidates_.clear();
  library_ = std::nullopt;
}

size_t ModelObj::GroupNeed(int g) const {
  size_t bytes = 0;
  for (size_t b : subtasks_.plan(g).storage_bytes) bytes += b;
  for (const auto& id : subtasks_.tensors(g)) {
    if (subtasks_.internal(id) || tensor_data_.count(id)) continue;
    bytes += subtasks_.TensorBytes(id);
  }
  return bytes;
}

void ModelObj::FreeGroupBlocks(int g) {
  for (void* block : subtasks_.blocks(g)) device_->Release(block);
  subtasks_.blocks(g).clear();
  for (const auto& [id, block] : subtasks_.plan(g).assignment) tensor_data_.erase(id);
}

void ModelObj::BindLayer(int i, const std::map<std::string, void*>* placed) {
  for (size_t a = 0; a < layer_arg_ids_[i].size(); ++a) {
    const std::string& id = layer_arg_ids_[i][a];
    const auto& where = placed && placed->count(id) ? *placed : env_tensors_.count(id) ? env_data_ : tensor_data_;
    auto found = where.find(id);
    if (found != where.end()) {
      layer_args_[i][a].data = found->second;
    } else if (!placed_.count(id)) {  // a placed tensor keeps what its placement bound last
      layer_args_[i][a].data = nullptr;
    }
  }
}

void ModelObj::BindLayers(int first, int last, const std::vector<std::pair<std::string, void*>>& placed) {
  std::map<std::string, void*> data(placed.begin(), placed.end());
  for (int i = first; i <= last; ++i) BindLayer(i, &data);
}

void ModelObj::PrepareGroup(int g, StreamHandle copy_stream) {
  std::vector<std::string> fresh;  // allocated here: freed again if a later step fails
  try {
    for (const auto& id : subtasks_.tensors(g)) {
      if (subtasks_.internal(id) || tensor_data_.count(id) || placed_.count(id)) continue;
      auto host = subtasks_.host_weights.find(id);
      if (host != subtasks_.host_weights.end()) {
        if (!host->second.data) TVM_FFI_THROW(TvmschedError) << "internal: weight " << id << " has no host copy";
        void* data = AllocFor("weight " + id, host->second.nbytes);
        tensor_data_[id] = data;
        fresh.push_back(id);
        device_->CopyToDevice(data, host->second.data, host->second.nbytes, copy_stream);
      } else {
        tensor_data_[id] = AllocFor("the activation " + id, subtasks_.TensorBytes(id));
        fresh.push_back(id);
      }
    }
    const MemoryPlan& plan = subtasks_.plan(g);
    std::vector<void*>& blocks = subtasks_.blocks(g);
    std::vector<std::string> held(plan.storage_bytes.size());  // per block, its tensors (named if it cannot be had)
    for (const auto& [id, block] : plan.assignment) held[block] += (held[block].empty() ? "" : ", ") + id;
    for (size_t block = 0; block < plan.storage_bytes.size(); ++block) {
      blocks.push_back(AllocFor("the activation block of " + held[block], plan.storage_bytes[block]));
    }
    for (const auto& [id, block] : plan.assignment) tensor_data_[id] = blocks[block];
    if (copy_stream) device_->SyncStream(copy_stream);
  } catch (...) {
    FreeGroupBlocks(g);
    for (const auto& id : fresh) {
      device_->Release(tensor_data_.at(id));
      tensor_data_.erase(id);
    }
    throw;
  }
  BindGroup(g);
}

void* ModelObj::TensorData(const std::string& id) const {
  if (auto found = env_data_.find(id); found != env_data_.end()) return found->second;
  auto found = tensor_data_.find(id);
  return found == tensor_data_.end() ? nullptr : found->second;
}

void ModelObj::BindGroup(int g) {
  // shared activations: group 0's blocks hold every layer's
  bool all = subtasks_.shared_activations() && g == 0;
  int first = all ? 0 : subtasks_.layers(g).first;
  int last = all ? num_layers() - 1 : subtasks_.layers(g).second;
  for (int i = first; i <= last; ++i) BindLayer(i);
}

void ModelObj::CleanGroup(int g, const std::vector<bool>& pending) {
  FreeGroupBlocks(g);
  for (const auto& id : subtasks_.tensors(g)) {
    auto found = tensor_data_.find(id);
    if (subtasks_.internal(id) || found == tensor_data_.end()) continue;
    bool weight = subtasks_.is_weight(id);
    bool needed = false;
    for (int h : subtasks_.users(id)) {
      // an activation stays while a group the running request has still to run reads it, this one included: a
      // finished copy of g left by the last request may be cleaned while the running request has yet to run g
      if ((h != g && group_state(h) != kAbsent) || (!weight && pending[h])) needed = true;
    }
    if (needed) continue;
    device_->Release(found->second);
    tensor_data_.erase(found);
  }
  for (int i = subtasks_.layers(g).first; i <= subtasks_.layers(g).second; ++i) BindLayer(i);
}

void ModelObj::AddUser() {
  std::lock_guard<std::mutex> lock(env_mu_);
  users.fetch_add(1);
}

bool ModelObj::TryCleanEnvironment() {
  std::lock_guard<std::mutex> lock(env_mu_);
  if (users.load() > 0) return false;
  for (int g = 0; g < num_groups(); ++g) {
    if (group_state(g) != kAbsent) return false;
  }
  CleanEnvironment();
  return true;
}

bool ModelObj::TryFreeDeviceMemory() {
  std::lock_guard<std::mutex> lock(env_mu_);  // AddUser takes it: no request starts while the memory goes
  if (users.load() > 0) return false;
  for (int g = 0; g < num_groups(); ++g) SetGroupState(g, kAbsent);
  FreeDeviceMemory();
  return true;
}

std::string ModelObj::placement_error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return placement_error_;
}

void ModelObj::SetPlacementError(const std::string& error) {
  std::lock_guard<std::mutex> lock(error_mu_);
  placement_error_ = error;
}

void ModelObj::SetWaker(std::function<void()> waker) {
  std::lock_guard<std::mutex> lock(waker_mu_);
  waker_ = std::move(waker);
}

void ModelObj::Wake() {
  std::lock_guard<std::mutex> lock(waker_mu_);
  if (waker_) waker_();
}

void ModelObj::SetStreamPriority(StreamPriority priority) {
  std::lock_guard<std::mutex> lock(env_mu_);  // its streams go: not while its switcher cleans its environment
  if (priority == stream_priority_) return;
  Synchronize();
  for (auto& [units, stream] : streams_) device_->DestroyStream(stream);
  streams_.clear();
  current_stream_ = nullptr;
  stream_priority_ = priority;
}

void ModelObj::Replan(int reuse_distance) {
  if (reuse_distance < 1) TVM_FFI_THROW(TvmschedError) << "reuse distance must be at least 1";
  Synchronize();
  reuse_distance_ = reuse_distance;
  for (int g = 0; g < num_groups(); ++g) {
    std::vector<void*>& blocks = subtasks_.blocks(g);
    bool prepared = !blocks.empty() || group_state(g) >= kHeld;
    FreeGroupBlocks(g);
    subtasks_.Plan(g, reuse_distance_);
    if (!prepared) continue;
    const MemoryPlan& plan = subtasks_.plan(g);
    for (size_t block = 0; block < plan.storage_bytes.size(); ++block) {
      blocks.push_back(AllocFor("an activation block", plan.storage_bytes[block]));
    }
    for (const auto& [id, block] : plan.assignment) tensor_data_[id] = blocks[block];
    BindGroup(g);
  }
}

void ModelObj::CheckInputs(const ffi::Map<ffi::String, ffi::Tensor>& inputs, int64_t* rows) const {
  std::set<std::string> expected, given, unknown, missing;
  for (const Binding& b : manifest_.inputs) expected.insert(b.name);
  for (const auto& kv : inputs) given.insert(std::string(kv.first));
  std::set_difference(given.begin(), given.end(), expected.begin(), expected.end(),
                      std::inserter(unknown, unknown.end()));
  std::set_difference(expected.begin(), expected.end(), given.begin(), given.end(),
                      std::inserter(missing, missing.end()));
  auto list = [](const std::set<std::string>& names) {
    std::string out = "[";
    for (const auto& n : names) out += (out.size() > 1 ? ", '" : "'") + n + "'";
    return out + "]";
  };
  if (!unknown.empty() || !missing.empty()) {
    TVM_FFI_THROW(TvmschedError) << "input names do not match the model: unknown " << list(unknown) << ", missing "
                                 << list(missing) << "; expected " << list(expected);
  }
  for (const Binding& b : manifest_.inputs) {
    const TensorSpec& spec = manifest_.tensors.at(b.tensor);
    ffi::Tensor value = inputs[ffi::String(b.name)];
    const DLTensor* t = value.GetDLTensorPtr();
    bool same_shape =
        t->ndim == static_cast<int>(spec.shape.size()) && std::equal(spec.shape.begin(), spec.shape.end(), t->shape);
    if (rows && batch_size() > 0 && t->ndim == static_cast<int>(spec.shape.size()) && t->ndim > 0 &&
        std::equal(spec.shape.begin() + 1, spec.shape.end(), t->shape + 1)) {  // a part of a batch: its rows
      if (t->shape[0] < 1 || t->shape[0] > batch_size()) {
        TVM_FFI_THROW(TvmschedError) << "input '" << b.name << "' has " << t->shape[0] << " rows: the model takes 1 to "
                                     << batch_size() << " rows per request (max_batch_size)";
      }
      if (*rows > 0 && t->shape[0] != *rows) {
        TVM_FFI_THROW(TvmschedError) << "the inputs' batch dimensions disagree: input '" << b.name << "' has "
                                     << t->shape[0] << " rows, another " << *rows;
      }
      *rows = t->shape[0];
      same_shape = true;
    }
    if (!same_shape) {
      TVM_FFI_THROW(TvmschedError) << "input '" << b.name << "' has shape " << ShapeText(t->shape, t->ndim)
                                   << ", expected "
                                   << ShapeText(spec.shape.data(), static_cast<int>(spec.shape.size()));
    }
    if (t->dtype.code != spec.dtype.code || t->dtype.bits != spec.dtype.bits || t->dtype.lanes != 1) {
      TVM_FFI_THROW(TvmschedError) << "input '" << b.name << "' has dtype " << DTypeName(t->dtype) << ", expected "
                                   << spec.dtype_name;
    }
    if (t->device.device_type != kDLCPU || !value.IsContiguous()) {
      TVM_FFI_THROW(TvmschedError) << "input '" << b.name << "' must be a contiguous host array";
    }
  }
}

void ModelObj::CheckCandidates(const std::vector<int>& ids) const {
  bool ok = ids.size() == manifest_.layers.size();
  for (size_t i = 0; ok && i < ids.size(); ++i)
    ok = ids[i] >= 0 && ids[i] < static_cast<int>(manifest_.layers[i].candidates.size());
  if (!ok) {
    std::ostringstream text;
    text << "[";
    for (size_t i = 0; i < ids.size(); ++i) text << (i ? ", " : "") << ids[i];
    TVM_FFI_THROW(TvmschedError) << "candidate ids " << text.str() << "] do not match the model's "
                                 << manifest_.layers.size() << " layers and their candidates";
  }
}

void ModelObj::SetInputs(const ffi::Map<ffi::String, ffi::Tensor>& inputs) {
  CheckInputs(inputs);
  CopyInputs(inputs);
}

void ModelObj::CopyInputs(const ffi::Map<ffi::String, ffi::Tensor>& inputs) {
  for (const Binding& b : manifest_.inputs) {
    const DLTensor* t = inputs[ffi::String(b.name)].GetDLTensorPtr();
    device_->CopyToDevice(env_data_.at(b.tensor), static_cast<const char*>(t->data) + t->byte_offset,
                          manifest_.tensors.at(b.tensor).nbytes(), current_stream_);
  }
}

StreamHandle ModelObj::StreamFor(int units) {
  if (!device_->launches_async()) return nullptr;  // synchronous launches: no streams to order
  units = std::min(units, device_->total_units());
  auto found = streams_.find(units);
  if (found == streams_.end())
    found = streams_.emplace(units, device_->CreateStream(units, nullptr, stream_priority_)).first;
  return found->second;
}

void ModelObj::RunLayer(int index, int candidate) {
  if (index < 0 || index >= num_layers() || candidate < 0 || candidate >= static_cast<int>(candidates_[index].size())) {
    TVM_FFI_THROW(TvmschedError) << "no layer " << index << " with candidate " << candidate;
  }
  if (group_state(subtasks_.group_of(index)) < kReady || !env_ready()) {
    TVM_FFI_THROW(TvmschedError) << "model " << name() << " is not resident (layer " << index
                                 << "'s sub-task is not prepared)";
  }
  if (inject_fault_layer_.load(std::memory_order_relaxed) == index && inject_fault_layer_.exchange(-1) == index) {
    std::string text = "an injected fault (tvmsched.engine.inject_fault)";
    device_->ReportFault(text);  // as a sticky CUDA error would: every launch of the device is void until recovered
    TVM_FFI_THROW(TvmschedError) << text;
  }
  Candidate& cand = candidates_[index][candidate];
  StreamHandle stream = StreamFor(cand.units);
  device_->SetThreadUnits(cand.units);
  if (stream != current_stream_) {  // layers stay in order across streams of different units
    device_->StreamWaitStream(stream, current_stream_);
    current_stream_ = stream;
  }
  device_->UseStream(stream);
  if (stream && device_->host_queues()) {  // the device's thread runs it later: its arguments as bound now
    device_->Enqueue(stream, [kernel = cand.kernel, args = layer_args_[index], index,
                              func = &manifest_.layers[index].func]() mutable {
      std::vector<ffi::AnyView> views;
      views.reserve(args.size());
      for (DLTensor& arg : args) views.emplace_back(&arg);
      CallKernel(kernel, views, index, *func);
    });
    return;
  }
  CallKernel(cand.kernel, layer_views_[index], index, manifest_.layers[index].func);
}

void ModelObj::RunLayers(const std::vector<int>& ids) {
  if (!ids.empty()) CheckCandidates(ids);
  for (int i = 0; i < num_layers(); ++i) RunLayer(i, ids.empty() ? 0 : ids[i]);
}

void ModelObj::Synchronize() {
  for (auto& [units, stream] : streams_) device_->SyncStream(stream);
}

EventHandle ModelObj::RecordEvent() { return current_stream_ ? device_->RecordEvent(current_stream_) : nullptr; }

ffi::Map<ffi::String, ffi::Tensor> ModelObj::GetOutputs() {
  Synchronize();
  std::map<std::string, int32_t> words;  // one copy per flag word (31 checks a word)
  for (const IndexCheckSpec& check :
       manifest_.index_checks) {  // the outputs of a run that indexed out of range are void
    auto [at, fresh] = words.try_emplace(check.tensor, 0);
    if (fresh) device_->CopyToHost(&at->second, env_data_.at(check.tensor), sizeof(int32_t), nullptr);
    if (at->second >> check.bit & 1) TVM_FFI_THROW(TvmschedError) << "index out of range: " << check.message;
  }
  ffi::Map<ffi::String, ffi::Tensor> out;
  for (const Binding& b : manifest_.outputs) {
    const TensorSpec& spec = manifest_.tensors.at(b.tensor);
    ffi::Tensor host = EmptyHostTensor(spec.shape, spec.dtype);
    device_->CopyToHost(host.data_ptr(), env_data_.at(b.tensor), spec.nbytes(), nullptr);
    out.Set(ffi::String(b.name), host);
  }
  return out;
}

void ModelObj::SetPreemptFlag(bool on) {
  if (flags_.length) device_->SetFlags(flags_, on ? 1 : 0, flags_.length - 1);
}

bool ModelObj::preempt_flag_set() const {
  if (!flags_.length) return false;
  if (flags_.host_ptr) return __atomic_load_n(flags_.host_ptr, __ATOMIC_SEQ_CST) != 0;
  int32_t value = 0;
  device_->ReadWhileRunning(&value, flags_.device_ptr, sizeof(value));
  return value != 0;
}

void ModelObj::ClearStarted() {
  if (flags_.host_ptr) __atomic_store_n(flags_.host_ptr + flags_.length - 1, 0, __ATOMIC_SEQ_CST);
}

std::string ModelObj::RecordFault(int limit, double window_s) {
  std::lock_guard<std::mutex> lock(fault_mu_);
  double now = Device::NowMicros();
  fault_us_.push_back(now);
  while (!fault_us_.empty() && now - fault_us_.front() > window_s * 1e6) fault_us_.pop_front();
  if (limit > 0 && static_cast<int>(fault_us_.size()) >= limit && quarantined_.empty()) {
    std::ostringstream text;
    text << "model " << name() << " is quarantined: " << fault_us_.size() << " device faults within " << window_s
         << " s (load it again to retry)";
    quarantined_ = text.str();
  }
  return quarantined_;
}

std::string ModelObj::quarantined() const {
  std::lock_guard<std::mutex> lock(fault_mu_);
  return quarantined_;
}

bool ModelObj::started() const {
  return flags_.host_ptr && __atomic_load_n(flags_.host_ptr + flags_.length - 1, __ATOMIC_SEQ_CST) != 0;
}

void ModelObj::ResetProgress() {
  if (counters_) device_->MemsetD32(counters_, 0, manifest_.layers.size());
}

std::vector<int32_t> ModelObj::ReadCounters() const {
  std::vector<int32_t> out(manifest_.layers.size(), 0);
  if (counters_) device_->ReadWhileRunning(out.data(), counters_, sizeof(int32_t) * out.size());
  return out;
}

std::vector<int64_t> ModelObj::CompletedBlocks(const std::vector<int>& ids) const {
  std::vector<int32_t> counts = ReadCounters();
  std::vector<int64_t> out;
  for (size_t i = 0; i < counts.size(); ++i) {
    int c = ids.empty() ? 0 : ids[i];
    out.push_back(counts[i] / manifest_.layers[i].candidates[c].threads);
  }
  return out;
}

}  // namespace tvmsched
