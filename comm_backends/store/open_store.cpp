// Store urls: file://DIR, tcp://HOST:PORT, env://.
#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "comm_backends/net/timed_io.h"
#include "comm_backends/store/file_store.h"
#include "comm_backends/store/store.h"
#include "comm_backends/store/tcp_store.h"
#include "common/errors.h"

namespace partrain::comm {

namespace {

bool is_drive(const std::string& text, std::size_t at) {
  return text.size() >= at + 2 &&
         ((text[at] >= 'A' && text[at] <= 'Z') || (text[at] >= 'a' && text[at] <= 'z')) &&
         text[at + 1] == ':';
}

std::string percent_decode(const std::string& text, const std::string& url) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    PARTRAIN_CHECK(i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
                       std::isxdigit(static_cast<unsigned char>(text[i + 2])),
                   UsageError, "store url '", url, "': bad %-escape at offset ", i);
    out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
    i += 2;
  }
  return out;
}

StoreUrl tcp_url(const std::string& host_port, const std::string& url) {
  StoreUrl parsed;
  parsed.kind = StoreUrl::Kind::tcp;
  PARTRAIN_CHECK(net::split_host_port(host_port, parsed.host, parsed.port), UsageError,
                 "store url '", url, "': expected HOST:PORT with a port from 0 to 65535");
  return parsed;
}

}  // namespace

StoreUrl parse_store_url(const std::string& url) {
  const auto scheme_end = url.find("://");
  PARTRAIN_CHECK(scheme_end != std::string::npos, UsageError, "store url '", url,
                 "': expected file://DIR, tcp://HOST:PORT or env://");
  const std::string scheme = url.substr(0, scheme_end);
  std::string rest = url.substr(scheme_end + 3);
  if (scheme == "file") {
    // file:///tmp/x -> /tmp/x; file:///C:/x and file://C:/x -> C:/x; file://localhost/x -> /x.
    if (rest.rfind("localhost/", 0) == 0) rest = rest.substr(9);
    if (rest.size() >= 3 && rest[0] == '/' && is_drive(rest, 1) &&
        (rest.size() == 3 || rest[3] == '/' || rest[3] == '\\')) {
      rest = rest.substr(1);
    }
    StoreUrl parsed;
    parsed.path = percent_decode(rest, url);
    PARTRAIN_CHECK(!parsed.path.empty(), UsageError, "store url '", url, "': empty directory");
    return parsed;
  }
  if (scheme == "tcp") return tcp_url(rest, url);
  if (scheme == "env") {
    PARTRAIN_CHECK(rest.empty(), UsageError, "store url '", url,
                   "': env:// takes nothing after it");
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    PARTRAIN_CHECK(addr && *addr && port && *port, UsageError, "store url 'env://' needs ",
                   "MASTER_ADDR and MASTER_PORT in the environment");
    const std::string host = addr;
    const std::string host_port =
        (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + port;
    return tcp_url(host_port,
                   std::string("env:// (MASTER_ADDR=") + addr + ", MASTER_PORT=" + port + ")");
  }
  throw UsageError("store url '" + url + "': unknown scheme '" + scheme +
                   "' (expected file, tcp or env)");
}

std::unique_ptr<Store> open_store(const std::string& url, const StoreOptions& options) {
  const StoreUrl parsed = parse_store_url(url);
  if (parsed.kind == StoreUrl::Kind::file) {
    auto store = std::make_unique<FileStore>(parsed.path, options);
    if (!options.join_key.empty()) store->set(options.join_key, options.join_value);
    return store;
  }
  return std::make_unique<TcpStore>(parsed.host, parsed.port, options);
}

void try_set(Store& store, const std::string& key, const std::vector<std::uint8_t>& value,
             std::chrono::milliseconds bound) {
  try {
    const ScopedStoreTimeout bounded(store, std::min(store.timeout(), bound));
    store.set(key, value);
  } catch (...) {
    // Nobody to tell: whoever waits for the key learns of the store from the store.
  }
}

std::optional<std::vector<std::uint8_t>> try_get(Store& store, const std::string& key,
                                                 std::chrono::milliseconds bound) {
  try {
    const ScopedStoreTimeout bounded(store, std::min(store.timeout(), bound));
    if (!store.check({key})) return std::nullopt;
    return store.get(key);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace partrain::comm
