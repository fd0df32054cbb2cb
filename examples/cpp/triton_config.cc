// A model folder in Triton's layout, as tvmsched serve reads it (tvmsched/serve/triton_config.py: the same fields,
// checks and error lines): NAME/config.pbtxt parsed with Triton's model_config.proto (libprotobuf's text format, which
// records where each field was set, so every refusal names FILE:LINE), the latest version folder served.
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <tvmsched/kserve.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "model_config.pb.h"
#include "repository.h"

namespace tvmsched_server {

namespace fs = std::filesystem;
namespace pb = google::protobuf;
using Tree = pb::TextFormat::ParseInfoTree;

namespace {

constexpr const char* kConfig = "config.pbtxt";
constexpr const char* kDefaultFilename = "model.tvms";
// the fields tvmsched implements, by message path ("" is ModelConfig itself)
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
const std::vector<std::string> kParameters = {"qos_ms", "priority", "warmup"};

std::string Quoted(const std::string& text) { return "'" + text + "'"; }  // (Python's repr of a plain string)

template <typename List>
std::string ListText(const List& items) {  // [1, 2] (Python's str of a list of ints)
  std::string out = "[";
  for (auto item : items) out += (out.size() > 1 ? ", " : "") + std::to_string(item);
  return out + "]";
}

/*! \brief The parse's first error (libprotobuf reports each; lines 0-based). */
class FirstError : public pb::io::ErrorCollector {
 public:
  int line = -1;
  std::string message;
  void AddError(int at, int /*column*/, const std::string& text) override {
    if (line < 0) line = at, message = text;
  }
  void AddWarning(int, int, const std::string&) override {}
};

/*! \brief A parsed config.pbtxt and where each field was set. */
struct Parsed {
  inference::ModelConfig config;
  Tree tree;
  std::string path;

  std::runtime_error Fail(int line, const std::string& message) const {
    return std::runtime_error(path + ":" + std::to_string(line) + ": " + message);
  }
};

/*! \brief The 1-based line where `field` (element `index` when repeated) of the message `tree` describes was set. */
int LineOf(const Tree* tree, const pb::FieldDescriptor* field, int index, int fallback) {
  if (tree == nullptr) return fallback;
  pb::TextFormat::ParseLocation at = tree->GetLocation(field, field->is_repeated() ? std::max(index, 0) : -1);
  return at.line >= 0 ? at.line + 1 : fallback;
}

/*! \brief The first line (depth first, in field order) where a field named `name` is set in `message`; 0: nowhere. */
int FirstLine(const pb::Message& message, const Tree* tree, const std::string& name) {
  if (tree == nullptr) return 0;
  std::vector<const pb::FieldDescriptor*> fields;
  message.GetReflection()->ListFields(message, &fields);
  int first = 0;
  auto consider = [&first](int line) { first = line > 0 && (first == 0 || line < first) ? line : first; };
  for (const pb::FieldDescriptor* field : fields) {
    int count = field->is_repeated() ? message.GetReflection()->FieldSize(message, field) : 1;
    if (field->name() == name) consider(LineOf(tree, field, 0, 0));
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    for (int i = 0; i < count; ++i) {
      const pb::Message& item = field->is_repeated() ? message.GetReflection()->GetRepeatedMessage(message, field, i)
                                                     : message.GetReflection()->GetMessage(message, field);
      consider(FirstLine(item, tree->GetTreeForNested(field, field->is_repeated() ? i : -1), name));
    }
  }
  return first;
}

/*! \brief Refuse the first field set that tvmsched does not implement, at its line. */
void RefuseUnsupported(const Parsed& parsed, const pb::Message& message, const std::string& prefix, const Tree* tree,
                       int after) {
  std::vector<const pb::FieldDescriptor*> fields;
  const pb::Reflection* reflection = message.GetReflection();
  reflection->ListFields(message, &fields);
  auto supported = kSupported.find(prefix);
  for (const pb::FieldDescriptor* field : fields) {
    std::string where = prefix.empty() ? field->name() : prefix + "." + field->name();
    int line = LineOf(tree, field, 0, after);
    if (supported == kSupported.end() || !supported->second.count(field->name())) {
      std::string names;
      if (supported != kSupported.end())
        for (const std::string& each : supported->second) names += (names.empty() ? "" : ", ") + each;
      throw parsed.Fail(line, where + " is not supported by the tvmsched backend (supported: " + names + ")");
    }
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    int count = field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const pb::Message& item = field->is_repeated() ? reflection->GetRepeatedMessage(message, field, i)
                                                     : reflection->GetMessage(message, field);
      const Tree* nested = tree ? tree->GetTreeForNested(field, field->is_repeated() ? i : -1) : nullptr;
      int item_line = LineOf(tree, field, i, line);
      if (field->is_map()) {  // a map: its values (messages) are walked
        const pb::FieldDescriptor* value = item.GetDescriptor()->map_value();
        if (value->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && item.GetReflection()->HasField(item, value))
          RefuseUnsupported(parsed, item.GetReflection()->GetMessage(item, value), where + ".value",
                            nested ? nested->GetTreeForNested(value, -1) : nullptr, item_line);
      } else {
        RefuseUnsupported(parsed, item, where, nested, item_line);
      }
    }
  }
}

/*! \brief Parse `path` into `parsed` (it holds the tree of locations, which cannot be copied). */
void Parse(const fs::path& path, Parsed& parsed) {
  parsed.path = path.string();
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  if (!file || !(text << file.rdbuf())) throw std::runtime_error("cannot read " + parsed.path);
  FirstError error;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&error);
  parser.WriteLocationsTo(&parsed.tree);
  if (!parser.ParseFromString(text.str(), &parsed.config)) {
    std::string message = error.message;
    std::replace(message.begin(), message.end(), '\n', ' ');
    throw parsed.Fail(std::max(error.line, 0) + 1, message.empty() ? "not Triton's model configuration" : message);
  }
  RefuseUnsupported(parsed, parsed.config, "", &parsed.tree, 1);
}

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
    throw std::runtime_error("model folder " + folder.string() + " has a " + kConfig +
                             " but no version folder (such as " + (folder / "1").string() + ")");
  return {std::to_string(best), where};
}

/*! \brief The inputs and outputs the config declares are the artifact's (names, types, dims without the batch). */
void CheckTensors(const Parsed& parsed, const tvmsched::Manifest& manifest) {
  const auto* fields = inference::ModelConfig::descriptor();
  for (auto [side, bindings] :
       {std::pair<std::string, const std::vector<tvmsched::Binding>*>{"input", &manifest.inputs},
        {"output", &manifest.outputs}}) {
    int declared = side == "input" ? parsed.config.input_size() : parsed.config.output_size();
    std::string names;
    for (const auto& b : *bindings) names += (names.empty() ? "" : ", ") + b.name;
    for (int i = 0; i < declared; ++i) {
      const inference::ModelInput* in = side == "input" ? &parsed.config.input(i) : nullptr;
      const inference::ModelOutput* out = side == "output" ? &parsed.config.output(i) : nullptr;
      const std::string& name = in ? in->name() : out->name();
      inference::DataType type = in ? in->data_type() : out->data_type();
      std::vector<int64_t> dims(in ? in->dims().begin() : out->dims().begin(),
                                in ? in->dims().end() : out->dims().end());
      int line = LineOf(&parsed.tree, fields->FindFieldByName(side), i, 1);
      auto found = std::find_if(bindings->begin(), bindings->end(), [&](const auto& b) { return b.name == name; });
      if (found == bindings->end())
        throw parsed.Fail(line, side + " " + Quoted(name) + " is not one of the artifact's (" + names + ")");
      const tvmsched::TensorSpec& spec = manifest.tensors.at(found->tensor);
      std::string want = "TYPE_" + tvmsched::kserve::Datatype(spec.dtype);
      std::string got = inference::DataType_IsValid(type) ? inference::DataType_Name(type) : std::to_string(type);
      if (type != inference::TYPE_INVALID && got != want)
        throw parsed.Fail(line, side + " " + Quoted(name) + " is " + want + " in the artifact, not " + got);
      std::vector<int64_t> shape(spec.shape.begin() + (manifest.batch_size > 0 ? 1 : 0), spec.shape.end());
      if (!dims.empty() && dims != shape)
        throw parsed.Fail(line, side + " " + Quoted(name) + " has dims " + ListText(shape) + " in the artifact" +
                                    (manifest.batch_size > 0 ? " (without the batch)" : "") + ", not " +
                                    ListText(dims));
    }
  }
}

}  // namespace

bool IsTritonFolder(const fs::path& folder) { return fs::is_regular_file(folder / kConfig); }

Spec ReadTritonFolder(const std::string& name, const fs::path& folder, const std::vector<std::string>& devices) {
  Parsed parsed;
  Parse(folder / kConfig, parsed);
  const inference::ModelConfig& config = parsed.config;
  auto fail = [&parsed](const std::string& field, const std::string& message) {
    return parsed.Fail(std::max(FirstLine(parsed.config, &parsed.tree, field), 1), message);
  };
  auto fail_parameter = [&parsed](const std::string& key, const std::string& message) {
    const pb::FieldDescriptor* field = inference::ModelConfig::descriptor()->FindFieldByName("parameters");
    int line = 1;
    for (int i = 0; i < parsed.config.GetReflection()->FieldSize(parsed.config, field); ++i) {
      const pb::Message& entry = parsed.config.GetReflection()->GetRepeatedMessage(parsed.config, field, i);
      if (entry.GetReflection()->GetString(entry, entry.GetDescriptor()->map_key()) == key) {
        line = LineOf(&parsed.tree, field, i, 1);
        break;
      }
    }
    return parsed.Fail(line, message);
  };

  if (!config.name().empty() && config.name() != name)
    throw fail("name", "name " + Quoted(config.name()) + " is not the model folder's name " + Quoted(name));
  const std::string& backend = !config.backend().empty() ? config.backend() : config.platform();
  if (backend != "tvmsched")
    throw fail(
        config.backend().empty() ? "platform" : "backend",
        backend.empty() ? "backend: \"tvmsched\" is missing" : "backend must be \"tvmsched\", not " + Quoted(backend));
  Spec spec;
  spec.name = name;
  spec.config_path = parsed.path;
  fs::path where;
  std::tie(spec.version, where) = LatestVersion(folder);
  fs::path artifact =
      where / (config.default_model_filename().empty() ? kDefaultFilename : config.default_model_filename());
  if (!fs::is_regular_file(artifact))
    throw std::runtime_error("model " + Quoted(name) + " version " + spec.version + ": no artifact file at " +
                             artifact.string());
  spec.path = artifact.string();
  tvmsched::Manifest manifest;
  try {  // read and verified; its code is not loaded
    manifest = tvmsched::ReadArtifact(spec.path, tvmsched::TrustedKeys(), false).manifest;
  } catch (const tvm::ffi::Error& err) {
    throw std::runtime_error(err.message());
  }
  int64_t largest = manifest.batch_size;
  int64_t rows = config.max_batch_size();
  if (rows < 0 || (rows > 0) != (largest > 0) || rows > largest) {
    std::string reason = largest ? "the artifact is compiled for up to " + std::to_string(largest) +
                                       " rows: set max_batch_size from 1 to " + std::to_string(largest)
                                 : "the artifact is not compiled for a batch (tvmsched compile --batch-sizes)";
    throw fail("max_batch_size", "max_batch_size " + std::to_string(rows) + ": " + reason);
  }
  spec.max_batch_size = rows;
  CheckTensors(parsed, manifest);
  const inference::ModelDynamicBatching* dynamic = config.has_dynamic_batching() ? &config.dynamic_batching() : nullptr;
  if (dynamic && !largest)
    throw fail("dynamic_batching", "dynamic_batching needs a model compiled for a batch (max_batch_size > 0)");

  std::map<std::string, std::string> params;
  for (const auto& [key, value] : config.parameters()) params[key] = value.string_value();
  for (const auto& [key, value] : params) {
    if (std::find(kParameters.begin(), kParameters.end(), key) == kParameters.end())
      throw fail_parameter(key, "parameters " + Quoted(key) +
                                    " is not one the tvmsched backend reads (qos_ms, "
                                    "priority, warmup)");
  }
  auto priority = params.count("priority") ? std::optional<std::string>(params["priority"]) : std::nullopt;
  if (priority && *priority != "realtime" && *priority != "best_effort")
    throw fail_parameter("priority", "parameters priority is realtime or best_effort, not " + Quoted(*priority));
  if (dynamic && dynamic->default_priority_level()) {
    uint64_t level_number = dynamic->default_priority_level();
    std::string level = level_number == 1 ? "realtime" : "best_effort";
    if (dynamic->priority_levels() && level_number > dynamic->priority_levels())
      throw fail("default_priority_level", "default_priority_level " + std::to_string(level_number) +
                                               " is above priority_levels " +
                                               std::to_string(dynamic->priority_levels()));
    if (priority && *priority != level)
      throw fail("default_priority_level", "default_priority_level " + std::to_string(level_number) + " (" + level +
                                               ") disagrees with parameters priority " + Quoted(*priority));
    priority = level;
  }
  spec.priority = priority.value_or("best_effort");
  if (params.count("qos_ms")) {
    const std::string& text = params["qos_ms"];
    char* end = nullptr;
    double qos = text.empty() ? -1 : std::strtod(text.c_str(), &end);
    if (!(qos > 0) || std::isinf(qos) || (end && *end != '\0'))
      throw fail_parameter("qos_ms",
                           "parameters qos_ms must be a positive number of milliseconds, not " + Quoted(text));
    spec.qos_ms = qos;
  }
  std::string warmup = params.count("warmup") ? params["warmup"] : "true";
  if (warmup != "true" && warmup != "false")
    throw fail_parameter("warmup", "parameters warmup is true or false, not " + Quoted(warmup));
  spec.warmup = warmup == "true";

  if (config.instance_group_size() > 0) {
    const int n = static_cast<int>(devices.size());
    std::map<int, int64_t> per_device;  // device number -> streams (Triton: count instances on each device of gpus)
    for (const inference::ModelInstanceGroup& group : config.instance_group()) {
      if (std::any_of(group.gpus().begin(), group.gpus().end(), [n](int32_t gpu) { return gpu < 0 || gpu >= n; })) {
        std::string names;
        for (const std::string& d : devices) names += (names.empty() ? "" : ", ") + d;
        throw fail("gpus", "instance_group gpus " + ListText(group.gpus()) + ": the server has " + std::to_string(n) +
                               " device" + (n > 1 ? "s" : "") + " (" + names + ")");
      }
      std::set<int> on(group.gpus().begin(), group.gpus().end());
      if (on.empty()) {  // none named: every device
        for (int d = 0; d < n; ++d) on.insert(d);
      }
      for (int d : on) per_device[d] += std::max(group.count(), 1);
      spec.instance_kinds.push_back(inference::ModelInstanceGroup::Kind_Name(group.kind()));
    }
    std::set<int64_t> counts;
    std::string listed;
    for (const auto& [d, count] : per_device) {
      counts.insert(count);
      listed += (listed.empty() ? "" : ", ") + devices[d] + ": " + std::to_string(count);
    }
    if (counts.size() > 1)
      throw fail("count", "instance_group counts differ between devices (" + listed +
                              "): a model runs the same streams on each of its devices");
    const int64_t streams = *counts.begin();
    if (streams < 1 || streams > 64)
      throw fail("count",
                 "instance_group counts add up to " + std::to_string(streams) + " streams; 1 to 64 are served");
    spec.streams = static_cast<int>(streams);
    if (n > 1) {
      for (const auto& [d, count] : per_device) spec.devices.push_back(d);
    }
  }
  if (dynamic) {
    if (dynamic->has_default_queue_policy()) {
      const inference::ModelQueuePolicy& policy = dynamic->default_queue_policy();
      spec.queue.emplace();
      spec.queue->timeout_action = policy.timeout_action() == inference::ModelQueuePolicy::DELAY
                                       ? tvmsched::TimeoutAction::kDelay
                                       : tvmsched::TimeoutAction::kReject;
      spec.queue->default_timeout_us = static_cast<double>(policy.default_timeout_microseconds());
      spec.queue->allow_timeout_override = policy.allow_timeout_override();
      if (policy.max_queue_size() > 0) spec.max_queue = policy.max_queue_size();
    }
    if (dynamic->max_queue_delay_microseconds() > 60'000'000)
      throw fail("max_queue_delay_microseconds", "max_queue_delay_microseconds must be from 0 to 60000000");
    spec.max_queue_delay_us = static_cast<double>(dynamic->max_queue_delay_microseconds());
    spec.preferred_batch_sizes.assign(dynamic->preferred_batch_size().begin(), dynamic->preferred_batch_size().end());
  }
  return spec;
}

}  // namespace tvmsched_server
