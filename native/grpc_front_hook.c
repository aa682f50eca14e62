// Preloaded into tritonserver (LD_PRELOAD) by `s2t serve`, always. It does two jobs:
//
// - It starts the public fronts inside Triton's own process: the gRPC front (libs2t_grpc_front.so,
//   native/grpc_front.cc) and, where built and asked for, the HTTP front (libs2t_http_front.so), as soon as Triton's
//   server object exists, and stops them around Triton's own stop. It wraps the two C API calls tritonserver's main
//   makes, TRITONSERVER_ServerNew and TRITONSERVER_ServerStop, and calls the real ones.
// - It guards Triton 2.51's front ends against the classification of a BYTES output (see
//   TRITONSERVER_DataTypeByteSize below), which any caller can ask for on either protocol.
//
// A front's library is opened with RTLD_LOCAL: the gRPC, Abseil and OpenSSL libraries it links stay out of the
// process's global symbols, so nothing loaded later (the in-process backend's Python, ONNX Runtime) binds to them.
// This library itself needs nothing but libc, and takes itself and its settings out of the environment at once, so that
// the python stubs Triton starts are started without them.
//
// Environment, per front (PREFIX is S2T_GRPC_FRONT or S2T_HTTP_FRONT): PREFIX_LIBRARY (the library's path), PREFIX_ARGS
// (the front's options, as the gRPC front's binary takes them, separated by spaces); and S2T_GRPC_FRONT_PRELOAD_REST
// (what LD_PRELOAD held besides this library).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONSERVER_Server TRITONSERVER_Server;
typedef struct TRITONSERVER_ServerOptions TRITONSERVER_ServerOptions;

enum { TRITONSERVER_TYPE_BYTES = 13 };

// One front inside tritonserver: its library's three entry points are PREFIX_start, PREFIX_stop_accepting and
// PREFIX_end (s2t_grpc_front_start, ...).
struct front {
  const char* name;        // for messages
  const char* env_prefix;  // S2T_GRPC_FRONT
  const char* symbol_prefix;
  char* library;
  char* args;
  void (*stop_accepting)(void);
  void (*end)(void);
};

static struct front fronts[] = {
    {"gRPC front", "S2T_GRPC_FRONT", "s2t_grpc_front", NULL, NULL, NULL, NULL},
    {"HTTP front", "S2T_HTTP_FRONT", "s2t_http_front", NULL, NULL, NULL, NULL},
};
enum { FRONT_COUNT = sizeof fronts / sizeof fronts[0] };

// The tritonserver executable's own code (its front ends), where the classification guard applies.
static uintptr_t executable_start, executable_end;
static uint32_t (*real_data_type_byte_size)(int);

static char* take(const char* name) {
  const char* value = getenv(name);
  char* copy = value != NULL ? strdup(value) : NULL;
  unsetenv(name);
  return copy;
}

static char* take_for(const struct front* front, const char* suffix) {
  char name[64];
  snprintf(name, sizeof name, "%s_%s", front->env_prefix, suffix);
  return take(name);
}

// The first object dl_iterate_phdr reports is the executable: the span of its loaded segments.
static int find_executable(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  (void)data;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)* segment = &info->dlpi_phdr[i];
    if (segment->p_type != PT_LOAD) continue;
    uintptr_t start = info->dlpi_addr + segment->p_vaddr, end = start + segment->p_memsz;
    if (executable_start == 0 || start < executable_start) executable_start = start;
    if (end > executable_end) executable_end = end;
  }
  return 1;
}

__attribute__((constructor)) static void leave_environment(void) {
  char* rest = take("S2T_GRPC_FRONT_PRELOAD_REST");
  if (rest != NULL && rest[0] != '\0')
    setenv("LD_PRELOAD", rest, 1);
  else
    unsetenv("LD_PRELOAD");
  free(rest);
  for (int i = 0; i < FRONT_COUNT; ++i) {
    fronts[i].library = take_for(&fronts[i], "LIBRARY");
    fronts[i].args = take_for(&fronts[i], "ARGS");
  }
  dl_iterate_phdr(find_executable, NULL);
  // Resolved here, before any thread runs: libtritonserver.so is mapped before any constructor runs.
  real_data_type_byte_size = (uint32_t(*)(int))dlsym(RTLD_NEXT, "TRITONSERVER_DataTypeByteSize");
}

// A front that cannot start ends tritonserver: its public port would otherwise be silently missing.
static void fail(const char* what, const char* why) {
  fprintf(stderr, "s2t tritonserver hook: %s%s%s\n", what, why ? ": " : "", why ? why : "");
  fflush(stderr);
  exit(1);
}

static void start_front(struct front* front, TRITONSERVER_Server* server) {
  if (front->library == NULL || front->args == NULL) return;
  void* library = dlopen(front->library, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) fail("cannot load a front", dlerror());
  char symbol[64];
  snprintf(symbol, sizeof symbol, "%s_start", front->symbol_prefix);
  int (*start)(TRITONSERVER_Server*, const char*) = (int (*)(TRITONSERVER_Server*, const char*))dlsym(library, symbol);
  snprintf(symbol, sizeof symbol, "%s_stop_accepting", front->symbol_prefix);
  front->stop_accepting = (void (*)(void))dlsym(library, symbol);
  snprintf(symbol, sizeof symbol, "%s_end", front->symbol_prefix);
  front->end = (void (*)(void))dlsym(library, symbol);
  if (start == NULL || front->stop_accepting == NULL || front->end == NULL)
    fail(front->library, "not the library of a front");
  if (start(server, front->args) != 0) fail(front->name, "did not start");
}

TRITONSERVER_Error* TRITONSERVER_ServerNew(TRITONSERVER_Server** server, TRITONSERVER_ServerOptions* options) {
  TRITONSERVER_Error* (*real)(TRITONSERVER_Server**, TRITONSERVER_ServerOptions*) =
      (TRITONSERVER_Error * (*)(TRITONSERVER_Server**, TRITONSERVER_ServerOptions*)) dlsym(RTLD_NEXT,
                                                                                            "TRITONSERVER_ServerNew");
  if (real == NULL) fail("tritonserver has no TRITONSERVER_ServerNew", dlerror());
  TRITONSERVER_Error* error = real(server, options);
  if (error != NULL) return error;
  for (int i = 0; i < FRONT_COUNT; ++i) start_front(&fronts[i], *server);
  return NULL;
}

// A front's end is bounded: after a stop Triton could not finish (its exit timeout passed with requests
// unanswered, and the process then exits at once) it cancels what is left and does not wait long.
TRITONSERVER_Error* TRITONSERVER_ServerStop(TRITONSERVER_Server* server) {
  TRITONSERVER_Error* (*real)(TRITONSERVER_Server*) =
      (TRITONSERVER_Error * (*)(TRITONSERVER_Server*)) dlsym(RTLD_NEXT, "TRITONSERVER_ServerStop");
  if (real == NULL) fail("tritonserver has no TRITONSERVER_ServerStop", dlerror());
  for (int i = 0; i < FRONT_COUNT; ++i)
    if (fronts[i].stop_accepting != NULL) fronts[i].stop_accepting();
  TRITONSERVER_Error* error = real(server);
  for (int i = 0; i < FRONT_COUNT; ++i)
    if (fronts[i].end != NULL) fronts[i].end();
  return error;
}

// Triton 2.51's front ends (src/classification.cc, HTTP and gRPC alike) divide an output's byte size by
// TRITONSERVER_DataTypeByteSize(its datatype) before they look at the datatype, when a caller asks for the
// classification of that output; for BYTES that size is 0, and the division kills the server (SIGFPE). Upstream checks
// the datatype first (2.59.1, NGC 25.07) and refuses with "class result not available for output due to unsupported type
// 'BYTES'". Answering 1 for BYTES to the executable's own code makes 2.51 reach that same refusal: the executable's
// other callers ask only after handling BYTES apart (http_server.cc, grpc/infer_handler.cc). The backends, libraries
// of their own, keep the true answer.
uint32_t TRITONSERVER_DataTypeByteSize(int datatype) {
  if (real_data_type_byte_size == NULL) fail("tritonserver has no TRITONSERVER_DataTypeByteSize", NULL);
  uint32_t size = real_data_type_byte_size(datatype);
  uintptr_t caller = (uintptr_t)__builtin_return_address(0);
  if (size == 0 && datatype == TRITONSERVER_TYPE_BYTES && caller >= executable_start && caller < executable_end)
    return 1;
  return size;
}
