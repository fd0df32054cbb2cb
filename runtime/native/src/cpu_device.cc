// CPU device: host memory; kernels run on the calling thread with TVM's thread pool limited to a unit count.
#include <tvm/ffi/function.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

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

class CpuDevice final : public Device {
 public:
  CpuDevice() : units_(CpuUnits()) {}
  const char* kind() const override { return "cpu"; }
  DLDevice dl_device() const override { return DLDevice{kDLCPU, 0}; }
  int total_units() const override { return units_; }
  int unit_granularity() override { return 1; }
  bool launches_async() const override { return false; }
  bool host_memory() const override { return true; }
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
  void CopyToDevice(void* dst, const void* src, size_t n, StreamHandle) override { std::memcpy(dst, src, n); }
  void CopyToHost(void* dst, const void* src, size_t n, StreamHandle) override { std::memcpy(dst, src, n); }
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

  StreamHandle CreateStream(int units, int* granted) override {
    if (granted) *granted = units >= units_ || units <= 0 ? units_ : units;
    return nullptr;
  }
  void DestroyStream(StreamHandle) override {}
  void StreamWaitStream(StreamHandle, StreamHandle) override {}
  void SyncStream(StreamHandle) override {}
  void UseStream(StreamHandle) override {}
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

  EventHandle RecordEvent(StreamHandle) override { return nullptr; }
  bool EventDone(EventHandle) override { return true; }
  void WaitEvent(EventHandle) override {}
  void FreeEvent(EventHandle) override {}

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
  int units_;
  std::mutex cache_mu_;
  std::map<void*, size_t> sizes_;       // live blocks and their sizes
  std::multimap<size_t, void*> cache_;  // freed blocks kept for reuse
  size_t cached_ = 0;
};

}  // namespace

std::shared_ptr<Device> OpenCudaDevice(int index);  // cuda_device.cc

std::shared_ptr<Device> OpenDevice(const std::string& kind, int index) {
  if (kind == "cpu") {
    EnsureTvmRuntime(false);
    static std::shared_ptr<Device> cpu = std::make_shared<CpuDevice>();
    return cpu;
  }
  if (kind == "cuda") {
    EnsureTvmRuntime(true);
    return OpenCudaDevice(index);
  }
  TVM_FFI_THROW(TvmschedError) << "unknown device " << kind << ": use cpu or cuda";
}

}  // namespace tvmsched
