// The engine's CPU thread pool for the parallel loops of TVM-compiled kernels.
//
// A kernel's parallel loop calls TVMBackendParallelLaunch(lambda, cdata, num_task) through the function pointer
// `__TVMBackendParallelLaunch` in its library, which tvm-ffi's library loader fills from its registry of context
// symbols; lambda(task_id, {sync, num_task}, cdata) runs the task_id-th of num_task equal slices of the loop.
// TVM's pool hands slice i to worker i and waits, spinning on sched_yield, until every worker has run its slice:
// beside a process whose threads spin on the same cores, a descheduled worker stalls every layer for a time
// slice (bert-tiny 0.38 -> 92 ms, issue 28). Here the slices are claimed, not assigned: the launching thread
// and the woken workers take the next unclaimed slice from one atomic word until none is left, so a worker
// that is not running claims nothing and the launching thread runs the slices itself. The launching thread
// waits only for slices already being run. Idle workers spin briefly (TVMSCHED_CPU_POOL_SPIN_US) and then
// sleep on a futex, and nothing is pinned, so the OS can move a woken worker to whichever core is free.
// docs/engine.md, "The CPU thread pool".
#include "cpu_pool.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/reflection/registry.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tvm_runtime.h"

namespace tvmsched {
namespace ffi = tvm::ffi;
namespace {

// TVMParallelGroupEnv and FTVMParallelLambda of TVM's c_backend_api.h (the engine does not include TVM's headers)
struct ParallelGroupEnv {
  void* sync_handle;
  int32_t num_task;
};
using ParallelLambda = int (*)(int task_id, ParallelGroupEnv* penv, void* cdata);
using ParallelLaunchFn = int (*)(ParallelLambda, void*, int);

int EnvInt(const char* name, int fallback, int lo, int hi) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  long n = std::strtol(value, &end, 10);
  if (end == value || n < lo || n > hi) return fallback;
  return static_cast<int>(n);
}

struct Settings {
  bool enabled;
  int spin_us;  // how long an idle worker (or the launching thread waiting for a slice) spins before sleeping
  bool adapt;   // no spinning while the machine is contended (TVMSCHED_CPU_POOL_ADAPT=1; off by default)
  int chunks;   // slices per thread of a launch that leaves num_task to the runtime (the codegen always does)
  int default_threads;
  // fault injection for tests (TVMSCHED_CPU_POOL_STALL_WORKERS=1): workers wake but never take a slice, as a worker
  // the OS never schedules; a launch must still finish (tests/runtime/test_cpu_pool.py)
  bool stall_workers;
};

const Settings& GetSettings() {
  static const Settings settings = [] {
    Settings s;
    const char* kind = std::getenv("TVMSCHED_CPU_POOL");
    s.enabled = kind == nullptr || std::strcmp(kind, "tvm") != 0;
    s.spin_us = EnvInt("TVMSCHED_CPU_POOL_SPIN_US", 50, 0, 10000000);
    s.adapt = EnvInt("TVMSCHED_CPU_POOL_ADAPT", 0, 0, 1) == 1;
    s.chunks = EnvInt("TVMSCHED_CPU_POOL_CHUNKS", 1, 1, 64);
    s.stall_workers = EnvInt("TVMSCHED_CPU_POOL_STALL_WORKERS", 0, 0, 1) == 1;
    int threads = EnvInt("TVM_NUM_THREADS", 0, 1, 4096);
    if (threads == 0) threads = static_cast<int>(std::thread::hardware_concurrency());
    s.default_threads = threads > 0 ? threads : 1;
    return s;
  }();
  return settings;
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

inline double NowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Contention (TVMSCHED_CPU_POOL_ADAPT=1). The idea: a spinning thread is runnable all the time, so beside
// threads that also want the core the scheduler counts the spin as CPU use, and it may have to wait its turn
// when the launch it spun for arrives, or be preempted in the middle of its slice; a sleeping thread is woken at
// once. So with ADAPT nobody spins while the machine is contended: a thread of the pool that waited for a CPU
// (its run delay in /proc/thread-self/schedstat grew by kDelayUs or more since its last look, at most every
// kCheckUs) or was preempted (an involuntary context switch) marks the machine contended for kHoldUs. Measured
// (bench/results/contention.md) it did not help consistently beside a spinning neighbour, and on a machine busy
// with other work it stopped the spin that fine-grained models need (bert-tiny alone 1.7x slower): off by default.
constexpr double kCheckUs = 1000, kHoldUs = 10000, kDelayUs = 200;
std::atomic<double> contended_until_us{0};
std::atomic<int64_t> contention_seen{0};

struct ContentionProbe {
  int fd = -2;  // this thread's schedstat (-1: not available)
  double next_check = 0;
  long long run_delay_ns = -1;
  long nivcsw = -1;
  ~ContentionProbe() {
    if (fd >= 0) close(fd);
  }
  /*! \brief Whether this thread waited for a CPU or was preempted since the last look. */
  bool Look() {
    bool seen = false;
    if (fd == -2) fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {  // "<run ns> <run delay ns> <slices>"
      char text[96];
      ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
      long long run = 0, delay = 0;
      if (n > 0 && (text[n] = '\0', std::sscanf(text, "%lld %lld", &run, &delay) == 2)) {
        seen = run_delay_ns >= 0 && delay - run_delay_ns >= static_cast<long long>(kDelayUs * 1000);
        run_delay_ns = delay;
      }
    }
    rusage usage;
    if (getrusage(RUSAGE_THREAD, &usage) == 0) {
      seen = seen || (nivcsw >= 0 && usage.ru_nivcsw > nivcsw);
      nivcsw = usage.ru_nivcsw;
    }
    return seen;
  }
};

void CheckContention() {
  thread_local ContentionProbe probe;
  double now = NowUs();
  if (now < probe.next_check) return;
  probe.next_check = now + kCheckUs;
  if (probe.Look()) {
    contended_until_us.store(now + kHoldUs, std::memory_order_relaxed);
    contention_seen.fetch_add(1, std::memory_order_relaxed);
  }
}

bool Contended() { return NowUs() < contended_until_us.load(std::memory_order_relaxed); }

/*! \brief How long to spin before sleeping now: spin_us, or nothing while the machine is contended. */
int SpinBudget() {
  const Settings& settings = GetSettings();
  if (settings.spin_us == 0 || !settings.adapt) return settings.spin_us;
  CheckContention();
  return Contended() ? 0 : settings.spin_us;
}

/*! \brief Spin until `word` differs from `seen` (or `stop`), for at most spin_us, then sleep on it. The spin yields
 *  its core every 64 pauses: a thread just woken on this core (a server's handler whose request this launch
 *  finished) runs then instead of waiting behind the spin or for the scheduler's preemption (tens of µs). */
uint32_t AwaitChange(std::atomic<uint32_t>& word, uint32_t seen, std::atomic<int>& sleepers, int spin_us,
                     const std::atomic<bool>* stop) {
  auto changed = [&] { return word.load(std::memory_order_acquire) != seen || (stop && stop->load()); };
  if (spin_us > 0) {
    double deadline = NowUs() + spin_us;
    for (int i = 1; !changed(); ++i) {
      CpuRelax();
      if ((i & 63) == 0) {
        if (NowUs() > deadline) break;
        std::this_thread::yield();
      }
    }
  }
  while (!changed()) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (word.load(std::memory_order_seq_cst) == seen && !(stop && stop->load())) FutexWait(&word, seen);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  return word.load(std::memory_order_acquire);
}

thread_local bool in_pool_worker = false;
thread_local int thread_count = 0;  // 0: the default (TVM_NUM_THREADS, else the cores)

// The claim word: [epoch:32][num_task:16][next:16]. A slice is claimed by incrementing `next` with a
// compare-and-swap on the whole word, so a thread holding the word of an earlier launch can never claim a
// slice of a later one, and a launch's fields are stable while its word has unclaimed slices.
constexpr uint64_t kMaxTasks = 0xffff;
inline uint64_t Pack(uint32_t epoch, uint32_t num_task, uint32_t next) {
  return (uint64_t(epoch) << 32) | (uint64_t(num_task) << 16) | next;
}
inline uint32_t NumTask(uint64_t w) { return uint32_t(w >> 16) & 0xffff; }
inline uint32_t Next(uint64_t w) { return uint32_t(w) & 0xffff; }

class Pool {
 public:
  ~Pool() {
    if (owner_ != getpid()) {  // a forked child: the workers are its parent's threads, not joinable here
      for (auto& worker : workers_) worker.detach();
      return;
    }
    stop_.store(true);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    FutexWakeAll(&wake_);
    for (auto& worker : workers_) worker.join();
  }

  int Launch(ParallelLambda fn, void* cdata, int num_task, int threads) {
    const Settings& settings = GetSettings();
    int tasks = num_task > 0 ? num_task : threads * settings.chunks;
    launches_.fetch_add(1, std::memory_order_relaxed);
    if (threads <= 1 || tasks == 1 || static_cast<uint64_t>(tasks) > kMaxTasks) {
      // one thread: every slice here, in order (a launch asking for more slices than the word holds, too)
      tasks_.fetch_add(tasks, std::memory_order_relaxed);
      master_tasks_.fetch_add(tasks, std::memory_order_relaxed);
      ParallelGroupEnv env{nullptr, tasks};
      for (int i = 0; i < tasks; ++i) {
        if (fn(i, &env, cdata) != 0) return -1;
      }
      return 0;
    }
    EnsureWorkers(threads - 1);
    fn_.store(fn, std::memory_order_relaxed);
    cdata_.store(cdata, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    ++epoch_;
    claim_.store(Pack(epoch_, tasks, 0), std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&wake_);

    int mine = RunTasks();
    tasks_.fetch_add(tasks, std::memory_order_relaxed);
    master_tasks_.fetch_add(mine, std::memory_order_relaxed);
    // slices still being run by workers: spin a little, then sleep until the last one is done
    for (uint32_t seen = done_.load(std::memory_order_acquire); seen != static_cast<uint32_t>(tasks);) {
      seen = AwaitChange(done_, seen, done_sleepers_, SpinBudget(), nullptr);
    }
    if (error_ != nullptr) {
      TVMFFIErrorSetRaised(error_);
      TVMFFIObjectDecRef(error_);
      error_ = nullptr;
      return -1;
    }
    return 0;
  }

  void Stats(ffi::Map<ffi::String, int64_t>* out) const {
    out->Set("workers", static_cast<int64_t>(workers_.size()));
    out->Set("launches", launches_.load());
    out->Set("tasks", tasks_.load());
    out->Set("launcher_tasks", master_tasks_.load());
  }

 private:
  void EnsureWorkers(int n) {
    wanted_.store(n, std::memory_order_relaxed);
    if (workers_.empty()) owner_ = getpid();
    while (static_cast<int>(workers_.size()) < n) {
      int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { WorkerLoop(index); });
    }
  }

  void WorkerLoop(int index) {
    in_pool_worker = true;
    uint32_t seen = wake_.load(std::memory_order_acquire);
    for (;;) {
      seen = AwaitChange(wake_, seen, sleepers_, SpinBudget(), &stop_);
      if (stop_.load()) return;
      if (index < wanted_.load(std::memory_order_relaxed) && !GetSettings().stall_workers) RunTasks();
    }
  }

  /*! \brief Claim and run slices of the current launch until none is left; returns how many this thread ran. */
  int RunTasks() {
    int ran = 0;
    uint64_t w = claim_.load(std::memory_order_acquire);
    for (;;) {
      uint32_t n = NumTask(w), next = Next(w);
      if (next >= n) return ran;
      // while the word has unclaimed slices, its launch is live and these fields are its own
      ParallelLambda fn = fn_.load(std::memory_order_relaxed);
      void* cdata = cdata_.load(std::memory_order_relaxed);
      if (!claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      ParallelGroupEnv env{nullptr, static_cast<int32_t>(n)};
      if (fn(static_cast<int>(next), &env, cdata) != 0) RecordError();
      ++ran;
      bool last = done_.fetch_add(1, std::memory_order_seq_cst) + 1 == n;
      if (last && done_sleepers_.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&done_);
      w = claim_.load(std::memory_order_acquire);
    }
  }

  void RecordError() {
    TVMFFIObjectHandle error = nullptr;
    TVMFFIErrorMoveFromRaised(&error);
    std::lock_guard<std::mutex> lock(error_mu_);
    if (error_ == nullptr) {
      error_ = error;
    } else if (error != nullptr) {
      TVMFFIObjectDecRef(error);
    }
  }

  std::atomic<uint64_t> claim_{0};
  uint32_t epoch_ = 0;  // the launching thread's alone
  std::atomic<ParallelLambda> fn_{nullptr};
  std::atomic<void*> cdata_{nullptr};
  std::atomic<uint32_t> done_{0};  // slices finished in the current launch (the launching thread sleeps on it)
  std::atomic<int> done_sleepers_{0};
  std::atomic<uint32_t> wake_{0};  // bumped per launch (idle workers sleep on it)
  std::atomic<int> sleepers_{0};
  std::atomic<int> wanted_{0};  // workers taking part in launches (threads - 1)
  std::atomic<bool> stop_{false};
  std::mutex error_mu_;
  TVMFFIObjectHandle error_ = nullptr;
  std::vector<std::thread> workers_;
  pid_t owner_ = getpid();  // the process whose threads the workers are (a forked child runs slices alone)
  std::atomic<int64_t> launches_{0}, tasks_{0}, master_tasks_{0};
};

Pool& ThreadPool() {
  thread_local Pool pool;
  return pool;
}

int Threads() { return thread_count > 0 ? thread_count : GetSettings().default_threads; }

/*! \brief TVM's own launcher, for a library whose kernels synchronise their slices (TVMBackendParallelBarrier):
 *  slices that wait for each other need to run at once, which claiming does not promise. */
ParallelLaunchFn TvmLaunch() {
  static ParallelLaunchFn fn = reinterpret_cast<ParallelLaunchFn>(dlsym(RTLD_DEFAULT, "TVMBackendParallelLaunch"));
  return fn;
}

bool UsesBarrier(ParallelLambda fn) {
  thread_local std::unordered_map<void*, bool> known;
  void* key = reinterpret_cast<void*>(fn);
  auto found = known.find(key);
  if (found != known.end()) return found->second;
  bool uses = false;
  Dl_info info;
  if (dladdr(key, &info) != 0 && info.dli_fname != nullptr) {
    if (void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
      uses = dlsym(lib, "__TVMBackendParallelBarrier") != nullptr;
      dlclose(lib);
    }
  }
  if (known.size() >= 4096) known.clear();  // libraries come and go (models switched in and out)
  known.emplace(key, uses);
  return uses;
}

int EngineParallelLaunch(ParallelLambda fn, void* cdata, int num_task) {
  if (in_pool_worker) {  // a launch from inside a slice (TVM refuses it): run it here
    int tasks = num_task > 0 ? num_task : 1;
    ParallelGroupEnv env{nullptr, tasks};
    for (int i = 0; i < tasks; ++i) {
      if (fn(i, &env, cdata) != 0) return -1;
    }
    return 0;
  }
  if (UsesBarrier(fn) && TvmLaunch() != nullptr) return TvmLaunch()(fn, cdata, num_task);
  return ThreadPool().Launch(fn, cdata, num_task, Threads());
}

}  // namespace

bool CpuPoolEnabled() { return GetSettings().enabled; }

void InstallCpuPool() {
  if (!CpuPoolEnabled()) return;
  static std::once_flag once;
  std::call_once(once, [] {
    // registered after TVM's runtime registered its own: the loader writes the later one into each library
    void* launch = reinterpret_cast<void*>(&EngineParallelLaunch);
    if (TVMFFIEnvModRegisterContextSymbol("__TVMBackendParallelLaunch", launch) != 0) {
      TVM_FFI_THROW(TvmschedError) << "cannot register the engine's parallel launcher with tvm-ffi";
    }
    // Whoever sizes TVM's pool of a thread (runtime.config_threadpool(mode, n[, cpus]): the compiler's measurements
    // at k units, for one) sizes the engine's too, since kernels loaded from now on run on it; CPU lists (pinning)
    // apply to TVM's pool only.
    ffi::Function tvm_config = TvmRuntimeFunction("runtime.config_threadpool");
    ffi::Function::SetGlobal("runtime.config_threadpool",
                             ffi::Function::FromPacked([tvm_config](ffi::PackedArgs args, ffi::Any* rv) {
                               tvm_config.CallPacked(args, rv);
                               if (args.size() >= 2) SetCpuPoolThreads(args[1].cast<int>());
                             }),
                             /*override=*/true);
  });
}

void SetCpuPoolThreads(int threads) {  // 0: the default; at most the default, as TVM's pool
  thread_count = threads > 0 ? std::min(threads, GetSettings().default_threads) : 0;
}

TVM_FFI_STATIC_INIT_BLOCK() {
  tvm::ffi::reflection::GlobalDef().def("tvmsched.engine.cpu_pool", []() {
    // how this thread's parallel loops run: pool kind, threads, settings, and its pool's counters
    const Settings& settings = GetSettings();
    ffi::Map<ffi::String, int64_t> out;
    out.Set("engine", settings.enabled ? 1 : 0);
    out.Set("threads", Threads());
    out.Set("spin_us", settings.spin_us);
    out.Set("adapt", settings.adapt ? 1 : 0);
    out.Set("contended", Contended() ? 1 : 0);
    out.Set("contention_seen", contention_seen.load());
    out.Set("chunks", settings.chunks);
    if (settings.enabled) ThreadPool().Stats(&out);
    return out;
  });
}

}  // namespace tvmsched
