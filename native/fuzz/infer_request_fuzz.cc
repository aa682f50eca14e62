// libFuzzer target: the gRPC front's checks of a ModelInferRequest (native/infer_request_check.h) on any bytes, in
// the order the front takes them: the counts from the wire, protobuf's parse, the checks of the parsed message, and
// the checks against each served model (their config.pbtxt files, named by S2T_FUZZ_CONFIGS, colon-separated). Built
// under AddressSanitizer and UndefinedBehaviorSanitizer: any read past a buffer, overflow or crash is a finding.
// Besides not crashing, each check must refuse with words (a refusal is never an empty reason) of bounded size,
// because the front sends them back to the caller.
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/text_format.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "infer_request_check.h"

namespace {

// A refusal quotes at most a few names from the request, each bounded by the checks' limits.
constexpr size_t kMaxRefusalBytes = 4096;

std::vector<infer_check::ModelDescription>& Models() {
  static std::vector<infer_check::ModelDescription> models;
  return models;
}

void LoadModels() {
  const char* configs = std::getenv("S2T_FUZZ_CONFIGS");
  std::stringstream paths(configs ? configs : "");
  std::string path;
  while (std::getline(paths, path, ':')) {
    if (path.empty()) continue;
    std::ifstream file(path);
    std::stringstream text;
    text << file.rdbuf();
    inference::ModelConfig config;
    if (!file || !google::protobuf::TextFormat::ParseFromString(text.str(), &config)) {
      std::fprintf(stderr, "infer_request_fuzz: cannot read the model config %s\n", path.c_str());
      std::exit(2);
    }
    Models().push_back(infer_check::Describe(config));
  }
  if (Models().empty()) {
    std::fprintf(stderr, "infer_request_fuzz: S2T_FUZZ_CONFIGS names no model config\n");
    std::exit(2);
  }
}

void CheckRefusal(const std::string& refusal) {
  if (refusal.size() > kMaxRefusalBytes) {
    std::fprintf(stderr, "a refusal of %zu bytes: %.200s...\n", refusal.size(), refusal.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs every string field that is not UTF-8 it refuses: most mutations, and most of the run's time
  google::protobuf::SetLogHandler(nullptr);
  LoadModels();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const infer_check::Limits limits;
  const char* bytes = reinterpret_cast<const char*>(data);
  std::string refusal = infer_check::CountRefusal(bytes, size, limits);
  CheckRefusal(refusal);
  if (!refusal.empty()) return 0;
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(bytes, static_cast<int>(size))) return 0;
  refusal = infer_check::RequestRefusal(request, limits);
  CheckRefusal(refusal);
  if (!refusal.empty()) return 0;
  for (const infer_check::ModelDescription& model : Models()) CheckRefusal(infer_check::ModelRefusal(request, model));
  return 0;
}
