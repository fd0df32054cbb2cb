// Loading TVM's runtime library, which the kernel libraries of artifacts call into (thread pool,
// workspace allocation, CUDA module loading). The engine links only tvm-ffi.
#ifndef TVMSCHED_SRC_TVM_RUNTIME_H_
#define TVMSCHED_SRC_TVM_RUNTIME_H_

#include <tvm/ffi/function.h>

#include <string>
#include <vector>

namespace tvmsched {

/*! \brief Where libtvm_runtime.so is: SetTvmLibDir() (the Python side: the installed tvm's), else
 *  $TVMSCHED_TVM_LIBDIR, else the first of the engine library's own folder and ENGINE/../../tvm/lib (the installed
 *  packages) that holds it. No folder is baked in at build time. */
void SetTvmLibDir(const std::string& dir);
/*! \brief The folders tried, in order (one when set or named by the environment). */
std::vector<std::string> TvmLibDirCandidates();
/*! \brief dlopen TVM's runtime (and with `cuda` its CUDA part and libcudart) once, globally. */
void EnsureTvmRuntime(bool cuda);
/*! \brief A global function of TVM's runtime, or a one-line error. */
tvm::ffi::Function TvmRuntimeFunction(const char* name);

}  // namespace tvmsched

#endif  // TVMSCHED_SRC_TVM_RUNTIME_H_
