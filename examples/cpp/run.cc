// tvmsched_run: one request through the engine, from an .npz of inputs to an .npz of outputs.
//
//   tvmsched_run [--device cpu|cuda] [--trust KEY.pub ...] ARTIFACT IN.npz OUT.npz
//
// With --trust (repeatable), only an artifact signed by one of the keys is loaded (README, "Trust
// model"); the signature is checked before any of the artifact's code is. Without --trust the artifact's
// kernels.so runs unverified (TVMSCHED_REQUIRE_SIGNATURE=1 in the environment refuses that).
// IN.npz holds one array per model input (np.savez(path, input=x)); OUT.npz gets one array per
// model output, keyed by output name (np.load(path)["output"]). Any problem: one `error: ...` line
// on stderr and exit status 2.
#include <tvmsched/engine.h>
#include <tvmsched/npz.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage = "usage: tvmsched_run [--device cpu|cuda] [--trust KEY.pub ...] ARTIFACT IN.npz OUT.npz";

int Fail(const std::string& message) {
  std::string line = message;
  for (char& c : line) c = c == '\n' ? ' ' : c;  // one line, whatever the message
  std::cerr << "error: " << line << std::endl;
  return 2;
}

int Run(int argc, char** argv) {
  std::string device;
  std::vector<std::string> paths, trusted;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage << "\n";
      return 0;
    } else if (arg == "--device" && i + 1 < argc) {
      device = argv[++i];
      if (device != "cpu" && device != "cuda") return Fail("--device must be cpu or cuda, not '" + device + "'");
    } else if (arg.rfind("--device=", 0) == 0) {
      device = arg.substr(9);
      if (device != "cpu" && device != "cuda") return Fail("--device must be cpu or cuda, not '" + device + "'");
    } else if (arg == "--trust" && i + 1 < argc) {
      trusted.push_back(argv[++i]);
    } else if (arg.size() > 1 && arg[0] == '-') {
      return Fail("unknown option " + arg + " (" + kUsage + ")");
    } else {
      paths.push_back(arg);
    }
  }
  if (paths.size() != 3) return Fail(std::string("expected ARTIFACT IN.npz OUT.npz (") + kUsage + ")");
  const std::string &artifact = paths[0], &in_path = paths[1], &out_path = paths[2];

  tvmsched::Model model =
      tvmsched::Model::Load(artifact, device, tvmsched::FlagMemory::kAuto, tvmsched::TrustedKeys::FromFiles(trusted));
  auto inputs = tvmsched::LoadNpz(in_path);
  tvmsched::Stream stream = tvmsched::Stream::Create(model, model->name());
  tvmsched::Request request = stream->Submit(inputs, {});  // checks names, shapes and dtypes first
  request->Wait(-1, 50);
  stream->Close();
  if (!request->error().empty()) return Fail(std::string(request->error()));
  tvmsched::SaveNpz(out_path, request->outputs());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const tvm::ffi::Error& err) {
    return Fail(err.message());
  } catch (const std::exception& err) {
    return Fail(err.what());
  }
}
