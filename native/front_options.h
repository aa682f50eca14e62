// The option reading both public fronts share (native/http_front.cc, native/grpc_front.cc): `--name value` pairs,
// whole numbers within bounds, HOST:PORT addresses. A problem is thrown as BadOption, its message naming the option;
// each front answers it with its own usage.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace front_options {

struct BadOption : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The options as the preloaded hook passes them: one string, separated by spaces.
inline std::vector<std::string> Words(const char* args) {
  std::vector<std::string> words;
  std::istringstream split(args != nullptr ? args : "");
  for (std::string word; split >> word;) words.push_back(word);
  return words;
}

inline long Number(const std::string& name, const char* text, long min, long max) {
  char* end = nullptr;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < min || value > max)
    throw BadOption(name + " needs a whole number from " + std::to_string(min) + " to " + std::to_string(max) +
                    ", got '" + text + "'");
  return value;
}

inline bool LooksLikeAddress(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  for (size_t i = colon + 1; i < address.size(); ++i)
    if (address[i] < '0' || address[i] > '9') return false;
  return true;
}

inline void RequireAddress(const std::string& name, const std::string& address) {
  if (!LooksLikeAddress(address)) throw BadOption(name + " needs HOST:PORT, got '" + address + "'");
}

// A list of names separated by commas ("-": none).
inline std::vector<std::string> Names(const std::string& list) {
  std::vector<std::string> names;
  std::istringstream split(list);
  for (std::string name; std::getline(split, name, ',');)
    if (!name.empty() && name != "-") names.push_back(name);
  return names;
}

// `take(name, value)` for each pair of `words`; it returns false for a name it does not know.
template <typename Take>
void ReadPairs(const std::vector<std::string>& words, Take take) {
  for (size_t i = 0; i < words.size(); i += 2) {
    if (i + 1 >= words.size()) throw BadOption(words[i] + " needs a value");
    if (!take(words[i], words[i + 1].c_str())) throw BadOption("unknown option " + words[i]);
  }
}

// The options both fronts take: the public address and Triton's endpoint behind it, the event threads, how long a
// stop lets calls in flight finish, the custom request parameters the served models read (separated by commas, "-":
// none), and whether inference is only relayed (where Triton's own needs a key, for Triton to check it).
struct Common {
  std::string listen;
  std::string upstream;
  long threads = 1;
  long drain_seconds = 30;
  std::string request_parameters = "-";
  bool relay_only = false;
};

// Reads `words` into `options` (a Common and more): Common's options here, every other one by `take(name, value)`,
// which returns false for a name it does not know; both addresses required.
template <typename Options, typename Take>
void Read(const std::vector<std::string>& words, Options& options, Take take) {
  Common& common = options;
  ReadPairs(words, [&common, &take](const std::string& name, const char* value) {
    if (name == "--listen")
      common.listen = value;
    else if (name == "--upstream")
      common.upstream = value;
    else if (name == "--threads")
      common.threads = Number(name, value, 1, 64);
    else if (name == "--drain-seconds")
      common.drain_seconds = Number(name, value, 0, 86400);
    else if (name == "--request-parameters")
      common.request_parameters = value;
    else if (name == "--relay-only")
      common.relay_only = Number(name, value, 0, 1) == 1;
    else
      return take(name, value);
    return true;
  });
  RequireAddress("--listen", common.listen);
  RequireAddress("--upstream", common.upstream);
}

}  // namespace front_options
