// The config files of a model repository that the engine hands back to this server to parse (tvmsched/repository.h,
// ToJson), as `tvmsched serve` parses them (tvmsched/serve/repository.py): config.pbtxt with libprotobuf and Triton's
// model_config.proto (vendored in tvmsched/serve/proto, compiled by protoc at build time), handed over as protobuf's
// JSON; config.toml's `key = value` lines as a JSON object.
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>
#include <tvmsched/repository.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "model_config.pb.h"

namespace pb = google::protobuf;

namespace {

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

std::string PbtxtToJson(const std::string& path, const std::string& text) {
  inference::ModelConfig config;
  FirstError error;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&error);
  if (!parser.ParseFromString(text, &config)) {
    std::string message = error.message.empty() ? "not Triton's model configuration" : error.message;
    for (char& c : message) c = c == '\n' ? ' ' : c;
    throw std::runtime_error(path + ":" + std::to_string(std::max(error.line, 0) + 1) + ": " + message);
  }
  std::string out;
  pb::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!pb::util::MessageToJsonString(config, &out, options).ok()) throw std::runtime_error("cannot read " + path);
  return out;
}

/*! \brief config.toml's `key = value` lines (numbers, true/false, "strings", # comments) as a JSON object. */
std::string TomlToJson(const std::string& path, const std::string& text) {
  nlohmann::json out = nlohmann::json::object();
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
    nlohmann::json parsed = nlohmann::json::parse(value, nullptr, false);
    if (key.empty() || parsed.is_discarded() || parsed.is_object())
      throw std::runtime_error("cannot read " + path + ": '" + line + "' is not a key = value line this server reads");
    out[key] = parsed;
  }
  return out.dump();
}

}  // namespace

tvmsched::serving::ToJson ConfigToJson() {
  return [](const std::string& path, const std::string& text) {
    return path.size() > 6 && path.compare(path.size() - 6, 6, ".pbtxt") == 0 ? PbtxtToJson(path, text)
                                                                              : TomlToJson(path, text);
  };
}
