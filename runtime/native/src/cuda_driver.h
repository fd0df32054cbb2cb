/*!
 * \file cuda_driver.h
 * \brief The part of the CUDA driver API the engine calls (cuda_device.cc), declared here so the engine builds
 *  without a CUDA toolkit: libcuda.so.1 is opened with dlopen at run time and these calls are looked up in it.
 *
 * Written for the engine from the driver's documented ABI (CUDA 12.4+ / 13): only the types, values and call
 * signatures cuda_device.cc uses. Each call is listed with the symbol the driver exports for it (the `_v2` and other
 * versioned names that cuda.h's macros select). Values and layouts are part of the driver's stable ABI; the
 * static_asserts below pin the sizes the driver relies on.
 */
#ifndef TVMSCHED_SRC_CUDA_DRIVER_H_
#define TVMSCHED_SRC_CUDA_DRIVER_H_

#include <cstddef>

namespace tvmsched {
namespace cuda_driver {

/*! \brief A driver call's status (0: success). */
enum CUresult : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_ASSERT = 710,
  CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
  CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
  CUDA_ERROR_MISALIGNED_ADDRESS = 716,
  CUDA_ERROR_INVALID_PC = 718,
  CUDA_ERROR_LAUNCH_FAILED = 719,
};

using CUdevice = int;                     // a device ordinal handle
using CUdeviceptr = unsigned long long;   // a device address (64-bit on every platform the engine builds for)
using CUcontext = struct OpaqueContext*;  // the driver's handles are opaque pointers
using CUstream = struct OpaqueStream*;
using CUevent = struct OpaqueEvent*;
using CUgreenCtx = struct OpaqueGreenContext*;
using CUdevResourceDesc = struct OpaqueResourceDesc*;

enum CUdevice_attribute : int { CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16 };
enum CUdevResourceType : int { CU_DEV_RESOURCE_TYPE_SM = 1 };

constexpr unsigned int CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned int CU_EVENT_DISABLE_TIMING = 0x2;
constexpr unsigned int CU_MEMHOSTALLOC_PORTABLE = 0x1;
constexpr unsigned int CU_MEMHOSTALLOC_DEVICEMAP = 0x2;
constexpr unsigned int CU_MEMHOSTREGISTER_PORTABLE = 0x1;
constexpr unsigned int CU_GREEN_CTX_DEFAULT_STREAM = 0x1;

/*! \brief SM resource data (filled in by the driver; the engine reads smCount). */
struct CUdevSmResource {
  unsigned int smCount;
  unsigned int minSmPartitionSize;
  unsigned int smCoscheduledAlignment;
};

/*! \brief A device resource: its type, space the driver keeps to itself, then the per-type data (48 bytes). */
struct CUdevResource {
  CUdevResourceType type;
  unsigned char reserved[92];
  union {
    CUdevSmResource sm;
    unsigned char data[48];
  };
};
static_assert(sizeof(CUdevResource) == 144, "CUdevResource must keep the driver's layout");
static_assert(offsetof(CUdevResource, sm) == 96, "CUdevResource must keep the driver's layout");

// The calls: X(name, exported symbol, parameters); every one returns CUresult.
// clang-format off
#define TVMSCHED_CUDA_DRIVER_CALLS(X)                                                                                 \
  X(cuInit, "cuInit", (unsigned int flags))                                                                           \
  X(cuGetErrorString, "cuGetErrorString", (CUresult error, const char** text))                                       \
  X(cuDeviceGet, "cuDeviceGet", (CUdevice* device, int ordinal))                                                     \
  X(cuDeviceGetCount, "cuDeviceGetCount", (int* count))                                                              \
  X(cuDeviceGetName, "cuDeviceGetName", (char* name, int length, CUdevice device))                                   \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", (int* value, CUdevice_attribute attribute, CUdevice device))       \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext* context, CUdevice device))                     \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext context))                                                         \
  X(cuCtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange", (int* least, int* greatest))                        \
  X(cuMemGetInfo, "cuMemGetInfo_v2", (size_t* free, size_t* total))                                                  \
  X(cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr* ptr, size_t nbytes))                                                  \
  X(cuMemFree, "cuMemFree_v2", (CUdeviceptr ptr))                                                                    \
  X(cuMemHostAlloc, "cuMemHostAlloc", (void** ptr, size_t nbytes, unsigned int flags))                               \
  X(cuMemFreeHost, "cuMemFreeHost", (void* ptr))                                                                     \
  X(cuMemHostRegister, "cuMemHostRegister_v2", (void* ptr, size_t nbytes, unsigned int flags))                       \
  X(cuMemHostUnregister, "cuMemHostUnregister", (void* ptr))                                                         \
  X(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", (CUdeviceptr* device_ptr, void* host, unsigned int flags)) \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", (CUdeviceptr dst, const void* src, size_t nbytes, CUstream stream))   \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", (void* dst, CUdeviceptr src, size_t nbytes, CUstream stream))         \
  X(cuMemsetD32Async, "cuMemsetD32Async", (CUdeviceptr dst, unsigned int value, size_t count, CUstream stream))      \
  X(cuStreamCreate, "cuStreamCreate", (CUstream* stream, unsigned int flags))                                        \
  X(cuStreamCreateWithPriority, "cuStreamCreateWithPriority", (CUstream* stream, unsigned int flags, int priority))  \
  X(cuStreamDestroy, "cuStreamDestroy_v2", (CUstream stream))                                                        \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", (CUstream stream, CUevent event, unsigned int flags))                    \
  X(cuStreamSynchronize, "cuStreamSynchronize", (CUstream stream))                                                   \
  X(cuEventCreate, "cuEventCreate", (CUevent* event, unsigned int flags))                                            \
  X(cuEventRecord, "cuEventRecord", (CUevent event, CUstream stream))                                                \
  X(cuEventQuery, "cuEventQuery", (CUevent event))                                                                   \
  X(cuEventSynchronize, "cuEventSynchronize", (CUevent event))                                                       \
  X(cuEventDestroy, "cuEventDestroy_v2", (CUevent event))                                                            \
  X(cuDeviceGetDevResource, "cuDeviceGetDevResource", (CUdevice device, CUdevResource* resource, CUdevResourceType type)) \
  X(cuDevSmResourceSplitByCount, "cuDevSmResourceSplitByCount",                                                      \
    (CUdevResource* groups, unsigned int* count, const CUdevResource* input, CUdevResource* remainder,              \
     unsigned int flags, unsigned int min_count))                                                                    \
  X(cuDevResourceGenerateDesc, "cuDevResourceGenerateDesc", (CUdevResourceDesc* desc, CUdevResource* resources,     \
                                                             unsigned int count))                                    \
  X(cuGreenCtxCreate, "cuGreenCtxCreate", (CUgreenCtx* context, CUdevResourceDesc desc, CUdevice device,            \
                                           unsigned int flags))                                                      \
  X(cuGreenCtxStreamCreate, "cuGreenCtxStreamCreate", (CUstream* stream, CUgreenCtx context, unsigned int flags,    \
                                                       int priority))
// clang-format on

}  // namespace cuda_driver
}  // namespace tvmsched

#endif  // TVMSCHED_SRC_CUDA_DRIVER_H_
