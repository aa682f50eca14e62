// s2t_grpc_front: the public gRPC endpoint of the embedded tritonserver, in front of Triton's own on a loopback port.
//
// Triton 2.51's gRPC front end can crash the whole server when a unary call is cancelled while Triton works on it
// (a client that cancels, a deadline that expires, a connection that drops). This front forwards every method as raw
// bytes and never lets Triton see a unary call's cancellation: such a call carries no deadline upstream and is never
// cancelled: when its client goes away it is left to finish and its answer dropped. A stream's cancellation is
// passed on (Triton's stream handler takes it safely). Every upstream call holds one of --max-calls slots until
// Triton answers it, abandoned or not; past that, new calls are refused at once.
//
// Built two ways from this file (native/build_grpc_front.sh):
// - libs2t_grpc_front.so, loaded into tritonserver's own process (by grpc_front_hook.c) once Triton has started, and
//   what `s2t serve` runs: there a ModelInfer is answered through Triton's C API (TRITONSERVER_ServerInferAsync),
//   with no second process, no second gRPC hop and no gRPC front end of Triton's in its path. Requests the C API
//   path does not take (shared memory, typed contents, request parameters, decoupled models) are relayed to Triton's
//   own front end, as are all other methods; a refusal from the C API is answered with Triton's error, as Triton's own
//   front end would answer it. Triton is never told that a caller left.
// - the s2t_grpc_front binary, a process of its own that relays every method, whose port stays open while a new
//   tritonserver starts (`s2t serve --grpc-front-process`):
//
//   s2t_grpc_front --listen 0.0.0.0:8001 --upstream 127.0.0.1:PORT --max-message-bytes N [--max-calls N]
//                  [--threads N] [--drain-seconds S] [--ready-fd FD] [--message-seconds S]
//                  [--stream-idle-seconds S] [--request-parameters NAME,... (custom ones the models read)]
//                  [--relay-only 0|1 (in tritonserver)]
//
// Every ModelInfer request and every ModelStreamInfer message is parsed by protobuf, with the C++ classes protoc makes
// from Triton's own grpc_service.proto (native/proto), and checked (native/infer_request_check.h: counts bounded from
// its tags before it is parsed, then its parameters, datatypes and shapes, then, inside tritonserver, what its model
// declares) before Triton sees it. A request that fails is refused INVALID_ARGUMENT naming the field; a stream whose
// message fails ends INVALID_ARGUMENT once the answers to the messages before it have come back. What is relayed is
// the message protobuf read, written again: bytes no parser would read the same way never reach Triton.
//
// Each thread owns one completion queue; a call and its upstream call live on the same queue, so a relayed call's
// state is only ever touched by one thread and needs no lock (a call answered in process is finished from Triton's
// thread, when nothing else of it runs but its done tag). All threads share one upstream channel (one connection to
// Triton): once it has answered one call, it answers the next without a new connection. One thread by default: the
// front's cost is mostly its sockets' system calls and the switches between threads, and on two cores one thread
// spent less CPU per request than two (measured beside tritonserver and perf_analyzer at 16 connections).

#include <absl/synchronization/mutex.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpcpp/alarm.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/arena.h>
#include <google/protobuf/stubs/logging.h>

#include <mutex>
#include <unordered_map>

#include "front_options.h"
#include "grpc_service.pb.h"
#include "infer_request_check.h"
#include "triton_c_api.h"

#ifdef S2T_IN_TRITONSERVER
#include <google/protobuf/util/json_util.h>

// The parts of Triton's C API (server 2.51) the front uses beyond triton_c_api.h's.
extern "C" {
TRITONSERVER_Error* TRITONSERVER_ServerModelConfig(TRITONSERVER_Server* server, const char* model_name,
                                                   const int64_t model_version, const uint32_t config_version,
                                                   TRITONSERVER_Message** model_config);
}
#endif

namespace {

constexpr const char* kName = "s2t_grpc_front";
// Requests posted per queue for new calls: a burst of new calls is taken without waiting for a re-post.
constexpr int kAcceptsPerQueue = 16;
// Methods answered with one message: relayed as one call upstream. Everything else (ModelStreamInfer, methods this
// proxy does not know) is relayed as a stream, which is right for any kind of method on the wire.
// Objects the worker threads use are never destroyed (here and below): in tritonserver's process those threads may
// still run while the process exits.
const std::set<std::string>& kUnaryMethods = *new std::set<std::string>{
    "/inference.GRPCInferenceService/ServerLive",
    "/inference.GRPCInferenceService/ServerReady",
    "/inference.GRPCInferenceService/ModelReady",
    "/inference.GRPCInferenceService/ServerMetadata",
    "/inference.GRPCInferenceService/ModelMetadata",
    "/inference.GRPCInferenceService/ModelInfer",
    "/inference.GRPCInferenceService/ModelConfig",
    "/inference.GRPCInferenceService/ModelStatistics",
    "/inference.GRPCInferenceService/RepositoryIndex",
    "/inference.GRPCInferenceService/RepositoryModelLoad",
    "/inference.GRPCInferenceService/RepositoryModelUnload",
    "/inference.GRPCInferenceService/SystemSharedMemoryStatus",
    "/inference.GRPCInferenceService/SystemSharedMemoryRegister",
    "/inference.GRPCInferenceService/SystemSharedMemoryUnregister",
    "/inference.GRPCInferenceService/CudaSharedMemoryStatus",
    "/inference.GRPCInferenceService/CudaSharedMemoryRegister",
    "/inference.GRPCInferenceService/CudaSharedMemoryUnregister",
    "/inference.GRPCInferenceService/TraceSetting",
    "/inference.GRPCInferenceService/LogSettings",
    "/grpc.health.v1.Health/Check",
};
// Health and readiness: what an orchestrator's probes call (Slots: answered for a new address whatever others hold).
const std::set<std::string>& kProbeMethods = *new std::set<std::string>{
    "/grpc.health.v1.Health/Check",
    "/inference.GRPCInferenceService/ServerLive",
    "/inference.GRPCInferenceService/ServerReady",
    "/inference.GRPCInferenceService/ModelReady",
};

struct Options : front_options::Common {
  long max_calls = 1024;
  long max_message_bytes = 0;  // 0: required
  long ready_fd = -1;
  long message_seconds = 10;  // a call whose first message has not come by then is ended
  long stream_idle_seconds = 60;  // a stream with no message either way for that long is ended
  // TLS on the public port (PEM files; none: plaintext), as Triton's --grpc-use-ssl, --grpc-server-cert,
  // --grpc-server-key and, for --grpc-use-ssl-mutual, --grpc-root-cert: clients must then show a certificate it
  // signed. Triton's own endpoint behind the front is on loopback and stays plaintext.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
};

void Log(const char* format, ...) __attribute__((format(printf, 1, 2)));
void Log(const char* format, ...) {
  char line[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(line, sizeof line, format, args);
  va_end(args);
  fprintf(stderr, "%s: %s\n", kName, line);
  fflush(stderr);
}

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
}

// The address a peer connects from, without its port ("ipv4:10.0.0.7:41234" -> "ipv4:10.0.0.7"; gRPC names IPv6
// peers "ipv6:%5B::1%5D:5" -> "ipv6:[::1]", and an IPv4 caller of a dual-stack port "ipv6:%5B::ffff:10.0.0.7%5D:5"
// -> "ipv4:10.0.0.7"): a client's shares are counted by where it connects from, since it may open as many
// connections as it likes.
std::string PeerAddress(const std::string& peer) {
  std::string address;
  for (size_t i = 0; i < peer.size(); ++i) {
    if (peer.compare(i, 3, "%5B") == 0 || peer.compare(i, 3, "%5D") == 0) {
      address.push_back(peer[i + 2] == 'B' ? '[' : ']');
      i += 2;
    } else {
      address.push_back(peer[i]);
    }
  }
  const size_t colon = address.rfind(':');
  if (colon != std::string::npos && colon + 1 < address.size() &&
      address.find_first_not_of("0123456789", colon + 1) == std::string::npos)
    address.resize(colon);
  const std::string mapped = "ipv6:[::ffff:";
  if (address.rfind(mapped, 0) == 0 && address.back() == ']' && address.find('.') != std::string::npos)
    address = "ipv4:" + address.substr(mapped.size(), address.size() - mapped.size() - 1);
  return address;
}

// This machine's own callers: `s2t gateway` and the OpenAI API beside the server carry many users' calls on their
// own admission, and whoever connects from loopback already runs here.
bool IsLocalHost(const std::string& address) {
  return address == "ipv4:127.0.0.1" || address == "ipv6:[::1]" || address.rfind("unix:", 0) == 0;
}

// Upstream calls in flight, abandoned ones included: a slot is taken when a call is accepted and given back when
// Triton has answered it (or when it never reached Triton). Shares, so that one client opening calls it never sends
// (or streams it keeps open) leaves the rest to others:
// - one connection holds at most a quarter of the slots (or 16, where that is more: a small pool is not split into
//   shares too small to use);
// - one address as much, whatever number of connections it opens; this machine's own callers (IsLocalHost) all but
//   the reserve;
// - an eighth of the slots is a reserve that only an address holding fewer than a few calls draws on: however many
//   others hold, a new address is answered;
// - with `probes_always`, a health or readiness call from an address that holds none of these slots is taken even
//   past the limit: an orchestrator's probe is answered whatever others hold (one call per address over the limit).
// Counts live only while a connection or an address holds a call.
class Slots {
 public:
  Slots(long max, bool probes_always)
      : max_(max),
        share_(std::max(max / 4, std::min(max, 16L))),
        reserve_(max / 8),
        reserve_per_address_(std::max(1L, reserve_ / 16)),
        probes_always_(probes_always) {}

  enum Taken { kTaken, kFull, kConnectionFull, kAddressFull };
  Taken Take(const std::string& connection, const std::string& address, bool probe) {
    std::lock_guard<std::mutex> lock(mu_);
    auto by_address = addresses_.find(address);
    const long held_by_address = by_address == addresses_.end() ? 0 : by_address->second;
    const bool local = IsLocalHost(address);
    if (!(probe && probes_always_ && held_by_address == 0)) {
      if (held_ >= max_) return kFull;
      auto by_connection = connections_.find(connection);
      if (by_connection != connections_.end() && by_connection->second >= share_) return kConnectionFull;
      if (held_by_address >= (local ? max_ - reserve_ : share_)) return kAddressFull;
      if (held_ >= max_ - reserve_ && held_by_address >= reserve_per_address_) return kFull;
    }
    ++connections_[connection];
    ++addresses_[address];
    ++held_;
    return kTaken;
  }
  void Give(const std::string& connection, const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    --held_;
    for (auto* counts : {&connections_, &addresses_}) {
      auto it = counts->find(counts == &connections_ ? connection : address);
      if (it != counts->end() && --it->second <= 0) counts->erase(it);
    }
  }
  long held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  long max() const { return max_; }
  long share() const { return share_; }

 private:
  const long max_, share_, reserve_, reserve_per_address_;
  const bool probes_always_;
  std::mutex mu_;
  long held_ = 0;
  std::unordered_map<std::string, long> connections_, addresses_;
};

// Refusals are logged at most once a second (a flood of refused calls must not become a flood of log lines); the
// first refusal after a quiet second is logged at once.
class RefusalLog {
 public:
  void Refused(long held) {
    count_.fetch_add(1, std::memory_order_relaxed);
    double now = Now();
    double last = last_.load(std::memory_order_relaxed);
    if (now - last < 1.0 || !last_.compare_exchange_strong(last, now)) return;
    Flush(held);
  }
  void Flush(long held) {
    long count = count_.exchange(0);
    if (count > 0)
      Log("refused %ld call(s): %ld calls to tritonserver in flight, the most --max-calls allows", count, held);
  }

 private:
  std::atomic<long> count_{0};
  std::atomic<double> last_{-1e9};
};

Options g_options;
// Set in tritonserver's process (unless its gRPC inference is restricted): ModelInfer answered through the C API.
TRITONSERVER_Server* g_server = nullptr;
#ifdef S2T_IN_TRITONSERVER
TRITONSERVER_ResponseAllocator* g_allocator = nullptr;  // outputs in plain CPU memory, freed with the response
#endif
const char* const kModelInfer = "/inference.GRPCInferenceService/ModelInfer";
const char* const kModelStreamInfer = "/inference.GRPCInferenceService/ModelStreamInfer";
// Set once from the options, before the first call.
infer_check::Limits g_limits;
// Inference calls (ModelInfer, ModelStreamInfer, methods the front does not know) and the others (health, metadata,
// readiness, configuration, statistics, the repository, shared memory, trace and log settings) draw on separate
// slots: inference load never refuses a readiness or metadata call.
Slots* g_slots = nullptr;
Slots* g_control_slots = nullptr;
long CallsHeld() { return g_slots->held() + g_control_slots->held(); }
// Accepted calls whose state still exists: while one does, it may start an operation on its queue (its upstream call
// ends after its client's did), so the queues are not shut.
std::atomic<long> g_live_calls{0};
RefusalLog g_refusals;
grpc::AsyncGenericService& g_service = *new grpc::AsyncGenericService;
std::atomic<bool> g_stopping{false};

// Metadata a proxy may pass on: what the application sent, not what the transport sets for each hop (pseudo-headers,
// grpc-*, user-agent, content-type, te), and only what gRPC would accept to send (an invalid key or value would fail
// the whole call batch).
bool Forwardable(grpc::string_ref key, grpc::string_ref value) {
  if (key.empty() || key.data()[0] == ':' || key.starts_with("grpc-")) return false;
  static const char* const kHopHeaders[] = {"user-agent", "content-type", "te", "host", "content-length"};
  for (const char* hop : kHopHeaders)
    if (key == hop) return false;
  grpc_slice key_slice = grpc_slice_from_static_buffer(key.data(), key.size());
  if (!grpc_header_key_is_legal(key_slice)) return false;
  if (grpc_is_binary_header(key_slice)) return true;
  return grpc_header_nonbin_value_is_legal(grpc_slice_from_static_buffer(value.data(), value.size()));
}

std::string Str(grpc::string_ref s) { return std::string(s.data(), s.size()); }

// What protobuf says of a message it refuses (which string field is not UTF-8, say): kept for the refusal, and never
// logged (a flood of bad requests must not become a flood of log lines).
thread_local std::string t_protobuf_said;
void KeepProtobufMessage(google::protobuf::LogLevel, const char*, int, const std::string& message) {
  t_protobuf_said = message;
}

// An arena whose first block is the caller's: a message that fits costs the arena no allocation of its own.
google::protobuf::ArenaOptions FirstBlock(char* block, size_t size) {
  google::protobuf::ArenaOptions options;
  options.initial_block = block;
  options.initial_block_size = size;
  return options;
}

// A ModelInferRequest as protobuf read it, its parts in an arena that lives as long as Triton may read them.
struct ParsedRequest {
  alignas(8) char block[4096];
  google::protobuf::Arena arena{FirstBlock(block, sizeof block)};
  inference::ModelInferRequest* message =
      google::protobuf::Arena::CreateMessage<inference::ModelInferRequest>(&arena);
};

// "" with `parsed` filled, or why the message is refused: its counts from its tags first, so that protobuf never
// builds a message of a million parts; then protobuf's parse; then what holds for any model.
std::string ReadInferRequest(const grpc::ByteBuffer& buffer, ParsedRequest* parsed) {
  grpc::Slice slice;
  if (!buffer.DumpToSingleSlice(&slice).ok()) return "ModelInferRequest: no message";
  const char* data = reinterpret_cast<const char*>(slice.begin());
  std::string refusal = infer_check::CountRefusal(data, slice.size(), g_limits);
  if (!refusal.empty()) return refusal;
  t_protobuf_said.clear();
  if (!parsed->message->ParseFromArray(data, static_cast<int>(slice.size())))
    return "ModelInferRequest: not a message protobuf can parse" +
           (t_protobuf_said.empty() ? std::string() : " (" + t_protobuf_said + ")");
  return infer_check::RequestRefusal(*parsed->message, g_limits);
}

grpc::ByteBuffer Serialized(const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  grpc::Slice slice(grpc_slice_malloc(size), grpc::Slice::STEAL_REF);
  message.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(slice.begin()));
  return grpc::ByteBuffer(&slice, 1);
}

#ifdef S2T_IN_TRITONSERVER
// A model version as Triton's front end reads it (std::stol): empty is the latest (-1); false where Triton refuses it.
bool ParseVersion(const std::string& text, int64_t* version) {
  if (text.empty()) {
    *version = -1;
    return true;
  }
  errno = 0;
  char* end = nullptr;
  long value = strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || errno == ERANGE || value < 0) return false;
  *version = value;
  return true;
}

// Calls into Triton's C API from the front's threads, against Triton's end: once Triton's stop has returned, its
// server may be deleted at any moment, so no call starts after the front's end, and the end waits (bounded) for those
// under way. A call that comes later is relayed, and Triton's closed endpoint refuses it.
class TritonGate {
 public:
  bool Enter() {
    inside_.fetch_add(1);
    if (!closed_.load()) return true;
    inside_.fetch_sub(1);
    return false;
  }
  void Leave() { inside_.fetch_sub(1); }
  void Close(double seconds) {
    closed_ = true;
    const double deadline = Now() + seconds;
    while (inside_.load() > 0 && Now() < deadline) usleep(1000);
  }

 private:
  std::atomic<int> inside_{0};
  std::atomic<bool> closed_{false};
};
TritonGate& g_gate = *new TritonGate;

// Each model's description from its configuration as Triton holds it (TRITONSERVER_ServerModelConfig), kept for a
// second: a model loaded again with another configuration is seen within a second. Until then a request is checked
// against the old description: one the new model takes may be refused here, one it does not is refused by Triton's
// own checks, which see the new model. Those checks miss one thing: a classification of a BYTES output, which ends
// tritonserver; a request that asks for a classification is checked against a description read for it alone. The
// race left (a reload completing between that read and Triton's own look-up of the model, microseconds) is Triton's.
// Entries are keyed by the model's name and version as numbers Triton reads, and only for models Triton has: a
// caller cannot grow the cache beyond the models loaded (and it is emptied past kMaxEntries).
class ModelDescriptions {
 public:
  using Description = std::shared_ptr<const infer_check::ModelDescription>;

  // nullptr where Triton has no such model ready: Triton refuses the request in its own words.
  Description Get(const std::string& name, int64_t version, bool fresh) {
    std::string key = name;
    key.push_back('\0');
    key += std::to_string(version);
    const double now = Now();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (!fresh && it != entries_.end() && now - it->second.read_at < kFreshSeconds) return it->second.model;
    bool found = false;
    Description model = Read(name, version, &found);
    if (!found) {
      if (it != entries_.end()) entries_.erase(it);
      return nullptr;
    }
    if (entries_.size() >= kMaxEntries) entries_.clear();
    entries_[key] = Entry{model, now};  // nullptr where its configuration could not be read: unchecked
    return model;
  }

 private:
  static constexpr double kFreshSeconds = 1.0;
  static constexpr size_t kMaxEntries = 4096;
  struct Entry {
    Description model;
    double read_at;
  };

  static Description Read(const std::string& name, int64_t version, bool* found) {
    TRITONSERVER_Message* message = nullptr;
    TRITONSERVER_Error* error = TRITONSERVER_ServerModelConfig(g_server, name.c_str(), version, 1, &message);
    if (error != nullptr) {
      TRITONSERVER_ErrorDelete(error);
      return nullptr;
    }
    *found = true;
    const char* json = nullptr;
    size_t size = 0;
    Description model;
    error = TRITONSERVER_MessageSerializeToJson(message, &json, &size);
    if (error == nullptr) {
      inference::ModelConfig config;
      google::protobuf::util::JsonParseOptions options;
      options.ignore_unknown_fields = true;
      auto status = google::protobuf::util::JsonStringToMessage(std::string(json, size), &config, options);
      if (status.ok())
        model = std::make_shared<const infer_check::ModelDescription>(infer_check::Describe(config));
      else
        Log("the configuration of model '%s' could not be read (%s): its requests go to Triton unchecked",
            name.c_str(), status.ToString().c_str());
    } else {
      TRITONSERVER_ErrorDelete(error);
    }
    TRITONSERVER_MessageDelete(message);
    return model;
  }

  std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
};
ModelDescriptions& g_models = *new ModelDescriptions;

// What the model a request names refuses of it (infer_request_check.h's ModelRefusal); "" where Triton has no such
// model, or cannot read its version: Triton refuses those in its own words.
std::string ModelRefusalFor(const inference::ModelInferRequest& request) {
  int64_t version;
  if (!ParseVersion(request.model_version(), &version)) return "";
  bool classification = false;
  for (const auto& output : request.outputs()) classification |= output.parameters().count("classification") > 0;
  auto model = g_models.Get(request.model_name(), version, classification);
  return model != nullptr ? infer_check::ModelRefusal(request, *model) : "";
}

// Whether Triton's stream handler takes `request` as a decoupled model's: a model it has, of a version it reads,
// whose transaction policy is decoupled. Any other (a model it does not have included) is answered by its other path.
bool StreamedAsDecoupled(const inference::ModelInferRequest& request) {
  int64_t version;
  if (!ParseVersion(request.model_version(), &version)) return false;
  uint32_t txn = 0;
  TRITONSERVER_Error* error =
      TRITONSERVER_ServerModelTransactionProperties(g_server, request.model_name().c_str(), version, &txn, nullptr);
  if (error == nullptr) return (txn & TRITONSERVER_TXN_DECOUPLED) != 0;
  TRITONSERVER_ErrorDelete(error);
  return false;
}
#endif

class Worker;

enum Op {
  kAccept, kDownRead, kDownWrite, kDownFinish, kDownDone, kUpStart, kUpRead, kUpWrite, kUpWritesDone, kUpFinish,
  kTriton, kAlarm, kOps
};

class Relay;

struct Tag {
  Relay* relay;
  Op op;
};

class Worker {
 public:
  Worker(std::unique_ptr<grpc::ServerCompletionQueue> cq, grpc::GenericStub* stub) : cq_(std::move(cq)), stub_(stub) {}
  void Run();
  grpc::ServerCompletionQueue* cq() { return cq_.get(); }
  grpc::GenericStub& stub() { return *stub_; }

 private:
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  grpc::GenericStub* stub_;
};

// One client call and its upstream call. Lives until both have ended and no operation of either is pending.
class Relay {
 public:
  explicit Relay(Worker* worker) : worker_(worker), down_(&server_context_) {
    for (int op = 0; op < kOps; ++op) tags_[op] = Tag{this, static_cast<Op>(op)};
    // Told when the client's call ends, finished or cancelled: a stream's cancellation goes upstream (below).
    server_context_.AsyncNotifyWhenDone(Start(kDownDone));
    Start(kAccept);
    g_service.RequestCall(&server_context_, &down_, worker_->cq(), worker_->cq(), &tags_[kAccept]);
  }

  void Done(Op op, bool ok) {
    switch (op) {
      case kAccept: Accepted(ok); break;
      case kDownRead: unary_ ? UnaryRequestRead(ok) : StreamClientRead(ok); break;
      case kDownWrite: StreamClientWritten(ok); break;
      case kDownFinish: down_finished_ = true; break;
      case kDownDone: ClientCallDone(); break;
      case kUpStart: StreamUpstreamStarted(ok); break;
      case kUpRead: StreamUpstreamRead(ok); break;
      case kUpWrite: StreamUpstreamWritten(ok); break;
      case kUpWritesDone: up_write_pending_ = false; MaybeFinishUpstream(); break;
      case kUpFinish: UpstreamFinished(); break;
      case kAlarm: FirstMessageAlarm(ok); break;
      case kTriton: case kOps: break;
    }
    Unpend();
  }

 private:
  ~Relay() {
    if (holds_slot_) slots_->Give(peer_, address_);
    if (accepted_) g_live_calls.fetch_sub(1);
  }

  void* Start(Op op) {
    pending_.fetch_add(1, std::memory_order_relaxed);
    return &tags_[op];
  }

  // The last of the call's pending operations to end deletes it. A call never accepted (the server shutting down)
  // keeps its done tag: it goes with the process.
  void Unpend() {
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1 && down_finished_.load(std::memory_order_acquire))
      delete this;
  }

  void Accepted(bool ok) {
    if (!ok) {  // the server is shutting down
      down_finished_ = true;
      return;
    }
    if (!g_stopping.load()) new Relay(worker_);
    accepted_ = true;
    g_live_calls.fetch_add(1);
    unary_ = kUnaryMethods.count(server_context_.method()) > 0;
    checked_stream_ = server_context_.method() == kModelStreamInfer;
    if (checked_stream_ && server_context_.client_metadata().count("triton_grpc_error") > 0) {
      // In that mode tritonserver 2.51 frees a stream's state at its first error while its other requests are in
      // flight, and their answers then write to freed memory.
      FinishClient(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "metadata 'triton_grpc_error': not taken here (tritonserver 2.51 crashes in that "
                                "mode); each request's error comes in its own answer on the stream"));
      return;
    }
    slots_ = unary_ && server_context_.method() != kModelInfer ? g_control_slots : g_slots;
    peer_ = server_context_.peer();
    address_ = PeerAddress(peer_);
    Slots::Taken taken = slots_->Take(peer_, address_, kProbeMethods.count(server_context_.method()) > 0);
    if (taken != Slots::kTaken) {
      g_refusals.Refused(slots_->held());
      std::string why;
      if (taken == Slots::kFull)
        why = "the gRPC front of tritonserver holds " + std::to_string(slots_->held()) + " calls to it, its limit";
      else
        why = std::string(taken == Slots::kConnectionFull ? "this connection" : "the address it connects from") +
              " holds its share of the gRPC front's " + std::to_string(slots_->max()) + " calls to tritonserver";
      FinishClient(grpc::Status(grpc::StatusCode::UNAVAILABLE, why + "; try again"));
      return;
    }
    holds_slot_ = true;
    // A call whose first message does not come in time is ended: it would hold its slot for nothing. On a stream the
    // same alarm then bounds the quiet between messages (StreamAlarm).
    last_message_at_ = Now();
    alarm_armed_ = true;
    alarm_.Set(worker_->cq(), std::chrono::system_clock::now() + std::chrono::seconds(g_options.message_seconds),
               Start(kAlarm));
    if (unary_) {
      down_.Read(&in_, Start(kDownRead));
      return;
    }
    PrepareUpstreamContext();
    up_stream_ = worker_->stub().PrepareCall(&client_context_, server_context_.method(), worker_->cq());
    up_stream_->StartCall(Start(kUpStart));
    PumpClientToUpstream();
  }

  void PrepareUpstreamContext() {
    // No deadline: the call is never cut on the client's behalf.
    for (const auto& [key, value] : server_context_.client_metadata())
      if (Forwardable(key, value)) client_context_.AddMetadata(Str(key), Str(value));
  }

  void ReleaseSlot() {
    if (holds_slot_) slots_->Give(peer_, address_);
    holds_slot_ = false;
  }

  void FirstMessageAlarm(bool ok) {
    alarm_armed_ = false;
    if (!ok || client_call_done_) return;
    if (!first_message_) {
      server_context_.TryCancel();  // the pending read ends, and the call with it
      return;
    }
    if (unary_) return;
    // A stream quiet both ways for --stream-idle-seconds is ended: an open stream holds its slot until it ends, and
    // keepalive pings keep a silent one open for good.
    const double quiet_until = last_message_at_ + static_cast<double>(g_options.stream_idle_seconds);
    if (Now() >= quiet_until) {
      server_context_.TryCancel();
      return;
    }
    alarm_armed_ = true;
    alarm_.Set(worker_->cq(),
               std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<long>((quiet_until - Now()) * 1000) + 1),
               Start(kAlarm));
  }

  void FirstMessageCame() {
    last_message_at_ = Now();
    if (first_message_) return;
    first_message_ = true;
    // A stream keeps its alarm, which then bounds its quiet; a unary call has nothing more to wait for.
    if (unary_) {
      alarm_.Cancel();
      return;
    }
  }

  void CopyUpstreamInitialMetadata() {
    if (initial_metadata_sent_) return;
    initial_metadata_sent_ = true;
    for (const auto& [key, value] : client_context_.GetServerInitialMetadata())
      if (Forwardable(key, value)) server_context_.AddInitialMetadata(Str(key), Str(value));
  }

  void FinishClient(const grpc::Status& status) {
    down_finish_requested_ = true;
    down_.Finish(status, Start(kDownFinish));
  }

  // ---- unary: read the one request, send it upstream, answer with what Triton answered.

  void UnaryRequestRead(bool ok) {
    FirstMessageCame();
    if (!ok) {  // gone before sending its request, or the request was over the size limit
      ReleaseSlot();
      FinishClient(grpc::Status(grpc::StatusCode::INTERNAL, "No message returned for unary request"));
      return;
    }
    if (server_context_.method() == kModelInfer && ModelInferAnswered()) return;
    PrepareUpstreamContext();
    up_unary_ = worker_->stub().PrepareUnaryCall(&client_context_, server_context_.method(), in_, worker_->cq());
    in_.Clear();
    up_unary_->StartCall();
    up_unary_->Finish(&out_, &status_, Start(kUpFinish));
  }

  // A ModelInfer read, checked and answered here (refused, or through Triton's C API inside tritonserver); false
  // when it is to be relayed, and then `in_` holds the message protobuf read, written again.
  bool ModelInferAnswered() {
    auto parsed = std::make_unique<ParsedRequest>();
    std::string refusal = ReadInferRequest(in_, parsed.get());
#ifdef S2T_IN_TRITONSERVER
    if (refusal.empty() && g_server != nullptr && g_gate.Enter()) {
      refusal = ModelRefusalFor(*parsed->message);
      bool answered = refusal.empty() && InferInProcess(parsed);
      g_gate.Leave();
      if (answered) return true;
    }
#endif
    if (!refusal.empty()) {
      ReleaseSlot();
      FinishClient(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, refusal));
      return true;
    }
    in_ = Serialized(*parsed->message);
    return false;
  }

#ifdef S2T_IN_TRITONSERVER
  // ---- ModelInfer through Triton's C API. Triton is never told of a client that goes away: its answer is dropped.

  // Whether the C API path takes `r` as Triton's own front end would read it. Request parameters (but
  // triton_enable_empty_final_response, which Triton reads only for decoupled models' streams), input and output
  // parameters (shared memory, classification) and typed contents are Triton's front end's to apply.
  static bool Takes(const inference::ModelInferRequest& r, int64_t* version) {
    for (const auto& [key, value] : r.parameters())
      if (key != "triton_enable_empty_final_response") return false;
    for (const auto& input : r.inputs())
      if (input.parameters_size() > 0 || input.has_contents()) return false;
    for (const auto& output : r.outputs())
      if (output.parameters_size() > 0) return false;
    return !r.model_name().empty() && r.raw_input_contents_size() == r.inputs_size() &&
           ParseVersion(r.model_version(), version);
  }

  // True when the request went to Triton, or Triton refused it (answered with Triton's error, as its own front end
  // answers it: a refusal such as a full queue is not tried a second time through Triton's endpoint). False when it
  // is one for Triton's own front end: what Takes does not take, and a decoupled model's (refused there in its words).
  bool InferInProcess(std::unique_ptr<ParsedRequest>& parsed) {
    const inference::ModelInferRequest& r = *parsed->message;
    int64_t version;
    if (!Takes(r, &version)) return false;
    uint32_t txn = 0;
    TRITONSERVER_InferenceRequest* request = nullptr;
    TRITONSERVER_Error* error =
        TRITONSERVER_ServerModelTransactionProperties(g_server, r.model_name().c_str(), version, &txn, nullptr);
    if (error == nullptr && (txn & TRITONSERVER_TXN_DECOUPLED)) return false;
    if (error == nullptr)
      error = TRITONSERVER_InferenceRequestNew(&request, g_server, r.model_name().c_str(), version);
    if (error == nullptr && !r.id().empty()) error = TRITONSERVER_InferenceRequestSetId(request, r.id().c_str());
    for (int i = 0; error == nullptr && i < r.inputs_size(); ++i) {
      const auto& input = r.inputs(i);
      error = TRITONSERVER_InferenceRequestAddInput(request, input.name().c_str(),
                                                    TRITONSERVER_StringToDataType(input.datatype().c_str()),
                                                    input.shape().data(), input.shape_size());
      if (error == nullptr)
        error = TRITONSERVER_InferenceRequestAppendInputData(request, input.name().c_str(),
                                                             r.raw_input_contents(i).data(),
                                                             r.raw_input_contents(i).size(), TRITONSERVER_MEMORY_CPU, 0);
    }
    for (int i = 0; error == nullptr && i < r.outputs_size(); ++i)
      error = TRITONSERVER_InferenceRequestAddRequestedOutput(request, r.outputs(i).name().c_str());
    if (error == nullptr) error = TRITONSERVER_InferenceRequestSetReleaseCallback(request, Released, parsed.get());
    if (error == nullptr)
      error = TRITONSERVER_InferenceRequestSetResponseCallback(request, g_allocator, nullptr, Answered, this);
    if (error == nullptr) {
      Start(kTriton);
      error = TRITONSERVER_ServerInferAsync(g_server, request, nullptr);
      if (error != nullptr) pending_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (error == nullptr) {
      parsed.release();  // Triton's until it releases the request
      return true;
    }
    if (request != nullptr) TRITONSERVER_InferenceRequestDelete(request);
    ReleaseSlot();
    FinishClient(ErrorStatus(error));
    return true;
  }

  static void Released(TRITONSERVER_InferenceRequest* request, const uint32_t, void* userp) {
    TRITONSERVER_InferenceRequestDelete(request);
    delete static_cast<ParsedRequest*>(userp);
  }

  // On Triton's thread (or, for an answer Triton has at once, inside ServerInferAsync on the queue's). Nothing else
  // touches the call's state meanwhile: its other pending operations (its done tag, the read that brought the
  // request) only count down.
  static void Answered(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
    auto* relay = static_cast<Relay*>(userp);
    if (response != nullptr) {
      if (!relay->answered_)
        relay->TakeAnswer(response);
      else  // a second response: the model was loaded again as a decoupled one after the check above
        relay->status_ = grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                      "ModelInfer RPC doesn't support models with decoupled transaction policy");
      TRITONSERVER_InferenceResponseDelete(response);
    }
    if (!(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)) return;
    if (!relay->answered_) relay->status_ = grpc::Status(grpc::StatusCode::INTERNAL, "tritonserver sent no response");
    relay->ReleaseSlot();
    relay->down_finish_requested_ = true;
    if (relay->status_.ok())
      relay->down_.WriteAndFinish(relay->out_, grpc::WriteOptions(), relay->status_, relay->Start(kDownFinish));
    else
      relay->down_.Finish(relay->status_, relay->Start(kDownFinish));
    relay->Unpend();  // kTriton
  }

  void TakeAnswer(TRITONSERVER_InferenceResponse* response) {
    answered_ = true;
    TRITONSERVER_Error* error = TRITONSERVER_InferenceResponseError(response);
    if (error != nullptr) {
      status_ = ErrorStatus(error);
      return;
    }
    const char* model_name = "";
    int64_t model_version = -1;
    const char* id = "";
    uint32_t count = 0;
    alignas(8) char block[4096];
    google::protobuf::Arena arena(FirstBlock(block, sizeof block));
    auto* answer = google::protobuf::Arena::CreateMessage<inference::ModelInferResponse>(&arena);
    error = TRITONSERVER_InferenceResponseModel(response, &model_name, &model_version);
    if (error == nullptr) error = TRITONSERVER_InferenceResponseId(response, &id);
    if (error == nullptr) {
      answer->set_model_name(model_name);
      answer->set_model_version(std::to_string(model_version));
      answer->set_id(id);
      error = TRITONSERVER_InferenceResponseParameterCount(response, &count);
    }
    for (uint32_t i = 0; error == nullptr && i < count; ++i) {
      const char* name;
      TRITONSERVER_ParameterType type;
      const void* value;
      error = TRITONSERVER_InferenceResponseParameter(response, i, &name, &type, &value);
      if (error != nullptr) break;
      inference::InferParameter& parameter = (*answer->mutable_parameters())[name];
      switch (type) {
        case TRITONSERVER_PARAMETER_BOOL: parameter.set_bool_param(*static_cast<const bool*>(value)); break;
        case TRITONSERVER_PARAMETER_INT: parameter.set_int64_param(*static_cast<const int64_t*>(value)); break;
        case TRITONSERVER_PARAMETER_STRING: parameter.set_string_param(static_cast<const char*>(value)); break;
        case TRITONSERVER_PARAMETER_DOUBLE: parameter.set_double_param(*static_cast<const double*>(value)); break;
        default:  // as Triton's own front end answers it
          error = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                        "Response parameter of type 'TRITONSERVER_PARAMETER_BYTES' is not currently "
                                        "supported");
      }
    }
    if (error == nullptr) error = TRITONSERVER_InferenceResponseOutputCount(response, &count);
    for (uint32_t i = 0; error == nullptr && i < count; ++i) {
      const char* name;
      TRITONSERVER_DataType datatype;
      const int64_t* shape;
      uint64_t dims;
      const void* base;
      size_t size;
      TRITONSERVER_MemoryType memory_type;
      int64_t memory_type_id;
      void* userp;
      error = TRITONSERVER_InferenceResponseOutput(response, i, &name, &datatype, &shape, &dims, &base, &size,
                                                   &memory_type, &memory_type_id, &userp);
      if (error != nullptr) break;
      auto* output = answer->add_outputs();
      output->set_name(name);
      output->set_datatype(TRITONSERVER_DataTypeString(datatype));
      for (uint64_t d = 0; d < dims; ++d) output->add_shape(shape[d]);
      answer->add_raw_output_contents()->assign(static_cast<const char*>(base), size);
    }
    if (error != nullptr) {
      status_ = ErrorStatus(error);
      return;
    }
    out_ = Serialized(*answer);
  }

  static grpc::Status ErrorStatus(TRITONSERVER_Error* error) {
    static const grpc::StatusCode kCodes[] = {
        grpc::StatusCode::UNKNOWN, grpc::StatusCode::INTERNAL, grpc::StatusCode::NOT_FOUND,
        grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::UNIMPLEMENTED,
        grpc::StatusCode::ALREADY_EXISTS, grpc::StatusCode::CANCELLED};
    int code = TRITONSERVER_ErrorCode(error);
    grpc::Status status(code >= 0 && code < 8 ? kCodes[code] : grpc::StatusCode::UNKNOWN,
                        TRITONSERVER_ErrorMessage(error));
    TRITONSERVER_ErrorDelete(error);
    return status;
  }

#endif

  // ---- streams: one message in flight each way. A client's half-close half-closes the upstream call; a client that
  // cancels or goes away cancels it: Triton 2.51 takes a stream's cancellation on the stream handler's one thread,
  // where nothing races (the crash is the unary handler's), and a decoupled model (llm) stops generating for it.

  void ClientCallDone() {
    client_call_done_ = true;
    // The call's state goes once its tags are back: its alarm need not wait for its time.
    if (alarm_armed_) alarm_.Cancel();
    if (!unary_ && up_stream_ != nullptr && !up_finished_ && server_context_.IsCancelled()) client_context_.TryCancel();
  }

  void PumpClientToUpstream() {
    if (!down_read_pending_ && !in_ready_ && !up_write_pending_ && !client_done_ && !up_dead_ &&
        !down_finish_requested_) {
      down_read_pending_ = true;
      down_.Read(&in_, Start(kDownRead));
    }
    if (!up_started_ || up_dead_ || up_write_pending_) return;
    if (in_ready_) {
      in_ready_ = false;
      up_write_pending_ = true;
      up_stream_->Write(in_, Start(kUpWrite));
      in_.Clear();
    } else if (client_done_ && !up_writes_done_) {
      up_writes_done_ = up_write_pending_ = true;
      up_stream_->WritesDone(Start(kUpWritesDone));
    }
  }

  void PumpUpstreamToClient() {
    if (up_started_ && !up_read_pending_ && !up_read_ended_ && !down_write_pending_) {
      up_read_pending_ = true;
      up_stream_->Read(&out_, Start(kUpRead));
    }
  }

  void StreamClientRead(bool ok) {
    down_read_pending_ = false;
    FirstMessageCame();
    if (!ok) {
      client_done_ = true;  // half-closed: upstream is half-closed (a cancel or an over-size message: ClientCallDone)
    } else if (!checked_stream_) {
      in_ready_ = true;
    } else {
      ++messages_;
      std::string refusal = CheckStreamMessage();
      if (refusal.empty()) {
        in_ready_ = true;
      } else {
        // Nothing more is read or relayed: upstream is half-closed, and once it has answered what it was sent, the
        // client's call ends with the refusal.
        refusal_ = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "message " + std::to_string(messages_) + " of the stream: " + refusal);
        client_done_ = true;
        in_.Clear();
      }
    }
    PumpClientToUpstream();
  }

  // A ModelStreamInfer message checked as a ModelInfer request is; `in_` then holds it as protobuf read it, written
  // again. Inside tritonserver also: one stream takes requests for decoupled models or for others, not both.
  std::string CheckStreamMessage() {
    ParsedRequest parsed;
    std::string refusal = ReadInferRequest(in_, &parsed);
#ifdef S2T_IN_TRITONSERVER
    if (refusal.empty() && g_server != nullptr && g_gate.Enter()) {
      refusal = ModelRefusalFor(*parsed.message);
      if (refusal.empty()) refusal = StreamKindRefusal(*parsed.message);
      g_gate.Leave();
    }
#endif
    if (refusal.empty()) in_ = Serialized(*parsed.message);
    return refusal;
  }

#ifdef S2T_IN_TRITONSERVER
  // Triton 2.51's stream handler writes a decoupled model's answers and any other answer (a model it does not have
  // included) by two paths that do not wait for each other: one stream with both aborts tritonserver
  // (proto_buffer_writer.h:65, two writes at once on the stream). The stream's first request decides which it takes.
  // A model loaded again with the other transaction policy between this look and Triton's is the race left.
  std::string StreamKindRefusal(const inference::ModelInferRequest& request) {
    const bool decoupled = StreamedAsDecoupled(request);
    if (stream_model_.empty()) {
      stream_model_ = request.model_name().empty() ? "''" : "'" + request.model_name() + "'";
      stream_decoupled_ = decoupled;
      return "";
    }
    if (decoupled == stream_decoupled_) return "";
    return "model_name: '" + request.model_name() + "' is " +
           (decoupled ? "a decoupled model" : "not a decoupled model tritonserver has ready") +
           ", and the stream's first request went to " + (stream_decoupled_ ? "decoupled model " : "model ") +
           stream_model_ + ": one stream takes requests for decoupled models or for others, not both";
  }
#endif

  void StreamUpstreamStarted(bool ok) {
    if (!ok) {  // the call never started: Finish says why
      up_dead_ = up_read_ended_ = true;
      MaybeFinishUpstream();
      return;
    }
    up_started_ = true;
    PumpClientToUpstream();
    PumpUpstreamToClient();
  }

  void StreamUpstreamWritten(bool ok) {
    up_write_pending_ = false;
    if (!ok) up_dead_ = true;  // upstream ended the call; its reads end too
    PumpClientToUpstream();
    MaybeFinishUpstream();
  }

  void StreamUpstreamRead(bool ok) {
    up_read_pending_ = false;
    if (!ok) {
      up_read_ended_ = up_dead_ = true;
      MaybeFinishUpstream();
      return;
    }
    last_message_at_ = Now();
    if (client_gone_ || down_finish_requested_) {
      out_.Clear();  // nobody waits for it
    } else {
      CopyUpstreamInitialMetadata();
      down_write_pending_ = true;
      down_.Write(out_, Start(kDownWrite));
      out_.Clear();
    }
    PumpUpstreamToClient();
  }

  void StreamClientWritten(bool ok) {
    down_write_pending_ = false;
    if (!ok) client_gone_ = true;
    PumpUpstreamToClient();
    MaybeFinishClient();
  }

  void MaybeFinishUpstream() {
    if (up_read_ended_ && !up_write_pending_ && !up_finish_requested_) {
      up_finish_requested_ = true;
      up_stream_->Finish(&status_, Start(kUpFinish));
    }
  }

  // ---- both: Triton has answered; the slot is free, and a client that still waits gets its answer.

  void UpstreamFinished() {
    up_finished_ = true;
    ReleaseSlot();
    if (unary_) {
      CopyUpstreamInitialMetadata();
      CopyUpstreamTrailingMetadata();
      down_finish_requested_ = true;
      if (status_.ok())
        down_.WriteAndFinish(out_, grpc::WriteOptions(), status_, Start(kDownFinish));
      else
        down_.Finish(status_, Start(kDownFinish));
      out_.Clear();
      return;
    }
    MaybeFinishClient();
  }

  void MaybeFinishClient() {
    if (!up_finished_ || down_write_pending_ || down_finish_requested_) return;
    CopyUpstreamInitialMetadata();
    CopyUpstreamTrailingMetadata();
    FinishClient(refusal_.ok() ? status_ : refusal_);
  }

  void CopyUpstreamTrailingMetadata() {
    for (const auto& [key, value] : client_context_.GetServerTrailingMetadata())
      if (Forwardable(key, value)) server_context_.AddTrailingMetadata(Str(key), Str(value));
  }

  Worker* worker_;
  Tag tags_[kOps];
  Slots* slots_ = nullptr;
  bool accepted_ = false;
  std::string peer_, address_;
  grpc::Alarm alarm_;
  bool first_message_ = false, client_call_done_ = false, alarm_armed_ = false;
  double last_message_at_ = 0;
  std::atomic<int> pending_{0};
  bool answered_ = false;
  bool holds_slot_ = false;
  bool unary_ = false;

  grpc::GenericServerContext server_context_;
  grpc::GenericServerAsyncReaderWriter down_;
  grpc::ClientContext client_context_;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> up_unary_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> up_stream_;
  grpc::ByteBuffer in_, out_;
  grpc::Status status_;
  // ModelStreamInfer: its messages are checked; the refusal the call ends with once Triton has answered the rest.
  bool checked_stream_ = false;
  long messages_ = 0;
  grpc::Status refusal_;
  std::string stream_model_;
  bool stream_decoupled_ = false;

  bool down_read_pending_ = false, down_write_pending_ = false, down_finish_requested_ = false;
  std::atomic<bool> down_finished_{false};
  bool initial_metadata_sent_ = false;
  bool client_done_ = false, client_gone_ = false, in_ready_ = false;
  bool up_started_ = false, up_dead_ = false, up_read_pending_ = false, up_read_ended_ = false;
  bool up_write_pending_ = false, up_writes_done_ = false, up_finish_requested_ = false, up_finished_ = false;
};

void Worker::Run() {
  for (int i = 0; i < kAcceptsPerQueue; ++i) new Relay(this);
  void* tag;
  bool ok;
  while (cq_->Next(&tag, &ok)) {
    Tag* t = static_cast<Tag*>(tag);
    t->relay->Done(t->op, ok);
  }
}

std::shared_ptr<grpc::Channel> UpstreamChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // Triton's answers are as large as the request allows
  args.SetMaxSendMessageSize(-1);     // the limit is on the public side
  // A restarted tritonserver is reached within a fraction of a second, not after gRPC's back-off of up to 2 minutes;
  // meanwhile calls fail at once with UNAVAILABLE.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  // Nothing to retry on one hop over loopback, and no per-call retry buffer to pay for.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // Neither deadlines nor compression on this hop: the filters that handle them are left out of each call's path.
  args.SetInt(GRPC_ARG_MINIMAL_STACK, 1);
  args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
  // Loopback: no bandwidth-delay product to probe for, so no extra pings on the connection.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

[[noreturn]] void Usage(const std::string& problem) {
  fprintf(stderr,
          "%s: %s\n"
          "usage: %s --listen HOST:PORT --upstream HOST:PORT --max-message-bytes N [--max-calls N] [--threads N]\n"
          "       [--drain-seconds S] [--ready-fd FD] [--message-seconds S] [--stream-idle-seconds S]\n"
          "       [--request-parameters NAME,...] [--relay-only 0|1]\n"
          "       [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]\n",
          kName, problem.c_str(), kName);
  exit(2);
}

Options Parse(const std::vector<std::string>& words) {
  using front_options::Number;
  Options options;
  try {
    front_options::Read(words, options, [&options](const std::string& name, const char* value) {
      if (name == "--max-calls")
        options.max_calls = Number(name, value, 1, 1000000);
      else if (name == "--max-message-bytes")
        options.max_message_bytes = Number(name, value, 1, INT_MAX);
      else if (name == "--ready-fd")
        options.ready_fd = Number(name, value, 0, INT_MAX);
      else if (name == "--message-seconds")
        options.message_seconds = Number(name, value, 1, 3600);
      else if (name == "--stream-idle-seconds")
        options.stream_idle_seconds = Number(name, value, 1, 86400);
      else if (name == "--tls-cert")
        options.tls_cert = value;
      else if (name == "--tls-key")
        options.tls_key = value;
      else if (name == "--tls-client-ca")
        options.tls_client_ca = value;
      else
        return false;
      return true;
    });
  } catch (const front_options::BadOption& bad) {
    Usage(bad.what());
  }
  if (options.max_message_bytes == 0) Usage("--max-message-bytes is required");
  if (options.tls_cert.empty() != options.tls_key.empty()) Usage("--tls-cert and --tls-key go together");
  if (!options.tls_client_ca.empty() && options.tls_cert.empty()) Usage("--tls-client-ca needs --tls-cert");
  g_limits.custom_parameters = front_options::Names(options.request_parameters);
  return options;
}

// The public endpoint: its server, the one upstream channel, and a worker thread per completion queue. Never
// destroyed: in tritonserver's process the threads may outlive the last call into this library.
struct Endpoint {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<grpc::GenericStub> stub;
  std::vector<std::unique_ptr<Worker>> workers;
  std::atomic<int> running{0};
};
Endpoint* g_endpoint = new Endpoint;

bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream read;
  read << file.rdbuf();
  if (!file) return false;
  *text = read.str();
  return true;
}

// The public port's credentials: TLS where its files were given (nullptr, said in the log, when one cannot be read).
std::shared_ptr<grpc::ServerCredentials> PublicCredentials() {
  if (g_options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions tls(g_options.tls_client_ca.empty()
                                            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  for (const auto& [path, text] : {std::make_pair(g_options.tls_cert, &pair.cert_chain),
                                   std::make_pair(g_options.tls_key, &pair.private_key),
                                   std::make_pair(g_options.tls_client_ca, &tls.pem_root_certs)}) {
    if (!path.empty() && !ReadFile(path, text)) {
      Log("cannot read %s", path.c_str());
      return nullptr;
    }
  }
  tls.pem_key_cert_pairs.push_back(pair);
  return grpc::SslServerCredentials(tls);
}

bool Listen() {
  std::shared_ptr<grpc::ServerCredentials> credentials = PublicCredentials();
  if (!credentials) return false;
  g_slots = new Slots(g_options.max_calls, false);
  g_control_slots = new Slots(std::max(64L, g_options.max_calls / 4), true);
  google::protobuf::SetLogHandler(KeepProtobufMessage);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(g_options.listen, credentials, &port);
  builder.RegisterAsyncGenericService(&g_service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(g_options.max_message_bytes));
  // What gRPC holds for the calls' messages, both ways (a slow reader's answers included), is bounded: past it gRPC
  // takes no more from its connections until memory is given back.
  grpc::ResourceQuota quota("s2t_grpc_front");
  quota.Resize(static_cast<size_t>(64 << 20) + 4 * static_cast<size_t>(g_options.max_message_bytes));
  builder.SetResourceQuota(quota);
  builder.SetMaxSendMessageSize(-1);
  // A port held by another process is an error here, not a port shared with it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  // A client that vanished without closing its connection (a machine gone) is found within a minute or two, and
  // its calls end as cancelled ones do.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  for (long i = 0; i < g_options.threads; ++i) queues.push_back(builder.AddCompletionQueue());
  g_endpoint->server = builder.BuildAndStart();
  if (!g_endpoint->server || port == 0) {
    Log("cannot listen on %s (address in use, or not an address of this machine)", g_options.listen.c_str());
    return false;
  }
  g_endpoint->stub = std::make_unique<grpc::GenericStub>(UpstreamChannel(g_options.upstream));
  for (auto& queue : queues)
    g_endpoint->workers.push_back(std::make_unique<Worker>(std::move(queue), g_endpoint->stub.get()));
  for (auto& worker : g_endpoint->workers) {
    ++g_endpoint->running;
    std::thread([w = worker.get()] {
      w->Run();
      --g_endpoint->running;
    }).detach();
  }
  Log("listening on %s%s, forwarding to tritonserver at %s: at most %ld calls in flight, messages up to %ld bytes, "
      "%ld thread(s)",
      g_options.listen.c_str(), g_server != nullptr ? " in tritonserver's process (ModelInfer through its C API)" : "",
      g_options.upstream.c_str(), g_options.max_calls, g_options.max_message_bytes, g_options.threads);
  return true;
}

// No new calls; the calls in flight get --drain-seconds to be answered, then are cancelled.
std::atomic<bool> g_shut{false};  // every call has ended (answered, or cancelled at the drain's deadline)

void StopAccepting() {
  g_stopping = true;
  Log("stopping: %ld call(s) to tritonserver in flight", CallsHeld());
  std::thread([] {
    g_endpoint->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(g_options.drain_seconds));
    g_shut = true;
  }).detach();
}

void LogStopped() {
  g_refusals.Flush(CallsHeld());
  if (CallsHeld() > 0) Log("stopped with %ld call(s) to tritonserver unanswered", CallsHeld());
  else Log("stopped");
}

}  // namespace

#ifdef S2T_IN_TRITONSERVER
// ---- inside tritonserver: started and stopped by the preloaded hook (grpc_front_hook.c) around Triton's own start
// and stop, with the options the binary takes, as one string.

namespace {
TRITONSERVER_Error* AllocateOutput(TRITONSERVER_ResponseAllocator*, const char*, size_t byte_size,
                                   TRITONSERVER_MemoryType, int64_t, void*, void** buffer, void** buffer_userp,
                                   TRITONSERVER_MemoryType* actual_memory_type, int64_t* actual_memory_type_id) {
  *buffer = byte_size == 0 ? nullptr : malloc(byte_size);
  *buffer_userp = nullptr;
  *actual_memory_type = TRITONSERVER_MEMORY_CPU;
  *actual_memory_type_id = 0;
  if (byte_size != 0 && *buffer == nullptr)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory for an output");
  return nullptr;
}

TRITONSERVER_Error* ReleaseOutput(TRITONSERVER_ResponseAllocator*, void* buffer, void*, size_t,
                                  TRITONSERVER_MemoryType, int64_t) {
  free(buffer);
  return nullptr;
}

}  // namespace

// 0 once listening; otherwise the reason is logged. `args`: the binary's options, separated by spaces.
extern "C" __attribute__((visibility("default"))) int s2t_grpc_front_start(TRITONSERVER_Server* server,
                                                                           const char* args) {
  g_options = Parse(front_options::Words(args));
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (!g_options.relay_only) {
    TRITONSERVER_Error* error = TRITONSERVER_ResponseAllocatorNew(&g_allocator, AllocateOutput, ReleaseOutput, nullptr);
    if (error != nullptr) {
      Log("cannot make a response allocator: %s", TRITONSERVER_ErrorMessage(error));
      TRITONSERVER_ErrorDelete(error);
      return 1;
    }
    g_server = server;
  }
  return Listen() ? 0 : 1;
}

// Before Triton's own stop: the calls in flight are answered while Triton drains; new calls are refused.
extern "C" __attribute__((visibility("default"))) void s2t_grpc_front_stop_accepting() {
  if (g_endpoint->server != nullptr) StopAccepting();
}

// After Triton's own stop returned (every request answered, or its exit timeout passed): what is left is streams
// relayed to Triton's endpoint, which it is about to close, and calls Triton will not answer any more; they are
// cancelled now rather than at the drain's deadline. Bounded: a call that still does not end leaves the workers
// running (their queues are not shut while a call may still post to them) and tritonserver exits anyway.
extern "C" __attribute__((visibility("default"))) void s2t_grpc_front_end() {
  if (!g_stopping.load()) return;
  // Triton's server may be deleted once this returns: a request read from now on is not given to its C API.
  g_gate.Close(2);
  grpc_server_cancel_all_calls(g_endpoint->server->c_server());
  double deadline = Now() + 5;
  while (!(g_shut.load() && g_live_calls.load() == 0) && Now() < deadline) usleep(10 * 1000);
  if (!(g_shut.load() && g_live_calls.load() == 0)) {
    LogStopped();
    return;
  }
  for (auto& worker : g_endpoint->workers) worker->cq()->Shutdown();
  deadline = Now() + 2;
  while (g_endpoint->running.load() > 0 && Now() < deadline) usleep(10 * 1000);
  // The relay's connection to Triton's own endpoint closed now: Triton's gRPC server, stopped next, waits for its
  // connections to end, and no thread of this front reads this one any more (left open, it held each stop 3 s).
  if (g_endpoint->running.load() == 0) g_endpoint->stub.reset();
  LogStopped();
}

#else
namespace {
// After SIGTERM or SIGINT: no new calls; the calls in flight get --drain-seconds to be answered (tritonserver drains
// its own at the same time), then the process ends. A second SIGINT ends it at once; more SIGTERMs change nothing
// (the parent-death signal comes once for each thread of the parent that ends).
void Drain(const sigset_t& signals) {
  double deadline = Now() + g_options.drain_seconds;
  StopAccepting();
  timespec tick{0, 20 * 1000 * 1000};
  while (Now() < deadline && !(g_shut && CallsHeld() == 0)) {
    if (sigtimedwait(&signals, nullptr, &tick) == SIGINT) {
      Log("stopped at once by a second signal, %ld call(s) in flight", CallsHeld());
      g_refusals.Flush(CallsHeld());
      _exit(1);
    }
  }
  LogStopped();
  _exit(0);
}
}  // namespace

int main(int argc, char** argv) {
  g_options = Parse(std::vector<std::string>(argv + 1, argv + argc));
  // Debian's Abseil checks every mutex for lock-order cycles (a debugging aid that showed in the front's profile).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Signals are taken by the main thread only: blocked before gRPC starts any thread of its own.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (!Listen()) return 1;
  if (g_options.ready_fd >= 0) {
    (void)!write(static_cast<int>(g_options.ready_fd), "ready\n", 6);
    close(static_cast<int>(g_options.ready_fd));
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  Drain(signals);
}
#endif
