// Mechanism D, the execution side (tvmsched/tiering.h): the host tiers of a model's streamed weights
// and the streamer thread that double-buffers them into the device ahead of their layers.
#include "tvmsched/tiering.h"

#include <fcntl.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <tvm/ffi/error.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "error_line.h"

namespace tvmsched {

namespace {

std::string Bytes(size_t n) {
  std::ostringstream out;
  out.precision(3);
  if (n >= (size_t(1) << 30)) {
    out << static_cast<double>(n) / (1 << 30) << " GiB";
  } else if (n >= (size_t(1) << 20)) {
    out << static_cast<double>(n) / (1 << 20) << " MiB";
  } else {
    out << n << " bytes";
  }
  return out.str();
}

/*! \brief An unnamed file in `dir` (removed by the kernel when its last descriptor closes, even if the
 *  process is killed): O_TMPFILE, else a unique name unlinked at once. */
int OpenUnnamedFile(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  std::string path = dir + "/tvmsched-weights-XXXXXX";
  fd = ::mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0)
    TVM_FFI_THROW(TvmschedError) << "cannot create the disk tier's weight file in " << dir << ": "
                                 << std::strerror(errno);
  ::unlink(path.c_str());
  return fd;
}

void WriteAll(int fd, const char* data, size_t n, int64_t offset, const std::string& dir) {
  while (n > 0) {
    ssize_t wrote = ::pwrite(fd, data, n, offset);
    if (wrote <= 0) {
      TVM_FFI_THROW(TvmschedError) << "cannot write the disk tier's weight file in " << dir << ": "
                                   << (wrote < 0 ? std::strerror(errno) : "nothing written");
    }
    data += wrote, n -= static_cast<size_t>(wrote), offset += wrote;
  }
}

}  // namespace

void BindToNode(void* addr, size_t nbytes, int node) {
  constexpr int kMaxNodes = 1024;
  if (node < 0 || node >= kMaxNodes) TVM_FFI_THROW(TvmschedError) << "NUMA node " << node << " is out of range";
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {0};
  mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, addr, nbytes, MPOL_BIND, mask, kMaxNodes + 1, 0) != 0) {
    TVM_FFI_THROW(TvmschedError) << "cannot bind " << Bytes(nbytes) << " to NUMA node " << node << ": "
                                 << std::strerror(errno) << " (is the node online and does it have memory?)";
  }
}

TierStore::TierStore(std::shared_ptr<Device> device, const std::vector<TierShare>& tiers,
                     const std::vector<std::pair<std::string, const std::string*>>& weights, const std::string& model)
    : device_(std::move(device)),
      tiers_(tiers),
      used_(tiers.size(), 0),
      regions_(tiers.size()),
      host_memory_(device_->host_memory()) {
  for (const TierShare& tier : tiers_) {
    if (tier.kind != "dram" && tier.kind != "cxl" && tier.kind != "disk") {
      TVM_FFI_THROW(TvmschedError) << "unknown memory tier " << tier.kind << " (dram, cxl or disk)";
    }
    if (tier.kind == "disk" && tier.path.empty()) TVM_FFI_THROW(TvmschedError) << "the disk tier needs a directory";
  }
  size_t total = 0;
  for (const auto& [id, data] : weights) total += PageRound(data->size());
  size_t t = 0;
  for (const auto& [id, data] : weights) {  // each tier filled before the next, in the order the layers read them
    size_t rounded = PageRound(data->size());
    while (t < tiers_.size() && used_[t] + rounded > tiers_[t].capacity) ++t;
    if (t == tiers_.size()) {
      std::ostringstream shares;
      size_t held = 0;
      for (const TierShare& tier : tiers_) {
        shares << (held || &tier != &tiers_[0] ? ", " : "") << tier.kind << " " << Bytes(tier.capacity);
        held += tier.capacity;
      }
      TVM_FFI_THROW(TvmschedError) << "model " << model << " streams " << Bytes(total)
                                   << " of weights but this device's tier shares hold " << Bytes(held) << " ("
                                   << (tiers_.empty() ? "none" : shares.str()) << "): short by at least "
                                   << Bytes(total > held ? total - held : rounded);
    }
    homes_[id] = Home{static_cast<int>(t), nullptr, static_cast<int64_t>(used_[t]), data->size()};
    used_[t] += rounded;
  }
  try {
    for (size_t i = 0; i < tiers_.size(); ++i) {
      if (!used_[i]) continue;
      const TierShare& tier = tiers_[i];
      if (tier.kind == "disk") {
        if (fd_ >= 0) TVM_FFI_THROW(TvmschedError) << "one disk tier per device";
        fd_ = OpenUnnamedFile(tier.path);
        for (const auto& [id, data] : weights) {
          const Home& h = homes_[id];
          if (h.tier == static_cast<int>(i)) WriteAll(fd_, data->data(), data->size(), h.offset, tier.path);
        }
        if (::ftruncate(fd_, static_cast<off_t>(used_[i])) != 0 || ::fdatasync(fd_) != 0) {
          TVM_FFI_THROW(TvmschedError) << "cannot write the disk tier's weight file in " << tier.path << ": "
                                       << std::strerror(errno);
        }
        // read past the page cache where the file system allows it; else drop what writing cached
        direct_fd_ = ::open(("/proc/self/fd/" + std::to_string(fd_)).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (direct_fd_ < 0) ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
        continue;
      }
      void* base = ::mmap(nullptr, used_[i], PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED)
        TVM_FFI_THROW(TvmschedError) << "cannot map " << Bytes(used_[i]) << " for the " << tier.kind << " tier";
      regions_[i] = Region{static_cast<char*>(base), used_[i]};
      if (tier.numa_node >= 0) BindToNode(base, used_[i], tier.numa_node);  // before the first touch places the pages
      for (const auto& [id, data] : weights) {
        Home& h = homes_[id];
        if (h.tier != static_cast<int>(i)) continue;
        h.data = regions_[i].base + h.offset;
        std::memcpy(const_cast<char*>(h.data), data->data(), data->size());
      }
      device_->RegisterHost(base, used_[i]);
    }
  } catch (...) {
    Release();
    throw;
  }
}

TierStore::~TierStore() { Release(); }

void TierStore::Release() {
  for (Region& region : regions_) {
    if (!region.base) continue;
    device_->UnregisterHost(region.base);
    ::munmap(region.base, region.bytes);
    region = Region();
  }
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
  direct_fd_ = fd_ = -1;
}

void TierStore::Fetch(const std::string& id, void* dst, char* bounce, StreamHandle stream) {
  const Home& h = homes_.at(id);
  if (h.data) return device_->CopyToDevice(dst, h.data, h.nbytes, stream);
  char* into = host_memory_ ? static_cast<char*>(dst) : bounce;  // device memory that is host memory: read straight in
  size_t want = PageRound(h.nbytes), done = 0;
  int fd = direct_fd_ >= 0 ? direct_fd_ : fd_;
  while (done < h.nbytes) {
    ssize_t got = ::pread(fd, into + done, want - done, h.offset + static_cast<int64_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      TVM_FFI_THROW(TvmschedError) << "cannot read weight " << id
                                   << " from the disk tier: " << (got < 0 ? std::strerror(errno) : "end of file");
    }
    done += static_cast<size_t>(got);
  }
  if (!host_memory_) device_->CopyToDevice(dst, into, h.nbytes, stream);
}

// ---- the streamed layout: which weights stream, and the groups they stream in ----------------------------------

namespace {

/*! \brief Groups of a tiered model: a group ends before a layer whose streamed weights would overflow a
 *  stream buffer, and before the first streaming layer after layers that stream nothing (so the resident
 *  layers run while the first streamed group is copied). */
std::vector<std::pair<int, int>> StreamGroups(const std::vector<LayerSpec>& layers,
                                              const std::set<std::string>& streamed,
                                              const std::map<std::string, size_t>& nbytes, size_t buffer) {
  std::vector<std::pair<int, int>> groups;
  int first = 0;
  size_t held = 0;
  bool streaming = false;
  std::set<std::string> in_group;
  for (const LayerSpec& layer : layers) {
    std::set<std::string> mine;  // its streamed weights
    for (const auto& id : layer.inputs) {
      if (streamed.count(id)) mine.insert(id);
    }
    auto added = [&] {  // bytes the group grows by with this layer
      size_t add = 0;
      for (const auto& id : mine) add += in_group.count(id) ? 0 : PageRound(nbytes.at(id));
      return add;
    };
    size_t add = added();
    if (layer.index > first && ((add && !streaming) || held + add > buffer)) {
      groups.emplace_back(first, layer.index - 1);
      first = layer.index;
      held = 0;
      streaming = false;
      in_group.clear();
      add = added();
    }
    in_group.insert(mine.begin(), mine.end());
    held += add;
    streaming = streaming || add > 0;
  }
  groups.emplace_back(first, static_cast<int>(layers.size()) - 1);
  return groups;
}

/*! \brief What a tiered model needs on the device beside its resident weights, for one choice of streamed weights. */
struct StreamingFootprint {
  size_t activations = 0;  ///< activation blocks of every group, and the activations crossing groups
  size_t slot = 0;         ///< the largest group's streamed weights: one stream buffer
};

/*! \brief Tiering's decision for a model larger than its room: which weights stay on the device and how many stream
 *  buffers. The weights read first stay while they fit beside the environment, the activations and two buffers;
 *  where even none leaves room for two, one buffer (each group's copy then waits for the one before to run).
 *  `footprint(streamed)` lays the model out for a choice (its last call is the one returned); `fail` raises. */
struct StreamingChoice {
  size_t resident = 0;  ///< bytes of the weights that stay
  int buffers = 2;
  size_t slot = 0;  ///< each stream buffer: the largest group's streamed weights in the chosen layout
};

StreamingChoice ChooseStreamed(const std::vector<std::string>& order, const std::map<std::string, size_t>& nbytes,
                               size_t env_bytes, size_t room, size_t buffer,
                               const std::function<StreamingFootprint(const std::set<std::string>&)>& footprint,
                               const std::function<void(const std::string&)>& fail) {
  StreamingChoice choice;
  long long for_resident = static_cast<long long>(room) - static_cast<long long>(env_bytes + 2 * buffer);
  while (true) {
    std::set<std::string> streamed;
    choice.resident = 0;
    for (const auto& id : order) {
      if (streamed.empty() && static_cast<long long>(choice.resident + nbytes.at(id)) <= for_resident) {
        choice.resident += nbytes.at(id);
      } else {
        streamed.insert(id);
      }
    }
    StreamingFootprint fp = footprint(streamed);
    size_t need = env_bytes + fp.activations + choice.resident + choice.buffers * (fp.slot + 4096);
    if (need <= room) {
      choice.slot = fp.slot;
      return choice;
    }
    if (choice.resident == 0 && choice.buffers == 2) {
      choice.buffers = 1;
      for_resident = static_cast<long long>(room) - static_cast<long long>(env_bytes + buffer);
      continue;
    }
    if (choice.resident == 0) {
      fail("it needs at least " + std::to_string(need) + " bytes of device memory (inputs and outputs " +
           std::to_string(env_bytes) + ", activations " + std::to_string(fp.activations) + ", a stream buffer of " +
           std::to_string(fp.slot) + ") and may use " + std::to_string(room));
    }
    for_resident = static_cast<long long>(choice.resident) - static_cast<long long>(need - room);
  }
}

// ---- the streamer -----------------------------------------------------------------------------

/*! \brief The streamed placement of a tiered model: it owns the model's streamed layout (its tiers, its stream
 *  buffers) and its thread copies each streamed sub-task into a buffer ahead of the request that runs it. */
class Streamer final : public Placement {
 public:
  const char* kind() const override { return "streamed"; }
  explicit Streamer(ModelObj* m) : m_(m), device_(m->shared_device()) {}
  ~Streamer() override {
    Detach();
    FreeBuffers();
  }

  const StreamedLayout& layout() const { return layout_; }
  /*! \brief Lay the model out (which weights stream, its groups, their places in a buffer), place the streamed
   *  weights in the tiers and the rest on the device (InitStreamed). Nothing is left allocated when it fails. */
  void Load(const std::string& path, ArtifactContents& contents, const TierOptions& options);
  /*! \brief The tiers and the model's device memory go (ReleaseTiers). */
  void ReleaseTiers();

  void Demand(ModelObj*, int group) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (parked_) {  // between turns: its memory first (the streamer's thread asks for it)
      if (!wanted_) wanted_since_us_ = Device::NowMicros();
      wanted_ = true;
      Notify();
      return;
    }
    int at = Position(group);
    if (at >= 0 && m_->group_state(group) < kReady) Move(at);
  }
  void GroupStarted(ModelObj*, int group) override {
    std::lock_guard<std::mutex> lock(mu_);
    int at = Position(group);
    if (at >= 0) Move((at + 1) % static_cast<int>(layout_.groups.size()));
  }
  void GroupFinished(ModelObj*, int, double) override {
    std::lock_guard<std::mutex> lock(mu_);
    Move(cursor_);
  }
  void RequestFinished(ModelObj*) override {  // the next request starts from the first group
    std::unique_lock<std::mutex> lock(mu_);
    last_used_us_ = Device::NowMicros();
    if (yield_ && ParkLocked(lock)) {  // another model waits for memory: its turn ends here when idle
      lock.unlock();
      if (turn_ended_) turn_ended_();
      return;
    }
    Move(0);
  }

  StreamedTurn Turn() {
    std::lock_guard<std::mutex> lock(mu_);
    return StreamedTurn{static_cast<bool>(make_room_),
                        !parked_ || granted_,
                        parked_ && wanted_ && !granted_,
                        need_,
                        last_used_us_,
                        wanted_ ? wanted_since_us_ : 0,
                        yield_};
  }
  bool Park() {
    std::unique_lock<std::mutex> lock(mu_);
    return ParkLocked(lock);
  }
  void Nudge() {
    std::lock_guard<std::mutex> lock(mu_);
    if (parked_ && wanted_) Notify();
  }
  void Yield() {
    std::lock_guard<std::mutex> lock(mu_);
    if (make_room_ && (!parked_ || granted_)) yield_ = true;
  }
  void Detach() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cond_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::vector<StageEvent> Events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

  /*! \brief Copy every streamed weight of one tier at a time into the buffers, as StreamIn does. */
  std::map<std::string, std::pair<double, size_t>> CopyFloor(int repeat) {
    std::unique_lock<std::mutex> lock(mu_);
    if (m_->users.load() > 0)
      TVM_FFI_THROW(TvmschedError) << "model " << m_->name() << " is in use; its copy floor is measured idle";
    if (parked_ || unparking_) {
      TVM_FFI_THROW(TvmschedError) << "model " << m_->name() << " is between turns (another streamed model holds "
                                   << "the device memory); its copy floor is measured while it holds it";
    }
    measuring_ = true;
    cond_.wait(lock, [&] { return !copying_; });
    for (int& g : slots_) g = -1;  // buffer 0 is written over: every group is loaded again afterwards
    for (int g : layout_.groups) m_->CasGroup(g, kReady, kAbsent) || m_->CasGroup(g, kFinished, kAbsent);
    lock.unlock();
    std::map<std::string, std::pair<double, size_t>> out;
    std::string error;
    try {
      out = MeasureCopies(repeat);
    } catch (const std::exception& err) {
      error = ErrorLine(err);
    }
    lock.lock();
    measuring_ = false;
    Notify();
    if (!error.empty()) TVM_FFI_THROW(TvmschedError) << error;
    return out;
  }

 private:
  int Position(int group) const {
    auto at = std::find(layout_.groups.begin(), layout_.groups.end(), group);
    return at == layout_.groups.end() ? -1 : static_cast<int>(at - layout_.groups.begin());
  }
  void Move(int cursor) {
    cursor_ = cursor;
    Notify();
  }
  void Notify() {
    dirty_ = true;
    if (!started_ && !stop_ &&
        (!layout_.groups.empty() || make_room_)) {  // started on first use: a stream may re-plan the activations before
      started_ = true;
      thread_ = std::thread([this] { Loop(); });
    }
    cond_.notify_all();
  }

  void Loop() {
    StreamHandle copy = nullptr;
    std::unique_lock<std::mutex> lock(mu_);
    try {
      m_->device().SetThreadUnits(0);
      copy = m_->device().CreateStream(0, nullptr);
      if (!m_->device().host_memory()) bounce_ = static_cast<char*>(m_->device().AllocHost(layout_.buffer_bytes));
    } catch (const std::exception& err) {
      Fail(lock, err);
    }
    while (!stop_) {
      if (!Step(lock, copy)) {
        if (parked_ && wanted_ && !failed_) {  // no memory for its turn yet: ask again shortly (turns end unasked)
          cond_.wait_for(lock, std::chrono::milliseconds(2), [&] { return stop_ || dirty_; });
        } else {
          cond_.wait(lock, [&] { return stop_ || dirty_; });
        }
        dirty_ = false;
      }
    }
    lock.unlock();
    if (copy) m_->device().DestroyStream(copy);
    if (bounce_) m_->device().FreeHost(bounce_);
  }

  /*! \brief Take back a buffer whose group is not wanted and fill a free one with a wanted group. */
  bool Step(std::unique_lock<std::mutex>& lock, StreamHandle copy) {
    if (measuring_ || failed_) return false;
    if (parked_) return wanted_ && !unparking_ && Unpark(lock);
    if (layout_.groups.empty()) return false;  // nothing streams (its thread runs for its turns only)
    int n = static_cast<int>(layout_.groups.size());
    int buffers = layout_.num_buffers;
    // the group the running request needs next, and (two buffers) the one after it; with one buffer the one after it
    // is not kept: a model of two streamed groups would keep the next request's first group in the only buffer and
    // its running request's second group would wait for ever (the watchdog's stall)
    int wanted[2] = {layout_.groups[cursor_], layout_.groups[buffers > 1 ? (cursor_ + 1) % n : cursor_]};
    auto is_wanted = [&](int g) { return g == wanted[0] || g == wanted[1]; };
    for (int s = 0; s < buffers; ++s) {
      int& g = slots_[s];
      if (g >= 0 && !is_wanted(g) && (m_->CasGroup(g, kReady, kAbsent) || m_->CasGroup(g, kFinished, kAbsent))) g = -1;
    }
    for (int g : wanted) {
      if (slots_[0] == g || slots_[1] == g) continue;
      int slot = slots_[0] < 0 ? 0 : (slots_[1] < 0 && buffers > 1) ? 1 : -1;
      if (slot < 0) return false;
      slots_[slot] = g;
      m_->SetGroupState(g, kPreparing);
      copying_ = true;
      lock.unlock();
      double start = Device::NowMicros();
      std::string error;
      try {
        StreamIn(g, slot, bounce_, copy);
      } catch (const std::exception& err) {
        error = ErrorLine(err);
      }
      double end = Device::NowMicros();
      lock.lock();
      copying_ = false;
      cond_.notify_all();
      if (!error.empty()) {
        slots_[slot] = -1;
        m_->SetGroupState(g, kAbsent);
        failed_ = true;
        m_->SetPlacementError(error);
      } else {
        m_->SetGroupState(g, kReady);
        if (events_.size() < 65536)
          events_.push_back({m_->name(), "stream", g, start, end, static_cast<int64_t>(layout_.stream_bytes[g]), slot});
      }
      lock.unlock();
      m_->Wake();  // outside mu_: the stream's waker takes the stream's lock, under which it calls in here
      lock.lock();
      return true;
    }
    return false;
  }

  void Fail(std::unique_lock<std::mutex>& lock, const std::exception& err) {
    failed_ = true;
    m_->SetPlacementError(ErrorLine(err));
    lock.unlock();
    m_->Wake();
    lock.lock();
  }

  std::map<std::string, std::pair<double, size_t>> MeasureCopies(int repeat) {
    Device& device = m_->device();
    device.SetThreadUnits(0);
    StreamHandle copy = device.CreateStream(0, nullptr);
    bool host_memory = device.host_memory();
    char* bounce = host_memory ? nullptr : static_cast<char*>(device.AllocHost(layout_.buffer_bytes));
    TierStore& store = *layout_.store;
    std::map<std::string, std::pair<double, size_t>> out;
    std::string error;
    try {
      for (size_t t = 0; t < store.tiers().size(); ++t) {
        if (!store.used()[t]) continue;
        double best = 1e300;
        size_t bytes = 0;
        for (int r = 0; r < std::max(1, repeat); ++r) {
          bytes = 0;
          double start = Device::NowMicros();
          for (int g : layout_.groups) {  // group by group, as the streamer copies them
            StreamIn(g, 0, bounce, copy, static_cast<int>(t), &bytes);
          }
          best = std::min(best, (Device::NowMicros() - start) * 1e-6);
        }
        auto& entry = out[store.tiers()[t].kind];
        entry.first += best;
        entry.second += bytes;
      }
    } catch (const std::exception& err) {
      error = ErrorLine(err);
    }
    if (bounce) device.FreeHost(bounce);
    device.DestroyStream(copy);
    if (!error.empty()) TVM_FFI_THROW(TvmschedError) << error;
    return out;
  }

  /*! \brief All its device memory: the resident weights (copied from `resident`), each group's activations, the
   *  stream buffers, and last the environment (a request starts once it is ready; the groups without streamed
   *  weights become kReady then). Nothing is left allocated when it fails. */
  void Allocate(const std::vector<std::pair<std::string, const std::string*>>& resident) {
    ModelObj& m = *m_;
    try {
      for (const auto& [id, bytes] : resident) {
        void* data = m.AllocTensor(id, "weight " + id, bytes->size());
        device_->CopyToDevice(data, bytes->data(), bytes->size(), nullptr);
      }
      for (int g = 0; g < m.num_groups(); ++g) {
        m.SetGroupState(g, kAbsent);
        m.PrepareGroup(g, nullptr);  // activations (the streamed weights come with StreamIn)
      }
      if (!layout_.groups.empty()) {
        for (int b = 0; b < layout_.num_buffers; ++b)
          layout_.buffers[b] = m.AllocFor("a stream buffer", layout_.buffer_bytes + 4096);  // page-aligned inside
      }
      m.PrepareEnvironment();
    } catch (...) {
      m.FreeDeviceMemory();
      FreeBuffers();
      throw;
    }
    for (int g = 0; g < m.num_groups(); ++g) {
      if (!layout_.stream_bytes[g]) m.SetGroupState(g, kReady);
    }
  }
  /*! \brief Allocate (true) if the room is there; false if it is not (another model took it meanwhile too). */
  bool Take(const std::vector<std::pair<std::string, const std::string*>>& resident) {
    if (Free() < need_) return false;
    try {
      Allocate(resident);
    } catch (const std::exception&) {
      if (Free() >= need_) throw;  // not for want of room
      return false;
    }
    std::lock_guard<std::mutex> lock(mu_);  // (its thread does not hold it while taking)
    granted_ = true;                        // it holds its memory: the next turn's decision sees it
    return true;
  }
  /*! \brief Room left in its budget (none: unlimited). */
  size_t Free() const {
    const auto& scope = m_->scope();
    return !scope || scope->budget() == 0 ? SIZE_MAX : scope->left();
  }
  /*! \brief Take its memory for a turn (mu_ held; let go of while allocating): true when it holds it now or failed
   *  for good (its placement error set); false while there is no room (it asks again). */
  bool Unpark(std::unique_lock<std::mutex>& lock) {
    if (m_->users.load() == 0) {  // its request went (failed by the watchdog): nobody waits
      wanted_ = false;
      return false;
    }
    unparking_ = true;
    yield_ = false;  // (its runtime may ask it again while granting the turn: others wait)
    lock.unlock();
    double start = Device::NowMicros();
    bool got = false;
    std::string error;
    try {
      std::vector<std::pair<std::string, const std::string*>> resident;
      for (const auto& [id, bytes] : resident_host_) resident.emplace_back(id, &bytes);
      got = make_room_(m_, need_, [&] { return Take(resident); });  // its runtime decides whether it is its turn
    } catch (const std::exception& err) {
      error = ErrorLine(err);
    }
    lock.lock();
    unparking_ = granted_ = false;
    if (!got && error.empty()) return false;
    if (got) {
      parked_ = wanted_ = false;
      slots_[0] = slots_[1] = -1;
      last_used_us_ = Device::NowMicros();
      if (events_.size() < 65536)
        events_.push_back({m_->name(), "unpark", -1, start, last_used_us_, static_cast<int64_t>(need_), 0});
      Move(0);
    } else {
      failed_ = true;
      m_->SetPlacementError(error);
    }
    lock.unlock();
    m_->Wake();  // outside mu_ (as Step)
    lock.lock();
    return true;
  }
  /*! \brief End its turn if nobody uses it (mu_ held): its device memory goes. */
  bool ParkLocked(std::unique_lock<std::mutex>& lock) {
    if (!make_room_) return false;
    cond_.wait(lock, [&] { return !copying_; });  // a copy into a buffer finishes first
    if (parked_) return true;
    if (unparking_ || measuring_ || failed_ || stop_) return false;
    if (!m_->TryFreeDeviceMemory()) return false;  // a request holds it (or was just taken)
    FreeBuffers();
    slots_[0] = slots_[1] = -1;
    cursor_ = 0;
    parked_ = true;
    yield_ = granted_ = false;
    double now = Device::NowMicros();
    if (events_.size() < 65536) events_.push_back({m_->name(), "park", -1, now, now, static_cast<int64_t>(need_), 0});
    return true;
  }

  /*! \brief Lay the model out with `streamed` weights streamed: its groups, their plans, each group's place in a
   *  stream buffer. */
  StreamingFootprint LayOut(const std::set<std::string>& streamed, const std::map<std::string, size_t>& nbytes,
                            size_t buffer);
  /*! \brief Copy group `g`'s streamed weights into stream buffer `slot` (0 or 1) on `copy_stream` (0: synchronous;
   *  `bounce`: page-aligned host memory of layout_.buffer_bytes for disk reads), wait for them, and bind its layers
   *  to them. For measuring: `only_tier` >= 0 copies only the weights in that tier and binds nothing; `copied` (if
   *  given) adds the bytes copied. */
  void StreamIn(int g, int slot, char* bounce, StreamHandle copy_stream, int only_tier = -1, size_t* copied = nullptr);
  void FreeBuffers() {
    for (void*& buffer : layout_.buffers) {
      if (buffer) device_->Release(buffer);
      buffer = nullptr;
    }
  }

  ModelObj* m_;
  std::shared_ptr<Device> device_;
  StreamedLayout layout_;
  std::mutex mu_;
  std::condition_variable cond_;
  std::thread thread_;
  bool started_ = false, stop_ = false, dirty_ = false, measuring_ = false, copying_ = false, failed_ = false;
  // turns (TierOptions::make_room): parked_: its device memory is given back; wanted_: a request waits for it;
  // unparking_: its thread is taking it; yield_: another model waits, park when idle
  std::function<bool(ModelObj*, size_t, const std::function<bool()>&)> make_room_;
  std::function<void()> turn_ended_;
  bool parked_ = false, wanted_ = false, unparking_ = false, yield_ = false;
  bool granted_ = false;  // its turn's memory was taken, its thread has yet to say so (parked_ is still set)
  size_t need_ = 0;       // the device memory a turn takes
  double last_used_us_ = 0, wanted_since_us_ = 0;
  std::vector<std::pair<std::string, std::string>> resident_host_;  // the resident weights' host copies (turns)
  int cursor_ = 0;           // position in layout_.groups of the group the running request needs next
  int slots_[2] = {-1, -1};  // the group in each stream buffer
  char* bounce_ = nullptr;
  std::vector<StageEvent> events_;
};

StreamingFootprint Streamer::LayOut(const std::set<std::string>& streamed, const std::map<std::string, size_t>& nbytes,
                                    size_t buffer) {
  layout_.streamed = streamed;
  std::vector<std::pair<int, int>> groups = StreamGroups(m_->manifest().layers, layout_.streamed, nbytes, buffer);
  // the activations planned per group (crossing ones apart) or in one plan over all layers: the smaller (one plan
  // shares storage across many groups; per group, a greedy plan may pack a few large groups tighter)
  auto activations = [&](bool shared) {
    m_->SetGroups(groups, shared);
    return m_->subtasks().PlannedActivationBytes();
  };
  size_t apart = activations(false);
  StreamingFootprint fp;
  fp.activations = activations(true);
  if (apart < fp.activations) fp.activations = activations(false);
  int n = m_->num_groups();
  layout_.offsets.assign(n, {});
  layout_.stream_bytes.assign(n, 0);
  for (int g = 0; g < n; ++g) {
    for (const auto& id : m_->subtasks().tensors(g)) {
      if (!layout_.streamed.count(id)) continue;
      layout_.offsets[g].emplace_back(id, layout_.stream_bytes[g]);
      layout_.stream_bytes[g] += PageRound(nbytes.at(id));
    }
    fp.slot = std::max(fp.slot, layout_.stream_bytes[g]);
  }
  return fp;
}

void Streamer::Load(const std::string& path, ArtifactContents& contents, const TierOptions& options) {
  ModelObj& m = *m_;
  const size_t room = options.device_bytes;
  auto fail = [&](const std::string& why) {
    TVM_FFI_THROW(TvmschedError) << "cannot stream model " << m.name() << ": " << why;
  };
  if (options.in_flight < 1) fail("launches in flight must be at least 1");
  // its stream keeps launches in flight on an asynchronous device: the activations are planned for them now, so the
  // room computed below holds (a stream that re-planned them later would pass it: the H200 run of 2026-11-26)
  m.Replan(device_->launches_async() ? options.in_flight : 1);  // no groups yet: the distance they are planned for
  std::vector<std::string> order;                               // weights in the order the layers first read them
  std::map<std::string, size_t> nbytes;
  size_t largest = 0;
  int largest_layer = 0;
  for (const LayerSpec& layer : m.manifest().layers) {
    size_t mine = 0;
    std::set<std::string> seen_here;
    for (const auto& id : layer.inputs) {
      auto weight = contents.weights.find(id);
      if (weight == contents.weights.end() || !seen_here.insert(id).second) continue;
      mine += PageRound(weight->second.data.size());
      if (!nbytes.count(id)) order.push_back(id);
      nbytes[id] = weight->second.data.size();
    }
    if (mine > largest) largest = mine, largest_layer = layer.index;
  }
  const size_t env_bytes = m.env_bytes();
  if (env_bytes >= room)
    fail("its inputs and outputs alone take " + std::to_string(env_bytes) + " of the " + std::to_string(room) +
         " bytes of device memory it may use");
  size_t buffer =
      options.buffer_bytes ? PageRound(options.buffer_bytes) : std::max(largest, PageRound((room - env_bytes) / 8));
  if (buffer < largest) {
    fail("a stream buffer of " + std::to_string(buffer) + " bytes cannot hold the weights of layer " +
         std::to_string(largest_layer) + " (" + std::to_string(largest) + " bytes)");
  }
  StreamingChoice choice = ChooseStreamed(
      order, nbytes, env_bytes, room, buffer,
      [&](const std::set<std::string>& streamed) { return LayOut(streamed, nbytes, buffer); },
      [&](const std::string& why) { fail(why + " (" + path + ")"); });
  layout_.buffer_bytes = choice.slot;
  layout_.num_buffers = choice.buffers;
  layout_.resident_weight_bytes = choice.resident;
  for (int g = 0; g < m.num_groups(); ++g) {
    if (layout_.stream_bytes[g]) layout_.groups.push_back(g);
  }
  std::vector<std::pair<std::string, const std::string*>> streamed;
  for (const auto& id : order) {
    if (layout_.streamed.count(id)) streamed.emplace_back(id, &contents.weights.at(id).data);
  }
  layout_.store = std::make_unique<TierStore>(device_, options.tiers, streamed, m.name());
  m.SetPlacedTensors(layout_.streamed);  // StreamIn binds them; the model never allocates them
  std::vector<std::pair<std::string, const std::string*>> resident;
  for (const auto& id : order) {
    if (!layout_.streamed.count(id)) resident.emplace_back(id, &contents.weights.at(id).data);
  }
  make_room_ = options.make_room;
  turn_ended_ = options.turn_ended;
  need_ = room;
  last_used_us_ = Device::NowMicros();
  try {
    if (make_room_) {  // it takes turns: its resident weights keep a host copy; no turn now: its first request's
      for (const auto& [id, bytes] : resident) resident_host_.emplace_back(id, *bytes);
      parked_ = !make_room_(m_, need_, [&] { return Take(resident); });
      granted_ = false;
    } else {
      Allocate(resident);
    }
  } catch (...) {
    layout_.store.reset();
    throw;
  }
}

void Streamer::ReleaseTiers() {
  if (!layout_.store) return;
  Detach();  // its thread stops first: nothing copies from the tiers after this
  m_->SetPlacementError("model " + m_->name() + " was shut down (its memory tiers are released)");
  layout_.store.reset();
  try {
    m_->Synchronize();
  } catch (...) {  // a failed device: free what can be freed
  }
  for (int g = 0; g < m_->num_groups(); ++g) m_->SetGroupState(g, kAbsent);
  m_->FreeDeviceMemory();  // its device memory goes now too, not when its last reference does
  FreeBuffers();
}

void Streamer::StreamIn(int g, int slot, char* bounce, StreamHandle copy_stream, int only_tier, size_t* copied) {
  auto address = reinterpret_cast<uintptr_t>(layout_.buffers[slot]);
  char* base = reinterpret_cast<char*>(PageRound(address));
  TierStore& store = *layout_.store;
  for (int disk = 0; disk < 2; ++disk) {  // host-memory tiers first: their copies run while the disk is read
    for (const auto& [id, offset] : layout_.offsets[g]) {
      const TierStore::Home& home = store.home(id);
      if ((home.data == nullptr) != (disk == 1) || (only_tier >= 0 && home.tier != only_tier)) continue;
      store.Fetch(id, base + offset, bounce ? bounce + offset : nullptr, copy_stream);
      if (copied) *copied += home.nbytes;
    }
  }
  if (copy_stream) device_->SyncStream(copy_stream);
  if (only_tier >= 0) return;
  std::vector<std::pair<std::string, void*>> placed;
  for (const auto& [id, offset] : layout_.offsets[g]) placed.emplace_back(id, base + offset);
  auto [first, last] = m_->group_layers(g);
  m_->BindLayers(first, last, placed);
}

Streamer* AsStreamer(ModelObj& model) { return dynamic_cast<Streamer*>(model.placement()); }

Streamer& StreamerOf(ModelObj& model) {
  Streamer* streamer = AsStreamer(model);
  if (!streamer || !streamer->layout().store)
    TVM_FFI_THROW(TvmschedError) << "model " << model.name() << " is not tiered (or was shut down)";
  return *streamer;
}

}  // namespace

void InitStreamed(ModelObj& model, const std::string& path, ArtifactContents& contents, const TierOptions& options) {
  auto streamer = std::make_shared<Streamer>(&model);
  streamer->Load(path, contents, options);
  model.SetPlacement(streamer);
}

const StreamedLayout* StreamedLayoutOf(ModelObj& model) {
  Streamer* streamer = AsStreamer(model);
  return streamer && streamer->layout().store ? &streamer->layout() : nullptr;
}

void ReleaseTiers(ModelObj& model) {
  if (Streamer* streamer = AsStreamer(model)) streamer->ReleaseTiers();
}

std::vector<StageEvent> StreamerEvents(ModelObj& model) { return StreamerOf(model).Events(); }

StreamedTurn TurnOf(ModelObj& model) {
  Streamer* streamer = AsStreamer(model);
  return streamer ? streamer->Turn() : StreamedTurn{};
}

bool ParkStreamed(ModelObj& model) {
  Streamer* streamer = AsStreamer(model);
  return streamer && streamer->Park();
}

void YieldStreamed(ModelObj& model) {
  if (Streamer* streamer = AsStreamer(model)) streamer->Yield();
}

void NudgeStreamed(ModelObj& model) {
  if (Streamer* streamer = AsStreamer(model)) streamer->Nudge();
}

std::map<std::string, std::pair<double, size_t>> TierCopyFloor(ModelObj& model, int repeat) {
  return StreamerOf(model).CopyFloor(repeat);
}

}  // namespace tvmsched
