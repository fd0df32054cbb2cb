#include "tvmsched/timer.h"

#include <algorithm>
#include <exception>
#include <thread>

namespace tvmsched {
namespace {

KernelTiming TimeOnThisThread(Device& device, const tvm::ffi::Function& func, const std::vector<tvm::ffi::Any>& args,
                              StreamHandle stream, int repeat, double min_batch_us) {
  std::vector<tvm::ffi::AnyView> views(args.begin(), args.end());
  auto batch_us = [&](int number) {
    double start = Device::NowMicros();
    for (int i = 0; i < number; ++i) {
      tvm::ffi::Any result;
      func.CallPacked(views.data(), static_cast<int32_t>(views.size()), &result);
    }
    device.SyncStream(stream);
    return (Device::NowMicros() - start) / number;
  };
  double once = batch_us(1);  // also the warm-up
  int number = static_cast<int>(std::clamp(min_batch_us / std::max(once, 1.0), 1.0, 1000.0));
  KernelTiming timing;
  for (int r = 0; r < repeat; ++r) timing.us_per_call.push_back(batch_us(number));
  return timing;
}

}  // namespace

KernelTiming TimeKernel(Device& device, const tvm::ffi::Function& func, const std::vector<tvm::ffi::Any>& args,
                        int units, int repeat, double min_batch_us) {
  KernelTiming timing;
  std::exception_ptr error;
  // a thread of its own: CPU pools and the current CUDA stream are per thread
  std::thread worker([&] {
    try {
      device.SetThreadUnits(units);
      int granted = 0;
      StreamHandle stream = device.CreateStream(units, &granted);
      device.UseStream(stream);
      try {
        timing = TimeOnThisThread(device, func, args, stream, repeat, min_batch_us);
      } catch (...) {
        device.SyncStream(stream);
        device.DestroyStream(stream);
        throw;
      }
      device.DestroyStream(stream);
      timing.granted_units = granted;
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
  return timing;
}

}  // namespace tvmsched
