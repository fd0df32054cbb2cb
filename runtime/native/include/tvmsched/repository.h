// A model repository, as both servers read it (`tvmsched serve`: tvmsched/serve/repository.py through
// tvmsched.engine.repository_*; examples/cpp/server.cc): one folder per model, named as the model is served, in
// either of two layouts (docs/batching.md, "Serving as Triton users configure it"; docs/cpp-server.md):
//
//   tvmsched's own   NAME/one.tvms and an optional config.json (or config.toml) with the keys of kFolderKeys
//   Triton's         NAME/config.pbtxt (Triton's model_config.proto) and version folders NAME/<n>/model.tvms; the
//                    latest version is served
//
// The engine reads the folders and checks every key against the artifact's manifest (read and verified, its code not
// loaded) and the server's devices; what it cannot read itself is handed to the caller's `ToJson`: config.pbtxt is
// parsed by the caller's libprotobuf with model_config.proto (the format's own parser, in each language) and handed
// over as protobuf's JSON mapping, and config.toml as the JSON of its table. Every problem is one TvmschedError
// line; a Triton config's give FILE:LINE, and any field tvmsched does not implement is refused, never ignored.
#ifndef TVMSCHED_REPOSITORY_H_
#define TVMSCHED_REPOSITORY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tvmsched/runtime.h"

namespace tvmsched {
namespace serving {

/*! \brief A model to serve and how. */
struct ModelSpec {
  std::string name, path, priority = "best_effort";
  double qos_ms = 0;  ///< its latency target (0: the artifact's; ModelOptions::qos_ms)
  bool warmup = true;
  bool refresh_sizes = false;  ///< several batch sizes: their figures follow the launches (ModelOptions::refresh_sizes)
  int64_t max_queue = -1;      ///< requests queued for it at most (-1: the server's)
  int64_t streams = 1;
  double max_queue_delay_us = 0;               ///< a batched model: how long a free stream waits for a fuller batch
  std::vector<int64_t> preferred_batch_sizes;  ///< Triton's preferred_batch_size (each a compiled batch size)
  std::string version = "1";                   ///< the version folder served (Triton's layout), else 1
  int64_t max_batch_size = -1;                 ///< rows a request may bring (-1: the artifact's largest batch size)
  std::optional<QueuePolicy> queue;            ///< Triton's default_queue_policy (its max_queue_size: `max_queue`)
  std::string config_path;                     ///< the file it was read from ("": none)
  std::vector<int> devices;  ///< a server on several devices: a replica on each (ModelOptions::devices; none: placed)
};

/*! \brief A config file's text as JSON: config.pbtxt as protobuf's JSON mapping of inference.ModelConfig (field
 *  names as in the .proto), or one line "PATH:LINE: why" when it does not parse; config.toml as its table. */
using ToJson = std::function<std::string(const std::string& path, const std::string& text)>;

/*! \brief A `--model NAME=ARTIFACT[:QOS_MS[:PRIORITY]]` flag's model (examples/server.py's form). */
ModelSpec ModelFlag(const std::string& text);

/*! \brief The model folders of repository `root`, sorted (hidden ones left out). */
std::vector<std::string> RepositoryNames(const std::string& root);

/*! \brief Model `name` of repository `root`, for a server on `devices` (their names in order: "cpu", "cuda:0", ...). */
ModelSpec ReadModelFolder(const std::string& root, const std::string& name, const std::vector<std::string>& devices,
                          const ToJson& to_json);

}  // namespace serving
}  // namespace tvmsched

#endif  // TVMSCHED_REPOSITORY_H_
