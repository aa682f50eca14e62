// s2t_grpc_front: the public gRPC endpoint of the embedded tritonserver, in front of Triton's own on a loopback port.
//
// Triton 2.51's gRPC front end can crash the whole server when a unary call is cancelled while Triton works on it
// (a client that cancels, a deadline that expires, a connection that drops). This proxy forwards every method as raw
// bytes and never lets Triton see a unary call's cancellation: such a call carries no deadline upstream and is never
// cancelled: when its client goes away it is left to finish and its answer dropped. A stream's cancellation is
// passed on (Triton's stream handler takes it safely). Every upstream call holds one of --max-calls slots until
// Triton answers it, abandoned or not; past that, new calls are refused at once.
//
//   s2t_grpc_front --listen 0.0.0.0:8001 --upstream 127.0.0.1:PORT --max-message-bytes N [--max-calls N]
//                  [--threads N] [--drain-seconds S] [--ready-fd FD]
//
// Each thread owns one completion queue; a call and its upstream call live on the same queue, so a call's state is
// only ever touched by one thread and needs no lock. All threads share one upstream channel (one connection to
// Triton): once it has answered one call, it answers the next without a new connection. One thread by default: the
// front's cost is mostly its sockets' system calls and the switches between threads, and on two cores one thread
// spent less CPU per request than two (measured beside tritonserver and perf_analyzer at 16 connections).

#include <absl/synchronization/mutex.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr const char* kName = "s2t_grpc_front";
// Requests posted per queue for new calls: a burst of new calls is taken without waiting for a re-post.
constexpr int kAcceptsPerQueue = 16;
// Methods answered with one message: relayed as one call upstream. Everything else (ModelStreamInfer, methods this
// proxy does not know) is relayed as a stream, which is right for any kind of method on the wire.
const std::set<std::string> kUnaryMethods = {
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

struct Options {
  std::string listen;
  std::string upstream;
  long max_calls = 1024;
  long max_message_bytes = 0;  // 0: required
  long threads = 1;
  long drain_seconds = 30;
  long ready_fd = -1;
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

// Upstream calls in flight, abandoned ones included: a slot is taken when a call is accepted and given back when
// Triton has answered it (or when it never reached Triton).
class Slots {
 public:
  explicit Slots(long max) : max_(max) {}

  bool Take() {
    long held = held_.load(std::memory_order_relaxed);
    do {
      if (held >= max_) return false;
    } while (!held_.compare_exchange_weak(held, held + 1, std::memory_order_relaxed));
    return true;
  }
  void Give() { held_.fetch_sub(1, std::memory_order_relaxed); }
  long held() const { return held_.load(std::memory_order_relaxed); }
  long max() const { return max_; }

 private:
  const long max_;
  std::atomic<long> held_{0};
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
std::unique_ptr<Slots> g_slots;
RefusalLog g_refusals;
grpc::AsyncGenericService g_service;
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

class Worker;

enum Op {
  kAccept, kDownRead, kDownWrite, kDownFinish, kDownDone, kUpStart, kUpRead, kUpWrite, kUpWritesDone, kUpFinish, kOps
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
    --pending_;
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
      case kOps: break;
    }
    // A call never accepted (the server shutting down) keeps its done tag: it goes with the process.
    if (pending_ == 0 && down_finished_) delete this;
  }

 private:
  ~Relay() {
    if (holds_slot_) g_slots->Give();
  }

  void* Start(Op op) {
    ++pending_;
    return &tags_[op];
  }

  void Accepted(bool ok) {
    if (!ok) {  // the server is shutting down
      down_finished_ = true;
      return;
    }
    if (!g_stopping.load()) new Relay(worker_);
    unary_ = kUnaryMethods.count(server_context_.method()) > 0;
    if (!g_slots->Take()) {
      g_refusals.Refused(g_slots->held());
      FinishClient(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "the gRPC front of tritonserver holds " + std::to_string(g_slots->max()) +
                                    " calls to it, its limit; try again"));
      return;
    }
    holds_slot_ = true;
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
    if (holds_slot_) g_slots->Give();
    holds_slot_ = false;
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
    if (!ok) {  // gone before sending its request, or the request was over the size limit
      ReleaseSlot();
      FinishClient(grpc::Status(grpc::StatusCode::INTERNAL, "No message returned for unary request"));
      return;
    }
    PrepareUpstreamContext();
    up_unary_ = worker_->stub().PrepareUnaryCall(&client_context_, server_context_.method(), in_, worker_->cq());
    in_.Clear();
    up_unary_->StartCall();
    up_unary_->Finish(&out_, &status_, Start(kUpFinish));
  }

  // ---- streams: one message in flight each way. A client's half-close half-closes the upstream call; a client that
  // cancels or goes away cancels it: Triton 2.51 takes a stream's cancellation on the stream handler's one thread,
  // where nothing races (the crash is the unary handler's), and a decoupled model (llm) stops generating for it.

  void ClientCallDone() {
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
    if (ok)
      in_ready_ = true;
    else
      client_done_ = true;  // half-closed: upstream is half-closed (a cancel or an over-size message: ClientCallDone)
    PumpClientToUpstream();
  }

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
    FinishClient(status_);
  }

  void CopyUpstreamTrailingMetadata() {
    for (const auto& [key, value] : client_context_.GetServerTrailingMetadata())
      if (Forwardable(key, value)) server_context_.AddTrailingMetadata(Str(key), Str(value));
  }

  Worker* worker_;
  Tag tags_[kOps];
  int pending_ = 0;
  bool holds_slot_ = false;
  bool unary_ = false;

  grpc::GenericServerContext server_context_;
  grpc::GenericServerAsyncReaderWriter down_;
  grpc::ClientContext client_context_;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> up_unary_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> up_stream_;
  grpc::ByteBuffer in_, out_;
  grpc::Status status_;

  bool down_read_pending_ = false, down_write_pending_ = false, down_finish_requested_ = false;
  bool down_finished_ = false, initial_metadata_sent_ = false;
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
          "       [--drain-seconds S] [--ready-fd FD]\n",
          kName, problem.c_str(), kName);
  exit(2);
}

long Number(const std::string& name, const char* text, long min, long max) {
  char* end = nullptr;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < min || value > max)
    Usage(name + " needs a whole number from " + std::to_string(min) + " to " + std::to_string(max) + ", got '" +
          text + "'");
  return value;
}

bool LooksLikeAddress(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  for (size_t i = colon + 1; i < address.size(); ++i)
    if (address[i] < '0' || address[i] > '9') return false;
  return true;
}

Options Parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (i + 1 >= argc) Usage(name + " needs a value");
    const char* value = argv[++i];
    if (name == "--listen")
      options.listen = value;
    else if (name == "--upstream")
      options.upstream = value;
    else if (name == "--max-calls")
      options.max_calls = Number(name, value, 1, 1000000);
    else if (name == "--max-message-bytes")
      options.max_message_bytes = Number(name, value, 1, INT_MAX);
    else if (name == "--threads")
      options.threads = Number(name, value, 1, 64);
    else if (name == "--drain-seconds")
      options.drain_seconds = Number(name, value, 0, 86400);
    else if (name == "--ready-fd")
      options.ready_fd = Number(name, value, 0, INT_MAX);
    else
      Usage("unknown option " + name);
  }
  if (!LooksLikeAddress(options.listen)) Usage("--listen needs HOST:PORT, got '" + options.listen + "'");
  if (!LooksLikeAddress(options.upstream)) Usage("--upstream needs HOST:PORT, got '" + options.upstream + "'");
  if (options.max_message_bytes == 0) Usage("--max-message-bytes is required");
  return options;
}

// After SIGTERM or SIGINT: no new calls; the calls in flight get --drain-seconds to be answered (tritonserver drains
// its own at the same time), then the process ends. A second SIGINT ends it at once; more SIGTERMs change nothing
// (the parent-death signal comes once for each thread of the parent that ends).
void Drain(grpc::Server* server, const sigset_t& signals) {
  g_stopping = true;
  Log("stopping: %ld call(s) to tritonserver in flight", g_slots->held());
  double deadline = Now() + g_options.drain_seconds;
  std::atomic<bool> shut{false};
  std::thread shutdown([&] {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(g_options.drain_seconds));
    shut = true;
  });
  shutdown.detach();
  timespec tick{0, 20 * 1000 * 1000};
  while (Now() < deadline && !(shut && g_slots->held() == 0)) {
    if (sigtimedwait(&signals, nullptr, &tick) == SIGINT) {
      Log("stopped at once by a second signal, %ld call(s) in flight", g_slots->held());
      g_refusals.Flush(g_slots->held());
      _exit(1);
    }
  }
  g_refusals.Flush(g_slots->held());
  if (g_slots->held() > 0) Log("stopped with %ld call(s) to tritonserver unanswered", g_slots->held());
  else Log("stopped");
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  g_options = Parse(argc, argv);
  // Debian's Abseil checks every mutex for lock-order cycles (a debugging aid that showed in the front's profile).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Signals are taken by the main thread only: blocked before gRPC starts any thread of its own.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  g_slots = std::make_unique<Slots>(g_options.max_calls);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(g_options.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterAsyncGenericService(&g_service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(g_options.max_message_bytes));
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
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    Log("cannot listen on %s (address in use, or not an address of this machine)", g_options.listen.c_str());
    return 1;
  }
  grpc::GenericStub stub(UpstreamChannel(g_options.upstream));
  std::vector<std::unique_ptr<Worker>> workers;
  for (auto& queue : queues) workers.push_back(std::make_unique<Worker>(std::move(queue), &stub));
  std::vector<std::thread> threads;
  for (auto& worker : workers) threads.emplace_back([w = worker.get()] { w->Run(); });
  Log("listening on %s, forwarding to tritonserver at %s: at most %ld calls in flight, messages up to %ld bytes, "
      "%ld thread(s)",
      g_options.listen.c_str(), g_options.upstream.c_str(), g_options.max_calls, g_options.max_message_bytes,
      g_options.threads);
  if (g_options.ready_fd >= 0) {
    (void)!write(static_cast<int>(g_options.ready_fd), "ready\n", 6);
    close(static_cast<int>(g_options.ready_fd));
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  Drain(server.get(), signals);
}
