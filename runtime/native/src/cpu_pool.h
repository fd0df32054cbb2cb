// The engine's CPU thread pool: it runs the parallel loops of TVM-compiled kernels (the
// TVMBackendParallelLaunch ABI) in place of TVM's pool, so that a descheduled worker never stalls a layer.
#ifndef TVMSCHED_SRC_CPU_POOL_H_
#define TVMSCHED_SRC_CPU_POOL_H_

namespace tvmsched {

/*! \brief Whether kernels' parallel loops go through the engine's pool, not TVM's (TVMSCHED_CPU_POOL=tvm).
 *  Read once. */
bool CpuPoolEnabled();

/*! \brief Make the engine's launcher the parallel launcher of every kernel library loaded from now on
 *  (tvm-ffi's context symbol `__TVMBackendParallelLaunch`). Called once, after TVM's runtime is loaded
 *  (which registers TVM's own); a no-op when the pool is disabled. */
void InstallCpuPool();

/*! \brief The calling thread's parallel loops run on `threads` threads (itself and threads - 1 workers). */
void SetCpuPoolThreads(int threads);

}  // namespace tvmsched

#endif  // TVMSCHED_SRC_CPU_POOL_H_
