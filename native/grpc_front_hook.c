// Preloaded into tritonserver (LD_PRELOAD) by `s2t serve`: starts the gRPC front inside Triton's own process
// (libs2t_grpc_front.so, native/grpc_front.cc) as soon as Triton's server object exists, and stops it around Triton's
// own stop. It wraps the two C API calls tritonserver's main makes, TRITONSERVER_ServerNew and TRITONSERVER_ServerStop,
// and calls the real ones.
//
// The front's library is opened with RTLD_LOCAL: the gRPC, Abseil and OpenSSL libraries it links stay out of the
// process's global symbols, so nothing loaded later (the in-process backend's Python, ONNX Runtime) binds to them.
// This library itself needs nothing but libc, and takes itself and its settings out of the environment at once, so that
// the python stubs Triton starts are started without them.
//
// Environment: S2T_GRPC_FRONT_LIBRARY (the library's path), S2T_GRPC_FRONT_ARGS (the front's options, as the binary
// takes them, separated by spaces), S2T_GRPC_FRONT_PRELOAD_REST (what LD_PRELOAD held besides this library).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONSERVER_Server TRITONSERVER_Server;
typedef struct TRITONSERVER_ServerOptions TRITONSERVER_ServerOptions;

static void (*front_stop_accepting)(void);
static void (*front_end)(void);
static char* front_library;
static char* front_args;

static char* take(const char* name) {
  const char* value = getenv(name);
  char* copy = value != NULL ? strdup(value) : NULL;
  unsetenv(name);
  return copy;
}

__attribute__((constructor)) static void leave_environment(void) {
  char* rest = take("S2T_GRPC_FRONT_PRELOAD_REST");
  if (rest != NULL && rest[0] != '\0')
    setenv("LD_PRELOAD", rest, 1);
  else
    unsetenv("LD_PRELOAD");
  free(rest);
  front_library = take("S2T_GRPC_FRONT_LIBRARY");
  front_args = take("S2T_GRPC_FRONT_ARGS");
}

// A front that cannot start ends tritonserver: its public gRPC port would otherwise be silently missing.
static void fail(const char* what, const char* why) {
  fprintf(stderr, "s2t_grpc_front: %s%s%s\n", what, why ? ": " : "", why ? why : "");
  fflush(stderr);
  exit(1);
}

TRITONSERVER_Error* TRITONSERVER_ServerNew(TRITONSERVER_Server** server, TRITONSERVER_ServerOptions* options) {
  TRITONSERVER_Error* (*real)(TRITONSERVER_Server**, TRITONSERVER_ServerOptions*) =
      (TRITONSERVER_Error * (*)(TRITONSERVER_Server**, TRITONSERVER_ServerOptions*)) dlsym(RTLD_NEXT,
                                                                                            "TRITONSERVER_ServerNew");
  if (real == NULL) fail("tritonserver has no TRITONSERVER_ServerNew", dlerror());
  TRITONSERVER_Error* error = real(server, options);
  const char* library = front_library;
  const char* args = front_args;
  if (error != NULL || library == NULL || args == NULL) return error;
  void* front = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (front == NULL) fail("cannot load the gRPC front", dlerror());
  int (*start)(TRITONSERVER_Server*, const char*) =
      (int (*)(TRITONSERVER_Server*, const char*))dlsym(front, "s2t_grpc_front_start");
  front_stop_accepting = (void (*)(void))dlsym(front, "s2t_grpc_front_stop_accepting");
  front_end = (void (*)(void))dlsym(front, "s2t_grpc_front_end");
  if (start == NULL || front_stop_accepting == NULL || front_end == NULL) fail(library, "not the gRPC front's library");
  if (start(*server, args) != 0) fail("the gRPC front did not start", NULL);
  return NULL;
}

// The front's end is bounded: after a stop Triton could not finish (its exit timeout passed with requests
// unanswered, and the process then exits at once) it cancels what is left and does not wait long.
TRITONSERVER_Error* TRITONSERVER_ServerStop(TRITONSERVER_Server* server) {
  TRITONSERVER_Error* (*real)(TRITONSERVER_Server*) =
      (TRITONSERVER_Error * (*)(TRITONSERVER_Server*)) dlsym(RTLD_NEXT, "TRITONSERVER_ServerStop");
  if (real == NULL) fail("tritonserver has no TRITONSERVER_ServerStop", dlerror());
  if (front_stop_accepting != NULL) front_stop_accepting();
  TRITONSERVER_Error* error = real(server);
  if (front_end != NULL) front_end();
  return error;
}
