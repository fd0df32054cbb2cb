// A model repository's folders read into ModelSpecs (tvmsched/repository.h), and tvmsched.engine.repository_*: the
// same reading, keys, checks and error lines for `tvmsched serve` and the C++ server.
#include "tvmsched/repository.h"

#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "json_reader.h"
#include "tvmsched/artifact.h"
#include "tvmsched/engine.h"
#include "tvmsched/kserve.h"

namespace tvmsched {
namespace serving {

namespace {

namespace fs = std::filesystem;
using json_reader::Document;
using json_reader::Kind;
using json_reader::Node;

constexpr const char* kConfig = "config.pbtxt";
constexpr const char* kDefaultFilename = "model.tvms";
constexpr int kMaxDepth = 64;

// tvmsched's layout: config.json's keys and the kinds of value each takes (Python's type names, as errors say them)
const std::vector<std::pair<std::string, std::string>> kFolderKeys = {{"qos_ms", "number"},
                                                                      {"priority", "str"},
                                                                      {"warmup", "bool"},
                                                                      {"refresh_sizes", "bool"},
                                                                      {"max_queue", "int"},
                                                                      {"streams", "int"},
                                                                      {"max_queue_delay_us", "number"},
                                                                      {"preferred_batch_sizes", "list"}};

// Triton's layout: the fields tvmsched implements, by message path ("" is ModelConfig itself)
const std::map<std::string, std::set<std::string>> kSupported = {
    {"",
     {"name", "platform", "backend", "max_batch_size", "input", "output", "dynamic_batching", "instance_group",
      "default_model_filename", "parameters"}},
    {"input", {"name", "data_type", "dims"}},
    {"output", {"name", "data_type", "dims"}},
    {"dynamic_batching",
     {"preferred_batch_size", "max_queue_delay_microseconds", "priority_levels", "default_priority_level",
      "default_queue_policy"}},
    {"dynamic_batching.default_queue_policy",
     {"timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size"}},
    {"instance_group", {"name", "kind", "count", "gpus"}},
    {"parameters.value", {"string_value"}},  // (a map: its entries' values are walked)
};
const std::vector<std::string> kParameters = {"qos_ms", "priority", "warmup", "refresh_sizes"};

[[noreturn]] void Fail(const std::string& line) {
  TVM_FFI_THROW(TvmschedError) << line;
  __builtin_unreachable();  // (the macro's temporary throws as the statement ends)
}

std::string Quoted(const std::string& text) { return "'" + text + "'"; }  // (Python's repr of a plain string)

std::string ListText(const std::vector<int64_t>& items) {  // [1, 2] (Python's str of a list of ints)
  std::string out = "[";
  for (int64_t item : items) out += (out.size() > 1 ? ", " : "") + std::to_string(item);
  return out + "]";
}

std::string ReadText(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  if (!file || !(text << file.rdbuf())) Fail("cannot read " + path.string());
  return text.str();
}

/*! \brief Python's type name of a JSON value (what "has the wrong type" says). */
const char* TypeName(const Node& node) {  // (in the order of json_reader::Kind)
  static const char* const kNames[] = {"NoneType", "bool", "int", "float", "str", "list", "dict"};
  return kNames[static_cast<int>(node.kind)];
}

double NumberOf(const Node& node) { return node.kind == Kind::kInt ? static_cast<double>(node.integer) : node.number; }

/*! \brief A config.pbtxt: its text, protobuf's JSON of it, and where its fields are set (the first line at or after a
 *  given one that sets a field, as `name:` or `name {`, outside comments). */
class TritonConfig {
 public:
  TritonConfig(std::string path, std::string text, const std::string& json)
      : path(std::move(path)), text_(std::move(text)), json_(json) {
    try {
      doc_.emplace(json_, kMaxDepth);
    } catch (const std::invalid_argument& err) {
      Fail("cannot read " + this->path + ": " + err.what());
    }
    std::stringstream lines(text_);
    for (std::string line; std::getline(lines, line);) lines_.push_back(line.substr(0, line.find('#')));
    if (doc_->root().kind != Kind::kObject) Fail(this->path + ":1: not Triton's model configuration");
  }

  const std::string path;
  const Node& root() const { return doc_->root(); }
  const Document& doc() const { return *doc_; }

  [[noreturn]] void FailAt(int line, const std::string& message) const {
    Fail(path + ":" + std::to_string(std::max(line, 1)) + ": " + message);
  }
  /*! \brief The first line at or after `after` (1-based) setting field `name`; `after` when none does. */
  int LineOf(const std::string& name, int after = 1) const {
    for (size_t n = std::max(after, 1); n <= lines_.size(); ++n) {
      const std::string& line = lines_[n - 1];
      for (size_t at = line.find(name); at != std::string::npos; at = line.find(name, at + 1)) {
        if (at > 0 && !std::strchr(" \t{,;", line[at - 1])) continue;
        size_t next = line.find_first_not_of(" \t", at + name.size());
        if (next != std::string::npos && std::strchr(":{[<", line[next])) return static_cast<int>(n);
      }
    }
    return std::max(after, 1);
  }
  /*! \brief The first line where the quoted string `value` appears (a parameter's key, a tensor's name), else 1. */
  int LineOfValue(const std::string& value) const {
    for (size_t n = 1; n <= lines_.size(); ++n) {
      const std::string& line = lines_[n - 1];
      if (line.find('"' + value + '"') != std::string::npos || line.find('\'' + value + '\'') != std::string::npos)
        return static_cast<int>(n);
    }
    return 1;
  }
  [[noreturn]] void FailField(const std::string& field, const std::string& message) const {
    FailAt(LineOf(field), message);
  }
  [[noreturn]] void FailParameter(const std::string& key, const std::string& message) const {
    FailAt(LineOfValue(key), message);
  }

  /*! \brief Refuse the first field set that tvmsched does not implement, at its line (depth first, in order). */
  void RefuseUnsupported(const Node& message, const std::string& prefix, int after) const {
    auto supported = kSupported.find(prefix);
    for (uint32_t i = 0; i + 1 < message.count; i += 2) {
      const std::string name(doc_->child(message, i).text);
      const Node& value = doc_->child(message, i + 1);
      const std::string where = prefix.empty() ? name : prefix + "." + name;
      const int line = LineOf(name, after);
      if (supported == kSupported.end() || !supported->second.count(name)) {
        std::string names;
        if (supported != kSupported.end())
          for (const std::string& each : supported->second) names += (names.empty() ? "" : ", ") + each;
        FailAt(line, where + " is not supported by the tvmsched backend (supported: " + names + ")");
      }
      if (name == "parameters" && prefix.empty()) {  // a map: its values (messages) are walked
        for (uint32_t k = 0; k + 1 < value.count; k += 2) {
          const Node& entry = doc_->child(value, k + 1);
          if (entry.kind == Kind::kObject) RefuseUnsupported(entry, where + ".value", line);
        }
      } else if (value.kind == Kind::kObject) {
        RefuseUnsupported(value, where, line);
      } else if (value.kind == Kind::kArray) {
        for (uint32_t k = 0; k < value.count; ++k) {
          if (doc_->child(value, k).kind == Kind::kObject) RefuseUnsupported(doc_->child(value, k), where, line);
        }
      }
    }
  }

 private:
  std::string text_, json_;
  std::optional<Document> doc_;
  std::vector<std::string> lines_;
};

/*! \brief Reading protobuf's JSON mapping: a member of `object` (nullptr: not set), and its values (64-bit integers
 *  are strings there, enums their names). */
struct Fields {
  const Document& doc;
  const Node* Get(const Node* object, std::string_view key) const {
    return object && object->kind == Kind::kObject ? doc.member(*object, key) : nullptr;
  }
  int64_t Int(const Node* object, std::string_view key) const {
    const Node* node = Get(object, key);
    return node ? IntOf(*node) : 0;
  }
  static int64_t IntOf(const Node& node) {
    if (node.kind == Kind::kString) return std::strtoll(std::string(node.text).c_str(), nullptr, 10);
    return node.kind == Kind::kInt ? node.integer : static_cast<int64_t>(node.number);
  }
  std::string Str(const Node* object, std::string_view key) const {
    const Node* node = Get(object, key);
    return node && node->kind == Kind::kString ? std::string(node->text) : node ? std::to_string(IntOf(*node)) : "";
  }
  bool Bool(const Node* object, std::string_view key) const {
    const Node* node = Get(object, key);
    return node && node->kind == Kind::kBool && node->boolean;
  }
  std::vector<int64_t> Ints(const Node* object, std::string_view key) const {
    std::vector<int64_t> out;
    if (const Node* list = Get(object, key); list && list->kind == Kind::kArray) {
      for (uint32_t i = 0; i < list->count; ++i) out.push_back(IntOf(doc.child(*list, i)));
    }
    return out;
  }
  std::vector<const Node*> Items(const Node* object, std::string_view key) const {
    std::vector<const Node*> out;
    if (const Node* list = Get(object, key); list && list->kind == Kind::kArray) {
      for (uint32_t i = 0; i < list->count; ++i) out.push_back(&doc.child(*list, i));
    }
    return out;
  }
};

/*! \brief (version, its folder): the highest numbered version folder (Triton's default version policy). */
std::pair<std::string, fs::path> LatestVersion(const fs::path& folder) {
  int64_t best = -1;
  fs::path where;
  for (const auto& entry : fs::directory_iterator(folder)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.empty() || name.size() > 18 ||
        name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    if (int64_t number = std::stoll(name); number > best) best = number, where = entry.path();
  }
  if (best < 0)
    Fail("model folder " + folder.string() + " has a " + kConfig + " but no version folder (such as " +
         (folder / "1").string() + ")");
  return {std::to_string(best), where};
}

/*! \brief The inputs and outputs the config declares are the artifact's (names, types, dims without the batch). */
void CheckTensors(const TritonConfig& config, const Fields& f, const Manifest& manifest) {
  for (auto [side, bindings] : {std::pair<std::string, const std::vector<Binding>*>{"input", &manifest.inputs},
                                {"output", &manifest.outputs}}) {
    std::string names;
    for (const Binding& b : *bindings) names += (names.empty() ? "" : ", ") + b.name;
    for (const Node* tensor : f.Items(&config.root(), side)) {
      const std::string name = f.Str(tensor, "name"), type = f.Str(tensor, "data_type");
      const std::vector<int64_t> dims = f.Ints(tensor, "dims");
      const int line = name.empty() ? config.LineOf(side) : config.LineOfValue(name);
      auto found = std::find_if(bindings->begin(), bindings->end(), [&](const Binding& b) { return b.name == name; });
      if (found == bindings->end())
        config.FailAt(line, side + " " + Quoted(name) + " is not one of the artifact's (" + names + ")");
      const TensorSpec& spec = manifest.tensors.at(found->tensor);
      const std::string want = "TYPE_" + kserve::Datatype(spec.dtype);
      if (!type.empty() && type != "TYPE_INVALID" && type != want)
        config.FailAt(line, side + " " + Quoted(name) + " is " + want + " in the artifact, not " + type);
      std::vector<int64_t> shape(spec.shape.begin() + (manifest.batch_size > 0 ? 1 : 0), spec.shape.end());
      if (!dims.empty() && dims != shape)
        config.FailAt(line, side + " " + Quoted(name) + " has dims " + ListText(shape) + " in the artifact" +
                                (manifest.batch_size > 0 ? " (without the batch)" : "") + ", not " + ListText(dims));
    }
  }
}

/*! \brief The instance groups: streams per device (the same on each) and the devices holding a replica. */
void ReadInstanceGroups(const TritonConfig& config, const Fields& f, const std::vector<std::string>& devices,
                        ModelSpec* spec) {
  const std::vector<const Node*> groups = f.Items(&config.root(), "instance_group");
  if (groups.empty()) return;
  const int n = static_cast<int>(devices.size());
  const std::string kind = devices.empty() || devices[0].rfind("cpu", 0) == 0 ? "KIND_CPU" : "KIND_GPU";
  std::map<int, int64_t> per_device;  // device number -> streams (Triton: count instances on each device of gpus)
  for (const Node* group : groups) {
    const std::vector<int64_t> gpus = f.Ints(group, "gpus");
    if (std::any_of(gpus.begin(), gpus.end(), [n](int64_t gpu) { return gpu < 0 || gpu >= n; })) {
      std::string names;
      for (const std::string& d : devices) names += (names.empty() ? "" : ", ") + d;
      config.FailField("gpus", "instance_group gpus " + ListText(gpus) + ": the server has " + std::to_string(n) +
                                   " device" + (n > 1 ? "s" : "") + " (" + names + ")");
    }
    const std::string group_kind = f.Str(group, "kind");
    if (!group_kind.empty() && group_kind != "KIND_AUTO" && group_kind != kind)
      config.FailField("kind", "instance_group kind " + group_kind + " cannot run on this server's device (" +
                                   (devices.empty() ? "cpu" : devices[0]) + "): use " + kind + " or KIND_AUTO");
    std::set<int> on(gpus.begin(), gpus.end());
    if (on.empty()) {  // none named: every device
      for (int d = 0; d < n; ++d) on.insert(d);
    }
    for (int d : on) per_device[d] += std::max<int64_t>(f.Int(group, "count"), 1);
  }
  std::set<int64_t> counts;
  std::string listed;
  for (const auto& [d, count] : per_device) {
    counts.insert(count);
    listed += (listed.empty() ? "" : ", ") + devices[d] + ": " + std::to_string(count);
  }
  if (counts.size() > 1)
    config.FailField("count", "instance_group counts differ between devices (" + listed +
                                  "): a model runs the same streams on each of its devices");
  spec->streams = counts.empty() ? 1 : *counts.begin();
  if (spec->streams < 1 || spec->streams > 64)
    config.FailField(
        "count", "instance_group counts add up to " + std::to_string(spec->streams) + " streams; 1 to 64 are served");
  if (n > 1) {
    for (const auto& [d, count] : per_device) spec->devices.push_back(d);
  }
}

/*! \brief A Triton-layout folder (Triton's model_config.proto fields as tvmsched serves them, docs/batching.md). */
ModelSpec TritonSpec(const std::string& name, const fs::path& folder, const std::vector<std::string>& devices,
                     const ToJson& to_json) {
  const std::string path = (folder / kConfig).string(), text = ReadText(folder / kConfig);
  const TritonConfig config(path, text, to_json(path, text));
  config.RefuseUnsupported(config.root(), "", 1);
  const Fields f{config.doc()};
  const Node* root = &config.root();
  const std::string config_name = f.Str(root, "name"), backend_field = f.Get(root, "backend") ? "backend" : "platform";
  if (!config_name.empty() && config_name != name)
    config.FailField("name", "name " + Quoted(config_name) + " is not the model folder's name " + Quoted(name));
  const std::string backend = f.Str(root, backend_field.c_str());
  if (backend != "tvmsched")
    config.FailField(backend_field, backend.empty() ? "backend: \"tvmsched\" is missing"
                                                    : "backend must be \"tvmsched\", not " + Quoted(backend));
  ModelSpec spec;
  spec.name = name;
  spec.config_path = path;
  fs::path where;
  std::tie(spec.version, where) = LatestVersion(folder);
  const std::string filename = f.Str(root, "default_model_filename");
  const fs::path artifact = where / (filename.empty() ? kDefaultFilename : filename);
  if (!fs::is_regular_file(artifact))
    Fail("model " + Quoted(name) + " version " + spec.version + ": no artifact file at " + artifact.string());
  spec.path = artifact.string();
  const Manifest manifest = ReadArtifact(spec.path, TrustedKeys(), false).manifest;  // verified; its code not loaded
  const int64_t largest = manifest.batch_size, rows = f.Int(root, "max_batch_size");
  if (rows < 0 || (rows > 0) != (largest > 0) || rows > largest)
    config.FailField("max_batch_size",
                     "max_batch_size " + std::to_string(rows) + ": " +
                         (largest ? "the artifact is compiled for up to " + std::to_string(largest) +
                                        " rows: set max_batch_size from 1 to " + std::to_string(largest)
                                  : "the artifact is not compiled for a batch (tvmsched compile "
                                    "--batch-sizes)"));
  spec.max_batch_size = rows;
  CheckTensors(config, f, manifest);
  const Node* dynamic = f.Get(root, "dynamic_batching");
  if (dynamic && !largest)
    config.FailField("dynamic_batching", "dynamic_batching needs a model compiled for a batch (max_batch_size > 0)");

  std::map<std::string, std::string> params;
  if (const Node* map = f.Get(root, "parameters")) {
    for (uint32_t i = 0; i + 1 < map->count; i += 2) {
      params[std::string(config.doc().child(*map, i).text)] = f.Str(&config.doc().child(*map, i + 1), "string_value");
    }
  }
  for (const auto& [key, value] : params) {
    if (std::find(kParameters.begin(), kParameters.end(), key) == kParameters.end())
      config.FailParameter(key, "parameters " + Quoted(key) +
                                    " is not one the tvmsched backend reads (qos_ms, "
                                    "priority, warmup, refresh_sizes)");
  }
  std::optional<std::string> priority;
  if (params.count("priority")) priority = params["priority"];
  if (priority && *priority != "realtime" && *priority != "best_effort")
    config.FailParameter("priority", "parameters priority is realtime or best_effort, not " + Quoted(*priority));
  if (int64_t level_number = f.Int(dynamic, "default_priority_level"); level_number) {
    const std::string level = level_number == 1 ? "realtime" : "best_effort";
    const int64_t levels = f.Int(dynamic, "priority_levels");
    if (levels && level_number > levels)
      config.FailField("default_priority_level", "default_priority_level " + std::to_string(level_number) +
                                                     " is above priority_levels " + std::to_string(levels));
    if (priority && *priority != level)
      config.FailField("default_priority_level", "default_priority_level " + std::to_string(level_number) + " (" +
                                                     level + ") disagrees with parameters priority " +
                                                     Quoted(*priority));
    priority = level;
  }
  spec.priority = priority.value_or("best_effort");
  if (params.count("qos_ms")) {
    const std::string& qos_text = params["qos_ms"];
    char* end = nullptr;
    const double qos = qos_text.empty() ? -1 : std::strtod(qos_text.c_str(), &end);
    if (!(qos > 0) || std::isinf(qos) || (end && *end != '\0'))
      config.FailParameter("qos_ms",
                           "parameters qos_ms must be a positive number of milliseconds, not " + Quoted(qos_text));
    spec.qos_ms = qos;
  }
  auto flag = [&](const std::string& key, bool otherwise) {  // a true/false parameter
    if (!params.count(key)) return otherwise;
    const std::string& value = params[key];
    if (value != "true" && value != "false")
      config.FailParameter(key, "parameters " + key + " is true or false, not " + Quoted(value));
    return value == "true";
  };
  spec.warmup = flag("warmup", true);
  spec.refresh_sizes = flag("refresh_sizes", false);
  ReadInstanceGroups(config, f, devices, &spec);
  if (dynamic) {
    if (const Node* policy = f.Get(dynamic, "default_queue_policy")) {
      spec.queue.emplace();
      spec.queue->timeout_action =
          f.Str(policy, "timeout_action") == "DELAY" ? TimeoutAction::kDelay : TimeoutAction::kReject;
      spec.queue->default_timeout_us = static_cast<double>(f.Int(policy, "default_timeout_microseconds"));
      spec.queue->allow_timeout_override = f.Bool(policy, "allow_timeout_override");
      if (int64_t most = f.Int(policy, "max_queue_size"); most > 0) spec.max_queue = most;
    }
    const int64_t delay = f.Int(dynamic, "max_queue_delay_microseconds");
    if (delay < 0 || delay > 60'000'000)
      config.FailField("max_queue_delay_microseconds", "max_queue_delay_microseconds must be from 0 to 60000000");
    spec.max_queue_delay_us = static_cast<double>(delay);
    spec.preferred_batch_sizes = f.Ints(dynamic, "preferred_batch_size");
  }
  return spec;
}

/*! \brief A folder in tvmsched's layout: its one artifact and its optional config.json (or config.toml). */
ModelSpec FolderSpec(const std::string& name, const fs::path& folder, const ToJson& to_json) {
  ModelSpec spec;
  spec.name = name;
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (entry.path().extension() == ".tvms") found.push_back(entry.path());
  }
  if (found.size() != 1)
    Fail("model folder " + folder.string() + " must hold exactly one .tvms artifact, not " +
         std::to_string(found.size()));
  spec.path = found[0].string();
  fs::path path = folder / "config.json";
  const bool toml = !fs::is_regular_file(path) && fs::is_regular_file(folder / "config.toml");
  if (toml) path = folder / "config.toml";
  if (!fs::is_regular_file(path)) return spec;
  const std::string where = path.string(), text = ReadText(path), json = toml ? to_json(where, text) : text;
  std::optional<Document> doc;
  try {
    doc.emplace(json, kMaxDepth);
  } catch (const std::invalid_argument& err) {
    Fail("cannot read " + where + ": " + err.what());
  }
  const Node& config = doc->root();
  if (config.kind != Kind::kObject) Fail(where + " must hold an object");
  std::string known;
  for (const auto& [key, kind] : kFolderKeys) known += (known.empty() ? "" : ", ") + key;
  for (uint32_t i = 0; i + 1 < config.count; i += 2) {
    const std::string key(doc->child(config, i).text);
    const Node& value = doc->child(config, i + 1);
    auto kind = std::find_if(kFolderKeys.begin(), kFolderKeys.end(), [&](const auto& k) { return k.first == key; });
    if (kind == kFolderKeys.end()) Fail(where + ": unknown key " + Quoted(key) + " (known: " + known + ")");
    const std::string& want = kind->second;
    const bool ok =
        want == "number" ? value.kind == Kind::kInt || value.kind == Kind::kDouble : want == TypeName(value);
    if (!ok) Fail(where + ": " + key + " has the wrong type (" + TypeName(value) + ")");
  }
  const Fields f{*doc};
  const Node* root = &config;
  if (const Node* qos = f.Get(root, "qos_ms")) spec.qos_ms = NumberOf(*qos);
  if (f.Get(root, "priority")) spec.priority = f.Str(root, "priority");
  if (const Node* warmup = f.Get(root, "warmup")) spec.warmup = warmup->boolean;
  if (const Node* refresh = f.Get(root, "refresh_sizes")) spec.refresh_sizes = refresh->boolean;
  if (f.Get(root, "max_queue")) spec.max_queue = f.Int(root, "max_queue");
  if (f.Get(root, "streams")) spec.streams = f.Int(root, "streams");
  if (spec.priority != "realtime" && spec.priority != "best_effort")
    Fail(where + ": priority must be one of realtime, best_effort");
  if ((f.Get(root, "qos_ms") && !(spec.qos_ms > 0)) || (f.Get(root, "max_queue") && spec.max_queue < 1))
    Fail(where + ": qos_ms and max_queue must be positive");
  if (spec.streams < 1 || spec.streams > 64) Fail(where + ": streams must be from 1 to 64");
  for (const Node* size : f.Items(root, "preferred_batch_sizes")) {
    if (size->kind != Kind::kInt || size->integer < 1 || size->integer > (int64_t{1} << 20))
      Fail(where + ": preferred_batch_sizes must be a list of row counts from 1 to 1048576");
    spec.preferred_batch_sizes.push_back(size->integer);
  }
  if (const Node* delay = f.Get(root, "max_queue_delay_us")) spec.max_queue_delay_us = NumberOf(*delay);
  if (!(spec.max_queue_delay_us >= 0 && spec.max_queue_delay_us <= 60e6))
    Fail(where + ": max_queue_delay_us must be from 0 to 60000000");
  return spec;
}

}  // namespace

ModelSpec ModelFlag(const std::string& text) {
  const std::string flag = "--model " + Quoted(text) + " ";
  ModelSpec spec;
  const size_t eq = text.find('=');
  std::stringstream rest(eq == std::string::npos ? "" : text.substr(eq + 1));
  std::vector<std::string> parts;
  for (std::string part; std::getline(rest, part, ':');) parts.push_back(part);
  if (eq == 0 || eq == std::string::npos || parts.empty() || parts.size() > 3 || parts[0].empty())
    Fail(flag + "is not NAME=ARTIFACT[:QOS_MS[:PRIORITY]] with a positive QOS_MS");
  spec.name = text.substr(0, eq), spec.path = parts[0];
  if (parts.size() > 1 && !parts[1].empty()) {
    char* end = nullptr;
    spec.qos_ms = std::strtod(parts[1].c_str(), &end);
    if (*end != '\0' || !(spec.qos_ms > 0) || std::isinf(spec.qos_ms))
      Fail(flag + "is not NAME=ARTIFACT[:QOS_MS[:PRIORITY]] with a positive QOS_MS");
  }
  if (parts.size() > 2 && !parts[2].empty()) spec.priority = parts[2];
  if (spec.priority != "realtime" && spec.priority != "best_effort")
    Fail(flag + "priority must be one of realtime, best_effort, not " + Quoted(spec.priority));
  return spec;
}

std::vector<std::string> RepositoryNames(const std::string& root) {
  std::error_code error;
  if (!fs::is_directory(root, error)) Fail("--model-repository " + root + ": not a folder");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) {
    std::string name = entry.path().filename().string();
    if (entry.is_directory() && name[0] != '.') names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

ModelSpec ReadModelFolder(const std::string& root, const std::string& name, const std::vector<std::string>& devices,
                          const ToJson& to_json) {
  const fs::path folder = fs::path(root) / name;
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.' || !fs::is_directory(folder))
    Fail("no model named " + Quoted(name) + " in the repository " + root);
  if (fs::is_regular_file(folder / kConfig)) return TritonSpec(name, folder, devices, to_json);
  return FolderSpec(name, folder, to_json);
}

namespace {

ffi::Map<ffi::String, ffi::Any> AsMap(const ModelSpec& s) {
  ffi::Map<ffi::String, ffi::Any> out, queue;
  if (s.queue) {
    queue.Set("timeout_action", ffi::String(s.queue->timeout_action == TimeoutAction::kDelay ? "delay" : "reject"));
    queue.Set("default_timeout_us", static_cast<int64_t>(s.queue->default_timeout_us));
    queue.Set("allow_timeout_override", s.queue->allow_timeout_override);
  }
  out.Set("name", ffi::String(s.name));
  out.Set("path", ffi::String(s.path));
  out.Set("priority", ffi::String(s.priority));
  out.Set("qos_ms", s.qos_ms);
  out.Set("warmup", s.warmup);
  out.Set("refresh_sizes", s.refresh_sizes);
  out.Set("max_queue", s.max_queue);
  out.Set("streams", s.streams);
  out.Set("max_queue_delay_us", s.max_queue_delay_us);
  out.Set("preferred_batch_sizes", ffi::Array<int64_t>(s.preferred_batch_sizes.begin(), s.preferred_batch_sizes.end()));
  out.Set("version", ffi::String(s.version));
  out.Set("max_batch_size", s.max_batch_size);
  out.Set("queue_policy", queue);
  out.Set("config_path", ffi::String(s.config_path));
  out.Set("devices", ffi::Array<int64_t>(std::vector<int64_t>(s.devices.begin(), s.devices.end())));
  return out;
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("tvmsched.engine.repository_names",
           [](const std::string& root) {
             ffi::Array<ffi::String> out;
             for (const std::string& name : RepositoryNames(root)) out.push_back(name);
             return out;
           })
      // (root, name, devices, to_json(path, text) -> str) -> the ModelSpec's fields (qos_ms 0: the artifact's;
      // max_queue and max_batch_size < 0: not set; queue_policy: {} when none)
      .def(
          "tvmsched.engine.repository_model",
          [](const std::string& root, const std::string& name, ffi::Array<ffi::String> devices, ffi::Function to_json) {
            std::vector<std::string> names(devices.begin(), devices.end());
            return AsMap(ReadModelFolder(root, name, names, [&](const std::string& path, const std::string& text) {
              return std::string(to_json(path, text).cast<ffi::String>());
            }));
          })
      .def("tvmsched.engine.model_flag", [](const std::string& text) { return AsMap(ModelFlag(text)); });
}

}  // namespace serving
}  // namespace tvmsched
