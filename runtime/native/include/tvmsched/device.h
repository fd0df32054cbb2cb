/*!
 * \file tvmsched/device.h
 * \brief The engine's one device interface (CPU, CUDA): memory, streams, events, the preempt flag,
 *        timestamps. Everything above it (model, stream) is device-free.
 *
 * Modelled on TVM's DeviceAPI: one small abstract class. A Device is owned through shared_ptr by the
 * models and streams using it; its methods are thread-safe.
 */
#ifndef TVMSCHED_DEVICE_H_
#define TVMSCHED_DEVICE_H_

#include <dlpack/dlpack.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace tvmsched {

/*! \brief An opaque stream handle: CUDA: a CUstream (0 = none yet); CPU: a launch queue in the asynchronous mode,
 *  else none (nullptr: launches are synchronous). */
using StreamHandle = void*;
/*! \brief An opaque event handle (CUDA: CUevent; CPU: a point in a launch queue, asynchronous mode only). */
using EventHandle = void*;

/*! \brief A stream's scheduling priority: real-time tenants' streams high, best-effort ones low (CUDA: the context's
 *  greatest and least stream priorities; CPU asynchronous mode: the queue thread's nice value, 0 or +10). */
enum class StreamPriority : int { kLow = -1, kNormal = 0, kHigh = 1 };

/*! \brief Where the preempt flag lives on a GPU (see Device::AllocFlags). */
enum class FlagMemory { kAuto, kHostMapped, kDevice };

/*!
 * \brief A memory budget for a set of models (one Runtime's): what they allocate counts against it, and
 *  Allocate refuses to pass it. Other models of the process (other Runtimes, plain executors) count
 *  against their own scopes or none; the device's capacity is checked apart from any scope.
 */
class MemoryScope {
 public:
  explicit MemoryScope(size_t budget) : budget_(budget) {}
  size_t budget() const { return budget_; }
  size_t in_use() const;
  /*! \brief What the budget has left (0 when it is spent). */
  size_t left() const;
  size_t peak() const;
  /*! \brief Count `nbytes` for `what`, or one TvmschedError line when the budget would be passed. */
  void Reserve(size_t nbytes, const std::string& what, const char* kind);
  void Unreserve(size_t nbytes);

 private:
  const size_t budget_;
  mutable std::mutex mu_;
  size_t in_use_ = 0, peak_ = 0;
};

/*! \brief Memory the kernels take as an int32 array, written by the host (the preempt flag). */
struct FlagArray {
  int32_t* device_ptr = nullptr;  ///< what kernels read (CPU: host memory; CUDA: device or host-mapped)
  int32_t* host_ptr = nullptr;    ///< host view when host-mapped or CPU, else nullptr
  int64_t length = 0;
  FlagMemory memory = FlagMemory::kHostMapped;
};

class Device {
 public:
  virtual ~Device() = default;
  /*! \brief "cpu" or "cuda". */
  virtual const char* kind() const = 0;
  virtual DLDevice dl_device() const = 0;
  /*! \brief All compute units: CPU worker threads (TVM_NUM_THREADS, else the cores) or GPU SMs. */
  virtual int total_units() const = 0;
  /*! \brief The smallest unit partition the device grants (CPU: 1 thread; CUDA: the green-context SM granularity). */
  virtual int unit_granularity() = 0;
  /*! \brief Abilities, asked instead of the device's kind. Whether a launch returns before its work is done
   *  (GPU: streams, events and a window of launches in flight; CPU: the kernel runs on the calling thread). */
  virtual bool launches_async() const = 0;
  /*! \brief Whether device memory is host memory (CPU: weights are read straight into it, no bounce buffer). */
  virtual bool host_memory() const = 0;
  /*! \brief Whether a non-idempotent kernel compiled for this device checks the preempt flag once at its entry and
   *  marks the started slot when it passes (CPU; a GPU kernel has no such check: it is only held back). */
  virtual bool entry_checks() const { return false; }
  /*! \brief Whether kernels run by the device's own threads from launch queues (the CPU device's asynchronous
   *  mode): a launch is handed over with Enqueue, its arguments copied. GPU: a kernel call enqueues itself. */
  virtual bool host_queues() const { return false; }
  /*! \brief Run `work` (a kernel call) in order on `stream` (nullptr: now, on the calling thread). */
  virtual void Enqueue(StreamHandle /*stream*/, std::function<void()> work) { work(); }
  /*! \brief The processor's name ("AMD EPYC", "NVIDIA H100 80GB HBM3"). */
  virtual std::string name() const = 0;

  /*! \brief Memory the device could still give now (CPU: the kernel's MemAvailable; CUDA: cuMemGetInfo's free). */
  virtual size_t FreeMemory() = 0;
  virtual void* Alloc(size_t nbytes) = 0;
  virtual void Free(void* ptr) = 0;
  /*! \brief Host memory that copies to and from the device fast (CUDA: pinned). */
  virtual void* AllocHost(size_t nbytes) = 0;
  virtual void FreeHost(void* ptr) = 0;
  /*! \brief Make host memory allocated elsewhere (e.g. bound to a NUMA node) copy as fast as AllocHost's
   *  (CUDA: page-locked with cuMemHostRegister; CPU: nothing to do). UnregisterHost before freeing it. */
  virtual void RegisterHost(void* ptr, size_t nbytes) = 0;
  virtual void UnregisterHost(void* ptr) = 0;
  /*! \brief Copies ordered on `stream` (0: synchronous); CPU copies are always synchronous. */
  virtual void CopyToDevice(void* dst, const void* src, size_t nbytes, StreamHandle stream) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t nbytes, StreamHandle stream) = 0;
  /*! \brief Copy device memory to the host without waiting for other streams' kernels. */
  virtual void ReadWhileRunning(void* dst, const void* src, size_t nbytes) = 0;
  virtual void MemsetD32(void* dst, int32_t value, size_t count) = 0;

  /*! \brief A new stream whose kernels use at most `units` units (<= 0 or >= total_units(): all).
   *  CPU: nullptr (the calling thread launches; see SetThreadUnits). CUDA: a plain stream, or a
   *  stream of a green context of about `units` SMs (one context per SM count, kept by the device);
   *  `granted` receives the units it really has. The caller owns it (DestroyStream). */
  virtual StreamHandle CreateStream(int units, int* granted, StreamPriority priority = StreamPriority::kNormal) = 0;
  virtual void DestroyStream(StreamHandle stream) = 0;
  /*! \brief Make `waiter` wait (on the device, not the host) for the work queued on `stream` so far. */
  virtual void StreamWaitStream(StreamHandle waiter, StreamHandle stream) = 0;
  virtual void SyncStream(StreamHandle stream) = 0;
  /*! \brief Make kernels launched from this thread go to `stream` (TVM's per-device current stream). */
  virtual void UseStream(StreamHandle stream) = 0;
  /*! \brief CPU: this thread's kernels use `units` worker threads. CUDA: makes the context current. */
  virtual void SetThreadUnits(int units) = 0;
  /*! \brief Run the calling thread on the device's cores: a CPU device that is a share of them (OpenCpuShare; the
   *  pool workers the thread starts inherit them); others: nothing. A stream's threads call it as they start. */
  virtual void PinThread() {}

  virtual EventHandle RecordEvent(StreamHandle stream) = 0;
  virtual bool EventDone(EventHandle event) = 0;
  virtual void WaitEvent(EventHandle event) = 0;
  virtual void FreeEvent(EventHandle event) = 0;

  /*! \brief The preempt flag array: CUDA host-mapped pinned memory or device memory set from a
   *  high-priority stream (kAuto measures both once and keeps the faster). */
  virtual FlagArray AllocFlags(int64_t length, FlagMemory memory) = 0;
  virtual void FreeFlags(const FlagArray& flags) = 0;
  /*! \brief Set `count` slots of the flag to `value`; visible to kernels launched or running after it returns. */
  virtual void SetFlags(const FlagArray& flags, int32_t value, int64_t count) = 0;

  /*! \brief Monotonic microseconds (the clock of timeline records). */
  static double NowMicros();

  // ---- accounted device memory: what models allocate goes through here ----------------------------
  struct MemoryStats {
    size_t in_use = 0;  ///< bytes allocated through Allocate and not yet released
    size_t peak = 0;    ///< the most in_use has been since the last ResetPeak
    size_t budget = 0;  ///< Allocate refuses to go past it (0: no budget)
  };
  /*! \brief `nbytes` of device memory for `what` (named in the error), or one TvmschedError line when
   *  `scope`'s budget (the models of one Runtime) or the device's would be exceeded, or the device has
   *  not enough. Checked at every allocation; the memory counts against `scope` until released. */
  void* Allocate(size_t nbytes, const std::string& what, std::shared_ptr<MemoryScope> scope = nullptr);
  /*! \brief Free what Allocate returned. */
  void Release(void* ptr);
  MemoryStats memory() const;
  /*! \brief Set the budget (0: none); a budget below what is in use is refused. */
  void SetBudget(size_t bytes);
  void ResetPeak();

  // ---- faults (src/faults.cc, docs/faults.md) -------------------------------------------------------
  // A fault in one tenant's kernel (on CUDA: a sticky error) makes every launch on the device void until the
  // device is recovered: HEALTHY -> FAULTED (launches park) -> recovered (generation + 1) or LOST.
  enum Health : int { kHealthy = 0, kFaulted = 1, kLost = 2 };
  struct FaultStats {
    int health = kHealthy;
    uint64_t generation = 0;  ///< recoveries so far: a request started in an older one runs again
    int64_t faults = 0;
    int64_t recoveries = 0;
    double last_recovery_s = 0;  ///< fault reported to recovered, the latest
    std::string lost;            ///< why the device is lost (empty: it is not)
  };
  /*! \brief Bracket of one launch: waits (at most `timeout_s`) while the device is FAULTED, then counts the
   *  launch as running and returns the generation it runs in; one TvmschedError line when the device is lost. */
  uint64_t EnterLaunch(double timeout_s);
  void ExitLaunch();
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  int health() const { return health_.load(std::memory_order_acquire); }
  /*! \brief A launch saw a sticky fault: HEALTHY -> FAULTED (later reports of the same fault are ignored). */
  void ReportFault(const std::string& error);
  /*! \brief The faulting launch's thread, after its launch ended: wait for the other launches running to end
   *  (`timeout_s`), Recreate(), generation + 1, HEALTHY. Returns empty, or why the device is now LOST. */
  std::string Recover(double timeout_s);
  FaultStats faults() const;
  /*! \brief The line a launch on a lost device fails with ("the cuda device is lost: WHY"; empty: not lost). */
  std::string LostLine() const;
  /*! \brief Test hook (CPU): the next Recreate() fails, so the device is lost. */
  void FailNextRecreate() { fail_recreate_.store(true); }

 protected:
  /*! \brief Make the device usable again after a fault: true, or false with `why` (the device is then lost).
   *  CPU: nothing to redo. CUDA: not implemented (docs/faults.md: context reset, memory re-prepared). */
  virtual bool Recreate(std::string* why) = 0;
  std::string LostLineLocked() const;  // (under fault_mu_)

 private:
  mutable std::mutex fault_mu_;
  std::condition_variable fault_cond_;
  std::atomic<int> health_{kHealthy};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_launches_{0};
  std::atomic<bool> fail_recreate_{false};
  FaultStats fault_stats_;  // under fault_mu_ (health and generation mirrored in the atomics)
  double faulted_at_us_ = 0;

 private:
  mutable std::mutex account_mu_;
  struct Live {
    size_t nbytes;
    std::shared_ptr<MemoryScope> scope;
  };
  std::map<void*, Live> live_;
  MemoryStats stats_;
};

/*! \brief The CPU device's mode from TVMSCHED_CPU_LAUNCHES: "async" (true), "sync" or unset (false); anything
 *  else is one TvmschedError line. OpenDevice("cpu") reads it at each call. */
bool CpuLaunchesAsync();

/*!
 * \brief Open a device: "cpu" or "cuda" (ordinal `index`). CUDA loads libcuda.so.1 at run time and
 *  fails with a one-line error where there is no driver or GPU.
 */
std::shared_ptr<Device> OpenDevice(const std::string& kind, int index = 0);

/*! \brief The GPUs this process sees (`--devices all`); one TvmschedError line where there is no CUDA driver. */
int CudaDeviceCount();

/*! \brief A new CPU device standing for one of `of` GPUs (a Runtime over several devices, tested without GPUs): the
 *  `index`-th share of the process's cores (more devices than cores: one core each, shared), its kernels' threads
 *  pinned to them, its own memory accounting and fault state. Each call opens another device. */
std::shared_ptr<Device> OpenCpuShare(int index, int of);

/*! \brief Size in bytes of a DLPack dtype element (bool counts 1). */
size_t DTypeBytes(DLDataType dtype);

}  // namespace tvmsched

#endif  // TVMSCHED_DEVICE_H_
