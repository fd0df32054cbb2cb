// numpy's .npy and .npz formats (tvmsched/npz.h).
#include "tvmsched/npz.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "tvmsched/model.h"

namespace tvmsched {
namespace {

std::invalid_argument Error(const std::string& text) { return std::invalid_argument(text); }

void Put16(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>((v >> 8) & 0xff));
}

void Put32(std::string& out, uint32_t v) {
  Put16(out, v & 0xffff);
  Put16(out, v >> 16);
}

/*! \brief The value after `'key':` in a .npy header dict, up to the next top-level comma or brace. */
std::string Field(const std::string& header, const std::string& key, const std::string& what) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) throw Error(what + " is not a valid .npy array (its header lacks '" + key + "')");
  at = header.find(':', at);
  if (at == std::string::npos) throw Error(what + " is not a valid .npy array (bad header)");
  size_t end = at + 1;
  int depth = 0;
  for (; end < header.size(); ++end) {
    char c = header[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  std::string value = header.substr(at + 1, end - at - 1);
  size_t first = value.find_first_not_of(' '), last = value.find_last_not_of(' ');
  return first == std::string::npos ? "" : value.substr(first, last - first + 1);
}

DLDataType DTypeOfDescr(const std::string& descr, const std::string& what) {
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '=')) {
    throw Error(what + " has dtype " + descr + " (only little-endian numbers and bools are read)");
  }
  int size = std::atoi(descr.c_str() + 2);
  uint8_t code = descr[1] == 'f'   ? kDLFloat
                 : descr[1] == 'i' ? kDLInt
                 : descr[1] == 'u' ? kDLUInt
                 : descr[1] == 'b' ? kDLBool
                                   : 255;
  if (code == 255 || (size != 1 && size != 2 && size != 4 && size != 8) || (code == kDLBool && size != 1) ||
      (code == kDLFloat && size == 1)) {
    throw Error(what + " has dtype " + descr + " (only numbers and bools are read)");
  }
  return DLDataType{code, static_cast<uint8_t>(size * 8), 1};
}

std::string DescrOf(DLDataType dtype) {
  int size = dtype.bits / 8;
  char kind = dtype.code == kDLFloat  ? 'f'
              : dtype.code == kDLInt  ? 'i'
              : dtype.code == kDLUInt ? 'u'
              : dtype.code == kDLBool ? 'b'
                                      : '?';
  if (kind == '?' || dtype.lanes != 1 || dtype.bits % 8 != 0) {
    throw Error("cannot write dtype " + DTypeName(dtype) + " to .npy");
  }
  return std::string(size == 1 ? "|" : "<") + kind + std::to_string(size);
}

/*! \brief CRC-32 (ISO-HDLC, as zip uses). */
uint32_t Crc32(const std::string& data) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

}  // namespace

HostArray ParseNpy(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw Error(what + " is not a .npy array");
  int major = static_cast<uint8_t>(bytes[6]);
  if (major < 1 || major > 3) throw Error(what + " has .npy format version " + std::to_string(major));
  size_t prefix = major == 1 ? 10 : 12;
  if (bytes.size() < prefix) throw Error(what + " has a truncated .npy header");
  size_t header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  if (major > 1) {
    header_len |= (static_cast<size_t>(static_cast<uint8_t>(bytes[10])) << 16) |
                  (static_cast<size_t>(static_cast<uint8_t>(bytes[11])) << 24);
  }
  if (prefix + header_len > bytes.size()) throw Error(what + " has a truncated .npy header");
  std::string header = bytes.substr(prefix, header_len);

  std::string descr = Field(header, "descr", what);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"')) {
    throw Error(what + " has a structured dtype (only plain numbers and bools are read)");
  }
  DLDataType dtype = DTypeOfDescr(descr.substr(1, descr.size() - 2), what);
  if (Field(header, "fortran_order", what) != "False") throw Error(what + " is in Fortran order (write it in C order)");
  std::string shape_text = Field(header, "shape", what);
  if (shape_text.size() < 2 || shape_text.front() != '(' || shape_text.back() != ')') {
    throw Error(what + " has a bad shape " + shape_text);
  }
  std::vector<int64_t> shape;
  size_t count = 1;
  std::stringstream dims(shape_text.substr(1, shape_text.size() - 2));
  for (std::string dim; std::getline(dims, dim, ',');) {
    if (dim.find_first_not_of(' ') == std::string::npos) continue;
    char* end = nullptr;
    long long d = std::strtoll(dim.c_str(), &end, 10);
    if (d < 0 || end == dim.c_str()) throw Error(what + " has a bad shape " + shape_text);
    shape.push_back(d);
    count *= static_cast<size_t>(d);
  }
  size_t nbytes = count * (dtype.bits / 8);
  if (bytes.size() - prefix - header_len != nbytes) {
    throw Error(what + " holds " + std::to_string(bytes.size() - prefix - header_len) +
                " data bytes, its shape needs " + std::to_string(nbytes));
  }
  return HostArray{shape, dtype, bytes.substr(prefix + header_len)};
}

std::string WriteNpy(const ffi::Tensor& tensor) {
  const DLTensor* t = tensor.GetDLTensorPtr();
  if (t->device.device_type != kDLCPU || !tensor.IsContiguous())
    throw Error("only contiguous host tensors are written");
  std::string shape = "(";
  size_t count = 1;
  for (int i = 0; i < t->ndim; ++i) {
    shape += std::to_string(t->shape[i]) + (t->ndim == 1 ? ",)" : i + 1 < t->ndim ? ", " : ")");
    count *= static_cast<size_t>(t->shape[i]);
  }
  if (t->ndim == 0) shape += ")";
  std::string header = "{'descr': '" + DescrOf(t->dtype) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // numpy pads the header with spaces so the data starts at a multiple of 64, then a newline
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  Put16(out, static_cast<uint32_t>(header.size()));
  out += header;
  out.append(static_cast<const char*>(t->data) + t->byte_offset, count * (t->dtype.bits / 8));
  return out;
}

std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& members) {
  const uint32_t kTime = 0, kDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01 00:00: reproducible bytes
  std::string out, directory;
  for (const auto& [name, data] : members) {
    if (data.size() >= 0xFFFFFFFFu || out.size() >= 0xFFFFFFFFu || name.size() > 0xFFFF) {
      throw Error("member " + name + " is too large for a zip without zip64");
    }
    uint32_t crc = Crc32(data), size = static_cast<uint32_t>(data.size()), offset = static_cast<uint32_t>(out.size());
    Put32(out, 0x04034b50);  // local file header
    Put16(out, 20);          // version needed: 2.0
    Put16(out, 0);           // flags
    Put16(out, 0);           // method: stored
    Put16(out, kTime);
    Put16(out, kDate);
    Put32(out, crc);
    Put32(out, size);  // compressed size
    Put32(out, size);  // uncompressed size
    Put16(out, static_cast<uint32_t>(name.size()));
    Put16(out, 0);  // extra field length
    out += name;
    out += data;

    Put32(directory, 0x02014b50);     // central directory entry
    Put16(directory, (3 << 8) | 20);  // made by: unix, 2.0
    Put16(directory, 20);
    Put16(directory, 0);
    Put16(directory, 0);
    Put16(directory, kTime);
    Put16(directory, kDate);
    Put32(directory, crc);
    Put32(directory, size);
    Put32(directory, size);
    Put16(directory, static_cast<uint32_t>(name.size()));
    Put16(directory, 0);            // extra
    Put16(directory, 0);            // comment
    Put16(directory, 0);            // disk number
    Put16(directory, 0);            // internal attributes
    Put32(directory, 0644u << 16);  // external attributes: -rw-r--r--
    Put32(directory, offset);
    directory += name;
  }
  if (members.size() > 0xFFFF || out.size() + directory.size() >= 0xFFFFFFFFu)
    throw Error("too large for a zip without zip64");
  uint32_t directory_at = static_cast<uint32_t>(out.size());
  out += directory;
  Put32(out, 0x06054b50);  // end of central directory
  Put16(out, 0);
  Put16(out, 0);
  Put16(out, static_cast<uint32_t>(members.size()));
  Put16(out, static_cast<uint32_t>(members.size()));
  Put32(out, static_cast<uint32_t>(directory.size()));
  Put32(out, directory_at);
  Put16(out, 0);  // comment length
  return out;
}

ffi::Map<ffi::String, ffi::Tensor> LoadNpz(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error("input file not found: " + path);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ffi::Map<ffi::String, ffi::Tensor> out;
  for (const auto& [member, data] : ReadStoredZip(bytes, path)) {
    bool npy = member.size() > 4 && member.compare(member.size() - 4, 4, ".npy") == 0;
    std::string key = npy ? member.substr(0, member.size() - 4) : member;
    HostArray array = ParseNpy(data, path + ":" + member);
    ffi::Tensor tensor = EmptyHostTensor(array.shape, array.dtype);
    if (!array.data.empty()) std::memcpy(tensor.data_ptr(), array.data.data(), array.data.size());
    out.Set(ffi::String(key), tensor);
  }
  return out;
}

void SaveNpz(const std::string& path, const ffi::Map<ffi::String, ffi::Tensor>& arrays) {
  std::vector<std::pair<std::string, std::string>> members;
  for (const auto& kv : arrays) members.emplace_back(std::string(kv.first) + ".npy", WriteNpy(kv.second));
  std::string bytes = StoredZip(members);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw Error("cannot write " + path);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) throw Error("cannot write " + path);
}

}  // namespace tvmsched
