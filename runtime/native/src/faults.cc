// Device faults (docs/faults.md): the state machine every device shares. A sticky fault reported by one
// tenant's launch parks every launch of the device (EnterLaunch waits), the reporting thread waits for the launches
// already running to end, has the device recreate what the fault made unusable, and starts a new generation; a
// stream whose request started in an older generation runs it again from its first layer (stream.cc). A device
// that cannot be recreated, or launches that do not end within the recovery deadline, leave the device LOST: every
// later launch fails with one line.
#include <tvm/ffi/error.h>

#include <chrono>
#include <sstream>

#include "tvmsched/device.h"

namespace tvmsched {

std::string Device::LostLineLocked() const {
  return std::string("the ") + kind() + " device is lost: " + fault_stats_.lost;
}

std::string Device::LostLine() const {
  std::lock_guard<std::mutex> lock(fault_mu_);
  return health_.load(std::memory_order_acquire) == kLost ? LostLineLocked() : std::string();
}

uint64_t Device::EnterLaunch(double timeout_s) {
  active_launches_.fetch_add(1, std::memory_order_acq_rel);
  if (health_.load(std::memory_order_acquire) == kHealthy) return generation_.load(std::memory_order_acquire);
  ExitLaunch();  // not running: wait for the recovery outside the count
  std::unique_lock<std::mutex> lock(fault_mu_);
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 1e9);
  while (true) {
    int health = health_.load(std::memory_order_acquire);
    if (health == kLost) TVM_FFI_THROW(TvmschedError) << LostLineLocked();
    if (health == kHealthy) {
      active_launches_.fetch_add(1, std::memory_order_acq_rel);
      if (health_.load(std::memory_order_acquire) == kHealthy) return generation_.load(std::memory_order_acquire);
      active_launches_.fetch_sub(1, std::memory_order_acq_rel);
      continue;
    }
    if (fault_cond_.wait_until(lock, until) == std::cv_status::timeout) {
      TVM_FFI_THROW(TvmschedError) << "a launch waited " << timeout_s << " s for the " << kind()
                                   << " device to recover from a fault (" << fault_stats_.lost << ")";
    }
  }
}

void Device::ExitLaunch() {
  if (active_launches_.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
      health_.load(std::memory_order_acquire) != kHealthy) {
    std::lock_guard<std::mutex> lock(fault_mu_);  // the recovering thread waits for the last launch
    fault_cond_.notify_all();
  }
}

void Device::ReportFault(const std::string& error) {
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (health_.load() != kHealthy) return;  // one fault at a time: the first report is the fault
  ++fault_stats_.faults;
  faulted_at_us_ = NowMicros();
  health_.store(kFaulted, std::memory_order_release);
  fault_stats_.health = kFaulted;
  fault_stats_.lost = error;  // (shown to launches parked past their deadline)
}

std::string Device::Recover(double timeout_s) {
  std::unique_lock<std::mutex> lock(fault_mu_);
  if (health_.load() != kFaulted) return health_.load() == kLost ? fault_stats_.lost : "";
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 1e9);
  std::string why;
  while (active_launches_.load(std::memory_order_acquire) > 0) {  // launches running at the fault end first
    if (fault_cond_.wait_until(lock, until) == std::cv_status::timeout &&
        active_launches_.load(std::memory_order_acquire) > 0) {
      std::ostringstream text;
      text << active_launches_.load() << " launch(es) still running " << timeout_s << " s after the fault";
      why = text.str();
      break;
    }
  }
  bool recreated = false;
  if (why.empty()) {
    lock.unlock();  // (launches are parked: nothing else touches the device)
    if (fail_recreate_.exchange(false)) {
      why = "recreating it failed (an injected failure)";
    } else {
      recreated = Recreate(&why);
    }
    lock.lock();
  }
  if (recreated) {
    generation_.fetch_add(1, std::memory_order_acq_rel);
    ++fault_stats_.recoveries;
    fault_stats_.generation = generation_.load();
    fault_stats_.last_recovery_s = (NowMicros() - faulted_at_us_) / 1e6;
    fault_stats_.lost.clear();
    fault_stats_.health = kHealthy;
    health_.store(kHealthy, std::memory_order_release);
  } else {
    fault_stats_.lost = why;
    fault_stats_.health = kLost;
    health_.store(kLost, std::memory_order_release);
  }
  fault_cond_.notify_all();
  return recreated ? "" : why;
}

Device::FaultStats Device::faults() const {
  std::lock_guard<std::mutex> lock(fault_mu_);
  FaultStats stats = fault_stats_;
  stats.health = health_.load();
  stats.generation = generation_.load();
  if (stats.health == kHealthy) stats.lost.clear();
  return stats;
}

}  // namespace tvmsched
