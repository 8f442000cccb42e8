// defines: BindAddressRequest, choose_bind_address(), interface_address(),
// route_source_address(), interface_with_address(), resolve_host(), is_loopback_host(),
// kSocketInterfaceEnv — which address of this host the backends listen on and publish for
// the other hosts.
//
// The order, first match wins (the same idea as GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME):
//   1. comm.host: that address (a name is resolved); it must belong to this host
//   2. PARTRAIN_SOCKET_IFNAME, then comm.interface: the named NIC's address
//   3. the master's address known: the local address of the route to it — what connecting
//      a UDP socket to it reveals (no packet is sent)
//   4. every rank on this host: 127.0.0.1
//   5. otherwise the first non-loopback address this host's name resolves to
// Anything that cannot be honoured (no such NIC, an address of another host, a master that
// does not resolve) is a UsageError naming the setting.
#pragma once

#include <string>

namespace partrain::comm::net {

inline constexpr const char* kSocketInterfaceEnv = "PARTRAIN_SOCKET_IFNAME";

struct BindAddressRequest {
  std::string host;              // comm.host
  std::string interface;         // comm.interface (PARTRAIN_SOCKET_IFNAME overrides it)
  std::string master_host;       // the rendezvous master (tcp store host or MASTER_ADDR); may be ""
  bool single_host = false;      // every rank of the run is on this host
  bool read_environment = true;  // look at PARTRAIN_SOCKET_IFNAME
};

// An IP literal (no brackets) the caller can bind and publish.
std::string choose_bind_address(const BindAddressRequest& request);

// The address of network interface `name`: IPv4 unless want_v6 (or it has no IPv4), never
// an IPv6 link-local one. UsageError naming the interfaces there are when it has none.
std::string interface_address(const std::string& name, bool want_v6);

// The name of the interface that holds address `address` (an IP literal); "" if none does.
std::string interface_with_address(const std::string& address);

// The local address the kernel would use to reach `host` (a name or an IP literal).
std::string route_source_address(const std::string& host);

// A name or literal (IPv6 with or without brackets) to its first address, as a literal.
std::string resolve_host(const std::string& host);

// "localhost", 127.x.y.z, ::1 (bracketed or not).
bool is_loopback_host(const std::string& host);

}  // namespace partrain::comm::net
