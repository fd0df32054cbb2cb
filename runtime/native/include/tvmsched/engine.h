/*!
 * \file tvmsched/engine.h
 * \brief The tvmsched engine, for C++ programs that embed it:
 *
 *   auto model = tvmsched::Model::Load("resnet.tvms");          // reads and verifies the artifact
 *   auto stream = tvmsched::Stream::Create(model, "resnet");     // a tenant: queue + submitter thread
 *   tvmsched::Request r = stream->Submit(inputs, {});           // inputs: Map<String, Tensor> on the host
 *   r->Wait(-1, 0);  auto outputs = r->outputs();               // or r->OnDone(callback)
 *   stream->Preempt(); stream->Resume();
 *   auto group = tvmsched::PreemptionGroup::Create();           // best-effort streams stopped while real-time
 *   group->Add(best_effort); group->Hold(r, stream);            // requests run (resumed when the last is done)
 *
 * Link with tvmsched_engine (CMake: find_package(tvmsched), `python -m tvmsched.runtime.native --cmakedir`).
 * Errors are tvm::ffi::Error of kind "TvmschedError" with a one-line message.
 */
#ifndef TVMSCHED_ENGINE_H_
#define TVMSCHED_ENGINE_H_

#include "tvmsched/artifact.h"
#include "tvmsched/device.h"
#include "tvmsched/kserve.h"
#include "tvmsched/model.h"
#include "tvmsched/policy.h"
#include "tvmsched/preemption.h"
#include "tvmsched/runtime.h"
#include "tvmsched/serving.h"
#include "tvmsched/split.h"
#include "tvmsched/stream.h"
#include "tvmsched/switching.h"
#include "tvmsched/tiering.h"
#include "tvmsched/timer.h"

#endif  // TVMSCHED_ENGINE_H_
