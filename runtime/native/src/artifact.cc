// The artifact reader: zip of stored members -> checksums -> manifest (tvm-ffi's JSON parser) -> weights (.npy).
#include "tvmsched/artifact.h"

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>

#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

namespace tvmsched {

namespace ffi = tvm::ffi;

size_t TensorSpec::nbytes() const {
  size_t n = (static_cast<size_t>(dtype.bits) * dtype.lanes + 7) / 8;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

DLDataType ParseDType(const std::string& name) {
  if (name == "bool") return DLDataType{kDLBool, 8, 1};
  struct Prefix {
    const char* text;
    uint8_t code;
  };
  for (Prefix p : {Prefix{"bfloat", kDLBfloat}, Prefix{"float", kDLFloat}, Prefix{"uint", kDLUInt}, Prefix{"int", kDLInt}}) {
    size_t len = std::char_traits<char>::length(p.text);
    if (name.compare(0, len, p.text) == 0 && name.size() > len) {
      int bits = std::atoi(name.c_str() + len);
      if (bits == 8 || bits == 16 || bits == 32 || bits == 64) return DLDataType{p.code, static_cast<uint8_t>(bits), 1};
    }
  }
  TVM_FFI_THROW(TvmschedError) << "unsupported dtype " << name;
}

namespace {

uint32_t Le32(const std::string& b, size_t at) {
  return uint32_t(uint8_t(b[at])) | uint32_t(uint8_t(b[at + 1])) << 8 | uint32_t(uint8_t(b[at + 2])) << 16 |
         uint32_t(uint8_t(b[at + 3])) << 24;
}
uint16_t Le16(const std::string& b, size_t at) { return uint16_t(uint8_t(b[at]) | uint8_t(b[at + 1]) << 8); }
uint64_t Le64(const std::string& b, size_t at) { return uint64_t(Le32(b, at)) | uint64_t(Le32(b, at + 4)) << 32; }

[[noreturn]] void Corrupt(const std::string& what, const std::string& why) {
  TVM_FFI_THROW(TvmschedError) << what << " is not a readable tvmsched artifact (truncated or corrupt: " << why << ")";
}

// ---- manifest --------------------------------------------------------------------------------

/*! \brief Typed access to a JSON object, each missing or mistyped field a one-line error. */
class Json {
 public:
  Json(ffi::Any value, std::string where) : value_(std::move(value)), where_(std::move(where)) {}
  Json operator[](const char* key) const {
    auto object = value_.try_cast<ffi::Map<ffi::Any, ffi::Any>>();
    if (!object) Fail("is not an object");
    auto found = object->find(ffi::String(key));
    return Json(found == object->end() ? ffi::Any() : (*found).second, where_ + "." + key);
  }
  bool null() const { return value_ == nullptr; }
  std::string str() const {
    auto s = value_.try_cast<ffi::String>();
    if (!s) Fail("is not a string");
    return std::string(*s);
  }
  int64_t integer() const {
    auto v = value_.as<int64_t>();
    if (!v) Fail("is not an integer");
    return *v;
  }
  int64_t integer_or(int64_t fallback) const { return null() ? fallback : integer(); }
  double number() const {
    if (auto i = value_.as<int64_t>()) return static_cast<double>(*i);
    auto v = value_.as<double>();
    if (!v) Fail("is not a number");
    return *v;
  }
  bool boolean() const {
    auto v = value_.as<bool>();
    if (!v) Fail("is not a boolean");
    return *v;
  }
  std::vector<Json> items() const {
    auto array = value_.try_cast<ffi::Array<ffi::Any>>();
    if (!array) Fail("is not a list");
    std::vector<Json> out;
    for (size_t i = 0; i < array->size(); ++i) out.emplace_back((*array)[i], where_ + "[" + std::to_string(i) + "]");
    return out;
  }
  std::vector<std::pair<std::string, Json>> entries() const {
    auto object = value_.try_cast<ffi::Map<ffi::Any, ffi::Any>>();
    if (!object) Fail("is not an object");
    std::vector<std::pair<std::string, Json>> out;
    for (const auto& kv : *object) {
      auto key = kv.first.try_cast<ffi::String>();
      if (!key) Fail("has a non-string key");
      out.emplace_back(std::string(*key), Json(kv.second, where_ + "." + std::string(*key)));
    }
    return out;
  }
  std::vector<std::string> strings() const {
    std::vector<std::string> out;
    for (const Json& item : items()) out.push_back(item.str());
    return out;
  }

 private:
  [[noreturn]] void Fail(const char* why) const { throw std::invalid_argument(where_ + " " + why); }
  ffi::Any value_;
  std::string where_;
};

/*! \brief What the kernels rely on before any runs: every tensor has a known size, every model input
 *  tensor is bound to an input (else a kernel reads uninitialised memory), every layer reads only
 *  weights, inputs or earlier layers' outputs, activations are written by exactly one layer, and
 *  candidates are numbered by position. */
void CheckInvariants(const Manifest& m) {
  for (const auto& [id, spec] : m.tensors) {
    double bytes = (spec.dtype.bits + 7) / 8;
    for (int64_t d : spec.shape) bytes *= static_cast<double>(d);
    if (bytes > double(int64_t(1) << 40)) {
      std::ostringstream text;
      text << "tensor " << id << " needs " << std::fixed << std::setprecision(0) << bytes
           << " bytes, more than the engine's limit of 1 TiB per tensor";
      throw std::invalid_argument(text.str());
    }
    if (spec.kind != "input" && spec.kind != "weight" && spec.kind != "activation") {
      throw std::invalid_argument("tensor " + id + " has unknown kind " + spec.kind);
    }
  }
  std::set<std::string> bound, written;
  for (const Binding& b : m.inputs) {
    if (m.tensors.at(b.tensor).kind != "input") throw std::invalid_argument("input " + b.name + " is bound to a non-input tensor");
    if (!bound.insert(b.tensor).second) throw std::invalid_argument("tensor " + b.tensor + " is bound to two inputs");
  }
  for (const auto& [id, spec] : m.tensors) {
    if (spec.kind == "input" && !bound.count(id)) throw std::invalid_argument("input tensor " + id + " is bound to no model input");
  }
  for (const LayerSpec& layer : m.layers) {
    for (const auto& id : layer.inputs) {
      const std::string& kind = m.tensors.at(id).kind;
      if (kind == "activation" && !written.count(id)) {
        throw std::invalid_argument("layer " + layer.func + " reads " + id + " before any layer writes it");
      }
    }
    for (const auto& id : layer.outputs) {
      if (m.tensors.at(id).kind != "activation") throw std::invalid_argument("layer " + layer.func + " writes non-activation " + id);
      if (!written.insert(id).second) throw std::invalid_argument("tensor " + id + " is written by two layers");
    }
    for (size_t c = 0; c < layer.candidates.size(); ++c) {
      if (layer.candidates[c].id != static_cast<int>(c)) throw std::invalid_argument("layer " + layer.func + " has candidate ids out of order");
    }
  }
  for (const Binding& b : m.outputs) {
    if (m.tensors.at(b.tensor).kind == "activation" && !written.count(b.tensor)) {
      throw std::invalid_argument("output " + b.name + " is written by no layer");
    }
  }
  for (const IndexCheckSpec& c : m.index_checks) {
    const TensorSpec& spec = m.tensors.at(c.tensor);
    if (!written.count(c.tensor) || !spec.shape.empty() || spec.dtype_name != "int32") {
      throw std::invalid_argument("index check " + c.tensor + " is not an int32 scalar written by a layer");
    }
  }
}

}  // namespace

void CheckJsonDepth(const std::string& text, const std::string& what, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {  // no recursion: the parser's own would overflow the stack
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) throw std::invalid_argument(what + " nests deeper than " + std::to_string(max_depth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

namespace {

Manifest ParseManifest(const std::string& text) {
  CheckJsonDepth(text, "manifest.json", kMaxJsonDepth);
  ffi::String error;
  ffi::Any root = ffi::json::Parse(ffi::String(text), &error);
  if (!error.empty()) throw std::invalid_argument("manifest.json is not JSON: " + std::string(error));
  Json json(root, "manifest");
  Manifest m;
  m.schema_version = static_cast<int>(json["schema_version"].integer());
  if (m.schema_version != kSchemaVersion) return m;  // the caller reports the version
  m.model_name = json["model_name"].str();
  m.device = json["device"].str();
  if (m.device != "cpu" && m.device != "cuda") throw std::invalid_argument("manifest.device must be cpu or cuda");
  m.device_code = json["device_code"].str();
  m.progress_counters = !json["progress_counters"].null() && json["progress_counters"].boolean();
  for (const char* side : {"inputs", "outputs"}) {
    for (const Json& b : json[side].items()) (side[0] == 'i' ? m.inputs : m.outputs).push_back({b["name"].str(), b["tensor"].str()});
  }
  for (const auto& [id, t] : json["tensors"].entries()) {
    TensorSpec spec;
    for (const Json& d : t["shape"].items()) {
      int64_t dim = d.integer();
      if (dim < 0 || dim > (int64_t(1) << 40)) throw std::invalid_argument("tensor " + id + " has a bad shape");
      spec.shape.push_back(dim);
    }
    spec.dtype_name = t["dtype"].str();
    spec.dtype = ParseDType(spec.dtype_name);
    spec.kind = t["kind"].str();
    m.tensors.emplace(id, std::move(spec));
  }
  auto known = [&](const std::string& id) {
    if (!m.tensors.count(id)) throw std::invalid_argument("unknown tensor " + id);
    return id;
  };
  for (const Binding& b : m.inputs) known(b.tensor);
  for (const Binding& b : m.outputs) known(b.tensor);
  for (const Json& l : json["layers"].items()) {
    LayerSpec layer;
    layer.index = static_cast<int>(l["index"].integer());
    layer.func = l["func"].str();
    for (const auto& id : l["inputs"].strings()) layer.inputs.push_back(known(id));
    for (const auto& id : l["outputs"].strings()) layer.outputs.push_back(known(id));
    for (const Json& c : l["candidates"].items()) {
      CandidateSpec cand;
      cand.id = static_cast<int>(c["id"].integer());
      cand.kernel = c["kernel"].str();
      cand.units = static_cast<int>(c["units"].integer_or(0));
      cand.mechanism = c["mechanism"].null() ? "" : c["mechanism"].str();
      cand.idempotent = !c["idempotent"].null() && c["idempotent"].boolean();
      cand.threads = std::max<int64_t>(1, c["threads"].integer_or(1));
      // the progress bitmap's unit: blocks the kernels count when they count, else the launch's blocks
      int64_t blocks = (m.progress_counters ? c["progress_blocks"] : c["blocks"]).integer_or(1);
      cand.blocks = std::max<int64_t>(1, blocks);
      cand.latency_us = c["latency_us"].null() ? 1.0 : c["latency_us"].number();
      layer.candidates.push_back(std::move(cand));
    }
    if (layer.candidates.empty()) throw std::invalid_argument("layer " + layer.func + " has no candidates");
    if (layer.index != static_cast<int>(m.layers.size())) throw std::invalid_argument("layers are out of order");
    m.layers.push_back(std::move(layer));
  }
  if (!json["index_checks"].null()) {
    for (const Json& c : json["index_checks"].items()) {
      int64_t bit = c["bit"].integer();
      if (bit < 0 || bit > 30) throw std::invalid_argument("index check bit " + std::to_string(bit) + " is out of range");
      m.index_checks.push_back({known(c["tensor"].str()), static_cast<int>(bit), c["message"].str()});
    }
  }
  m.preempt_flags = static_cast<int>(json["preempt_flags"].integer_or(0));
  if (m.preempt_flags < 0 || m.preempt_flags > 4096) throw std::invalid_argument("manifest.preempt_flags out of range");
  if (!json["qos_ms"].null()) m.qos_ms = json["qos_ms"].number();
  if (!json["cpu"].null()) m.cpu = json["cpu"].str();  // absent (older artifacts): compiled generic
  if (!json["cpu_features"].null()) m.cpu_features = json["cpu_features"].strings();
  CheckInvariants(m);
  return m;
}

// ---- weights (.npy members of weights.npz) ----------------------------------------------------

HostArray ParseNpy(const std::string& bytes, const std::string& name) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw std::invalid_argument(name + " is not .npy");
  int major = uint8_t(bytes[6]);
  size_t header_len = major == 1 ? Le16(bytes, 8) : Le32(bytes, 8);
  size_t start = (major == 1 ? 10 : 12) + header_len;
  if (start > bytes.size()) throw std::invalid_argument(name + " has a truncated header");
  std::string header = bytes.substr(major == 1 ? 10 : 12, header_len);
  auto field = [&](const char* key) {
    size_t at = header.find(std::string("'") + key + "'");
    if (at == std::string::npos) throw std::invalid_argument(name + " lacks " + key);
    at = header.find(':', at);
    return header.substr(at + 1);
  };
  std::string descr = field("descr");
  descr = descr.substr(descr.find('\'') + 1);
  descr = descr.substr(0, descr.find('\''));
  if (field("fortran_order").find("False") > 2) throw std::invalid_argument(name + " is in Fortran order");
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|')) throw std::invalid_argument(name + " has dtype " + descr);
  HostArray out;
  int size = std::atoi(descr.c_str() + 2);
  uint8_t code = descr[1] == 'f' ? kDLFloat : descr[1] == 'i' ? kDLInt : descr[1] == 'u' ? kDLUInt : descr[1] == 'b' ? kDLBool : 255;
  if (code == 255 || size <= 0 || size > 8) throw std::invalid_argument(name + " has dtype " + descr);
  out.dtype = DLDataType{code, static_cast<uint8_t>(size * 8), 1};
  std::string shape = field("shape");
  shape = shape.substr(shape.find('(') + 1, shape.find(')') - shape.find('(') - 1);
  std::stringstream dims(shape);
  size_t count = 1;
  for (std::string dim; std::getline(dims, dim, ',');) {
    if (dim.find_first_not_of(' ') == std::string::npos) continue;
    int64_t d = std::stoll(dim);
    if (d < 0) throw std::invalid_argument(name + " has a negative dimension");
    out.shape.push_back(d);
    count *= static_cast<size_t>(d);
  }
  if (bytes.size() - start != count * size) throw std::invalid_argument(name + " holds the wrong number of bytes");
  out.data = bytes.substr(start);
  return out;
}

}  // namespace

std::map<std::string, std::string> ReadStoredZip(const std::string& b, const std::string& what, size_t max_members) {
  if (b.size() < 22) Corrupt(what, "too short for a zip archive");
  size_t eocd = std::string::npos;
  for (size_t at = b.size() - 22;; --at) {
    if (Le32(b, at) == 0x06054b50) {
      eocd = at;
      break;
    }
    if (at == 0 || b.size() - at > 22 + 65535) break;
  }
  if (eocd == std::string::npos) Corrupt(what, "no zip directory");
  size_t entries = Le16(b, eocd + 10);
  uint64_t dir_size = Le32(b, eocd + 12), dir_at = Le32(b, eocd + 16);
  if (entries > max_members) Corrupt(what, "more than " + std::to_string(max_members) + " members");
  if (dir_at + dir_size > eocd) Corrupt(what, "zip directory out of range");
  std::map<std::string, std::string> members;
  size_t at = dir_at;
  for (size_t i = 0; i < entries; ++i) {
    if (at + 46 > eocd || Le32(b, at) != 0x02014b50) Corrupt(what, "bad zip directory entry");
    uint16_t method = Le16(b, at + 10);
    uint64_t csize = Le32(b, at + 20), usize = Le32(b, at + 24), offset = Le32(b, at + 42);
    size_t name_len = Le16(b, at + 28), extra_len = Le16(b, at + 30), comment_len = Le16(b, at + 32);
    if (at + 46 + name_len + extra_len + comment_len > eocd) Corrupt(what, "bad zip directory entry");
    std::string name = b.substr(at + 46, name_len);
    // zip64: the 0xffffffff fields come from the extra field, in order usize, csize, offset
    for (size_t e = at + 46 + name_len; e + 4 <= at + 46 + name_len + extra_len;) {
      uint16_t id = Le16(b, e), len = Le16(b, e + 2);
      size_t p = e + 4, end = p + len;
      if (end > at + 46 + name_len + extra_len) break;
      if (id == 0x0001) {
        if (usize == 0xffffffff && p + 8 <= end) usize = Le64(b, p), p += 8;
        if (csize == 0xffffffff && p + 8 <= end) csize = Le64(b, p), p += 8;
        if (offset == 0xffffffff && p + 8 <= end) offset = Le64(b, p), p += 8;
      }
      e = end;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (method != 0 || csize != usize) {
      TVM_FFI_THROW(TvmschedError) << what << " has a compressed member " << name
                                   << " (tvmsched writes stored members only; refusing to inflate it)";
    }
    if (offset + 30 > b.size() || Le32(b, offset) != 0x04034b50) Corrupt(what, "bad local header of " + name);
    uint64_t data_at = offset + 30 + Le16(b, offset + 26) + Le16(b, offset + 28);
    if (data_at > b.size() || usize > b.size() - data_at) Corrupt(what, name + " runs past the end of the file");
    if (!members.emplace(name, b.substr(data_at, usize)).second) Corrupt(what, "duplicate member " + name);
  }
  return members;
}

ArtifactContents ReadArtifact(const std::string& path, const TrustedKeys& trusted) {
  std::ifstream file(path, std::ios::binary);
  if (!file) TVM_FFI_THROW(TvmschedError) << "artifact not found: " << path;
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  auto members = ReadStoredZip(bytes, path, 16);
  bytes.clear();
  for (const char* name : {"manifest.json", "kernels.so", "weights.npz", "checksums.json"}) {
    if (!members.count(name)) Corrupt(path, std::string("there is no item named '") + name + "' in the archive");
  }
  std::string signer = trusted.empty() ? "" : trusted.Verify(path, members["signature.json"], members["checksums.json"]);
  ffi::String error;
  try {
    CheckJsonDepth(members["checksums.json"], "checksums.json", kMaxJsonDepth);
  } catch (const std::invalid_argument& err) {
    Corrupt(path, err.what());
  }
  ffi::Any sums = ffi::json::Parse(ffi::String(members["checksums.json"]), &error);
  for (const char* name : {"manifest.json", "kernels.so", "weights.npz"}) {
    std::string expected;
    try {
      expected = error.empty() ? Json(sums, "checksums")[name].str() : "";
    } catch (const std::invalid_argument&) {
    }
    if (Sha256Hex(members[name]) != expected) TVM_FFI_THROW(TvmschedError) << path << " is corrupt: checksum mismatch in " << name;
  }
  ArtifactContents out;
  try {
    out.manifest = ParseManifest(members["manifest.json"]);
  } catch (const std::invalid_argument& err) {
    TVM_FFI_THROW(TvmschedError) << path << " is a corrupt artifact: bad manifest or weights (" << err.what() << ")";
  }
  int version = out.manifest.schema_version;
  if (version > kSchemaVersion) {
    TVM_FFI_THROW(TvmschedError) << path << " has artifact schema version " << version << ", newer than this tvmsched reads ("
                                 << kSchemaVersion << "); upgrade tvmsched";
  }
  if (version < kSchemaVersion) {
    TVM_FFI_THROW(TvmschedError) << path << " has artifact schema version " << version << "; this tvmsched reads version "
                                 << kSchemaVersion << " only (recompile the model)";
  }
  try {
    auto arrays = ReadStoredZip(members["weights.npz"], "weights.npz", 65535);
    for (const auto& [id, spec] : out.manifest.tensors) {
      if (spec.kind != "weight") continue;
      auto found = arrays.find(id + ".npy");
      if (found == arrays.end()) throw std::invalid_argument("weights.npz lacks " + id);
      HostArray array = ParseNpy(found->second, id);
      bool same_dtype = array.dtype.code == spec.dtype.code && array.dtype.bits == spec.dtype.bits;
      if (array.shape != spec.shape || !same_dtype) throw std::invalid_argument("weight " + id + " does not match its shape or dtype");
      out.weights.emplace(id, std::move(array));
    }
  } catch (const std::invalid_argument& err) {
    TVM_FFI_THROW(TvmschedError) << path << " is a corrupt artifact: bad manifest or weights (" << err.what() << ")";
  } catch (const ffi::Error& err) {
    TVM_FFI_THROW(TvmschedError) << path << " is a corrupt artifact: bad manifest or weights (" << err.message() << ")";
  }
  out.signer = signer;
  out.manifest_json = std::move(members["manifest.json"]);
  out.kernels = std::move(members["kernels.so"]);
  return out;
}

}  // namespace tvmsched
