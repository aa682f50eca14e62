// s2t_http_front: the public HTTP endpoint of the embedded tritonserver, in front of Triton's own HTTP endpoint on a
// loopback port, loaded into tritonserver's own process by the preloaded hook (native/grpc_front_hook.c), which
// calls s2t_http_front_start once Triton's server exists and s2t_http_front_stop_accepting / s2t_http_front_end
// around Triton's own stop.
//
// Triton 2.51's HTTP front end can be killed by a single request (the classification of a BYTES output divides by its
// byte size, 0: SIGFPE). This front reads every request with libevent's HTTP server and:
// - answers POST /v2/models/NAME[/versions/V]/infer (JSON, or JSON with the binary-data extension) through Triton's
//   C API (TRITONSERVER_ServerInferAsync), writing the KServe v2 answer as Triton's own front end writes it
//   (http_front_infer.h), after checking it against the model's configuration: an output the model does not have,
//   the classification of a non-numeric output, more inputs or outputs than the model has, a shape the
//   configuration cannot take, an unknown request parameter, a field of the wrong JSON type (Triton answers those
//   500), data short of its shape, inference of a decoupled model (Triton: 501): each refused 400 naming the field;
// - refuses on every route a POST body that is not strict JSON (Triton's reader takes NaN and Infinity, and answers
//   what it cannot parse 500), a content coding Triton does not read (415; Triton: 501), a Content-Length or
//   Content-Encoding given twice, and a model name longer than any model's;
// - relays everything else unchanged to Triton's own HTTP endpoint (health, metadata, configuration, repository,
//   statistics, logging, trace, shared memory, generate, compressed bodies, classification of numeric outputs,
//   requests this reading does not take), and any infer Triton refuses before running it, so that Triton refuses it
//   again in its own words.
//
// A relayed request goes over its client connection's own connection to Triton's endpoint, open as long as the
// client's is: Triton sees each client come and go as when its port was public (a client that leaves cancels its
// generation; stopping, Triton waits for the connections open to it), and a streamed (chunked) answer is passed on
// chunk by chunk as Triton writes it. Before Triton's HTTP front end stops waiting at SIGTERM, the relays still
// running are cut, so that no generation asked through it still answers after it is gone (Worker::Release).
//
// Bounded: a request's head and body have size limits (413 / 431 from libevent past them), a connection that sends
// nothing for --idle-seconds is closed, a request's head and body must have arrived --request-seconds after their
// first byte (a trickle is cut), connections are counted from their accept, overall and per peer address (past either
// limit a connection is answered 503 and closed), and requests to Triton
// in flight are counted (past --max-calls, 503 at once), and so are the bytes of their bodies held in memory, raw and
// inflated (past --max-body-memory-bytes, 503 at once). Objects the worker threads use are never destroyed: those
// threads may still run while the process exits.
//
//   options: --listen HOST:PORT --upstream HOST:PORT --max-body-bytes N [--max-header-bytes N] [--threads N]
//            [--idle-seconds S] [--head-seconds S] [--request-seconds S] [--max-connections N] [--max-connections-per-peer N]
//            [--max-calls N] [--max-body-memory-bytes N] [--drain-seconds S] [--request-parameters NAME,...]
//            [--relay-only 0|1]

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "front_options.h"
#include "http_front_infer.h"
#include "triton_c_api.h"

namespace http_front {

constexpr const char* kName = "s2t_http_front";

struct Options : front_options::Common {
  long max_body_bytes = 0;  // 0: required
  long max_header_bytes = 16 * 1024;
  long idle_seconds = 60;
  long request_seconds = 60;
  long head_seconds = 10;  // a request's head must have arrived this long after its first byte
  long max_connections = 4096;
  long max_connections_per_peer = 512;
  long max_calls = 1024;
  long max_body_memory_bytes = 1L << 30;  // request bodies held in flight, raw and inflated, overall
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

// A counter with a ceiling, shared by every thread.
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

// Refusals are logged at most once a second, each line counting those since the last.
class RefusalLog {
 public:
  void Refused(const char* what) {
    count_.fetch_add(1, std::memory_order_relaxed);
    double now = Now();
    double last = last_.load(std::memory_order_relaxed);
    if (now - last < 1.0 || !last_.compare_exchange_strong(last, now)) return;
    long count = count_.exchange(0);
    if (count > 0) Log("refused %ld request(s) or connection(s): %s", count, what);
  }

 private:
  std::atomic<long> count_{0};
  std::atomic<double> last_{-1e9};
};

Options g_options;
Slots* g_calls = nullptr;
BodyMemory* g_body_memory = nullptr;
// The bytes of g_body_memory each request of this thread's worker holds (every request is read, refused and relayed
// on its worker's thread; one answered in process takes its share into its InferCall). Never destroyed.
thread_local std::unordered_map<evhttp_request*, long>* t_body_bytes = nullptr;

bool HoldBody(evhttp_request* request, long bytes) {
  if (!g_body_memory->Take(bytes)) return false;
  if (t_body_bytes == nullptr) t_body_bytes = new std::unordered_map<evhttp_request*, long>;
  (*t_body_bytes)[request] += bytes;
  return true;
}

// What `request` holds of g_body_memory, no longer counted against it here (the caller gives it back).
long TakeBodyBytes(evhttp_request* request) {
  if (t_body_bytes == nullptr) return 0;
  auto held = t_body_bytes->find(request);
  if (held == t_body_bytes->end()) return 0;
  long bytes = held->second;
  t_body_bytes->erase(held);
  return bytes;
}

void ReleaseBody(evhttp_request* request) { g_body_memory->Give(TakeBodyBytes(request)); }
RefusalLog g_refusals;
std::atomic<bool> g_stopping{false};
// Set shortly before Triton's HTTP front end stops waiting for connections to it (see Release): nothing more relayed.
std::atomic<bool> g_released{false};
std::atomic<bool> g_let_go{false};  // and then Triton's wait let end
TRITONSERVER_Server* g_server = nullptr;  // set unless relay_only: infer answered through the C API

class Worker;

// Connections open, overall and per peer address, counted from their accept, each with what it is doing. When every
// connection is taken, a new one still gets in where a peer holding at least two more than the newcomer's has one that
// is doing nothing useful: the oldest idle one of the peer holding most, else the oldest whose head (then body) is
// still arriving. A connection waiting for its answer is never taken. So a few addresses holding every connection
// with heads they never finish (or idle keep-alive ones) cannot keep another address out, while two peers never take
// connections from each other back and forth.
class Connections {
 public:
  enum Phase { kIdle, kHead, kBody, kAnswering };
  struct Victim {
    Worker* worker = nullptr;
    uint64_t id = 0;
  };
  // False: refused (over the peer's limit, or nothing to take from another peer). `victim` (its worker set): the
  // connection this one takes the place of, no longer counted, for its worker to close.
  bool Admit(uint64_t id, Worker* worker, const std::string& peer, Victim* victim) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto mine = peers_.find(peer);
    size_t held = mine != peers_.end() ? mine->second.size() : 0;
    if (static_cast<long>(held) >= g_options.max_connections_per_peer) return false;
    if (total_ >= g_options.max_connections && !TakeVictim(held, victim)) return false;
    entries_[id] = Entry{worker, peer, kIdle, Now()};
    peers_[peer].insert(id);
    ++total_;
    return true;
  }
  // What connection `id` does from now; false when it was taken for another (it is being closed).
  bool Enter(uint64_t id, Phase phase) {
    const double now = Now();  // read before the lock every connection of every worker takes
    std::lock_guard<std::mutex> lock(mutex_);
    auto entry = entries_.find(id);
    if (entry == entries_.end()) return false;
    if (entry->second.phase != phase) {
      entry->second.phase = phase;
      entry->second.since = now;
    }
    return true;
  }
  void Leave(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    Remove(id);
  }

 private:
  struct Entry {
    Worker* worker;
    std::string peer;
    Phase phase;
    double since;  // when it began doing what it does
  };

  void Remove(uint64_t id) {
    auto entry = entries_.find(id);
    if (entry == entries_.end()) return;
    auto peer = peers_.find(entry->second.peer);
    if (peer != peers_.end()) {
      peer->second.erase(id);
      if (peer->second.empty()) peers_.erase(peer);
    }
    entries_.erase(entry);
    --total_;
  }

  bool TakeVictim(size_t newcomer_holds, Victim* victim) {
    std::vector<std::pair<size_t, const std::unordered_set<uint64_t>*>> larger;
    for (const auto& [address, ids] : peers_)
      if (ids.size() > newcomer_holds + 1) larger.emplace_back(ids.size(), &ids);
    std::sort(larger.begin(), larger.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [count, ids] : larger) {
      const Entry* best = nullptr;
      uint64_t best_id = 0;
      for (uint64_t id : *ids) {
        const Entry& entry = entries_.at(id);
        if (entry.phase == kAnswering) continue;
        if (best == nullptr || entry.phase < best->phase || (entry.phase == best->phase && entry.since < best->since)) {
          best = &entry;
          best_id = id;
        }
      }
      if (best == nullptr) continue;
      *victim = Victim{best->worker, best_id};
      Remove(best_id);
      return true;
    }
    return false;
  }

  std::mutex mutex_;
  long total_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;
  std::unordered_map<std::string, std::unordered_set<uint64_t>> peers_;
};
Connections& g_connections = *new Connections;

// Headers that describe one hop, not the message: never passed on (RFC 9110 7.6.1), nor the ones libevent writes
// itself for the next hop (Content-Length).
bool HopHeader(const char* key) {
  static const char* const kHop[] = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
                                     "trailer", "upgrade", "proxy-authenticate", "proxy-authorization",
                                     "content-length"};
  for (const char* hop : kHop)
    if (strcasecmp(key, hop) == 0) return true;
  return false;
}

void AddErrorJson(evbuffer* out, const std::string& message);

class Worker;
struct Relay;

// POST /v2/models/NAME[/versions/N]/generate or /generate_stream (a query string aside).
bool IsGeneratePath(const char* uri) {
  if (uri == nullptr) return false;
  std::string path(uri, strcspn(uri, "?"));
  auto ends_with = [&path](const char* tail) {
    size_t n = strlen(tail);
    return path.size() >= n && path.compare(path.size() - n, n, tail) == 0;
  };
  return path.rfind("/v2/models/", 0) == 0 && (ends_with("/generate") || ends_with("/generate_stream"));
}

// The llm model's refusal when its admission queue holds its maximum (backends/llm/engine.py's QueueFull): the
// one error of a generation that says "busy", not "bad request".
bool SaysBusy(evbuffer* body) {
  static const char kQueueFull[] = "admission queue is full";
  size_t length = evbuffer_get_length(body);
  if (length == 0 || length > 4096) return false;
  const char* text = reinterpret_cast<const char*>(evbuffer_pullup(body, -1));
  return text != nullptr && memmem(text, length, kQueueFull, sizeof kQueueFull - 1) != nullptr;
}

// One client connection, from its accept until libevent frees it. libevent 2.1 tells a server of a connection only
// with its first complete request; this front makes each connection's bufferevent itself (evhttp_set_bevcb), keeps a
// reference to it, and learns of the connection libevent built on it from the callback argument libevent gives it
// (the connection), just after the accept: so a connection is counted from its accept, and its close is seen even when
// libevent frees it without calling its close callback.
struct Connection {
  Worker* worker = nullptr;
  bufferevent* bev = nullptr;
  evbuffer_cb_entry* watch = nullptr;  // on its input: when a request's first bytes arrive
  evhttp_connection* connection = nullptr;  // once adopted
  std::string peer;
  uint64_t id = 0;  // its name in g_connections
  bool admitted = false;
  bool busy = false;  // a request read whole and not yet answered
  double reading_since = 0;  // when the head or body being read began to arrive (0: none is)
  // The head being read: whether it has ended (its empty line seen), the length of its line being read, and how many
  // lines came before it. Every byte of a head passes OnInput once, before libevent reads it.
  bool head_done = false;
  long head_line = 0;
  long head_lines = 0;
  // This connection's own connection to Triton's endpoint, kept while it is open: its relays go over it, and Triton,
  // stopping, waits for it as it waited for the client's own connection when its port was public.
  evhttp_connection* upstream = nullptr;
  // A plain connection to Triton's endpoint from the first request on, for the same wait where nothing was relayed.
  evutil_socket_t presence = -1;
  Relay* relay = nullptr;  // the relayed request in flight
  // While a relay is in flight libevent reads nothing from the client (it would see its close only when a write to
  // it fails, a token or two later): this watches the socket itself, so that a client that leaves cancels at once.
  event* gone_watch = nullptr;
};

// A request relayed to Triton's own HTTP endpoint.
struct Relay {
  Worker* worker;
  evhttp_request* down;  // the client's request, answered as Triton answers (or fails)
  evhttp_connection* up_connection;
  Connection* client = nullptr;  // owns up_connection; null: up_connection is this relay's own
  evhttp_request* up = nullptr;
  bool streaming = false;  // a chunked answer, passed on chunk by chunk as it comes
  bool generate = false;  // POST .../generate or .../generate_stream
};

class Worker {
 public:
  Worker();
  void Run();
  event_base* base() { return base_; }
  evhttp* http() { return http_; }

  void Handle(evhttp_request* request);
  void RelayRequest(evhttp_request* request);
  // From Triton's threads: `run` is called on this worker's thread.
  void Post(void (*run)(void*), void* arg);
  // The configuration of a model (version -1: the one Triton serves), as read within kShapeSeconds, or now (`fresh`);
  // null where it cannot be read.
  const ModelShape* Shape(const std::string& model, int64_t version, bool fresh);

 private:
  static void OnRequest(evhttp_request* request, void* worker) { static_cast<Worker*>(worker)->Handle(request); }
  static bufferevent* NewConnection(event_base* base, void* worker);
  static void OnConnectionClosed(evhttp_connection* connection, void* arg);
  static void OnInput(evbuffer* input, const evbuffer_cb_info* info, void* state);
  static void OnAnswered(evhttp_request* request, void* state);
  static void OnAdopt(evutil_socket_t, short, void* worker);
  static void OnSweep(evutil_socket_t, short, void* worker);
  static void OnEvict(void* eviction);
  // A request's bytes from `from` in `input`: its head read on; g_connections told when the head is done.
  static void ReadHead(Connection* state, evbuffer* input, size_t from);
  // The connection libevent built on `state`'s bufferevent, counted (or closed, over a limit); false when libevent
  // has already freed it.
  bool Adopt(Connection* state, bool from_request);
  // `closing`: from libevent's close callback of its connection (a request of it in flight is then this front's).
  void Forget(Connection* state, bool closing = false);
  static void OnRelayed(evhttp_request* up, void* relay);
  static int OnRelayedHead(evhttp_request* up, void* relay);
  static void OnRelayedChunk(evhttp_request* up, void* relay);
  Connection* ClientOf(evhttp_request* request);
  void CancelRelay(Relay* relay, bool down_detached);
  static void WatchClient(Connection* state);
  static void StopWatching(Connection* state);
  static void OnClientReadable(evutil_socket_t fd, short, void* state);
 public:
  // On this worker's thread: every connection to Triton's endpoint closed, the relays still in flight cut.
  void Release();
  // Then: the connections that only held Triton's wait open closed.
  void LetTritonGo();

 private:
  static void OnPosted(evutil_socket_t fd, short, void* worker);
  bool AdmitConnection(evhttp_request* request);
  evhttp_connection* TakeUpstream();
  void GiveUpstream(evhttp_connection* connection);

  event_base* base_;
  evhttp* http_;
  std::unordered_map<std::string, std::pair<double, ModelShape>> shapes_;
  std::unordered_map<bufferevent*, Connection*> connections_;
  std::unordered_map<uint64_t, Connection*> by_id_;
  std::vector<Connection*> unadopted_;
  std::vector<evutil_socket_t> lingering_;  // connections to Triton kept after their clients left (see Release)
  event* adopt_;
  event* sweep_;
  int wake_fd_;
  event* wake_;
  std::mutex posted_mutex_;
  std::vector<std::pair<void (*)(void*), void*>> posted_;
};

Worker::Worker() {
  base_ = event_base_new();
  http_ = evhttp_new(base_);
  evhttp_set_max_body_size(http_, g_options.max_body_bytes);
  evhttp_set_max_headers_size(http_, g_options.max_header_bytes);
  evhttp_set_timeout(http_, static_cast<int>(g_options.idle_seconds));
  // Every method reaches Triton's front end, which answers those it does not serve in its own words.
  evhttp_set_allowed_methods(http_, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
                                        EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                        EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
  // An answer carries the Content-Type its writer gave it, or none, as Triton's.
  evhttp_set_default_content_type(http_, nullptr);
  evhttp_set_gencb(http_, OnRequest, this);
  evhttp_set_bevcb(http_, NewConnection, this);
  adopt_ = evtimer_new(base_, OnAdopt, this);
  sweep_ = event_new(base_, -1, EV_PERSIST, OnSweep, this);
  timeval second{1, 0};
  event_add(sweep_, &second);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  wake_ = event_new(base_, wake_fd_, EV_READ | EV_PERSIST, OnPosted, this);
  event_add(wake_, nullptr);
}

void Worker::Run() { event_base_loop(base_, EVLOOP_NO_EXIT_ON_EMPTY); }

void Worker::Post(void (*run)(void*), void* arg) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(posted_mutex_);
    first = posted_.empty();
    posted_.emplace_back(run, arg);
  }
  if (first) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
}

void Worker::OnPosted(evutil_socket_t fd, short, void* arg) {
  auto* worker = static_cast<Worker*>(arg);
  uint64_t count;
  (void)!read(fd, &count, sizeof count);
  std::vector<std::pair<void (*)(void*), void*>> posted;
  {
    std::lock_guard<std::mutex> lock(worker->posted_mutex_);
    posted.swap(worker->posted_);
  }
  for (auto& [run, arg] : posted) run(arg);
}

// No CLOSE_ON_FREE: libevent closes the socket itself the moment it frees the connection, while the reference kept here
// only keeps the bufferevent's memory until this front has seen that.
bufferevent* Worker::NewConnection(event_base* base, void* arg) {
  auto* worker = static_cast<Worker*>(arg);
  bufferevent* bev = bufferevent_socket_new(base, -1, 0);
  if (bev == nullptr) return nullptr;
  bufferevent_incref(bev);
  static std::atomic<uint64_t> last_id{0};
  auto* state = new Connection;
  state->worker = worker;
  state->bev = bev;
  state->id = ++last_id;
  worker->by_id_[state->id] = state;
  state->watch = evbuffer_add_cb(bufferevent_get_input(bev), OnInput, state);
  worker->connections_[bev] = state;
  worker->unadopted_.push_back(state);
  timeval now{0, 0};
  event_add(worker->adopt_, &now);
  return bev;
}

void Worker::OnAdopt(evutil_socket_t, short, void* arg) {
  auto* worker = static_cast<Worker*>(arg);
  std::vector<Connection*> unadopted;
  unadopted.swap(worker->unadopted_);
  for (Connection* state : unadopted)
    if (state != nullptr && state->connection == nullptr && !worker->Adopt(state, false)) worker->Forget(state);
}

bool Worker::Adopt(Connection* state, bool from_request) {
  bufferevent_event_cb error_callback = nullptr;
  void* argument = nullptr;
  bufferevent_getcb(state->bev, nullptr, nullptr, &error_callback, &argument);
  if (error_callback == nullptr || argument == nullptr) return false;  // freed by libevent already
  state->connection = static_cast<evhttp_connection*>(argument);
  char* address = nullptr;
  ev_uint16_t port = 0;
  evhttp_connection_get_peer(state->connection, &address, &port);
  state->peer = address != nullptr ? address : "";
  Connections::Victim victim;
  state->admitted = g_connections.Admit(state->id, this, state->peer, &victim);
  evhttp_connection_set_closecb(state->connection, OnConnectionClosed, state);
  if (victim.worker != nullptr) {
    g_refusals.Refused("connections idle or with a request still arriving closed for another peer's "
                       "(--max-connections)");
    victim.worker->Post(OnEvict, new Connections::Victim(victim));
  }
  if (state->admitted || from_request) return true;
  // Over a limit before its first request: told so in a few bytes and closed.
  g_refusals.Refused("too many connections (--max-connections or --max-connections-per-peer)");
  static const std::string kRefusal = [] {
    std::string body = ErrorJson("too many connections to the HTTP front of tritonserver; try again");
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  (void)!send(bufferevent_getfd(state->bev), kRefusal.data(), kRefusal.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  evhttp_connection_free(state->connection);  // calls OnConnectionClosed
  return true;
}

void Worker::Forget(Connection* state, bool closing) {
  StopWatching(state);
  if (state->relay != nullptr) CancelRelay(state->relay, closing);
  if (state->upstream != nullptr) evhttp_connection_free(state->upstream);
  if (state->presence >= 0 && g_released.load() && !g_let_go.load())
    lingering_.push_back(state->presence);  // Triton's wait is held until the cancelled generations end
  else if (state->presence >= 0)
    close(state->presence);
  if (state->admitted) g_connections.Leave(state->id);
  connections_.erase(state->bev);
  by_id_.erase(state->id);
  for (Connection*& waiting : unadopted_)
    if (waiting == state) waiting = nullptr;
  evbuffer_remove_cb_entry(bufferevent_get_input(state->bev), state->watch);
  bufferevent_decref(state->bev);
  delete state;
}

void Worker::OnConnectionClosed(evhttp_connection*, void* arg) {
  auto* state = static_cast<Connection*>(arg);
  state->worker->Forget(state, true);
}

// A request's first bytes start its deadlines (--head-seconds, --request-seconds).
void Worker::OnInput(evbuffer* input, const evbuffer_cb_info* info, void* arg) {
  auto* state = static_cast<Connection*>(arg);
  if (info->n_added == 0 || state->busy) return;
  if (state->reading_since == 0) {
    state->reading_since = Now();
    state->head_done = false;
    state->head_line = state->head_lines = 0;
    g_connections.Enter(state->id, Connections::kHead);
  }
  size_t length = evbuffer_get_length(input);
  if (!state->head_done) ReadHead(state, input, length >= info->n_added ? length - info->n_added : 0);
}

void Worker::ReadHead(Connection* state, evbuffer* input, size_t from) {
  size_t length = evbuffer_get_length(input);
  if (from >= length) return;
  evbuffer_ptr start;
  if (evbuffer_ptr_set(input, &start, from, EVBUFFER_PTR_SET) != 0) return;
  int count = evbuffer_peek(input, length - from, &start, nullptr, 0);
  std::vector<evbuffer_iovec> pieces(count > 0 ? count : 0);
  count = evbuffer_peek(input, length - from, &start, pieces.data(), count);
  for (int i = 0; i < count && !state->head_done; ++i) {
    const char* bytes = static_cast<const char*>(pieces[i].iov_base);
    for (size_t j = 0; j < pieces[i].iov_len; ++j) {
      if (bytes[j] == '\n') {
        // Empty lines before the request line are skipped, as libevent does.
        if (state->head_line == 0 && state->head_lines > 0) {
          state->head_done = true;
          g_connections.Enter(state->id, Connections::kBody);
          break;
        }
        if (state->head_line > 0) ++state->head_lines;
        state->head_line = 0;
      } else if (bytes[j] != '\r') {
        ++state->head_line;
      }
    }
  }
}

void Worker::OnAnswered(evhttp_request*, void* arg) {
  auto* state = static_cast<Connection*>(arg);
  state->busy = false;
  // A pipelined request already waiting starts its deadlines now.
  state->head_done = false;
  state->head_line = state->head_lines = 0;
  if (evbuffer_get_length(bufferevent_get_input(state->bev)) > 0) {
    state->reading_since = Now();
    g_connections.Enter(state->id, Connections::kHead);
    ReadHead(state, bufferevent_get_input(state->bev), 0);
  } else {
    state->reading_since = 0;
    g_connections.Enter(state->id, Connections::kIdle);
  }
}

// On the worker of a connection taken for another peer's: closed unless a request of it was read whole since (that
// one is answered, and its connection closed after: see AdmitConnection).
void Worker::OnEvict(void* arg) {
  auto* victim = static_cast<Connections::Victim*>(arg);
  Worker* worker = victim->worker;
  auto found = worker->by_id_.find(victim->id);
  delete victim;
  if (found == worker->by_id_.end()) return;
  Connection* state = found->second;
  state->admitted = false;
  if (state->connection != nullptr && !state->busy) evhttp_connection_free(state->connection);  // OnConnectionClosed
}

// Once a second: connections libevent freed without a word are forgotten; a head that has been arriving for longer
// than --head-seconds, or a head and body for longer than --request-seconds (a trickle that the idle time never ends),
// closes its connection.
void Worker::OnSweep(evutil_socket_t, short, void* arg) {
  auto* worker = static_cast<Worker*>(arg);
  double now = Now();
  std::vector<Connection*> gone, late;
  for (auto& [bev, state] : worker->connections_) {
    bufferevent_event_cb error_callback = nullptr;
    bufferevent_getcb(bev, nullptr, nullptr, &error_callback, nullptr);
    if (state->connection != nullptr && error_callback == nullptr)
      gone.push_back(state);
    else if (state->connection != nullptr && state->reading_since > 0 &&
             now - state->reading_since >
                 (state->head_done ? g_options.request_seconds
                                   : std::min(g_options.head_seconds, g_options.request_seconds)))
      late.push_back(state);
  }
  for (Connection* state : gone) worker->Forget(state);
  if (!late.empty())
    g_refusals.Refused("a request's head did not arrive within --head-seconds, or its body within --request-seconds");
  for (Connection* state : late) evhttp_connection_free(state->connection);  // calls OnConnectionClosed
}

// A connection is counted from its accept; one over a limit is answered 503 and closed.
bool Worker::AdmitConnection(evhttp_request* request) {
  evhttp_connection* connection = evhttp_request_get_connection(request);
  auto found = connection != nullptr ? connections_.find(evhttp_connection_get_bufferevent(connection))
                                     : connections_.end();
  if (found == connections_.end()) return true;
  Connection* state = found->second;
  if (state->connection == nullptr && !Adopt(state, true)) return true;
  if (state->admitted) {
    state->busy = true;
    state->reading_since = 0;
    // Taken for another peer's connection just now: this request is answered, then the connection closed.
    if (!g_connections.Enter(state->id, Connections::kAnswering))
      evhttp_add_header(evhttp_request_get_output_headers(request), "Connection", "close");
    evhttp_request_set_on_complete_cb(request, OnAnswered, state);
    return true;
  }
  g_refusals.Refused("too many connections (--max-connections or --max-connections-per-peer)");
  evhttp_add_header(evhttp_request_get_output_headers(request), "Connection", "close");
  evhttp_add_header(evhttp_request_get_output_headers(request), "Content-Type", "application/json");
  AddErrorJson(evhttp_request_get_output_buffer(request),
               "too many connections to the HTTP front of tritonserver; try again");
  evhttp_send_reply(request, 503, "Service Unavailable", nullptr);
  return false;
}

bool InferInProcess(Worker* worker, evhttp_request* request);
bool GuardBody(evhttp_request* request);
evutil_socket_t OpenPresence();
void RefuseWith(evhttp_request* request, int code, const char* reason, const std::string& message);

void Worker::Handle(evhttp_request* request) {
  if (!AdmitConnection(request)) return;
  Connection* client = ClientOf(request);
  if (client != nullptr && client->presence < 0 && !g_released.load(std::memory_order_relaxed))
    client->presence = OpenPresence();
  if (g_stopping.load(std::memory_order_relaxed)) {
    evhttp_add_header(evhttp_request_get_output_headers(request), "Connection", "close");
  }
  if (!g_calls->Take()) {
    g_refusals.Refused("too many requests to tritonserver in flight (--max-calls)");
    evhttp_add_header(evhttp_request_get_output_headers(request), "Content-Type", "application/json");
    AddErrorJson(evhttp_request_get_output_buffer(request),
                 "the HTTP front of tritonserver holds " + std::to_string(g_calls->max()) +
                     " requests to it, its limit; try again");
    evhttp_send_reply(request, 503, "Service Unavailable", nullptr);
    return;
  }
  if (!GuardBody(request)) return;
  if (g_server != nullptr && InferInProcess(this, request)) return;
  // The body goes to Triton's endpoint on loopback, which reads it at once: Triton's to hold from here.
  ReleaseBody(request);
  RelayRequest(request);
}

// Connections to Triton's endpoint: each client connection's own, kept while it is open and closed with it. When
// tritonserver stops, its HTTP front end refuses new connections and waits (up to the exit timeout) for those open to
// close before Triton drains: relays in flight then and later on the same client connection go on over the
// connections already open, as the client's own did when Triton's port was public, and a client that leaves closes
// its connection to Triton, which cancels what it asked for (a generation stops).
evhttp_connection* Worker::TakeUpstream() {
  static const std::string host = g_options.upstream.substr(0, g_options.upstream.rfind(':'));
  static const int port = atoi(g_options.upstream.c_str() + g_options.upstream.rfind(':') + 1);
  evhttp_connection* connection = evhttp_connection_base_new(base_, nullptr, host.c_str(), port);
  if (connection == nullptr) return nullptr;
  // A request is never sent twice: Triton may have run it. Triton takes as long as it takes (a queue, a slow
  // model): no timeout here (libevent's default would cut a request after 50 s).
  evhttp_connection_set_retries(connection, 0);
  evhttp_connection_set_timeout(connection, 7 * 86400);
  return connection;
}

// A connection to Triton's endpoint that carries nothing: Triton counts it as it counted the client's connection.
evutil_socket_t OpenPresence() {
  static const std::string address = g_options.upstream;
  static sockaddr_storage peer{};
  static int peer_size = [] {
    int size = sizeof peer;
    return evutil_parse_sockaddr_port(address.c_str(), reinterpret_cast<sockaddr*>(&peer), &size) == 0 ? size : 0;
  }();
  if (peer_size == 0) return -1;
  evutil_socket_t fd = socket(peer.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&peer), peer_size) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

void FreeConnection(evutil_socket_t, short, void* connection) {
  evhttp_connection_free(static_cast<evhttp_connection*>(connection));
}

// Freed once libevent is done with the request that used it (not from within its callback).
void Worker::GiveUpstream(evhttp_connection* connection) {
  event_base_once(base_, -1, EV_TIMEOUT, FreeConnection, connection, nullptr);
}

Connection* Worker::ClientOf(evhttp_request* request) {
  evhttp_connection* connection = evhttp_request_get_connection(request);
  if (connection == nullptr) return nullptr;
  auto found = connections_.find(evhttp_connection_get_bufferevent(connection));
  return found != connections_.end() && found->second->connection == connection ? found->second : nullptr;
}

void Worker::RelayRequest(evhttp_request* down) {
  if (g_released.load(std::memory_order_relaxed)) {
    RefuseWith(down, 503, "Service Unavailable", "tritonserver is stopping");
    return;
  }
  Connection* client = ClientOf(down);
  auto* relay = new Relay{this, down, nullptr};
  relay->generate = IsGeneratePath(evhttp_request_get_uri(down));
  if (client != nullptr && client->relay == nullptr) {
    if (client->upstream == nullptr) client->upstream = TakeUpstream();
    relay->client = client;
    relay->up_connection = client->upstream;
  } else {
    relay->up_connection = TakeUpstream();
  }
  evhttp_request* up = relay->up_connection != nullptr ? evhttp_request_new(OnRelayed, relay) : nullptr;
  if (up == nullptr) {
    OnRelayed(nullptr, relay);
    return;
  }
  relay->up = up;
  evhttp_request_set_header_cb(up, OnRelayedHead);
  evhttp_request_set_chunked_cb(up, OnRelayedChunk);
  evkeyvalq* up_headers = evhttp_request_get_output_headers(up);
  for (evkeyval* header = evhttp_request_get_input_headers(down)->tqh_first; header != nullptr;
       header = header->next.tqe_next)
    if (!HopHeader(header->key)) evhttp_add_header(up_headers, header->key, header->value);
  if (relay->client == nullptr) evhttp_add_header(up_headers, "Connection", "close");
  evbuffer* body = evhttp_request_get_input_buffer(down);
  evhttp_cmd_type method = evhttp_request_get_command(down);
  if (evbuffer_get_length(body) > 0 || method == EVHTTP_REQ_POST || method == EVHTTP_REQ_PUT ||
      method == EVHTTP_REQ_PATCH)
    evhttp_add_header(up_headers, "Content-Length", std::to_string(evbuffer_get_length(body)).c_str());
  evbuffer_add_buffer(evhttp_request_get_output_buffer(up), body);
  if (relay->client != nullptr) relay->client->relay = relay;
  if (evhttp_make_request(relay->up_connection, up, method, evhttp_request_get_uri(down)) != 0) {
    // libevent has freed `up` and will not call back.
    relay->up = nullptr;
    OnRelayed(nullptr, relay);
    return;
  }
  if (relay->client != nullptr) WatchClient(relay->client);
}

// Level-triggered and one-shot: re-armed while the socket has nothing to read. Bytes to read (a pipelined request)
// end the watch: libevent reads them once this relay is answered, and a close behind them is seen as before.
void Worker::WatchClient(Connection* state) {
  if (state->gone_watch == nullptr) {
    state->gone_watch = event_new(state->worker->base_, bufferevent_getfd(state->bev), EV_READ, OnClientReadable,
                                  state);
    if (state->gone_watch == nullptr) return;
  }
  event_add(state->gone_watch, nullptr);
}

void Worker::StopWatching(Connection* state) {
  if (state->gone_watch == nullptr) return;
  event_free(state->gone_watch);
  state->gone_watch = nullptr;
}

// The client's socket is readable while its request is relayed: its end of the stream (it closed or reset the
// connection) frees the connection, which cancels the relay (see CancelRelay), as a failed write would later.
void Worker::OnClientReadable(evutil_socket_t fd, short, void* arg) {
  auto* state = static_cast<Connection*>(arg);
  char byte;
  ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    event_add(state->gone_watch, nullptr);
    return;
  }
  if (n > 0 || state->relay == nullptr || state->connection == nullptr) return;
  evhttp_connection_free(state->connection);  // calls OnConnectionClosed: the relay cancelled, `state` forgotten
}

// Triton's head: a chunked answer (a stream of generated tokens) is passed on as it comes, each chunk when it arrives.
int Worker::OnRelayedHead(evhttp_request* up, void* arg) {
  auto* relay = static_cast<Relay*>(arg);
  const char* encoding = evhttp_find_header(evhttp_request_get_input_headers(up), "Transfer-Encoding");
  int code = evhttp_request_get_response_code(up);
  if (encoding == nullptr || strcasecmp(encoding, "chunked") != 0 || code == 0) return 0;
  // A refusal of a generation is one short event, read whole so that its status can follow its reason (OnRelayed).
  if (relay->generate && code >= 400) return 0;
  relay->streaming = true;
  evkeyvalq* down_headers = evhttp_request_get_output_headers(relay->down);
  for (evkeyval* header = evhttp_request_get_input_headers(up)->tqh_first; header != nullptr;
       header = header->next.tqe_next)
    if (!HopHeader(header->key)) evhttp_add_header(down_headers, header->key, header->value);
  const char* reason = evhttp_request_get_response_code_line(up);
  evhttp_send_reply_start(relay->down, code, reason != nullptr ? reason : "");
  return 0;
}

// A piece of Triton's body: on to the client now when streaming, else kept until the whole answer is there.
void Worker::OnRelayedChunk(evhttp_request* up, void* arg) {
  auto* relay = static_cast<Relay*>(arg);
  evbuffer* piece = evhttp_request_get_input_buffer(up);
  if (relay->streaming)
    evhttp_send_reply_chunk(relay->down, piece);
  else
    evbuffer_add_buffer(evhttp_request_get_output_buffer(relay->down), piece);
}

void Worker::OnRelayed(evhttp_request* up, void* arg) {
  auto* relay = static_cast<Relay*>(arg);
  Worker* worker = relay->worker;
  evhttp_request* down = relay->down;
  if (relay->client != nullptr) {
    relay->client->relay = nullptr;
    StopWatching(relay->client);
  }
  int code = up != nullptr ? evhttp_request_get_response_code(up) : 0;
  if (relay->streaming) {
    // Cut short (Triton's connection failed mid-answer): the client sees the stream end without its last chunk.
    evhttp_send_reply_end(down);
  } else if (code == 0) {
    evbuffer_drain(evhttp_request_get_output_buffer(down), evbuffer_get_length(evhttp_request_get_output_buffer(down)));
    evhttp_add_header(evhttp_request_get_output_headers(down), "Content-Type", "application/json");
    AddErrorJson(evhttp_request_get_output_buffer(down), "tritonserver's HTTP endpoint did not answer");
    evhttp_send_reply(down, 502, "Bad Gateway", nullptr);
  } else {
    evkeyvalq* down_headers = evhttp_request_get_output_headers(down);
    for (evkeyval* header = evhttp_request_get_input_headers(up)->tqh_first; header != nullptr;
         header = header->next.tqe_next)
      if (!HopHeader(header->key)) evhttp_add_header(down_headers, header->key, header->value);
    const char* reason = evhttp_request_get_response_code_line(up);
    if (relay->generate && code == 400 && SaysBusy(evhttp_request_get_output_buffer(down))) {
      // Triton's generate endpoint answers every error of a model 400; a full admission queue is no fault of the
      // request: 429 with when to try again, as any busy HTTP service answers (clients and SDKs retry it).
      evhttp_add_header(down_headers, "Retry-After", "1");
      evhttp_send_reply(down, 429, "Too Many Requests", nullptr);
    } else {
      evhttp_send_reply(down, code, reason != nullptr ? reason : "", nullptr);
    }
  }
  if (relay->client == nullptr && relay->up_connection != nullptr) worker->GiveUpstream(relay->up_connection);
  g_calls->Give();
  delete relay;
}

// The client's connection is going away with its relay in flight: the request to Triton is cancelled (its connection
// closed, as the client's own closed when Triton's port was public) and the client's request, when libevent has left
// it to this front (`down_detached`), freed.
// Triton 2.51's HTTP front end, stopping, waits up to the exit timeout for the connections to it to close, then frees
// its response allocator while the generations asked through it may still be answering: a generation still streaming
// then crashes tritonserver. So before that wait ends (see WatchStop), in two steps: first every request this front relays is cut
// (its connection to Triton closed, which Triton takes for a client that left: it cancels the generation, which ends
// at its next token); a stream still running is cut (its client's connection closed), another request still waiting
// is answered 503; then, once the cancelled generations have had time to end, the connections that only hold Triton's
// wait open are closed too.
void Worker::Release() {
  g_released.store(true);
  std::vector<Connection*> streaming;
  std::vector<Connection*> all;
  for (auto& [bev, state] : connections_) all.push_back(state);
  for (Connection* state : all) {
    Relay* relay = state->relay;
    if (relay != nullptr && relay->streaming && state->connection != nullptr) {
      streaming.push_back(state);
      continue;
    }
    if (relay != nullptr) {
      if (relay->up != nullptr) evhttp_cancel_request(relay->up);
      evbuffer* out = evhttp_request_get_output_buffer(relay->down);
      evbuffer_drain(out, evbuffer_get_length(out));
      evhttp_add_header(evhttp_request_get_output_headers(relay->down), "Connection", "close");
      state->relay = nullptr;
      StopWatching(state);
      RefuseWith(relay->down, 503, "Service Unavailable", "tritonserver is stopping");
      delete relay;
    }
    if (state->upstream != nullptr) evhttp_connection_free(state->upstream);
    state->upstream = nullptr;
  }
  if (!streaming.empty()) g_refusals.Refused("a stream still running when tritonserver stopped waiting for it (cut)");
  for (Connection* state : streaming) evhttp_connection_free(state->connection);  // calls OnConnectionClosed
}

void Worker::LetTritonGo() {
  g_let_go.store(true);
  for (auto& [bev, state] : connections_) {
    if (state->presence >= 0) close(state->presence);
    state->presence = -1;
  }
  for (evutil_socket_t fd : lingering_) close(fd);
  lingering_.clear();
}

void Worker::CancelRelay(Relay* relay, bool down_detached) {
  if (relay->up != nullptr) evhttp_cancel_request(relay->up);
  if (down_detached && evhttp_request_get_connection(relay->down) == nullptr) evhttp_request_free(relay->down);
  relay->client->relay = nullptr;
  g_calls->Give();
  delete relay;
}

void AddErrorJson(evbuffer* out, const std::string& message) {
  std::string json = ErrorJson(message.c_str());
  evbuffer_add(out, json.data(), json.size());
}

// ---- what no route of Triton's may be sent: JSON nested past a depth (Triton's parser and its reading of "data"
// recurse once a level: a body of a million '[' exhausts its stack), and a compressed body that inflates past the body
// limit (Triton inflates it whole, and 2.51 reads its length as a 32-bit number).

constexpr int kMaxJsonDepth = 64;

class DepthCheck : public rapidjson::BaseReaderHandler<rapidjson::UTF8<>, DepthCheck> {
 public:
  bool StartObject() { return Deeper(); }
  bool EndObject(rapidjson::SizeType) { return Shallower(); }
  bool StartArray() { return Deeper(); }
  bool EndArray(rapidjson::SizeType) { return Shallower(); }
  bool too_deep() const { return too_deep_; }

 private:
  bool Deeper() { return !(too_deep_ = ++depth_ > kMaxJsonDepth); }
  bool Shallower() {
    --depth_;
    return true;
  }
  int depth_ = 0;
  bool too_deep_ = false;
};

// Why `size` bytes at `json` may not reach Triton, empty when they may: nested deeper than kMaxJsonDepth (read as far
// as they are JSON, without recursion), or, when `strict`, not JSON at all.
std::string JsonRefusal(const char* json, size_t size, bool strict) {
  rapidjson::MemoryStream stream(json, size);
  DepthCheck check;
  rapidjson::Reader reader;
  if (strict)
    reader.Parse<rapidjson::kParseIterativeFlag>(stream, check);
  else
    reader.Parse<rapidjson::kParseIterativeFlag | rapidjson::kParseStopWhenDoneFlag>(stream, check);
  if (check.too_deep()) return "body: JSON nested more than " + std::to_string(kMaxJsonDepth) + " levels deep";
  if (!strict || !reader.HasParseError()) return "";
  return std::string("body: not JSON (") + rapidjson::GetParseError_En(reader.GetParseErrorCode()) + " at byte " +
         std::to_string(reader.GetErrorOffset()) + ")";
}

void RefuseWith(evhttp_request* request, int code, const char* reason, const std::string& message) {
  g_refusals.Refused(message.c_str());
  evhttp_add_header(evhttp_request_get_output_headers(request), "Content-Type", "application/json");
  AddErrorJson(evhttp_request_get_output_buffer(request), message);
  evhttp_send_reply(request, code, reason, nullptr);
  ReleaseBody(request);
  g_calls->Give();
}

// The body inflated in place (Content-Encoding gzip or deflate, as Triton reads them); false when it was refused: it
// inflates past the body limit, or it is not what it says (Triton 2.51 keeps what it inflated of such a body).
bool Inflate(evhttp_request* request, const char* encoding) {
  evbuffer* input = evhttp_request_get_input_buffer(request);
  size_t size = evbuffer_get_length(input);
  z_stream stream{};
  if (inflateInit2(&stream, 15 | 32) != Z_OK) {
    RefuseWith(request, 503, "Service Unavailable", "body: cannot be inflated now; try again");
    return false;
  }
  stream.next_in = evbuffer_pullup(input, -1);
  stream.avail_in = static_cast<uInt>(size);
  evbuffer* inflated = evbuffer_new();
  size_t limit = static_cast<size_t>(g_options.max_body_bytes);
  int status = Z_OK;
  long taken = 0;  // of g_body_memory, for the inflated bytes
  bool budget = true;
  while (status == Z_OK && evbuffer_get_length(inflated) <= limit) {
    constexpr long kStep = 64 * 1024;
    if (evbuffer_get_length(inflated) + kStep > static_cast<size_t>(taken)) {
      if (!(budget = HoldBody(request, kStep))) break;
      taken += kStep;
    }
    evbuffer_iovec space;
    if (evbuffer_reserve_space(inflated, kStep, &space, 1) < 1) break;
    if (space.iov_len > static_cast<size_t>(kStep)) space.iov_len = kStep;  // libevent may offer more than asked
    stream.next_out = static_cast<Bytef*>(space.iov_base);
    stream.avail_out = static_cast<uInt>(space.iov_len);
    status = inflate(&stream, Z_NO_FLUSH);
    space.iov_len -= stream.avail_out;
    evbuffer_commit_space(inflated, &space, 1);
    if (status == Z_BUF_ERROR && stream.avail_in == 0) break;
  }
  inflateEnd(&stream);
  bool over = evbuffer_get_length(inflated) > limit;
  long kept = static_cast<long>(evbuffer_get_length(inflated));
  if (budget && status == Z_STREAM_END && !over) {
    evbuffer_drain(input, size);
    evbuffer_add_buffer(input, inflated);
    evhttp_remove_header(evhttp_request_get_input_headers(request), "Content-Encoding");
    // The request holds its inflated body now, and no longer the compressed one.
    g_body_memory->Give(TakeBodyBytes(request) - kept);
    HoldBody(request, 0);
    (*t_body_bytes)[request] = kept;
  }
  evbuffer_free(inflated);
  if (!budget) {
    RefuseWith(request, 503, "Service Unavailable",
               "body: the request bodies in flight hold the memory set aside for them (--max-body-memory-bytes " +
                   std::to_string(g_body_memory->max()) + "); try again");
    return false;
  }
  if (over)
    RefuseWith(request, 413, "Payload Too Large",
               std::string("body: more than ") + std::to_string(limit) + " bytes once inflated (Content-Encoding " +
                   encoding + ")");
  else if (status != Z_STREAM_END)
    RefuseWith(request, 400, "Bad Request",
               std::string("body: not a whole ") + encoding + " stream (Content-Encoding " + encoding + ")");
  return status == Z_STREAM_END && !over;
}

// RFC 9110 12.4.2: a weight is "q=" and 0 to 1 with at most three decimals. Triton 2.51 reads it with std::stod and
// dies of the exception a value like 1e999 throws.
bool ValidWeight(std::string weight) {
  while (!weight.empty() && (weight.back() == ' ' || weight.back() == '\t')) weight.pop_back();
  size_t start = weight.find_first_not_of(" \t");
  weight = start == std::string::npos ? "" : weight.substr(start);
  if (weight.size() < 2 || (weight[0] != 'q' && weight[0] != 'Q') || weight[1] != '=') return true;  // not a weight
  std::string value = weight.substr(2);
  if (value.empty() || value.size() > 5 || (value[0] != '0' && value[0] != '1')) return false;
  if (value.size() == 1) return true;
  if (value[1] != '.') return false;
  for (size_t i = 2; i < value.size(); ++i)
    if (value[i] < '0' || value[i] > '9' || (value[0] == '1' && value[i] != '0')) return false;
  return true;
}

bool ValidAcceptEncoding(const char* header) {
  std::istringstream codings(header);
  for (std::string coding; std::getline(codings, coding, ',');) {
    std::istringstream parameters(coding);
    std::string parameter;
    std::getline(parameters, parameter, ';');  // the coding itself
    while (std::getline(parameters, parameter, ';'))
      if (!ValidWeight(parameter)) return false;
  }
  return true;
}

// A model is a directory of a model repository: its name is at most NAME_MAX bytes.
constexpr size_t kMaxModelName = 255;

// False when the request was refused here.
bool GuardBody(evhttp_request* request) {
  evkeyvalq* headers = evhttp_request_get_input_headers(request);
  const char* uri = evhttp_request_get_uri(request);
  static const char kModels[] = "/v2/models/";
  if (uri != nullptr && strncmp(uri, kModels, sizeof kModels - 1) == 0) {
    size_t length = strcspn(uri + sizeof kModels - 1, "/?#");
    if (length > kMaxModelName) {
      RefuseWith(request, 400, "Bad Request",
                 "model name: " + std::to_string(length) + " bytes, longer than a model's name can be (" +
                     std::to_string(kMaxModelName) + ")");
      return false;
    }
  }
  if (!HoldBody(request, static_cast<long>(evbuffer_get_length(evhttp_request_get_input_buffer(request))))) {
    RefuseWith(request, 503, "Service Unavailable",
               "body: the request bodies in flight hold the memory set aside for them (--max-body-memory-bytes " +
                   std::to_string(g_body_memory->max()) + "); try again");
    return false;
  }
  const char* accept = evhttp_find_header(headers, "Accept-Encoding");
  if (accept != nullptr && !ValidAcceptEncoding(accept)) {
    RefuseWith(request, 400, "Bad Request",
               "Accept-Encoding: a weight (q=) must be a number from 0 to 1 with at most three decimals");
    return false;
  }
  // One of each: libevent and Triton read the first, a proxy before them may read the last (RFC 9112 6.3).
  int lengths = 0, encodings = 0;
  for (evkeyval* header = headers->tqh_first; header != nullptr; header = header->next.tqe_next) {
    lengths += evutil_ascii_strcasecmp(header->key, "Content-Length") == 0;
    encodings += evutil_ascii_strcasecmp(header->key, "Content-Encoding") == 0;
  }
  if (lengths > 1 || encodings > 1) {
    evhttp_add_header(evhttp_request_get_output_headers(request), "Connection", "close");
    RefuseWith(request, 400, "Bad Request",
               std::string(lengths > 1 ? "Content-Length" : "Content-Encoding") + ": given " +
                   std::to_string(lengths > 1 ? lengths : encodings) + " times; a request has one");
    return false;
  }
  const char* encoding = evhttp_find_header(headers, "Content-Encoding");
  if (encoding != nullptr && (encoding[0] == '\0' || strcmp(encoding, "identity") == 0)) {
    // No coding, as Triton reads it.
    evhttp_remove_header(headers, "Content-Encoding");
    encoding = nullptr;
  }
  if (encoding != nullptr && strcmp(encoding, "gzip") != 0 && strcmp(encoding, "deflate") != 0) {
    // Triton answers any other coding 501, as if the server lacked something a client may expect of it.
    RefuseWith(request, 415, "Unsupported Media Type",
               std::string("Content-Encoding: '") + encoding + "' is not a coding the server reads (gzip, deflate)");
    return false;
  }
  evbuffer* input = evhttp_request_get_input_buffer(request);
  if (evbuffer_get_length(input) == 0) return true;
  if (encoding != nullptr) {
    std::string named = encoding;
    if (!Inflate(request, named.c_str())) return false;
  }
  size_t size = evbuffer_get_length(input);
  // With binary data after it, only the JSON head is Triton's to parse; only its infer route reads the head's length
  // (generate and the others parse the whole body).
  const char* head = evhttp_find_header(headers, "Inference-Header-Content-Length");
  const char* path = uri != nullptr ? uri : "";
  size_t path_length = strcspn(path, "?#");
  static const char kInfer[] = "/infer";
  bool infer_route = path_length >= sizeof kInfer - 1 &&
                     memcmp(path + path_length - (sizeof kInfer - 1), kInfer, sizeof kInfer - 1) == 0;
  if (head != nullptr && infer_route) {
    char* end = nullptr;
    unsigned long long parsed = strtoull(head, &end, 10);
    if (end != head && *end == '\0' && parsed > 0 && parsed < size) size = parsed;
  }
  const char* body = reinterpret_cast<const char*>(evbuffer_pullup(input, -1));
  // Every body Triton reads is JSON (POST: infer, generate, the repository, logging, trace, shared memory). Its own
  // reader takes NaN and Infinity, which no check of a shape here has then seen, and answers what it cannot parse 500.
  std::string refusal = JsonRefusal(body, size, evhttp_request_get_command(request) == EVHTTP_REQ_POST);
  if (refusal.empty()) return true;
  RefuseWith(request, 400, "Bad Request", refusal);
  return false;
}

// ---- inference through Triton's C API

TRITONSERVER_ResponseAllocator* g_allocator = nullptr;
// Request parameters passed on to the model besides those of the protocol (--request-parameters): the custom ones
// the served models read. Any other is refused: it would do nothing, and a caller who sent it expects it to.
std::unordered_set<std::string>& g_custom_parameters = *new std::unordered_set<std::string>;
// How long a model's configuration is taken as known (a reload may change it); a refusal always reads it afresh.
constexpr double kShapeSeconds = 1.0;

// One request answered in process: it lives until Triton has released the request and its answer has been sent.
struct InferCall {
  Worker* worker = nullptr;
  evhttp_request* down = nullptr;
  evbuffer* body = nullptr;  // the request's body, moved here once Triton has it: binary inputs point into it
  long body_bytes = 0;  // what it holds of g_body_memory, given back with it
  std::vector<std::string> serialized;  // inputs given as JSON data, as Triton reads them
  std::unordered_map<std::string, OutputKind> kinds;
  OutputKind default_kind = OutputKind::kJson;
  std::atomic<int> pending{2};  // Triton's release of the request, and the answer sent
  int code = 200;
  bool answered = false, has_binary = false;
  size_t json_size = 0;
  std::string answer;
};

void FinishCall(InferCall* call) {
  if (call->pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  evbuffer_free(call->body);
  g_body_memory->Give(call->body_bytes);
  delete call;
}

// On the worker's thread: the answer Triton's thread wrote.
void SendAnswer(void* arg) {
  auto* call = static_cast<InferCall*>(arg);
  evkeyvalq* headers = evhttp_request_get_output_headers(call->down);
  if (call->code == 200 && call->has_binary) {
    evhttp_add_header(headers, "Content-Type", "application/octet-stream");
    evhttp_add_header(headers, "Inference-Header-Content-Length", std::to_string(call->json_size).c_str());
  } else if (call->code == 200) {
    evhttp_add_header(headers, "Content-Type", "application/json");
  } else {
    // What Triton's front end answers a refusal of Triton's with (its server's default type).
    evhttp_add_header(headers, "Content-Type", "text/plain");
  }
  evbuffer_add(evhttp_request_get_output_buffer(call->down), call->answer.data(), call->answer.size());
  static const char* const kReasons[] = {"OK", "Bad Request", "Not Found", "Internal Server Error",
                                         "Not Implemented", "Service Unavailable"};
  int code = call->code;
  const char* reason = code == 200 ? kReasons[0] : code == 400 ? kReasons[1] : code == 404 ? kReasons[2]
                       : code == 500 ? kReasons[3] : code == 501 ? kReasons[4] : kReasons[5];
  evhttp_send_reply(call->down, code, reason, nullptr);
  g_calls->Give();
  FinishCall(call);
}

void Released(TRITONSERVER_InferenceRequest* request, const uint32_t, void* userp) {
  TRITONSERVER_InferenceRequestDelete(request);
  FinishCall(static_cast<InferCall*>(userp));
}

// On Triton's thread: the answer written here, as Triton's front end writes it on its.
void Answered(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  auto* call = static_cast<InferCall*>(userp);
  if (response != nullptr) {
    TRITONSERVER_Error* error = nullptr;
    if (call->answered) {
      error = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "expected a single response, got 2");
    } else {
      call->answered = true;
      error = TRITONSERVER_InferenceResponseError(response);
      if (error == nullptr)
        error = WriteResponse(
            response,
            [call](const char* name) {
              auto kind = call->kinds.find(name);
              return kind != call->kinds.end() ? kind->second : call->default_kind;
            },
            &call->answer, &call->json_size, &call->has_binary);
    }
    TRITONSERVER_InferenceResponseDelete(response);
    if (error != nullptr) {
      call->code = HttpCode(error);
      call->answer = ErrorJson(TRITONSERVER_ErrorMessage(error));
      TRITONSERVER_ErrorDelete(error);
    }
  }
  if (!(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)) return;
  if (!call->answered) {
    call->code = 500;
    call->answer = ErrorJson("expected a single response, got 0");
  }
  call->worker->Post(SendAnswer, call);
}

void Refuse(evhttp_request* request, const std::string& message) { RefuseWith(request, 400, "Bad Request", message); }

const ModelShape* Worker::Shape(const std::string& model, int64_t version, bool fresh) {
  std::string key = model + '\n' + std::to_string(version);
  double now = Now();
  auto known = shapes_.find(key);
  if (known != shapes_.end() && !fresh && now - known->second.first < kShapeSeconds) return &known->second.second;
  TRITONSERVER_Message* message = nullptr;
  TRITONSERVER_Error* error = TRITONSERVER_ServerModelConfig(g_server, model.c_str(), version, 1, &message);
  const char* json = nullptr;
  size_t size = 0;
  if (error == nullptr) error = TRITONSERVER_MessageSerializeToJson(message, &json, &size);
  ModelShape shape;
  bool read = error == nullptr && ReadModelShape(json, size, &shape);
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
  if (message != nullptr) TRITONSERVER_MessageDelete(message);
  if (!read) {
    shapes_.erase(key);
    return nullptr;
  }
  // Names of models come from callers: the map is bounded by dropping all when full.
  if (shapes_.size() >= 1024) shapes_.clear();
  auto& entry = shapes_[key];
  entry = {now, std::move(shape)};
  return &entry.second;
}

// The values in a tensor's "data" (nested arrays: nested no deeper than kMaxJsonDepth, checked before).
uint64_t CountValues(const rapidjson::Value& data) {
  if (!data.IsArray()) return 1;
  uint64_t count = 0;
  for (const auto& element : data.GetArray()) count += CountValues(element);
  return count;
}

// Why a request cannot be valid for `shape`, naming the field; empty when it may be.
std::string Check(const rapidjson::Document& doc, const std::string& model, const ModelShape& shape,
                  bool* classify_numeric) {
  const auto& inputs = doc["inputs"];
  if (!shape.inputs.empty() && inputs.Size() > shape.inputs.size())
    return "inputs: " + std::to_string(inputs.Size()) + " given, and model '" + model + "' has " +
           std::to_string(shape.inputs.size());
  for (rapidjson::SizeType i = 0; i < inputs.Size(); ++i) {
    const auto& input = inputs[i];
    std::string field = "inputs[" + std::to_string(i) + "].shape";
    const auto& dims = input["shape"];
    if (dims.Size() > kMaxRank)
      return field + ": " + std::to_string(dims.Size()) + " dimensions, more than the " + std::to_string(kMaxRank) +
             " any input takes";
    for (const auto& d : dims.GetArray())
      if (!d.IsUint64() || d.GetUint64() > static_cast<uint64_t>(INT64_MAX))
        return field + ": every dimension must be a whole number from 0";
    auto config = shape.inputs.find(input["name"].GetString());
    const bool configured = config != shape.inputs.end() && !config->second.ragged && !config->second.dims.empty();
    const std::vector<int64_t> none;
    const std::vector<int64_t>& want = configured ? config->second.dims : none;
    size_t batch = shape.max_batch_size > 0 ? 1 : 0;
    if (configured && dims.Size() != want.size() + batch)
      return field + ": " + std::to_string(dims.Size()) + " dimensions, and input '" + config->first + "' of model '" +
             model + "' has " + std::to_string(want.size() + batch);
    if (configured && batch && static_cast<int64_t>(dims[0].GetUint64()) > shape.max_batch_size)
      return field + ": a batch of " + std::to_string(dims[0].GetUint64()) + ", more than model '" + model +
             "' takes (" + std::to_string(shape.max_batch_size) + ")";
    for (size_t d = 0; configured && d < want.size(); ++d)
      if (want[d] >= 0 && static_cast<int64_t>(dims[batch + d].GetUint64()) != want[d])
        return field + ": dimension " + std::to_string(batch + d) + " is " +
               std::to_string(dims[batch + d].GetUint64()) + ", and input '" + config->first + "' of model '" + model +
               "' has " + std::to_string(want[d]);
    auto data = input.FindMember("data");
    if (data != input.MemberEnd()) {
      // Triton sizes the tensor from its shape before it counts the values (a shape of 2^40 rows: std::bad_alloc).
      uint64_t elements = 1, values = CountValues(data->value);
      for (const auto& d : dims.GetArray())
        if (__builtin_mul_overflow(elements, d.GetUint64(), &elements)) elements = UINT64_MAX;
      if (elements != values)
        return "inputs[" + std::to_string(i) + "].data: " + std::to_string(values) + " values, and its shape holds " +
               (elements == UINT64_MAX ? std::string("more than 2^64") : std::to_string(elements));
    }
  }
  auto outputs = doc.FindMember("outputs");
  if (outputs == doc.MemberEnd()) return "";
  if (!shape.outputs.empty() && outputs->value.Size() > shape.outputs.size())
    return "outputs: " + std::to_string(outputs->value.Size()) + " requested, and model '" + model + "' has " +
           std::to_string(shape.outputs.size());
  for (rapidjson::SizeType i = 0; i < outputs->value.Size(); ++i) {
    const auto& output = outputs->value[i];
    std::string field = "outputs[" + std::to_string(i) + "]";
    std::string name = output["name"].GetString();
    auto config = shape.outputs.find(name);
    if (!shape.outputs.empty() && config == shape.outputs.end())
      return field + ".name: model '" + model + "' has no output '" + name + "'";
    auto parameters = output.FindMember("parameters");
    if (parameters == output.MemberEnd() || !parameters->value.HasMember("classification")) continue;
    if (config == shape.outputs.end() || config->second.datatype == "BYTES" || config->second.datatype.empty())
      return field + ".parameters.classification: output '" + name + "' of model '" + model + "' is " +
             (config == shape.outputs.end() || config->second.datatype.empty() ? std::string("of unknown type")
                                                                                : config->second.datatype) +
             ", and classification needs a numeric output";
    *classify_numeric = true;
  }
  return "";
}

// Why a request Triton will read cannot be valid because it asks for the classification of an output that is not
// numeric; empty when it does not.
std::string GuardClassification(const rapidjson::Document& doc, const std::string& model, int64_t version,
                                Worker* worker) {
  if (!doc.IsObject()) return "";
  auto outputs = doc.FindMember("outputs");
  if (outputs == doc.MemberEnd() || !outputs->value.IsArray()) return "";
  const ModelShape* shape = nullptr;
  for (rapidjson::SizeType i = 0; i < outputs->value.Size(); ++i) {
    const auto& output = outputs->value[i];
    if (!output.IsObject() || !output.HasMember("name") || !output["name"].IsString()) continue;
    auto parameters = output.FindMember("parameters");
    if (parameters == output.MemberEnd() || !parameters->value.IsObject() ||
        !parameters->value.HasMember("classification"))
      continue;
    if (shape == nullptr && (shape = worker->Shape(model, version, true)) == nullptr) return "";
    auto config = shape->outputs.find(output["name"].GetString());
    if (config != shape->outputs.end() && config->second.datatype != "BYTES") continue;
    return "outputs[" + std::to_string(i) + "].parameters.classification: output '" + output["name"].GetString() +
           "' of model '" + model + "' is " +
           (config == shape->outputs.end() ? std::string("not one of its outputs") : config->second.datatype) +
           ", and classification needs a numeric output";
  }
  return "";
}

// BYTES elements (strings, in nested arrays) as Triton serializes them; false where Triton would refuse.
bool SerializeBytes(const rapidjson::Value& data, std::string* out) {
  if (data.IsArray()) {
    for (const auto& element : data.GetArray())
      if (!SerializeBytes(element, out)) return false;
    return true;
  }
  if (!data.IsString()) return false;
  uint32_t length = data.GetStringLength();
  out->append(reinterpret_cast<const char*>(&length), sizeof length);
  out->append(data.GetString(), length);
  return true;
}

template <typename T>
bool SerializeNumbers(const rapidjson::Value& data, TRITONSERVER_DataType type, std::string* out) {
  if (data.IsArray()) {
    for (const auto& element : data.GetArray())
      if (!SerializeNumbers<T>(element, type, out)) return false;
    return true;
  }
  T value;
  if (type == TRITONSERVER_TYPE_BOOL) {
    if (!data.IsBool()) return false;
    value = static_cast<T>(data.GetBool() ? 1 : 0);
  } else if (type == TRITONSERVER_TYPE_FP32 || type == TRITONSERVER_TYPE_FP64) {
    if (!data.IsNumber()) return false;
    value = static_cast<T>(data.GetDouble());
  } else if (type == TRITONSERVER_TYPE_UINT8 || type == TRITONSERVER_TYPE_UINT16 || type == TRITONSERVER_TYPE_UINT32 ||
             type == TRITONSERVER_TYPE_UINT64) {
    if (!data.IsUint64()) return false;
    value = static_cast<T>(data.GetUint64());
  } else {
    if (!data.IsInt64()) return false;
    value = static_cast<T>(data.GetInt64());
  }
  out->append(reinterpret_cast<const char*>(&value), sizeof value);
  return true;
}

bool SerializeJsonData(const rapidjson::Value& data, TRITONSERVER_DataType type, int64_t elements, std::string* out) {
  bool ok;
  switch (type) {
    case TRITONSERVER_TYPE_BYTES: return SerializeBytes(data, out);
    case TRITONSERVER_TYPE_BOOL: case TRITONSERVER_TYPE_UINT8: ok = SerializeNumbers<uint8_t>(data, type, out); break;
    case TRITONSERVER_TYPE_UINT16: ok = SerializeNumbers<uint16_t>(data, type, out); break;
    case TRITONSERVER_TYPE_UINT32: ok = SerializeNumbers<uint32_t>(data, type, out); break;
    case TRITONSERVER_TYPE_UINT64: ok = SerializeNumbers<uint64_t>(data, type, out); break;
    case TRITONSERVER_TYPE_INT8: ok = SerializeNumbers<int8_t>(data, type, out); break;
    case TRITONSERVER_TYPE_INT16: ok = SerializeNumbers<int16_t>(data, type, out); break;
    case TRITONSERVER_TYPE_INT32: ok = SerializeNumbers<int32_t>(data, type, out); break;
    case TRITONSERVER_TYPE_INT64: ok = SerializeNumbers<int64_t>(data, type, out); break;
    case TRITONSERVER_TYPE_FP32: ok = SerializeNumbers<float>(data, type, out); break;
    case TRITONSERVER_TYPE_FP64: ok = SerializeNumbers<double>(data, type, out); break;
    default: return false;
  }
  return ok && static_cast<int64_t>(out->size()) == elements * TRITONSERVER_DataTypeByteSize(type);
}

// "/v2/models/NAME[/versions/V]/infer": the model's name and version (-1: Triton's choice); false for any other path,
// and for names and versions Triton's own front end reads differently (escapes, versions that are no number).
bool InferPath(const char* path, std::string* model, int64_t* version) {
  static const char kPrefix[] = "/v2/models/";
  if (path == nullptr || strncmp(path, kPrefix, sizeof kPrefix - 1) != 0) return false;
  std::string rest = path + sizeof kPrefix - 1;
  static const std::string kInfer = "/infer";
  if (rest.size() <= kInfer.size() || rest.compare(rest.size() - kInfer.size(), kInfer.size(), kInfer) != 0)
    return false;
  rest.resize(rest.size() - kInfer.size());
  size_t slash = rest.find('/');
  *model = rest.substr(0, slash);
  *version = -1;
  if (model->empty() || model->find('%') != std::string::npos) return false;
  if (slash == std::string::npos) return true;
  static const std::string kVersions = "/versions/";
  if (rest.compare(slash, kVersions.size(), kVersions) != 0) return false;
  std::string digits = rest.substr(slash + kVersions.size());
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *version = std::stoll(digits);
  return true;
}

// True when the request is answered here: through Triton's C API, or refused (400) as one that cannot be valid.
// False sends it to Triton's own front end: any request this reading does not take, and any Triton refuses before
// running it (refused there again, in Triton's words).
bool InferInProcess(Worker* worker, evhttp_request* request) {
  if (evhttp_request_get_command(request) != EVHTTP_REQ_POST) return false;
  const evhttp_uri* uri = evhttp_request_get_evhttp_uri(request);
  std::string model;
  int64_t version;
  if (uri == nullptr || evhttp_uri_get_query(uri) != nullptr || !InferPath(evhttp_uri_get_path(uri), &model, &version))
    return false;
  evkeyvalq* headers = evhttp_request_get_input_headers(request);
  // Bodies in a coding this front does not read (it inflates gzip and deflate) were refused before.
  if (evhttp_find_header(headers, "Content-Encoding") != nullptr) return false;
  const char* accept = evhttp_find_header(headers, "Accept-Encoding");
  bool compress = accept != nullptr && (strstr(accept, "gzip") != nullptr || strstr(accept, "deflate") != nullptr);
  evbuffer* input = evhttp_request_get_input_buffer(request);
  size_t body_size = evbuffer_get_length(input);
  size_t header_size = body_size;
  const char* header_length = evhttp_find_header(headers, "Inference-Header-Content-Length");
  if (header_length != nullptr) {
    char* end = nullptr;
    errno = 0;
    unsigned long long parsed = strtoull(header_length, &end, 10);
    if (errno != 0 || end == header_length || *end != '\0' || header_length[0] == '-' || parsed == 0 ||
        parsed > body_size)
      return false;
    header_size = parsed;
  }
  if (header_size == 0) return false;
  const char* body = reinterpret_cast<const char*>(evbuffer_pullup(input, -1));
  rapidjson::Document doc;
  doc.Parse(body, header_size);
  if (doc.HasParseError()) {
    Refuse(request, NotJson(doc));
    return true;
  }
  bool tritons = false;
  std::string malformed = Malformed(doc, &tritons);
  if (!malformed.empty()) {
    Refuse(request, malformed);
    return true;
  }
  uint32_t txn = 0;
  TRITONSERVER_Error* txn_error =
      TRITONSERVER_ServerModelTransactionProperties(g_server, model.c_str(), version, &txn, nullptr);
  if (txn_error != nullptr) {
    TRITONSERVER_ErrorDelete(txn_error);  // an unknown model or version: refused by Triton in its words
  } else if (txn & TRITONSERVER_TXN_DECOUPLED) {
    // Triton answers 501, as if the server lacked something; it is the caller's choice of route.
    Refuse(request, "model '" + model + "' is decoupled: its answers come as a stream, which POST .../infer cannot "
                    "carry; send it through POST .../generate_stream or gRPC's ModelStreamInfer");
    return true;
  }
  if (tritons) {
    // Triton's to read, but never data short of its shape nor a classification of an output that is not numeric
    // (Triton 2.51 dies of either).
    std::string refusal = UnfilledShape(doc);
    if (refusal.empty()) refusal = GuardClassification(doc, model, version, worker);
    if (refusal.empty()) return false;
    Refuse(request, refusal);
    return true;
  }

  const ModelShape* shape = worker->Shape(model, version, false);
  if (shape == nullptr) {
    std::string refusal = UnfilledShape(doc);
    if (refusal.empty()) return false;
    Refuse(request, refusal);
    return true;
  }
  bool classify_numeric = false;
  std::string refusal = Check(doc, model, *shape, &classify_numeric);
  if (!refusal.empty() || classify_numeric) {
    // Before refusing, or letting a classification through, the configuration as it is now (a reload may have
    // changed it).
    shape = worker->Shape(model, version, true);
    if (shape == nullptr) return false;
    classify_numeric = false;
    refusal = Check(doc, model, *shape, &classify_numeric);
  }
  if (!refusal.empty()) {
    Refuse(request, refusal);
    return true;
  }
  auto* call = new InferCall;
  call->worker = worker;
  call->down = request;
  auto parameters = doc.FindMember("parameters");
  if (parameters != doc.MemberEnd()) {
    for (const auto& p : parameters->value.GetObject()) {
      std::string key = p.name.GetString();
      // Their types were checked by Malformed.
      if (key == "binary_data_output") {
        call->default_kind = p.value.GetBool() ? OutputKind::kBinary : OutputKind::kJson;
      } else if (key == "priority" || key == "timeout") {
      } else if (key.compare(0, 7, "triton_") == 0 || key == "sequence_id" || key == "sequence_start" ||
                 key == "sequence_end") {
        // Triton's to apply (sequences), or to refuse in its words. Any other key, `sequence_foo` too, Triton would
        // pass to the model: the rule below, as on the gRPC front.
        delete call;
        return false;
      } else if (!g_custom_parameters.count(key)) {
        delete call;
        std::string known;
        for (const auto& name : g_custom_parameters) known += (known.empty() ? "" : ", ") + name;
        Refuse(request, "parameters." + key + ": not a parameter of the protocol nor one the served models read (" +
                            (known.empty() ? std::string("none") : known) + ")");
        return true;
      }
    }
  }
  auto outputs = doc.FindMember("outputs");
  if (outputs != doc.MemberEnd())
    for (const auto& output : outputs->value.GetArray()) {
      auto parameters = output.FindMember("parameters");
      OutputKind kind = OutputKind::kJson;
      if (parameters != output.MemberEnd()) {
        auto binary = parameters->value.FindMember("binary_data");
        if (binary != parameters->value.MemberEnd() && binary->value.GetBool()) kind = OutputKind::kBinary;
      }
      call->kinds[output["name"].GetString()] = kind;
    }
  if (compress || classify_numeric) {
    delete call;
    return false;
  }

  TRITONSERVER_InferenceRequest* irequest = nullptr;
  TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestNew(&irequest, g_server, model.c_str(), version);
  // A request this front refuses itself, naming the field (Triton answers data of the wrong type 500); what Triton
  // refuses 4xx before running it goes there, to be refused in its words.
  std::string refused;
  auto id = doc.FindMember("id");
  if (error == nullptr && id != doc.MemberEnd())
    error = TRITONSERVER_InferenceRequestSetId(irequest, id->value.GetString());
  if (error == nullptr && parameters != doc.MemberEnd())
    for (const auto& p : parameters->value.GetObject()) {
      std::string key = p.name.GetString();
      if (error != nullptr) break;
      if (key == "priority")
        error = TRITONSERVER_InferenceRequestSetPriorityUInt64(irequest, p.value.GetUint64());
      else if (key == "timeout")
        error = TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(irequest, p.value.GetUint64());
      else if (key == "binary_data_output")
        continue;
      else if (p.value.IsString())
        error = TRITONSERVER_InferenceRequestSetStringParameter(irequest, key.c_str(), p.value.GetString());
      else if (p.value.IsInt64())
        error = TRITONSERVER_InferenceRequestSetIntParameter(irequest, key.c_str(), p.value.GetInt64());
      else if (p.value.IsBool())
        error = TRITONSERVER_InferenceRequestSetBoolParameter(irequest, key.c_str(), p.value.GetBool());
      else
        error = TRITONSERVER_InferenceRequestSetDoubleParameter(irequest, key.c_str(), p.value.GetDouble());
    }
  size_t offset = header_size;
  const auto& inputs = doc["inputs"];
  call->serialized.reserve(inputs.Size());
  for (rapidjson::SizeType i = 0; error == nullptr && i < inputs.Size(); ++i) {
    const auto& input = inputs[i];
    const char* name = input["name"].GetString();
    TRITONSERVER_DataType type = TRITONSERVER_StringToDataType(input["datatype"].GetString());
    std::vector<int64_t> dims;
    int64_t elements = 1;
    for (const auto& d : input["shape"].GetArray()) {
      dims.push_back(static_cast<int64_t>(d.GetUint64()));
      if (__builtin_mul_overflow(elements, dims.back(), &elements)) elements = -1;
    }
    std::string field = "inputs[" + std::to_string(i) + "]";
    if (elements < 0 || type == TRITONSERVER_TYPE_INVALID || type == TRITONSERVER_TYPE_FP16 ||
        type == TRITONSERVER_TYPE_BF16) {
      error = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "");
      break;
    }
    error = TRITONSERVER_InferenceRequestAddInput(irequest, name, type, dims.data(), dims.size());
    if (error != nullptr) break;
    auto parameters = input.FindMember("parameters");
    auto binary_size = parameters != input.MemberEnd() ? parameters->value.FindMember("binary_data_size")
                                                       : input.MemberEnd();
    if (parameters != input.MemberEnd() && binary_size != parameters->value.MemberEnd()) {
      uint64_t size = binary_size->value.GetUint64();
      if (size > body_size - offset) {
        error = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "");
        break;
      }
      error = TRITONSERVER_InferenceRequestAppendInputData(irequest, name, size > 0 ? body + offset : nullptr, size,
                                                           TRITONSERVER_MEMORY_CPU, 0);
      offset += size;
    } else if (elements == 0) {
      error = TRITONSERVER_InferenceRequestAppendInputData(irequest, name, nullptr, 0, TRITONSERVER_MEMORY_CPU, 0);
    } else {
      call->serialized.emplace_back();
      std::string& data = call->serialized.back();
      if (!SerializeJsonData(input["data"], type, elements, &data)) {
        refused = field + ".data: must hold " + std::to_string(elements) + " " + input["datatype"].GetString() +
                  (type == TRITONSERVER_TYPE_BYTES ? " strings" : type == TRITONSERVER_TYPE_BOOL ? " true or false"
                                                                                               : " numbers") +
                  " (in nested arrays), as its shape and datatype say";
        break;
      }
      error = TRITONSERVER_InferenceRequestAppendInputData(irequest, name, data.data(), data.size(),
                                                           TRITONSERVER_MEMORY_CPU, 0);
    }
  }
  if (error == nullptr && refused.empty() && offset != body_size)
    error = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "");
  if (!refused.empty()) {
    if (irequest != nullptr) TRITONSERVER_InferenceRequestDelete(irequest);
    if (error != nullptr) TRITONSERVER_ErrorDelete(error);
    delete call;
    Refuse(request, refused);
    return true;
  }
  for (auto& [name, kind] : call->kinds)
    if (error == nullptr) error = TRITONSERVER_InferenceRequestAddRequestedOutput(irequest, name.c_str());
  if (error == nullptr) error = TRITONSERVER_InferenceRequestSetReleaseCallback(irequest, Released, call);
  if (error == nullptr)
    error = TRITONSERVER_InferenceRequestSetResponseCallback(irequest, g_allocator, nullptr, Answered, call);
  if (error == nullptr) {
    call->body = evbuffer_new();
    error = TRITONSERVER_ServerInferAsync(g_server, irequest, nullptr);
    if (error == nullptr) {
      // Moved, not copied: the binary inputs Triton reads stay where they are.
      evbuffer_add_buffer(call->body, input);
      call->body_bytes = TakeBodyBytes(request);
      return true;
    }
    evbuffer_free(call->body);
  }
  TRITONSERVER_ErrorDelete(error);
  if (irequest != nullptr) TRITONSERVER_InferenceRequestDelete(irequest);
  delete call;
  return false;
}

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

[[noreturn]] void Usage(const std::string& problem) {
  Log("%s", problem.c_str());
  Log("options: --listen HOST:PORT --upstream HOST:PORT --max-body-bytes N [--max-header-bytes N] [--threads N] "
      "[--idle-seconds S] [--head-seconds S] [--request-seconds S] [--max-connections N] [--max-connections-per-peer N] [--max-calls N] "
      "[--drain-seconds S] "
      "[--request-parameters NAME,...] [--relay-only 0|1]");
  throw std::invalid_argument(problem);
}

Options Parse(const std::vector<std::string>& words) {
  using front_options::Number;
  Options options;
  try {
    front_options::Read(words, options, [&options](const std::string& name, const char* value) {
      if (name == "--max-body-bytes")
        options.max_body_bytes = Number(name, value, 1, LONG_MAX / 2);
      else if (name == "--max-header-bytes")
        options.max_header_bytes = Number(name, value, 1024, 1 << 20);
      else if (name == "--idle-seconds")
        options.idle_seconds = Number(name, value, 1, 86400);
      else if (name == "--request-seconds")
        options.request_seconds = Number(name, value, 1, 86400);
      else if (name == "--head-seconds")
        options.head_seconds = Number(name, value, 1, 86400);
      else if (name == "--max-connections")
        options.max_connections = Number(name, value, 1, 1000000);
      else if (name == "--max-connections-per-peer")
        options.max_connections_per_peer = Number(name, value, 1, 1000000);
      else if (name == "--max-calls")
        options.max_calls = Number(name, value, 1, 1000000);
      else if (name == "--max-body-memory-bytes")
        options.max_body_memory_bytes = Number(name, value, 1, LONG_MAX / 2);
      else
        return false;
      return true;
    });
  } catch (const front_options::BadOption& bad) {
    Usage(bad.what());
  }
  if (options.max_body_bytes == 0) Usage("--max-body-bytes is required");
  return options;
}

// The listening socket (shared by every worker's HTTP server), the workers, and their threads. Never destroyed.
struct Endpoint {
  evutil_socket_t listener = -1;
  std::vector<Worker*> workers;
  std::vector<evhttp_bound_socket*> bound;
  std::atomic<int> running{0};
};
Endpoint& g_endpoint = *new Endpoint;

evutil_socket_t OpenListener(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  std::string port = address.substr(address.rfind(':') + 1);
  evutil_addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_NUMERICHOST;
  evutil_addrinfo* found = nullptr;
  if (evutil_getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) return -1;
  evutil_socket_t fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  // Not SO_REUSEPORT: a port held by another process is an error here, not a port shared with it.
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  evutil_freeaddrinfo(found);
  return fd;
}

bool Listen() {
  g_calls = new Slots(g_options.max_calls);
  g_body_memory = new BodyMemory(g_options.max_body_memory_bytes);
  g_endpoint.listener = OpenListener(g_options.listen);
  if (g_endpoint.listener < 0) {
    Log("cannot listen on %s: %s", g_options.listen.c_str(), strerror(errno));
    return false;
  }
  for (long i = 0; i < g_options.threads; ++i) {
    auto* worker = new Worker;
    // Every worker accepts on the one socket: whichever is free takes the next connection.
    // Each its own descriptor of the socket: libevent closes the one it was given when that worker stops accepting.
    evutil_socket_t fd = i == 0 ? g_endpoint.listener : fcntl(g_endpoint.listener, F_DUPFD_CLOEXEC, 0);
    evhttp_bound_socket* bound = fd >= 0 ? evhttp_accept_socket_with_handle(worker->http(), fd) : nullptr;
    if (bound == nullptr) {
      Log("cannot accept on %s", g_options.listen.c_str());
      return false;
    }
    g_endpoint.bound.push_back(bound);
    g_endpoint.workers.push_back(worker);
  }
  for (Worker* worker : g_endpoint.workers) {
    ++g_endpoint.running;
    std::thread([worker] {
      worker->Run();
      --g_endpoint.running;
    }).detach();
  }
  Log("listening on %s%s, forwarding to tritonserver at %s: bodies up to %ld bytes, heads up to %ld, %ld thread(s), "
      "at most %ld requests in flight, %ld connections (%ld per peer), idle connections closed after %ld s, heads "
      "cut after %ld s",
      g_options.listen.c_str(),
      g_server != nullptr ? " in tritonserver's process (infer through its C API)" : " in tritonserver's process",
      g_options.upstream.c_str(), g_options.max_body_bytes, g_options.max_header_bytes, g_options.threads,
      g_options.max_calls, g_options.max_connections, g_options.max_connections_per_peer, g_options.idle_seconds,
      g_options.head_seconds);
  return true;
}

void DeleteBound(void* arg) {
  auto* pair = static_cast<std::pair<Worker*, evhttp_bound_socket*>*>(arg);
  evhttp_del_accept_socket(pair->first->http(), pair->second);
  delete pair;
}

void ExitLoop(void* arg) { event_base_loopexit(static_cast<Worker*>(arg)->base(), nullptr); }

void ReleaseWorker(void* arg) { static_cast<Worker*>(arg)->Release(); }
void LetTritonGo(void* arg) { static_cast<Worker*>(arg)->LetTritonGo(); }

// Triton's stop begins with its SIGTERM (or SIGINT) handler, which it installs just after its server exists: this front
// chains its own in front of it to learn when Triton's HTTP front end starts its wait (see Worker::Release).
int g_signal_fd = -1;
struct sigaction g_triton_handlers[2];
constexpr int kStopSignals[2] = {SIGTERM, SIGINT};

void OnStopSignal(int signum, siginfo_t* info, void* context) {
  int saved = errno;
  uint64_t one = 1;
  (void)!write(g_signal_fd, &one, sizeof one);
  errno = saved;
  const struct sigaction& triton = g_triton_handlers[signum == SIGTERM ? 0 : 1];
  if (triton.sa_flags & SA_SIGINFO)
    triton.sa_sigaction(signum, info, context);
  else if (triton.sa_handler != SIG_DFL && triton.sa_handler != SIG_IGN)
    triton.sa_handler(signum);
}

void WatchStop() {
  g_signal_fd = eventfd(0, EFD_CLOEXEC);
  if (g_signal_fd < 0) return;
  std::thread([] {
    bool chained[2] = {false, false};
    for (int tries = 0; tries < 60000 && !(chained[0] && chained[1]) && !g_stopping.load(); ++tries) {
      for (int i = 0; i < 2; ++i) {
        struct sigaction current {};
        if (chained[i] || sigaction(kStopSignals[i], nullptr, &current) != 0) continue;
        bool installed = (current.sa_flags & SA_SIGINFO) ? current.sa_sigaction != nullptr
                                                         : current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN;
        if (!installed) continue;
        g_triton_handlers[i] = current;
        struct sigaction mine = current;
        mine.sa_flags = (current.sa_flags & ~SA_RESETHAND) | SA_SIGINFO;
        mine.sa_sigaction = OnStopSignal;
        chained[i] = sigaction(kStopSignals[i], &mine, nullptr) == 0;
      }
      if (!(chained[0] && chained[1])) usleep(10 * 1000);
    }
    if (!chained[0]) {
      Log("cannot see tritonserver's stop coming: streams still running at its end may not be cut in time");
      return;
    }
    uint64_t count = 0;
    if (read(g_signal_fd, &count, sizeof count) != sizeof count) return;
    // --drain-seconds is Triton's exit timeout and 5 s. Triton's HTTP front end waits for at most the exit timeout,
    // and what it waits is taken from the time left to Triton's own drain and unload (past it, tritonserver exits 1):
    // its wait is let end at half the exit timeout, the relays cut 2 s before that (a generation notices its
    // cancellation at its next token).
    double half = static_cast<double>(std::max<long>(0, g_options.drain_seconds - 5)) / 2;
    double signalled = Now();
    auto wait_until = [](double when) {
      while (Now() < when && !g_stopping.load()) usleep(20 * 1000);
      return !g_stopping.load();  // false: Triton's wait is over already
    };
    if (!wait_until(signalled + std::max(0.0, half - 2))) return;
    for (Worker* worker : g_endpoint.workers) worker->Post(ReleaseWorker, worker);
    if (!wait_until(signalled + half)) return;
    for (Worker* worker : g_endpoint.workers) worker->Post(LetTritonGo, worker);
  }).detach();
}

}  // namespace http_front

using namespace http_front;

// ---- entry points for the preloaded hook (grpc_front_hook.c)

// 0 once listening; otherwise the reason is logged. `args`: the options, separated by spaces.
extern "C" __attribute__((visibility("default"))) int s2t_http_front_start(TRITONSERVER_Server* server,
                                                                           const char* args) {
  try {
    g_options = Parse(front_options::Words(args));
  } catch (const std::invalid_argument&) {
    return 2;
  }
  if (!g_options.relay_only) {
    for (const std::string& name : front_options::Names(g_options.request_parameters))
      g_custom_parameters.insert(name);
    TRITONSERVER_Error* error = TRITONSERVER_ResponseAllocatorNew(&g_allocator, AllocateOutput, ReleaseOutput, nullptr);
    if (error != nullptr) {
      Log("cannot make a response allocator: %s", TRITONSERVER_ErrorMessage(error));
      TRITONSERVER_ErrorDelete(error);
      return 1;
    }
    g_server = server;
  }
  if (!Listen()) return 1;
  WatchStop();
  return 0;
}

// Before Triton's own stop: no new connections; requests in flight are answered while Triton drains, and each
// answer closes its connection. Triton's own front end keeps answering until its stop returns.
extern "C" __attribute__((visibility("default"))) void s2t_http_front_stop_accepting() {
  if (g_endpoint.workers.empty() || g_stopping.exchange(true)) return;
  Log("stopping: %ld request(s) to tritonserver in flight", g_calls->held());
  for (size_t i = 0; i < g_endpoint.workers.size(); ++i)
    g_endpoint.workers[i]->Post(DeleteBound, new std::pair<Worker*, evhttp_bound_socket*>(g_endpoint.workers[i],
                                                                                         g_endpoint.bound[i]));
}

// After Triton's own stop returned: requests still in flight get what is left of --drain-seconds (bounded by 5 s
// here: Triton answers nothing more), then the workers' loops end. The workers and their objects stay (never freed).
extern "C" __attribute__((visibility("default"))) void s2t_http_front_end() {
  if (!g_stopping.load()) return;
  double deadline = Now() + std::min<long>(5, g_options.drain_seconds);
  while (g_calls->held() > 0 && Now() < deadline) usleep(10 * 1000);
  for (Worker* worker : g_endpoint.workers) worker->Post(ExitLoop, worker);
  deadline = Now() + 2;
  while (g_endpoint.running.load() > 0 && Now() < deadline) usleep(10 * 1000);
  if (g_calls->held() > 0)
    Log("stopped with %ld request(s) to tritonserver unanswered", g_calls->held());
  else
    Log("stopped");
}
