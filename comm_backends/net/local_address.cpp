#include "comm_backends/net/local_address.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/host_name.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <cstdlib>
#include <set>
#include <vector>

#ifndef _WIN32
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#endif

#include "common/errors.h"

namespace partrain::comm::net {

namespace asio = boost::asio;
using asio::ip::udp;

namespace {

std::string strip_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

std::vector<asio::ip::address> resolve_all(const std::string& host, const std::string& what) {
  const std::string name = strip_brackets(host);
  PARTRAIN_CHECK(!name.empty(), UsageError, what, ": empty host name");
  boost::system::error_code ec;
  const auto literal = asio::ip::make_address(name, ec);
  if (!ec) return {literal};
  asio::io_context io;
  udp::resolver resolver(io);
  const auto results = resolver.resolve(name, "0", ec);
  PARTRAIN_CHECK(!ec && !results.empty(), UsageError, what, " '", host,
                 "' does not resolve: ", ec ? ec.message() : "no addresses");
  std::vector<asio::ip::address> addresses;
  for (const auto& entry : results) addresses.push_back(entry.endpoint().address());
  return addresses;
}

bool bindable(const asio::ip::address& address) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io);
  const asio::ip::tcp::endpoint endpoint(address, 0);
  boost::system::error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  return !ec;
}

bool usable_v6(const asio::ip::address& address) {
  return address.is_v6() && !address.to_v6().is_link_local() && !address.to_v6().is_v4_mapped();
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  const std::string name = strip_brackets(host);
  if (name == "localhost") return true;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(name, ec);
  return !ec && address.is_loopback();
}

std::string resolve_host(const std::string& host) {
  return resolve_all(host, "host").front().to_string();
}

std::string route_source_address(const std::string& host) {
  std::string last_error;
  for (const auto& address : resolve_all(host, "master address")) {
    asio::io_context io;
    udp::socket socket(io);
    boost::system::error_code ec;
    socket.open(address.is_v6() ? udp::v6() : udp::v4(), ec);
    // Connecting a datagram socket only picks a route and a source address; nothing is sent.
    if (!ec) socket.connect(udp::endpoint(address, 9), ec);
    if (!ec) {
      const auto local = socket.local_endpoint(ec).address();
      if (!ec && !local.is_unspecified()) return local.to_string();
    }
    last_error = ec ? ec.message() : "no source address";
  }
  throw UsageError("no route from this host to the master '" + host + "' (" + last_error +
                   "); set comm.interface or " + kSocketInterfaceEnv + " to the NIC to use");
}

std::string interface_address(const std::string& name, bool want_v6) {
#ifdef _WIN32
  (void)want_v6;
  throw UsageError("comm.interface '" + name +
                   "': choosing a NIC by name is not supported on Windows; set comm.host to "
                   "this host's address instead");
#else
  ifaddrs* list = nullptr;
  PARTRAIN_CHECK(getifaddrs(&list) == 0, UsageError, "cannot list this host's network interfaces");
  std::set<std::string> names;
  bool exists = false;
  std::vector<asio::ip::address> v4, v6;
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_name == nullptr) continue;
    names.insert(entry->ifa_name);
    if (name != entry->ifa_name) continue;
    exists = true;
    if (entry->ifa_addr == nullptr) continue;
    if (entry->ifa_addr->sa_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
      v4.push_back(asio::ip::address_v4(ntohl(in->sin_addr.s_addr)));
    } else if (entry->ifa_addr->sa_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr);
      asio::ip::address_v6::bytes_type bytes;
      std::copy(in6->sin6_addr.s6_addr, in6->sin6_addr.s6_addr + 16, bytes.begin());
      const asio::ip::address address = asio::ip::address_v6(bytes);
      if (usable_v6(address)) v6.push_back(address);
    }
  }
  freeifaddrs(list);
  if (!exists) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw UsageError("network interface '" + name +
                     "' does not exist on this host (it has: " + known + ")");
  }
  const auto& first = want_v6 ? v6 : v4;
  const auto& second = want_v6 ? v4 : v6;
  if (!first.empty()) return first.front().to_string();
  PARTRAIN_CHECK(!second.empty(), UsageError, "network interface '", name,
                 "' has no IP address (is it up and configured?)");
  return second.front().to_string();
#endif
}

std::string interface_with_address(const std::string& address) {
#ifdef _WIN32
  (void)address;
  return "";
#else
  boost::system::error_code ec;
  const auto wanted = asio::ip::make_address(strip_brackets(address), ec);
  if (ec) return "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (const ifaddrs* entry = list; entry != nullptr && found.empty(); entry = entry->ifa_next) {
    if (entry->ifa_name == nullptr || entry->ifa_addr == nullptr) continue;
    if (entry->ifa_addr->sa_family == AF_INET && wanted.is_v4()) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
      if (asio::ip::address_v4(ntohl(in->sin_addr.s_addr)) == wanted.to_v4()) {
        found = entry->ifa_name;
      }
    } else if (entry->ifa_addr->sa_family == AF_INET6 && wanted.is_v6()) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr);
      asio::ip::address_v6::bytes_type bytes;
      std::copy(in6->sin6_addr.s6_addr, in6->sin6_addr.s6_addr + 16, bytes.begin());
      if (asio::ip::address_v6(bytes) == wanted.to_v6()) found = entry->ifa_name;
    }
  }
  freeifaddrs(list);
  return found;
#endif
}

std::string choose_bind_address(const BindAddressRequest& request) {
  // An IPv6 master wants the NIC's IPv6 address (an IPv4 one could not reach it).
  bool master_v6 = false;
  if (!request.master_host.empty()) {
    boost::system::error_code ec;
    const auto literal = asio::ip::make_address(strip_brackets(request.master_host), ec);
    master_v6 = !ec && literal.is_v6();
  }
  if (!request.host.empty()) {
    for (const auto& address : resolve_all(request.host, "comm.host")) {
      if (bindable(address)) return address.to_string();
    }
    throw UsageError("comm.host '" + request.host + "' is not an address of this host");
  }
  std::string interface = request.interface;
  std::string source = "comm.interface";
  if (request.read_environment) {
    const char* env = std::getenv(kSocketInterfaceEnv);
    if (env != nullptr && *env != '\0') {
      interface = env;
      source = kSocketInterfaceEnv;
    }
  }
  if (!interface.empty()) {
    try {
      return interface_address(interface, master_v6);
    } catch (const UsageError& e) {
      throw UsageError(source + ": " + e.what());
    }
  }
  if (!request.master_host.empty()) return route_source_address(request.master_host);
  if (request.single_host) return "127.0.0.1";
  boost::system::error_code ec;
  const std::string own_name = asio::ip::host_name(ec);
  if (!ec) {
    try {
      for (const auto& address : resolve_all(own_name, "this host's name")) {
        if (!address.is_loopback() && (address.is_v4() || usable_v6(address)) &&
            bindable(address)) {
          return address.to_string();
        }
      }
    } catch (const UsageError&) {
      // Falls through to the message below, which says what to set.
    }
  }
  throw UsageError(std::string("cannot tell which address the other hosts reach this one at "
                               "(no master address, and this host's name gives none): set "
                               "comm.interface, comm.host or ") +
                   kSocketInterfaceEnv);
}

}  // namespace partrain::comm::net
