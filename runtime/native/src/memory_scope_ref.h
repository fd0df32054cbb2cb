// A Runtime's memory budget as Python holds it: tvmsched.engine.create_memory_scope makes one, the engine Runtime's
// `memory_scope` hands out its own (a plain Executor loaded into it counts against that Runtime's budget).
#ifndef TVMSCHED_SRC_MEMORY_SCOPE_REF_H_
#define TVMSCHED_SRC_MEMORY_SCOPE_REF_H_

#include <tvm/ffi/object.h>

#include <memory>

#include "tvmsched/model.h"

namespace tvmsched {

class MemoryScopeObj : public ffi::Object {
 public:
  std::shared_ptr<MemoryScope> scope;
  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.MemoryScope", MemoryScopeObj, ffi::Object);
};

class MemoryScopeRef : public ffi::ObjectRef {
 public:
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(MemoryScopeRef, ffi::ObjectRef, MemoryScopeObj);
};

}  // namespace tvmsched

#endif  // TVMSCHED_SRC_MEMORY_SCOPE_REF_H_
