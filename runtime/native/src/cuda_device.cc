// CUDA device through the driver API, loaded at run time (libcuda.so.1), so the engine builds and runs
// everywhere and needs a driver only where a GPU is. Kernels of TVM modules launch on the stream made
// current with TVMFFIEnvSetStream; restricted-unit streams come from green contexts of k SMs.
#include <dlfcn.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda_driver.h"
#include "tvmsched/device.h"
#include "tvmsched/sm_windows.h"

namespace tvmsched {
namespace {

using namespace cuda_driver;  // NOLINT: the driver API's own names (cuda_driver.h), no CUDA toolkit needed

/*! \brief The driver functions the engine uses, looked up by their versioned symbol names. */
struct Driver {
#define TVMSCHED_CU_FN(name, symbol, params) CUresult(*name) params = nullptr;
  TVMSCHED_CUDA_DRIVER_CALLS(TVMSCHED_CU_FN)
#undef TVMSCHED_CU_FN

  static Driver& Get() {
    static Driver driver;
    return driver;
  }

  void Check(CUresult result, const char* what) const {
    if (result == CUDA_SUCCESS) return;
    const char* text = nullptr;
    if (cuGetErrorString) cuGetErrorString(result, &text);
    std::ostringstream line;
    line << "CUDA driver error in " << what << ": " << (text ? text : "unknown") << " (" << static_cast<int>(result)
         << ")";
    if (Sticky(result)) {  // the context is unusable for every tenant: the device's fault state machine (faults.cc)
      line << "; a sticky error: every later call in this context fails";
      if (Device* device = fault_target.load()) device->ReportFault(line.str());
    }
    TVM_FFI_THROW(TvmschedError) << line.str();
  }

  /*! \brief Errors after which the CUDA context is unusable (a kernel faulted): docs/faults.md. */
  static bool Sticky(CUresult result) {
    switch (result) {
      case CUDA_ERROR_ILLEGAL_ADDRESS:
      case CUDA_ERROR_MISALIGNED_ADDRESS:
      case CUDA_ERROR_ILLEGAL_INSTRUCTION:
      case CUDA_ERROR_HARDWARE_STACK_ERROR:
      case CUDA_ERROR_INVALID_PC:
      case CUDA_ERROR_LAUNCH_FAILED:
      case CUDA_ERROR_ASSERT:
        return true;
      default:
        return false;
    }
  }
  mutable std::atomic<Device*> fault_target{nullptr};  // the device a sticky error is reported to (the latest opened)

 private:
  Driver() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) TVM_FFI_THROW(TvmschedError) << "no CUDA driver on this machine (libcuda.so.1 not found)";
    // each call by the symbol the driver exports for it (cuMemAlloc -> cuMemAlloc_v2: cuda_driver.h)
#define TVMSCHED_CU_LOAD(name, symbol, params) name = reinterpret_cast<decltype(name)>(dlsym(lib, symbol));
    TVMSCHED_CUDA_DRIVER_CALLS(TVMSCHED_CU_LOAD)
#undef TVMSCHED_CU_LOAD
    if (!cuInit || !cuMemAlloc || !cuEventQuery) TVM_FFI_THROW(TvmschedError) << "libcuda.so.1 lacks the driver API";
    Check(cuInit(0), "cuInit");
  }
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : drv_(Driver::Get()) {
    drv_.Check(drv_.cuDeviceGet(&device_, index), "cuDeviceGet");
    drv_.Check(drv_.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
    MakeCurrent();
    drv_.Check(drv_.cuDeviceGetAttribute(&sm_count_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_), "SM count");
    int least = 0, greatest = 0;
    drv_.Check(drv_.cuCtxGetStreamPriorityRange(&least, &greatest), "cuCtxGetStreamPriorityRange");
    drv_.Check(drv_.cuStreamCreateWithPriority(&flag_stream_, CU_STREAM_NON_BLOCKING, greatest), "flag stream");
    drv_.Check(drv_.cuStreamCreate(&read_stream_, CU_STREAM_NON_BLOCKING), "counter stream");
    index_ = index;
    drv_.fault_target.store(this);
  }

  // Recovering a CUDA context (cuDevicePrimaryCtxReset, then every model's memory, modules, streams, events and the
  // flag memory made anew) is designed in docs/faults.md and not implemented: after a sticky fault the device is lost
  bool Recreate(std::string* why) override {
    *why =
        "a sticky CUDA fault; recreating the context is not implemented (docs/faults.md): reload the models in a "
        "new process";
    return false;
  }

  const char* kind() const override { return "cuda"; }
  DLDevice dl_device() const override { return DLDevice{kDLCUDA, index_}; }
  int total_units() const override { return sm_count_; }
  bool launches_async() const override { return true; }
  bool host_memory() const override { return false; }
  int unit_granularity() override {
    if (!drv_.cuDevSmResourceSplitByCount) return sm_count_;
    CUdevResource all{}, group{};
    unsigned int groups = 1;
    drv_.Check(drv_.cuDeviceGetDevResource(device_, &all, CU_DEV_RESOURCE_TYPE_SM), "SM resource");
    drv_.Check(drv_.cuDevSmResourceSplitByCount(&group, &groups, &all, nullptr, 0, 1), "SM split");
    return static_cast<int>(group.sm.smCount);  // what a request for 1 SM is rounded up to
  }
  std::string name() const override {
    char text[256] = {0};
    drv_.Check(drv_.cuDeviceGetName(text, sizeof(text) - 1, device_), "cuDeviceGetName");
    return text;
  }

  void MakeCurrent() const { drv_.Check(drv_.cuCtxSetCurrent(context_), "cuCtxSetCurrent"); }

  size_t FreeMemory() override {
    MakeCurrent();
    size_t free = 0, total = 0;
    drv_.Check(drv_.cuMemGetInfo(&free, &total), "cuMemGetInfo");
    return free;
  }
  void* Alloc(size_t nbytes) override {
    MakeCurrent();
    CUdeviceptr ptr = 0;
    drv_.Check(drv_.cuMemAlloc(&ptr, nbytes ? nbytes : 1), "cuMemAlloc");
    return reinterpret_cast<void*>(ptr);
  }
  void Free(void* ptr) override {
    MakeCurrent();
    drv_.cuMemFree(reinterpret_cast<CUdeviceptr>(ptr));
  }
  void* AllocHost(size_t nbytes) override {
    MakeCurrent();
    void* ptr = nullptr;
    drv_.Check(drv_.cuMemHostAlloc(&ptr, nbytes ? nbytes : 1, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
    return ptr;
  }
  void FreeHost(void* ptr) override { drv_.cuMemFreeHost(ptr); }
  void RegisterHost(void* ptr, size_t nbytes) override {
    MakeCurrent();
    drv_.Check(drv_.cuMemHostRegister(ptr, nbytes, CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister");
  }
  void UnregisterHost(void* ptr) override {
    MakeCurrent();
    drv_.cuMemHostUnregister(ptr);
  }
  void CopyToDevice(void* dst, const void* src, size_t n, StreamHandle stream) override {
    MakeCurrent();
    auto s = stream ? static_cast<CUstream>(stream) : read_stream_;
    drv_.Check(drv_.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dst), src, n, s), "copy to device");
    if (!stream) drv_.Check(drv_.cuStreamSynchronize(s), "copy to device");
  }
  void CopyToHost(void* dst, const void* src, size_t n, StreamHandle stream) override {
    MakeCurrent();
    auto s = stream ? static_cast<CUstream>(stream) : read_stream_;
    drv_.Check(drv_.cuMemcpyDtoHAsync(dst, reinterpret_cast<CUdeviceptr>(src), n, s), "copy to host");
    drv_.Check(drv_.cuStreamSynchronize(s), "copy to host");
  }
  void ReadWhileRunning(void* dst, const void* src, size_t n) override {
    std::lock_guard<std::mutex> lock(read_mutex_);
    CopyToHost(dst, src, n, read_stream_);
  }
  void MemsetD32(void* dst, int32_t value, size_t count) override {
    MakeCurrent();
    drv_.Check(drv_.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(dst), value, count, flag_stream_), "memset");
    drv_.Check(drv_.cuStreamSynchronize(flag_stream_), "memset");
  }

  StreamHandle CreateStream(int units, int* granted, StreamPriority priority) override {
    MakeCurrent();
    CUstream stream = nullptr;
    int least = 0, greatest = 0;  // numerically: greatest <= least
    drv_.Check(drv_.cuCtxGetStreamPriorityRange(&least, &greatest), "cuCtxGetStreamPriorityRange");
    int level = priority == StreamPriority::kHigh ? greatest : least;
    if (units <= 0 || units >= sm_count_ || !drv_.cuGreenCtxCreate) {
      drv_.Check(drv_.cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, level), "cuStreamCreateWithPriority");
      if (granted) *granted = sm_count_;
      return stream;
    }
    std::lock_guard<std::mutex> lock(green_mutex_);
    const Window window = TakeWindow(units);
    auto found = green_.find(window);
    if (found == green_.end()) found = green_.emplace(window, MakeGreenContext(window)).first;
    drv_.Check(drv_.cuGreenCtxStreamCreate(&stream, found->second.context, CU_STREAM_NON_BLOCKING, level),
               "green stream");
    stream_windows_[stream] = window;
    if (granted) *granted = found->second.granted;
    return stream;
  }
  void DestroyStream(StreamHandle stream) override {
    if (!stream) return;
    {
      std::lock_guard<std::mutex> lock(green_mutex_);
      auto found = stream_windows_.find(static_cast<CUstream>(stream));
      if (found != stream_windows_.end()) {
        if (found->second.first >= 0) windows_.Give(found->second.first, found->second.second);
        stream_windows_.erase(found);
      }
    }
    drv_.cuStreamDestroy(static_cast<CUstream>(stream));
  }
  void StreamWaitStream(StreamHandle waiter, StreamHandle stream) override {
    if (!waiter || !stream || waiter == stream) return;
    CUevent event = static_cast<CUevent>(RecordEvent(stream));
    drv_.Check(drv_.cuStreamWaitEvent(static_cast<CUstream>(waiter), event, 0), "cuStreamWaitEvent");
    FreeEvent(event);
  }
  void SyncStream(StreamHandle stream) override {
    if (stream) drv_.Check(drv_.cuStreamSynchronize(static_cast<CUstream>(stream)), "cuStreamSynchronize");
  }
  void UseStream(StreamHandle stream) override {
    TVMFFIStreamHandle previous = nullptr;
    TVMFFIEnvSetStream(kDLCUDA, index_, stream, &previous);
  }
  void SetThreadUnits(int) override { MakeCurrent(); }

  EventHandle RecordEvent(StreamHandle stream) override {
    CUevent event = nullptr;
    drv_.Check(drv_.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    drv_.Check(drv_.cuEventRecord(event, static_cast<CUstream>(stream)), "cuEventRecord");
    return event;
  }
  bool EventDone(EventHandle event) override {
    CUresult result = drv_.cuEventQuery(static_cast<CUevent>(event));
    if (result == CUDA_ERROR_NOT_READY) return false;
    drv_.Check(result, "cuEventQuery");
    return true;
  }
  void WaitEvent(EventHandle event) override {
    drv_.Check(drv_.cuEventSynchronize(static_cast<CUevent>(event)), "cuEventSynchronize");
  }
  void FreeEvent(EventHandle event) override { drv_.cuEventDestroy(static_cast<CUevent>(event)); }

  FlagArray AllocFlags(int64_t length, FlagMemory memory) override {
    if (memory == FlagMemory::kAuto) memory = FasterFlagMemory();
    FlagArray flags;
    flags.length = length;
    flags.memory = memory;
    if (memory == FlagMemory::kHostMapped) {
      MakeCurrent();
      void* host = nullptr;
      drv_.Check(
          drv_.cuMemHostAlloc(&host, sizeof(int32_t) * length, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
          "flag memory");
      CUdeviceptr mapped = 0;
      drv_.Check(drv_.cuMemHostGetDevicePointer(&mapped, host, 0), "flag mapping");
      flags.host_ptr = static_cast<int32_t*>(host);
      flags.device_ptr = reinterpret_cast<int32_t*>(mapped);
      for (int64_t i = 0; i < length; ++i) flags.host_ptr[i] = 0;
    } else {
      flags.device_ptr = static_cast<int32_t*>(Alloc(sizeof(int32_t) * length));
      MemsetD32(flags.device_ptr, 0, length);
    }
    return flags;
  }
  void FreeFlags(const FlagArray& flags) override {
    if (flags.memory == FlagMemory::kHostMapped) {
      FreeHost(flags.host_ptr);
    } else {
      Free(flags.device_ptr);
    }
  }
  void SetFlags(const FlagArray& flags, int32_t value, int64_t count) override {
    if (flags.memory == FlagMemory::kHostMapped) {
      for (int64_t i = 0; i < count; ++i) __atomic_store_n(flags.host_ptr + i, value, __ATOMIC_SEQ_CST);
    } else {
      // a DMA copy from pinned memory on the high-priority flag stream, then synchronised: a copy engine writes it
      // while every SM may be busy (a memset may run as a kernel, which would wait for the SMs the flag is to free)
      std::lock_guard<std::mutex> lock(flag_write_mutex_);
      if (!flag_source_) flag_source_ = static_cast<int32_t*>(AllocHost(sizeof(int32_t) * kFlagSourceLength));
      MakeCurrent();
      for (int64_t done = 0; done < count; done += kFlagSourceLength) {
        int64_t n = std::min<int64_t>(kFlagSourceLength, count - done);
        for (int64_t i = 0; i < n; ++i) flag_source_[i] = value;
        drv_.Check(drv_.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(flags.device_ptr + done), flag_source_,
                                          sizeof(int32_t) * n, flag_stream_),
                   "flag write");
        drv_.Check(drv_.cuStreamSynchronize(flag_stream_), "flag write");
      }
    }
  }

 private:
  struct GreenContext {
    CUgreenCtx context = nullptr;
    int granted = 0;
  };
  using Window = std::pair<int, int>;  // (first SM group, groups); first -1: k SMs split off the whole device

  /*! \brief The SM groups a new stream of `units` SMs runs on (sm_windows.h); green_mutex_ held. */
  Window TakeWindow(int units) {
    if (!SplitGroups()) return {-1, units};
    int size = static_cast<int>(sm_groups_[0].sm.smCount);
    int need = (units + size - 1) / size;
    return {windows_.Take(need), std::clamp(need, 1, windows_.groups())};
  }

  /*! \brief Split the SMs once into groups of the granularity; false where the driver cannot (then every context is
   *  k SMs split off the whole device, as before windows). green_mutex_ held. */
  bool SplitGroups() {
    if (split_tried_) return !sm_groups_.empty();
    split_tried_ = true;
    CUdevResource all{}, remainder{};
    if (drv_.cuDeviceGetDevResource(device_, &all, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS) return false;
    unsigned int count = static_cast<unsigned int>(sm_count_);  // at most one group per SM
    std::vector<CUdevResource> groups(count);
    if (drv_.cuDevSmResourceSplitByCount(groups.data(), &count, &all, &remainder, 0, unit_granularity()) !=
            CUDA_SUCCESS ||
        count == 0) {
      return false;
    }
    groups.resize(count);
    sm_groups_ = std::move(groups);
    const char* mode = std::getenv("TVMSCHED_SM_WINDOWS");
    windows_ = SmWindows(static_cast<int>(count), mode != nullptr && std::string(mode) == "prefix");
    return true;
  }

  GreenContext MakeGreenContext(const Window& window) {
    GreenContext out;
    CUdevResourceDesc desc = nullptr;
    if (window.first >= 0) {  // consecutive groups of the one split: one descriptor may combine them
      drv_.Check(drv_.cuDevResourceGenerateDesc(&desc, &sm_groups_[window.first], window.second), "SM window");
      for (int g = window.first; g < window.first + window.second; ++g) out.granted += sm_groups_[g].sm.smCount;
    } else {
      CUdevResource all{}, group{};
      drv_.Check(drv_.cuDeviceGetDevResource(device_, &all, CU_DEV_RESOURCE_TYPE_SM), "SM resource");
      unsigned int groups = 1;
      drv_.Check(drv_.cuDevSmResourceSplitByCount(&group, &groups, &all, nullptr, 0, window.second), "SM split");
      drv_.Check(drv_.cuDevResourceGenerateDesc(&desc, &group, 1), "resource descriptor");
      out.granted = static_cast<int>(group.sm.smCount);
    }
    drv_.Check(drv_.cuGreenCtxCreate(&out.context, desc, device_, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
    return out;
  }

  /*! \brief Time 200 sets of each kind of flag memory; the faster one is kept for every flag array. */
  FlagMemory FasterFlagMemory() {
    std::lock_guard<std::mutex> lock(flag_choice_mutex_);
    if (flag_choice_ != FlagMemory::kAuto) return flag_choice_;
    double best = 0;
    for (FlagMemory kind : {FlagMemory::kHostMapped, FlagMemory::kDevice}) {
      FlagArray flags = AllocFlags(4, kind);
      double start = NowMicros();
      for (int i = 0; i < 200; ++i) SetFlags(flags, i & 1, 4);
      double took = NowMicros() - start;
      FreeFlags(flags);
      if (flag_choice_ == FlagMemory::kAuto || took < best) flag_choice_ = kind, best = took;
    }
    return flag_choice_;
  }

  const Driver& drv_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  int index_ = 0;
  int sm_count_ = 0;
  CUstream flag_stream_ = nullptr;             // high priority: flag writes overtake queued kernels
  CUstream read_stream_ = nullptr;             // copies that must not wait for the tenants' kernels
  std::mutex read_mutex_;                      // guards read_stream_ use by monitor threads
  std::mutex green_mutex_;                     // guards the members below
  std::map<Window, GreenContext> green_;       // SM window -> its green context
  std::map<CUstream, Window> stream_windows_;  // the live green streams' windows
  std::vector<CUdevResource> sm_groups_;       // the SMs split once into groups of the granularity
  SmWindows windows_;                          // which groups the live windows cover
  bool split_tried_ = false;
  std::mutex flag_choice_mutex_;  // guards flag_choice_
  std::mutex flag_write_mutex_;   // guards flag_source_
  static constexpr int64_t kFlagSourceLength = 1024;
  int32_t* flag_source_ = nullptr;  // pinned: what SetFlags copies into device-memory flags (the device's lifetime)
  FlagMemory flag_choice_ = FlagMemory::kAuto;
};

}  // namespace

int CudaDeviceCount() {
  const Driver& drv = Driver::Get();
  int count = 0;
  drv.Check(drv.cuDeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

std::shared_ptr<Device> OpenCudaDevice(int index) {
  static std::mutex mutex;  // guards devices
  static std::map<int, std::shared_ptr<Device>> devices;
  std::lock_guard<std::mutex> lock(mutex);
  auto& device = devices[index];
  if (!device) device = std::make_shared<CudaDevice>(index);
  return device;
}

}  // namespace tvmsched
