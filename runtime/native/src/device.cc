// Device memory accounting: every allocation a model makes is checked against its scope's budget (its
// Runtime's) and the device's.
#include "tvmsched/device.h"

#include <tvm/ffi/error.h>

namespace tvmsched {

size_t MemoryScope::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

size_t MemoryScope::left() const {
  std::lock_guard<std::mutex> lock(mu_);
  return budget_ > in_use_ ? budget_ - in_use_ : 0;
}

size_t MemoryScope::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void MemoryScope::Reserve(size_t nbytes, const std::string& what, const char* kind) {
  std::lock_guard<std::mutex> lock(mu_);
  if (budget_ && in_use_ + nbytes > budget_) {
    TVM_FFI_THROW(TvmschedError) << what << " needs " << nbytes << " bytes of " << kind << " memory; " << in_use_
                                 << " of the budget of " << budget_ << " bytes are in use";
  }
  in_use_ += nbytes;
  peak_ = std::max(peak_, in_use_);
}

void MemoryScope::Unreserve(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= std::min(nbytes, in_use_);
}

void* Device::Allocate(size_t nbytes, const std::string& what, std::shared_ptr<MemoryScope> scope) {
  if (scope) scope->Reserve(nbytes, what, kind());  // the Runtime's budget, then the device's
  {
    std::lock_guard<std::mutex> lock(account_mu_);
    if (stats_.budget && stats_.in_use + nbytes > stats_.budget) {
      if (scope) scope->Unreserve(nbytes);
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
    {
      std::lock_guard<std::mutex> lock(account_mu_);
      stats_.in_use -= nbytes;
    }
    if (scope) scope->Unreserve(nbytes);
    TVM_FFI_THROW(TvmschedError) << what << " needs " << nbytes << " bytes (" << err.message() << ")";
  }
  std::lock_guard<std::mutex> lock(account_mu_);
  live_[ptr] = Live{nbytes, std::move(scope)};
  return ptr;
}

void Device::Release(void* ptr) {
  if (ptr == nullptr) return;
  Live live;
  {
    std::lock_guard<std::mutex> lock(account_mu_);
    auto found = live_.find(ptr);
    if (found == live_.end()) TVM_FFI_THROW(TvmschedError) << "internal: releasing memory the accounting does not know";
    live = std::move(found->second);
    stats_.in_use -= live.nbytes;
    live_.erase(found);
  }
  if (live.scope) live.scope->Unreserve(live.nbytes);
  Free(ptr);
}

Device::MemoryStats Device::memory() const {
  std::lock_guard<std::mutex> lock(account_mu_);
  return stats_;
}

void Device::SetBudget(size_t bytes) {
  std::lock_guard<std::mutex> lock(account_mu_);
  if (bytes && bytes < stats_.in_use) {
    TVM_FFI_THROW(TvmschedError) << "a " << kind() << " memory budget of " << bytes << " bytes is below the "
                                 << stats_.in_use << " bytes already in use";
  }
  stats_.budget = bytes;
}

void Device::ResetPeak() {
  std::lock_guard<std::mutex> lock(account_mu_);
  stats_.peak = stats_.in_use;
}

}  // namespace tvmsched
