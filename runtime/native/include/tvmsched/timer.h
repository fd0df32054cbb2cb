/*!
 * \file tvmsched/timer.h
 * \brief Timing one kernel at k compute units (for `tvmsched tune measure`): the same units mechanism
 *        the engine serves with — a CPU thread whose TVM pool has k threads, or a CUDA stream of a
 *        green context of about k SMs.
 */
#ifndef TVMSCHED_TIMER_H_
#define TVMSCHED_TIMER_H_

#include <tvm/ffi/any.h>
#include <tvm/ffi/function.h>

#include <vector>

#include "tvmsched/device.h"

namespace tvmsched {

struct KernelTiming {
  int granted_units = 0;            ///< the units the kernel really had
  std::vector<double> us_per_call;  ///< one entry per batch
};

/*!
 * \brief Call `func(args...)` once to warm up, then `repeat` batches of calls, each lasting at least
 *  `min_batch_us` (at most 1000 calls), timed on the host around a synchronisation of its stream.
 */
KernelTiming TimeKernel(Device& device, const tvm::ffi::Function& func, const std::vector<tvm::ffi::Any>& args,
                        int units, int repeat, double min_batch_us);

}  // namespace tvmsched

#endif  // TVMSCHED_TIMER_H_
