// Artifact signatures (Ed25519) and member checksums (SHA-256), both through OpenSSL's libcrypto.
//
// An artifact is native code: checksums.json only detects corruption (anyone can recompute it). A
// signed artifact also holds signature.json, an Ed25519 signature over the bytes of checksums.json,
// which names the SHA-256 of every other member; with trusted keys, ReadArtifact verifies it before
// anything else is read (README, "Trust model").
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "tvmsched/artifact.h"

namespace tvmsched {

namespace ffi = tvm::ffi;

namespace {

std::string Hex(const unsigned char* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) out += {digits[data[i] >> 4], digits[data[i] & 15]};
  return out;
}

bool Unhex(const std::string& hex, std::string* out) {
  auto value = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  if (hex.size() % 2) return false;
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = value(hex[i]), lo = value(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi << 4 | lo));
  }
  return true;
}

using PKey = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

}  // namespace

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &n, EVP_sha256(), nullptr) != 1) {
    TVM_FFI_THROW(TvmschedError) << "SHA-256 failed (OpenSSL)";
  }
  return Hex(digest, n);
}

std::string TrustedKeys::KeyId(const std::string& raw_public_key) { return Sha256Hex(raw_public_key).substr(0, 16); }

void TrustedKeys::AddPem(const std::string& pem, const std::string& what) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  PKey key(bio ? PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr) : nullptr, EVP_PKEY_free);
  if (!key || EVP_PKEY_id(key.get()) != EVP_PKEY_ED25519) {
    TVM_FFI_THROW(TvmschedError) << what
                                 << " is not an Ed25519 public key in PEM form (tvmsched keys generate writes one)";
  }
  std::string raw(32, '\0');
  size_t len = raw.size();
  EVP_PKEY_get_raw_public_key(key.get(), reinterpret_cast<unsigned char*>(raw.data()), &len);
  keys_[KeyId(raw)] = raw;
}

TrustedKeys TrustedKeys::FromFiles(const std::vector<std::string>& paths) {
  TrustedKeys keys;
  for (const std::string& path : paths) {
    std::string text = ReadRegularFile(path, "trusted key");
    if (text.size() > 64 * 1024) TVM_FFI_THROW(TvmschedError) << path << " is too large to be a key file";
    keys.AddPem(text, path);
  }
  return keys;
}

std::string TrustedKeys::Verify(const std::string& what, const std::string& signature_json,
                                const std::string& message) const {
  if (signature_json.empty()) {
    TVM_FFI_THROW(TvmschedError) << what << " is not signed; only artifacts signed by a trusted key are loaded here";
  }
  ffi::String error;
  ffi::Any root;
  try {
    CheckJsonDepth(signature_json, "signature.json", kMaxJsonDepth);
    root = ffi::json::Parse(ffi::String(signature_json), &error);
  } catch (const std::invalid_argument&) {
    error = "too deep";
  }
  auto object = error.empty() ? root.try_cast<ffi::Map<ffi::Any, ffi::Any>>() : std::nullopt;
  auto field = [&](const char* key) -> std::string {
    if (!object) return "";
    auto found = object->find(ffi::String(key));
    if (found == object->end()) return "";
    auto s = (*found).second.try_cast<ffi::String>();
    return s ? std::string(*s) : "";
  };
  std::string algorithm = field("algorithm"), key_id = field("key_id"), signature;
  if (algorithm != "ed25519" || !Unhex(field("signature"), &signature) || signature.size() != 64) {
    TVM_FFI_THROW(TvmschedError) << what << " has a malformed signature.json (expected an ed25519 signature in hex)";
  }
  auto key = keys_.find(key_id);
  if (key == keys_.end())
    TVM_FFI_THROW(TvmschedError) << what << " is signed by key " << key_id << ", which is not trusted here";
  PKey pkey(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                        reinterpret_cast<const unsigned char*>(key->second.data()), key->second.size()),
            EVP_PKEY_free);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  bool ok = pkey && ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey.get()) == 1 &&
            EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                             reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  if (!ok) TVM_FFI_THROW(TvmschedError) << what << " has a signature that does not verify (changed after signing)";
  return key_id;
}

}  // namespace tvmsched
