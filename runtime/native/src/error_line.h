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

}  // namespace tvmsched

#endif  // TVMSCHED_SRC_ERROR_LINE_H_
