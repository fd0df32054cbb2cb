// Device memory accounting: every allocation a model makes is checked against the device's budget.
#include <tvm/ffi/error.h>

#include "tvmsched/device.h"

namespace tvmsched {

void* Device::Allocate(size_t nbytes, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(account_mu_);
    if (stats_.budget && stats_.in_use + nbytes > stats_.budget) {
      TVM_FFI_THROW(TvmschedError) << what << " needs " << nbytes << " bytes of " << kind() << " memory; "
                                   << stats_.in_use << " of the budget of " << stats_.budget << " bytes are in use";
    }
    stats_.in_use += nbytes;  // reserved before allocating: concurrent loads never pass the budget together
    stats_.peak = std::max(stats_.peak, stats_.in_use);
  }
  void* ptr = nullptr;
  try {
    ptr = Alloc(nbytes);
  } catch (const tvm::ffi::Error& err) {
    std::lock_guard<std::mutex> lock(account_mu_);
    stats_.in_use -= nbytes;
    TVM_FFI_THROW(TvmschedError) << what << " needs " << nbytes << " bytes (" << err.message() << ")";
  }
  std::lock_guard<std::mutex> lock(account_mu_);
  live_[ptr] = nbytes;
  return ptr;
}

void Device::Release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(account_mu_);
    auto found = live_.find(ptr);
    if (found == live_.end()) TVM_FFI_THROW(TvmschedError) << "internal: releasing memory the accounting does not know";
    stats_.in_use -= found->second;
    live_.erase(found);
  }
  Free(ptr);
}

Device::MemoryStats Device::memory() const {
  std::lock_guard<std::mutex> lock(account_mu_);
  return stats_;
}

void Device::SetBudget(size_t bytes) {
  std::lock_guard<std::mutex> lock(account_mu_);
  if (bytes && bytes < stats_.in_use) {
    TVM_FFI_THROW(TvmschedError) << "a " << kind() << " memory budget of " << bytes << " bytes is below the " << stats_.in_use
                                 << " bytes already in use";
  }
  stats_.budget = bytes;
}

void Device::ResetPeak() {
  std::lock_guard<std::mutex> lock(account_mu_);
  stats_.peak = stats_.in_use;
}

}  // namespace tvmsched
