// CPU device: host memory; kernels run with the thread pool limited to a unit count. Synchronous mode (the
// default): on the calling thread. Asynchronous mode (TVMSCHED_CPU_LAUNCHES=async): like a GPU stream, each
// stream has a launch queue run in order by its own thread, with events and cross-stream waits, so the engine's
// GPU path (launches in flight, events, re-plans, drains) runs and is tested on any machine.
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <tvm/ffi/function.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu_pool.h"
#include "tvm_runtime.h"
#include "tvmsched/device.h"

namespace tvmsched {

double Device::NowMicros() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

size_t DTypeBytes(DLDataType dtype) { return (static_cast<size_t>(dtype.bits) * dtype.lanes + 7) / 8; }

namespace {

constexpr size_t kAlign = 64;

int CpuUnits() {
  if (const char* env = std::getenv("TVM_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

constexpr size_t kMaxCached = size_t(1) << 30;

/*! \brief The cores the process may run on (sched_getaffinity of the thread that opens the first share). */
const cpu_set_t& ProcessCores() {
  static const cpu_set_t cores = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
      for (int c = 0; c < static_cast<int>(std::thread::hardware_concurrency()); ++c) CPU_SET(c, &set);
    }
    return set;
  }();
  return cores;
}

/*! \brief A stream of the asynchronous mode: a launch queue its own thread runs in order, on `units` threads.
 *  A launch that throws records its error (the first one), which the next synchronization raises, as a CUDA
 *  stream reports a kernel's error at the next synchronizing call. */
class CpuStream {
 public:
  CpuStream(int units, std::function<void(int)> set_units) : units_(units) {
    thread_ = std::thread([this, set_units = std::move(set_units)] {
      set_units(units_);
      Loop();
    });
  }
  ~CpuStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cond_.notify_all();
    thread_.join();
  }
  /*! \brief Queue `work`; returns its sequence number (1, 2, ...). */
  uint64_t Enqueue(std::function<void()> work) {
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
      seq = ++enqueued_;
    }
    cond_.notify_all();
    return seq;
  }
  uint64_t enqueued() {
    std::lock_guard<std::mutex> lock(mu_);
    return enqueued_;
  }
  bool Done(uint64_t seq) const { return completed_.load(std::memory_order_acquire) >= seq; }
  /*! \brief Wait until the launches up to `seq` have run (never raises). */
  void Wait(uint64_t seq) {
    if (Done(seq)) return;
    std::unique_lock<std::mutex> lock(mu_);
    done_cond_.wait(lock, [&] { return Done(seq); });
  }
  /*! \brief Wait for everything queued, then raise the error a launch recorded (once). */
  void Sync() {
    Wait(enqueued());
    std::string error;
    {
      std::lock_guard<std::mutex> lock(mu_);
      error.swap(error_);
    }
    if (!error.empty()) TVM_FFI_THROW(TvmschedError) << error;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cond_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::string error;
      try {
        work();
      } catch (const tvm::ffi::Error& err) {
        error = err.message();
      } catch (const std::exception& err) {
        error = err.what();
      }
      lock.lock();
      if (!error.empty() && error_.empty()) error_ = error;
      completed_.fetch_add(1, std::memory_order_release);
      done_cond_.notify_all();
    }
  }

  const int units_;
  std::mutex mu_;
  std::condition_variable cond_, done_cond_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0;
  std::atomic<uint64_t> completed_{0};
  bool stop_ = false;
  std::string error_;
  std::thread thread_;
};

/*! \brief An event of the asynchronous mode: the point of its stream's queue when it was recorded. */
struct CpuEvent {
  CpuStream* stream;
  uint64_t seq;
};

class CpuDevice final : public Device {
 public:
  /*! \brief The whole machine (`cores` empty: TVM_NUM_THREADS, else every core), or a share of its cores: the
   *  threads that run its kernels (the streams' and their pools' workers) are pinned to them. */
  CpuDevice(bool async, std::vector<int> cores = {})
      : units_(cores.empty() ? CpuUnits() : static_cast<int>(cores.size())), async_(async), cores_(std::move(cores)) {
    CPU_ZERO(&share_);
    for (int c : cores_) CPU_SET(c, &share_);
  }
  const char* kind() const override { return "cpu"; }
  DLDevice dl_device() const override { return DLDevice{kDLCPU, 0}; }
  int total_units() const override { return units_; }
  int unit_granularity() override { return 1; }
  bool launches_async() const override { return async_; }
  bool host_memory() const override { return true; }
  bool entry_checks() const override { return true; }
  bool host_queues() const override { return async_; }
  std::string name() const override {
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
      if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
        return line.substr(line.find(':') + 2);
    }
    return "cpu";
  }

  size_t FreeMemory() override {
    std::ifstream meminfo("/proc/meminfo");
    for (std::string line; std::getline(meminfo, line);) {
      if (line.rfind("MemAvailable:", 0) == 0) return static_cast<size_t>(std::stoull(line.substr(13))) * 1024;
    }
    return 0;
  }
  // The arena keeps freed blocks (up to kMaxCached bytes) for allocations of the same size: a model
  // switched in again reuses pages already faulted in instead of paying the kernel's first-touch
  // faults on every switch (glibc returns large blocks to the kernel at free).
  void* Alloc(size_t nbytes) override {
    size_t size = (nbytes + kAlign - 1) / kAlign * kAlign + kAlign;
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      auto found = cache_.find(size);
      if (found != cache_.end()) {
        void* ptr = found->second;
        cache_.erase(found);
        cached_ -= size;
        sizes_[ptr] = size;
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(kAlign, size);
    if (ptr == nullptr) TVM_FFI_THROW(TvmschedError) << "out of host memory allocating " << nbytes << " bytes";
    std::lock_guard<std::mutex> lock(cache_mu_);
    sizes_[ptr] = size;
    return ptr;
  }
  void Free(void* ptr) override {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto found = sizes_.find(ptr);
    size_t size = found == sizes_.end() ? 0 : found->second;
    if (found != sizes_.end()) sizes_.erase(found);
    if (size && cached_ + size <= kMaxCached) {
      cache_.emplace(size, ptr);
      cached_ += size;
    } else {
      std::free(ptr);
    }
  }
  void* AllocHost(size_t nbytes) override {
    void* ptr = std::aligned_alloc(kAlign, (nbytes + kAlign - 1) / kAlign * kAlign + kAlign);
    if (ptr == nullptr) TVM_FFI_THROW(TvmschedError) << "out of host memory allocating " << nbytes << " bytes";
    return ptr;
  }
  void FreeHost(void* ptr) override { std::free(ptr); }
  void RegisterHost(void*, size_t) override {}
  void UnregisterHost(void*) override {}
  void CopyToDevice(void* dst, const void* src, size_t n, StreamHandle stream) override { Copy(dst, src, n, stream); }
  void CopyToHost(void* dst, const void* src, size_t n, StreamHandle stream) override { Copy(dst, src, n, stream); }
  void ReadWhileRunning(void* dst, const void* src, size_t n) override {
    // kernels add to the counters atomically; read each int32 atomically too
    auto* out = static_cast<int32_t*>(dst);
    auto* in = static_cast<const int32_t*>(src);
    for (size_t i = 0; i < n / sizeof(int32_t); ++i) out[i] = __atomic_load_n(in + i, __ATOMIC_RELAXED);
  }
  void MemsetD32(void* dst, int32_t value, size_t count) override {
    auto* p = static_cast<int32_t*>(dst);
    for (size_t i = 0; i < count; ++i) __atomic_store_n(p + i, value, __ATOMIC_RELAXED);
  }

  StreamHandle CreateStream(int units, int* granted, StreamPriority priority) override {
    units = units >= units_ || units <= 0 ? units_ : units;
    if (granted) *granted = units;
    if (!async_) return nullptr;  // synchronous: the calling thread runs its kernels
    return new CpuStream(units, [this, priority](int n) {
      PinThread();
      SetThreadUnits(n);
      // a best-effort queue yields the cores to the others (raising a priority needs privileges: high stays 0)
      if (priority == StreamPriority::kLow) setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
      pthread_setname_np(pthread_self(), priority == StreamPriority::kHigh  ? "tvms-q-high"
                                         : priority == StreamPriority::kLow ? "tvms-q-low"
                                                                            : "tvms-q");
    });
  }
  void DestroyStream(StreamHandle stream) override { delete AsStream(stream); }
  void StreamWaitStream(StreamHandle waiter, StreamHandle stream) override {
    if (!waiter || !stream || waiter == stream) return;
    CpuStream* other = AsStream(stream);
    uint64_t seq = other->enqueued();
    AsStream(waiter)->Enqueue([other, seq] { other->Wait(seq); });
  }
  void SyncStream(StreamHandle stream) override {
    if (stream) AsStream(stream)->Sync();
  }
  void UseStream(StreamHandle) override {}  // launches name their stream (Enqueue)
  void Enqueue(StreamHandle stream, std::function<void()> work) override {
    if (stream) {
      AsStream(stream)->Enqueue(std::move(work));
    } else {
      work();
    }
  }
  // a fault on the CPU device is injected (tests): host memory, threads and kernels stay usable
  bool Recreate(std::string* /*why*/) override { return true; }

  void SetThreadUnits(int units) override {
    thread_local int current = -1;
    if (units <= 0 || units > units_) units = units_;
    if (CpuPoolEnabled()) {  // the engine's pool runs the kernels' parallel loops (cpu_pool.cc)
      SetCpuPoolThreads(units);
      return;
    }
    if (units == current) return;
    static const tvm::ffi::Function config = TvmRuntimeFunction("runtime.config_threadpool");
    config(0, units);
    current = units;
  }

  EventHandle RecordEvent(StreamHandle stream) override {
    if (!stream) return nullptr;
    return new CpuEvent{AsStream(stream), AsStream(stream)->enqueued()};
  }
  bool EventDone(EventHandle event) override {
    return !event || static_cast<CpuEvent*>(event)->stream->Done(static_cast<CpuEvent*>(event)->seq);
  }
  void WaitEvent(EventHandle event) override {
    if (event) static_cast<CpuEvent*>(event)->stream->Wait(static_cast<CpuEvent*>(event)->seq);
  }
  void FreeEvent(EventHandle event) override { delete static_cast<CpuEvent*>(event); }

  FlagArray AllocFlags(int64_t length, FlagMemory) override {
    FlagArray flags;
    flags.length = length;
    flags.host_ptr = flags.device_ptr = static_cast<int32_t*>(Alloc(sizeof(int32_t) * length));
    flags.memory = FlagMemory::kHostMapped;
    MemsetD32(flags.host_ptr, 0, length);
    return flags;
  }
  void FreeFlags(const FlagArray& flags) override { Free(flags.host_ptr); }
  void SetFlags(const FlagArray& flags, int32_t value, int64_t count) override {
    for (int64_t i = 0; i < count; ++i) __atomic_store_n(flags.host_ptr + i, value, __ATOMIC_SEQ_CST);
  }

 private:
  static CpuStream* AsStream(StreamHandle stream) { return static_cast<CpuStream*>(stream); }
  /*! \brief A copy; on a stream of the asynchronous mode it comes after the launches queued there (it waits). */
  static void Copy(void* dst, const void* src, size_t n, StreamHandle stream) {
    if (stream) AsStream(stream)->Wait(AsStream(stream)->enqueued());
    std::memcpy(dst, src, n);
  }

  void PinThread() override {
    if (!cores_.empty()) sched_setaffinity(0, sizeof(cpu_set_t), &share_);
  }

  int units_;
  const bool async_;
  const std::vector<int> cores_;
  cpu_set_t share_;
  std::mutex cache_mu_;
  std::map<void*, size_t> sizes_;       // live blocks and their sizes
  std::multimap<size_t, void*> cache_;  // freed blocks kept for reuse
  size_t cached_ = 0;
};

}  // namespace

bool CpuLaunchesAsync() {
  const char* mode = std::getenv("TVMSCHED_CPU_LAUNCHES");
  if (mode == nullptr || *mode == 0 || std::strcmp(mode, "sync") == 0) return false;
  if (std::strcmp(mode, "async") == 0) return true;
  TVM_FFI_THROW(TvmschedError) << "TVMSCHED_CPU_LAUNCHES is '" << mode << "': use sync or async";
}

std::shared_ptr<Device> OpenCudaDevice(int index);  // cuda_device.cc

std::shared_ptr<Device> OpenCpuShare(int index, int of) {
  if (of < 1 || index < 0 || index >= of) {
    TVM_FFI_THROW(TvmschedError) << "cpu:" << index << " is not one of " << of << " CPU devices";
  }
  EnsureTvmRuntime(false);
  std::vector<int> all;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &ProcessCores())) all.push_back(c);
  }
  const int n = static_cast<int>(all.size());
  std::vector<int> cores;
  if (n >= of) {  // cores [index * n / of, (index + 1) * n / of): each device its own
    for (int j = index * n / of; j < (index + 1) * n / of; ++j) cores.push_back(all[j]);
  } else {  // more devices than cores: one core each, shared
    cores.push_back(all[index % n]);
  }
  return std::make_shared<CpuDevice>(CpuLaunchesAsync(), std::move(cores));
}

std::shared_ptr<Device> OpenDevice(const std::string& kind, int index) {
  if (kind == "cpu") {
    EnsureTvmRuntime(false);
    // one device per mode: models already loaded keep theirs when a test changes the mode
    static std::shared_ptr<Device> cpu = std::make_shared<CpuDevice>(false);
    static std::shared_ptr<Device> cpu_async = std::make_shared<CpuDevice>(true);
    return CpuLaunchesAsync() ? cpu_async : cpu;
  }
  if (kind == "cuda") {
    EnsureTvmRuntime(true);
    return OpenCudaDevice(index);
  }
  TVM_FFI_THROW(TvmschedError) << "unknown device " << kind << ": use cpu or cuda";
}

}  // namespace tvmsched
