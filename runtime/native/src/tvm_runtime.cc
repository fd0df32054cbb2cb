#include "tvm_runtime.h"

#include <dlfcn.h>
#include <tvm/ffi/error.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "cpu_pool.h"

namespace tvmsched {
namespace {

std::mutex mutex;  // guards lib_dir and the loaded flags
std::string lib_dir;
bool runtime_loaded = false, cuda_loaded = false;
constexpr const char* kSpinCount = "30000";

/*! \brief The folder of the engine library itself (where this code was loaded from), or empty. */
std::string EngineDir() {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&EnsureTvmRuntime), &info) || info.dli_fname == nullptr) return "";
  std::string self = info.dli_fname;
  size_t slash = self.rfind('/');
  return slash == std::string::npos ? "." : self.substr(0, slash);
}

/*! \brief The first folder that holds libtvm_runtime.so, or the first tried; `tried` lists them all. */
std::string LibDir(std::string* tried) {
  std::vector<std::string> dirs = TvmLibDirCandidates();
  for (const auto& dir : dirs) {
    if (tried) *tried += (tried->empty() ? "" : ", ") + dir;
  }
  for (const auto& dir : dirs) {
    if (access((dir + "/libtvm_runtime.so").c_str(), R_OK) == 0) return dir;
  }
  return dirs.empty() ? "" : dirs.front();
}

void* OpenGlobal(const std::string& path) { return dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL); }

}  // namespace

std::vector<std::string> TvmLibDirCandidates() {
  if (!lib_dir.empty()) return {lib_dir};
  if (const char* env = std::getenv("TVMSCHED_TVM_LIBDIR")) return {env};
  // no folder is baked in at build time (the build may run in a throw-away environment): look where the installed
  // packages put TVM's runtime relative to the engine (shipped beside it, or site-packages/tvmsched/lib ->
  // site-packages/tvm/lib); the Python side names the installed tvm's folder first (set_tvm_libdir)
  std::vector<std::string> dirs;
  if (std::string engine = EngineDir(); !engine.empty()) {
    dirs.push_back(engine);
    dirs.push_back(engine + "/../../tvm/lib");
  }
  return dirs;
}

void SetTvmLibDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mutex);
  lib_dir = dir;
}

void EnsureTvmRuntime(bool cuda) {
  std::lock_guard<std::mutex> lock(mutex);
  std::string tried;
  std::string dir = LibDir(&tried);
  if (!runtime_loaded) {
    // TVM's pool workers spin kSpinCount yields before they sleep (300000 by default: about a second when
    // idle, tens of seconds on a loaded machine), and a thread's pool is joined when that thread exits, so
    // closing a stream waited for its submitter's workers to stop spinning. A tenth keeps them warm across
    // layers and back-to-back requests; the user's own setting wins.
    setenv("TVM_THREAD_POOL_SPIN_COUNT", kSpinCount, /*overwrite=*/0);
    if (!OpenGlobal(dir + "/libtvm_runtime.so")) {
      TVM_FFI_THROW(TvmschedError) << "cannot load TVM's runtime library (libtvm_runtime.so) from " << tried
                                   << " (set TVMSCHED_TVM_LIBDIR to its folder): " << dlerror();
    }
    runtime_loaded = true;
    // kernels' parallel loops run on the engine's pool, not TVM's (cpu_pool.cc; TVMSCHED_CPU_POOL=tvm keeps TVM's)
    InstallCpuPool();
  }
  if (cuda && !cuda_loaded) {
    // TVM's CUDA module loader needs libcudart; CUDA 13 ships it by soname in the toolkit and pip wheels
    std::vector<std::string> cudart = {"libcudart.so.13", "/usr/local/cuda/lib64/libcudart.so.13"};
    bool found = false;
    for (const auto& path : cudart) found = found || OpenGlobal(path) != nullptr;
    if (!OpenGlobal(dir + "/libtvm_runtime_cuda.so")) {
      TVM_FFI_THROW(TvmschedError) << "cannot load TVM's CUDA runtime from " << dir
                                   << (found ? "" : " (libcudart.so.13 not found)") << ": " << dlerror();
    }
    cuda_loaded = true;
  }
}

tvm::ffi::Function TvmRuntimeFunction(const char* name) {
  auto func = tvm::ffi::Function::GetGlobal(name);
  if (!func.has_value()) TVM_FFI_THROW(TvmschedError) << "TVM's runtime lacks " << name;
  return *func;
}

}  // namespace tvmsched
