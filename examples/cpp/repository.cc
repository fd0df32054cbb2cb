// A model repository in tvmsched's layout (one .tvms and a config.json or config.toml per folder), the reading of
// tvmsched/serve/repository.py; Triton-layout folders are read by triton_config.cc.
#include "repository.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace tvmsched_server {

namespace fs = std::filesystem;
using json = nlohmann::json;

/*! \brief config.toml's `key = value` lines (numbers, true/false, "strings", # comments) as a JSON object. */
static json ReadToml(const std::string& text, const std::string& path) {
  json out = json::object();
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    bool quoted = false;  // a comment starts at a '#' outside a string
    for (size_t i = 0; i < line.size(); ++i) {
      quoted = line[i] == '"' && (i == 0 || line[i - 1] != '\\') ? !quoted : quoted;
      if (line[i] == '#' && !quoted) line.erase(i);
    }
    line.erase(0, line.find_first_not_of(" \t\r"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (line.empty()) continue;
    size_t eq = line.find('=');
    std::string key = line.substr(0, eq == std::string::npos ? 0 : line.find_last_not_of(" \t", eq - 1) + 1);
    std::string value = eq == std::string::npos ? "" : line.substr(line.find_first_not_of(" \t", eq + 1));
    json parsed =
        json::parse(value == "true" || value == "false" || value[0] == '"' ? value : value + " ", nullptr, false);
    if (key.empty() || parsed.is_discarded() || parsed.is_structured())
      throw std::runtime_error("cannot read " + path + ": '" + line + "' is not a key = value line this server reads");
    out[key] = parsed;
  }
  return out;
}

/*! \brief The models of a model repository (tvmsched/serve/repository.py: its layout, keys and checks). */
std::vector<Spec> ReadRepository(const std::string& root, const std::vector<std::string>& devices) {
  if (!fs::is_directory(root)) throw std::runtime_error("--model-repository " + root + ": not a folder");
  std::vector<fs::path> folders;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory() && entry.path().filename().string()[0] != '.') folders.push_back(entry.path());
  }
  std::sort(folders.begin(), folders.end());
  std::vector<Spec> specs;
  for (const fs::path& folder : folders) {
    Spec spec;
    spec.name = folder.filename().string();
    if (IsTritonFolder(folder)) {
      specs.push_back(ReadTritonFolder(spec.name, folder, devices));
      continue;
    }
    int artifacts = 0;
    for (const auto& entry : fs::directory_iterator(folder)) {
      if (entry.path().extension() == ".tvms") spec.path = entry.path().string(), ++artifacts;
    }
    if (artifacts != 1) {
      throw std::runtime_error("model folder " + folder.string() + " must hold exactly one .tvms artifact, not " +
                               std::to_string(artifacts));
    }
    fs::path path = folder / "config.json";
    bool toml = !fs::is_regular_file(path) && fs::is_regular_file(folder / "config.toml");
    if (toml) path = folder / "config.toml";
    json config = json::object();
    if (fs::is_regular_file(path)) {
      std::ifstream file(path);
      std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
      config = toml ? ReadToml(text, path.string()) : json::parse(text, nullptr, false);
      if (config.is_discarded()) throw std::runtime_error("cannot read " + path.string() + ": not valid JSON");
      if (!config.is_object()) throw std::runtime_error(path.string() + " must hold an object");
    }
    static const std::map<std::string, std::string> kKinds = {{"qos_ms", "number"},
                                                              {"priority", "string"},
                                                              {"warmup", "boolean"},
                                                              {"max_queue", "integer"},
                                                              {"streams", "integer"},
                                                              {"max_queue_delay_us", "number"},
                                                              {"preferred_batch_sizes", "array"}};
    for (const auto& [key, value] : config.items()) {
      auto kind = kKinds.find(key);
      if (kind == kKinds.end())
        throw std::runtime_error(path.string() + ": unknown key '" + key +
                                 "' (known: qos_ms, priority, warmup, max_queue, streams, max_queue_delay_us, "
                                 "preferred_batch_sizes)");
      bool ok = kind->second == "number"    ? value.is_number()
                : kind->second == "integer" ? value.is_number_integer()
                : kind->second == "string"  ? value.is_string()
                : kind->second == "array"   ? value.is_array()
                                            : value.is_boolean();
      if (!ok) throw std::runtime_error(path.string() + ": " + key + " has the wrong type (" + value.type_name() + ")");
    }
    spec.qos_ms = config.value("qos_ms", 0.0);
    spec.priority = config.value("priority", std::string("best_effort"));
    spec.warmup = config.value("warmup", true);
    spec.max_queue = config.value("max_queue", int64_t{-1});
    int64_t streams = config.value("streams", int64_t{1});
    if (spec.priority != "realtime" && spec.priority != "best_effort")
      throw std::runtime_error(path.string() + ": priority must be one of realtime, best_effort");
    if ((config.contains("qos_ms") && !(spec.qos_ms > 0)) || (config.contains("max_queue") && spec.max_queue < 1))
      throw std::runtime_error(path.string() + ": qos_ms and max_queue must be positive");
    if (streams < 1 || streams > 64) throw std::runtime_error(path.string() + ": streams must be from 1 to 64");
    spec.streams = static_cast<int>(streams);
    spec.max_queue_delay_us = config.value("max_queue_delay_us", 0.0);
    if (!(spec.max_queue_delay_us >= 0 && spec.max_queue_delay_us <= 60e6))
      throw std::runtime_error(path.string() + ": max_queue_delay_us must be from 0 to 60000000");
    for (const json& size : config.value("preferred_batch_sizes", json::array())) {
      if (!size.is_number_integer() || size.get<int64_t>() < 1 || size.get<int64_t>() > (int64_t{1} << 20))
        throw std::runtime_error(path.string() +
                                 ": preferred_batch_sizes must be a list of row counts from 1 to 1048576");
      spec.preferred_batch_sizes.push_back(size.get<int64_t>());
    }
    specs.push_back(spec);
  }
  return specs;
}

}  // namespace tvmsched_server
