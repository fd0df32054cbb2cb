// The first line of an engine error (tvm-ffi errors: their message, without the traceback): what a
// request that failed on a switcher's or streamer's thread reports.
#ifndef TVMSCHED_SRC_ERROR_LINE_H_
#define TVMSCHED_SRC_ERROR_LINE_H_

#include <tvm/ffi/error.h>

#include <exception>
#include <string>

namespace tvmsched {

inline std::string ErrorLine(const std::exception& err) {
  std::string text = err.what();
  if (auto* ffi_err = dynamic_cast<const tvm::ffi::Error*>(&err)) text = ffi_err->message();
  return text.substr(0, text.find('\n'));
}

/*! \brief Throw a refusal that the load brings (a full queue, admission, a runtime shutting down): an expected answer
 *  under overload, thrown without the backtrace TVM_FFI_THROW walks and symbolises. That walk took tens of µs, more
 *  than serving a small model's request, so an overloaded Runtime spent its time refusing and fell further behind. */
[[noreturn]] inline void ThrowRefusal(std::string message) {
  throw tvm::ffi::Error("TvmschedError", std::move(message), std::string());
}

}  // namespace tvmsched

#endif  // TVMSCHED_SRC_ERROR_LINE_H_
