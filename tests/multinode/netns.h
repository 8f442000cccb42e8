// defines: NetnsHosts — test hosts made of Linux network namespaces, for tests of runs that
// span machines: each host is a namespace with its own loopback and one NIC (eth0, a veth)
// plugged into a bridge in a namespace of its own, so the hosts talk real TCP over
// 10.A.B.0/24 and fd00:A:B::/64, and nothing outside the test can see or reach them. Each host also
// gets a name (host0, host1, ...) in /etc/netns/NS/hosts, which `ip netns exec` mounts over
// /etc/hosts, so host names resolve as on a real cluster.
//
//   NetnsHosts hosts(2);
//   if (!hosts.ok()) GTEST_SKIP() << hosts.why_not();
//   pid_t p = hosts.spawn(1, {exe, "run", ...}, log);   // runs inside host 1
//   hosts.set_link(1, false);                           // pull host 1's cable
//
// Names carry the test process id (ptn<PID>x<N>...), so tests running at once never meet.
// Everything is removed by the destructor, processes still running in the namespaces
// included; namespaces left by a test process that was killed outright are removed by the
// next NetnsHosts, which finds them by the dead pid in their names. Needs root and iproute2
// (scripts/setup.sh installs it); without them ok() is false and why_not() says why.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace partrain_test {

class NetnsHosts {
 public:
  // `hosts` namespaces on 10.<subnet_a>.<subnet_b>.0/24, host i at .(i+1).
  explicit NetnsHosts(int hosts, int subnet_a = 77) : subnet_a_(subnet_a) {
    static std::atomic<int> made{0};
    const int serial = made.fetch_add(1);
    prefix_ = "ptn" + std::to_string(::getpid()) + "x" + std::to_string(serial);
    subnet_b_ = (static_cast<int>(::getpid()) + serial) % 250;
    if (::geteuid() != 0) {
      why_not_ = "network namespaces need root (this test runs as uid " +
                 std::to_string(::geteuid()) + ")";
      return;
    }
    if (std::system("ip -V > /dev/null 2>&1") != 0) {
      why_not_ = "the ip command (iproute2) is missing: run scripts/setup.sh";
      return;
    }
    remove_leftovers_of_dead_tests();
    bridge_ = prefix_ + "br";
    if (!run("ip netns add " + bridge_)) {
      fail("cannot create a network namespace");
      return;
    }
    made_.push_back(bridge_);
    if (!run("ip -n " + bridge_ + " link add br0 type bridge") ||
        !run("ip -n " + bridge_ + " link set br0 up")) {
      {
        fail("cannot create a bridge in a network namespace");
        return;
      }
    }
    std::string hosts_file = "127.0.0.1 localhost\n";
    for (int i = 0; i < hosts; ++i) hosts_file += address(i) + " host" + std::to_string(i) + "\n";
    for (int i = 0; i < hosts; ++i) {
      const std::string ns = name(i);
      if (!run("ip netns add " + ns)) {
        fail("cannot create namespace " + ns);
        return;
      }
      made_.push_back(ns);
      const std::string port = "h" + std::to_string(i);
      const bool wired =
          run("ip -n " + ns + " link add eth0 type veth peer name " + port + " netns " + bridge_) &&
          run("ip -n " + bridge_ + " link set " + port + " master br0") &&
          run("ip -n " + bridge_ + " link set " + port + " up") &&
          run("ip -n " + ns + " addr add " + address(i) + "/24 dev eth0") &&
          run("ip -n " + ns + " addr add " + address6(i) + "/64 dev eth0 nodad") &&
          run("ip -n " + ns + " link set eth0 up") && run("ip -n " + ns + " link set lo up");
      if (!wired) {
        fail("cannot wire namespace " + ns + " to the bridge");
        return;
      }
      std::error_code ec;
      std::filesystem::create_directories(etc_dir(ns), ec);
      std::ofstream(etc_dir(ns) / "hosts") << hosts_file;
    }
    count_ = hosts;
    if (!wait_until_reachable()) {
      fail("the hosts cannot reach each other over the bridge");
      return;
    }
    ok_ = true;
  }

  ~NetnsHosts() { tear_down(); }
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  bool ok() const { return ok_; }
  const std::string& why_not() const { return why_not_; }
  int count() const { return count_; }

  std::string name(int host) const { return prefix_ + "h" + std::to_string(host); }
  std::string address(int host) const {
    return "10." + std::to_string(subnet_a_) + "." + std::to_string(subnet_b_) + "." +
           std::to_string(host + 1);
  }
  std::string address6(int host) const {
    return "fd00:" + std::to_string(subnet_a_) + ":" + std::to_string(subnet_b_) +
           "::" + std::to_string(host + 1);
  }
  static std::string host_name(int host) { return "host" + std::to_string(host); }

  // Runs `args` inside host `host`, stdout and stderr to `log`; extra_env is added first.
  pid_t spawn(int host, const std::vector<std::string>& args, const std::filesystem::path& log,
              const std::vector<std::string>& extra_env = {}) const {
    std::vector<std::string> argv = {"ip", "netns", "exec", name(host), "env"};
    argv.insert(argv.end(), extra_env.begin(), extra_env.end());
    argv.insert(argv.end(), args.begin(), args.end());
    const pid_t pid = ::fork();
    if (pid == 0) {
      FILE* out = std::freopen(log.c_str(), "w", stdout);
      (void)out;
      ::dup2(::fileno(stdout), ::fileno(stderr));
      std::vector<char*> raw;
      for (auto& a : argv) raw.push_back(const_cast<char*>(a.c_str()));
      raw.push_back(nullptr);
      ::execvp("ip", raw.data());
      ::_exit(127);
    }
    return pid;
  }

  // A bash command inside host `host`; true when it exits 0.
  bool shell(int host, const std::string& command) const {
    return run("ip netns exec " + name(host) + " bash -c '" + command + "'");
  }

  // Takes host `host`'s NIC down (up = false) or brings it back: packets stop without any
  // reset, as when a cable is pulled or a switch port dies.
  bool set_link(int host, bool up) const {
    return run("ip -n " + name(host) + " link set eth0 " + (up ? "up" : "down"));
  }

  // Limits host `host`'s egress with a token bucket (rate like "1gbit", "200mbit"). The
  // bucket's burst goes out at the NIC's speed after the link was idle: a test that holds
  // transfer times to bytes asks for a small one.
  bool limit_rate(int host, const std::string& rate, const std::string& burst = "256kb") const {
    return run("ip netns exec " + name(host) + " tc qdisc replace dev eth0 root tbf rate " + rate +
               " burst " + burst + " latency 50ms");
  }

  // Process ids running inside host `host`.
  std::vector<pid_t> pids(int host) const { return pids_in(name(host)); }

 private:
  static bool run(const std::string& command) {
    return std::system((command + " > /dev/null 2>&1").c_str()) == 0;
  }

  static std::filesystem::path etc_dir(const std::string& ns) {
    return std::filesystem::path("/etc/netns") / ns;
  }

  static std::vector<pid_t> pids_in(const std::string& ns) {
    std::vector<pid_t> pids;
    FILE* pipe = ::popen(("ip netns pids " + ns + " 2>/dev/null").c_str(), "r");
    if (pipe == nullptr) return pids;
    int pid = 0;
    while (std::fscanf(pipe, "%d", &pid) == 1) pids.push_back(pid);
    ::pclose(pipe);
    return pids;
  }

  static void remove_namespace(const std::string& ns) {
    // A namespace lives on while a process is inside it: stop those first (bounded).
    for (int round = 0; round < 50; ++round) {
      const auto pids = pids_in(ns);
      if (pids.empty()) break;
      for (pid_t pid : pids) ::kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    run("ip netns del " + ns);
    std::error_code ec;
    std::filesystem::remove_all(etc_dir(ns), ec);
  }

  void fail(const std::string& what) {
    why_not_ = what + " (is this a container without CAP_SYS_ADMIN?)";
    tear_down();
  }

  void tear_down() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) remove_namespace(*it);
    made_.clear();
    ok_ = false;
  }

  bool wait_until_reachable() const {
    // Bounded: 100 tries, 50 ms apart. A TCP connect to a closed port answers at once with a
    // reset once the link works, so "refused" here means reachable.
    for (int attempt = 0; attempt < 100; ++attempt) {
      bool all = true;
      for (int i = 1; i < count_ && all; ++i) {
        all = std::system(("ip netns exec " + name(0) + " timeout 1 bash -c 'exec 3<>/dev/tcp/" +
                           address(i) + "/9' 2>&1 | grep -q refused")
                              .c_str()) == 0;
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // Namespaces named ptn<PID>x... whose test process no longer exists.
  static void remove_leftovers_of_dead_tests() {
    FILE* pipe = ::popen("ip netns list 2>/dev/null", "r");
    if (pipe == nullptr) return;
    std::vector<std::string> stale;
    char line[512];
    while (std::fgets(line, sizeof line, pipe) != nullptr) {
      std::string ns(line);
      ns = ns.substr(0, ns.find_first_of(" \n"));
      if (ns.rfind("ptn", 0) != 0) continue;
      const auto x = ns.find('x', 3);
      if (x == std::string::npos) continue;
      const std::string pid_text = ns.substr(3, x - 3);
      if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) {
        continue;
      }
      const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
      if (::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(ns);
    }
    ::pclose(pipe);
    for (const auto& ns : stale) remove_namespace(ns);
  }

  std::string prefix_;
  std::string bridge_;
  int subnet_a_;
  int subnet_b_ = 0;
  int count_ = 0;
  bool ok_ = false;
  std::string why_not_;
  std::vector<std::string> made_;
};

}  // namespace partrain_test
