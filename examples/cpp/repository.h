// The models tvmsched_server serves: --model flags and a model repository, in either of tvmsched serve's layouts
// (tvmsched/serve/repository.py and triton_config.py): a folder with one .tvms and a config.json (or config.toml), or
// Triton's layout, NAME/config.pbtxt beside version folders NAME/<n>/model.tvms, parsed with Triton's
// model_config.proto (vendored in tvmsched/serve/proto, compiled by protoc at build time; libprotobuf from Debian).
#pragma once

#include <tvmsched/runtime.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tvmsched_server {

/*! \brief A model to serve: `tvmsched serve`'s ModelSpec (tvmsched/serve/repository.py). */
struct Spec {
  std::string name, path, priority = "best_effort";
  double qos_ms = 0;  // 0: the artifact's
  bool warmup = true;
  int64_t max_queue = -1;  // -1: the server's --max-queue
  int streams = 1;
  double max_queue_delay_us = 0;  // a model compiled for a batch: how long a free stream waits for a full one
  std::vector<int64_t> preferred_batch_sizes;  // Triton's preferred_batch_size (each a compiled batch size)
  std::string version = "1";                   // the version folder served (Triton's layout), else 1
  int64_t max_batch_size = -1;                 // rows a request may bring (-1: the artifact's largest batch size)
  std::optional<tvmsched::QueuePolicy> queue;  // Triton's default_queue_policy (its max_queue_size is `max_queue`)
  std::vector<std::string> instance_kinds;     // instance_group kinds (KIND_AUTO, KIND_CPU, KIND_GPU, ...)
  std::string config_path;                     // the file it was read from (for errors)
  std::vector<int> devices;  // a server on several devices: a replica on each (ModelOptions::devices; none: placed)
};

/*! \brief The models of a model repository, each folder in either layout; every problem one std::runtime_error line
 *  (a Triton config's with FILE:LINE). */
std::vector<Spec> ReadRepository(const std::string& root, const std::vector<std::string>& devices);

/*! \brief Whether `folder` is in Triton's layout (it holds a config.pbtxt). */
bool IsTritonFolder(const std::filesystem::path& folder);

/*! \brief The Spec of a Triton-layout model folder, checked against its artifact's manifest (read and verified, its
 *  code not loaded) and against the server's `devices` (their names, in order); a field tvmsched does not implement, or
 *  a file that does not parse, is one line naming FILE:LINE. */
Spec ReadTritonFolder(const std::string& name, const std::filesystem::path& folder,
                      const std::vector<std::string>& devices);

}  // namespace tvmsched_server
