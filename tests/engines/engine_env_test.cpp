// The rules of cli/engine_env.h, one environment at a time: the variables each engine
// exports, the rendezvous and token each derives, and the Slurm host-list and tasks-per-node
// formats.
#include "cli/engine_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "common/errors.h"

namespace partrain::cli {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup lookup(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

// Resolves every name to 10.1.<length>.1 and records what it was asked.
struct FakeResolver {
  std::vector<std::string> asked;
  HostResolver get() {
    return [this](const std::string& host, const std::string&) {
      asked.push_back(host);
      return host == "loop" ? std::string("127.0.1.1")
                            : "10.1." + std::to_string(host.size()) + ".1";
    };
  }
};

EngineRank read(const Vars& vars, const std::string& configured = "") {
  FakeResolver resolver;
  return read_engine_rank(lookup(vars), configured, resolver.get());
}

void expect_usage(const Vars& vars, const std::string& part, const std::string& configured = "") {
  try {
    read(vars, configured);
    ADD_FAILURE() << "no error; expected one naming '" << part << "'";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

Vars torchrun_vars(int rank, const std::string& restart = "0", const std::string& agent = "True") {
  return {{"RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"WORLD_SIZE", "2"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29533"},
          {"TORCHELASTIC_RUN_ID", "none"},
          {"TORCHELASTIC_RESTART_COUNT", restart},
          {"TORCHELASTIC_USE_AGENT_STORE", agent}};
}

Vars slurm_vars(int rank) {
  return {{"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_LOCALID", std::to_string(rank % 2)},
          {"SLURM_NODEID", std::to_string(rank / 2)},
          {"SLURM_NTASKS", "3"},
          {"SLURM_STEP_NUM_TASKS", "3"},
          {"SLURM_STEP_TASKS_PER_NODE", "2,1"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_ID", "123456"},
          {"SLURM_STEP_NODELIST", "gpu[07-08]"},
          {"SLURM_JOB_NODELIST", "gpu[07-08],cpu1"}};
}

TEST(EngineEnv, NoEngineIsOneRankWithoutRendezvous) {
  const EngineRank r = read({});
  EXPECT_EQ(r.engine, Engine::none);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.rendezvous, "");
  EXPECT_EQ(r.token, "");
}

TEST(EngineEnv, PartrainRunKeepsItsRendezvousTokenAndRestart) {
  Vars vars = torchrun_vars(1);
  vars.erase("TORCHELASTIC_RUN_ID");
  vars.erase("TORCHELASTIC_RESTART_COUNT");
  vars.erase("TORCHELASTIC_USE_AGENT_STORE");
  vars["PARTRAIN_RENDEZVOUS"] = "file:///tmp/x";
  vars["PARTRAIN_RUN_TOKEN"] = "abc";
  vars["PARTRAIN_RESTART"] = "2";
  const EngineRank r = read(vars, "tcp://10.0.0.1:1");
  EXPECT_EQ(r.engine, Engine::partrain);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.rendezvous, "file:///tmp/x");
  EXPECT_EQ(r.token, "abc.restart2");
  EXPECT_EQ(r.restart, 2);
}

TEST(EngineEnv, TorchrunStaticRendezvousLeavesMasterPortToTorchrun) {
  const EngineRank r0 = read(torchrun_vars(0));
  const EngineRank r1 = read(torchrun_vars(1));
  EXPECT_EQ(r0.engine, Engine::torchrun);
  EXPECT_EQ(r0.rendezvous, "tcp://127.0.0.1:29534");
  EXPECT_EQ(r1.rendezvous, r0.rendezvous);
  EXPECT_EQ(r1.rank, 1);
  EXPECT_EQ(r1.local_world_size, 2);
  EXPECT_EQ(r0.token.size(), 32u);
  EXPECT_EQ(r0.token, r1.token);  // agreed without talking
  // The c10d backend picks a MASTER_PORT it does not hold: rank 0 hosts on it.
  EXPECT_EQ(read(torchrun_vars(0, "0", "False")).rendezvous, "tcp://127.0.0.1:29533");
  // env:// in the config means the same.
  EXPECT_EQ(read(torchrun_vars(0), "env://").rendezvous, "tcp://127.0.0.1:29534");
  expect_usage(
      [] {
        Vars v = torchrun_vars(0);
        v["MASTER_PORT"] = "65535";
        return v;
      }(),
      "MASTER_PORT + 1");
}

TEST(EngineEnv, TorchrunRestartIsAFreshRun) {
  const EngineRank first = read(torchrun_vars(0, "0"));
  const EngineRank again = read(torchrun_vars(1, "1"));
  EXPECT_EQ(again.restart, 1);
  EXPECT_EQ(again.token, first.token + ".restart1");
  // A secret exported on every node keeps torchrun's restarts apart too.
  Vars vars = torchrun_vars(0, "2");
  vars["PARTRAIN_RUN_TOKEN"] = "secret";
  const EngineRank secret = read(vars);
  EXPECT_EQ(secret.engine, Engine::torchrun);
  EXPECT_EQ(secret.token, "secret.restart2");
}

TEST(EngineEnv, TorchrunRestartKeepsTheLockToken) {
  const EngineRank first = read(torchrun_vars(0, "0"));
  const EngineRank again = read(torchrun_vars(0, "3"));
  EXPECT_EQ(first.lock_token, first.token);
  EXPECT_EQ(again.lock_token, first.token);  // the same run to OUTPUT/partrain.lock
  Vars slurm = slurm_vars(0);
  slurm["SLURM_RESTART_COUNT"] = "1";
  const EngineRank requeued = read(slurm);
  EXPECT_EQ(requeued.token, requeued.lock_token + ".restart1");
}

// torchrun --rdzv_backend=c10d: each round a fresh MASTER_PORT; a node that joins later counts
// its restarts from 0 while the node that stayed counts on.
TEST(EngineEnv, TorchrunDynamicRoundIsOneRunWhateverEachNodesRestartCount) {
  Vars stayed = torchrun_vars(0, "1", "False");
  Vars joined = torchrun_vars(1, "0", "False");
  const EngineRank a = read(stayed);
  const EngineRank b = read(joined);
  EXPECT_EQ(a.restart, 1);
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.token.find(".restart"), std::string::npos);
  // The next round: another port, another world; another token, the same lock token.
  stayed["MASTER_PORT"] = "41017";
  stayed["WORLD_SIZE"] = "1";
  stayed["LOCAL_WORLD_SIZE"] = "1";
  const EngineRank shrunk = read(stayed);
  EXPECT_NE(shrunk.token, a.token);
  EXPECT_EQ(shrunk.lock_token, a.lock_token);
  EXPECT_EQ(b.lock_token, a.lock_token);
  EXPECT_NE(a.lock_token, a.token);
  // Another --rdzv_id is another run.
  stayed["TORCHELASTIC_RUN_ID"] = "job-2";
  EXPECT_NE(read(stayed).lock_token, a.lock_token);
  // With a secret: the secret names the run, the round's port and world tell rounds apart.
  stayed["PARTRAIN_RUN_TOKEN"] = "secret";
  joined["PARTRAIN_RUN_TOKEN"] = "secret";
  const EngineRank secret_a = read(stayed);
  EXPECT_EQ(secret_a.lock_token, "secret");
  EXPECT_EQ(secret_a.token.rfind("secret.round-", 0), 0u) << secret_a.token;
  EXPECT_NE(secret_a.token, read(joined).token);  // 41017 and 1 rank, 29533 and 2
  joined["MASTER_PORT"] = "41017";
  joined["WORLD_SIZE"] = "1";
  joined["RANK"] = "0";
  joined["LOCAL_RANK"] = "0";
  joined["LOCAL_WORLD_SIZE"] = "1";
  EXPECT_EQ(secret_a.token, read(joined).token);
}

TEST(EngineEnv, MpirunReadsOpenMpiVariablesBeforeSlurms) {
  Vars vars = slurm_vars(0);  // mpirun inside an sbatch allocation
  vars.erase("SLURM_STEP_ID");
  vars.insert({{"OMPI_COMM_WORLD_RANK", "3"},
               {"OMPI_COMM_WORLD_SIZE", "4"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
               {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
               {"OMPI_MCA_ess_base_jobid", "77"},
               {"MASTER_ADDR", "10.0.0.9"},
               {"MASTER_PORT", "29500"}});
  const EngineRank r = read(vars);
  EXPECT_EQ(r.engine, Engine::mpirun);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.rendezvous, "tcp://10.0.0.9:29500");
  vars["OMPI_MCA_ess_base_jobid"] = "78";  // the next mpirun: another token
  EXPECT_NE(read(vars).token, r.token);
  vars.erase("MASTER_ADDR");
  EXPECT_EQ(read(vars).rendezvous, "");
  EXPECT_EQ(read(vars, "file:///shared/rdzv").rendezvous, "file:///shared/rdzv");
}

TEST(EngineEnv, SrunDerivesTheRendezvousFromTheNodeListAndJob) {
  FakeResolver resolver;
  const EngineRank r = read_engine_rank(lookup(slurm_vars(2)), "", resolver.get());
  EXPECT_EQ(r.engine, Engine::slurm);
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world_size, 3);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_world_size, 1);                              // node 1 of "2,1"
  ASSERT_EQ(resolver.asked, std::vector<std::string>{"gpu07"});  // the step's list, not the job's
  EXPECT_EQ(r.rendezvous,
            "tcp://10.1.5.1:" + std::to_string(kSlurmPortBase + 123456 % kSlurmPortSpan));
  EXPECT_EQ(read(slurm_vars(0)).token, r.token);
  EXPECT_EQ(read(slurm_vars(0)).local_world_size, 2);

  Vars vars = slurm_vars(0);
  vars["MASTER_PORT"] = "29777";
  EXPECT_EQ(read(vars).rendezvous, "tcp://10.1.5.1:29777");
  vars["MASTER_ADDR"] = "10.2.2.2";
  EXPECT_EQ(read(vars).rendezvous, "tcp://10.2.2.2:29777");
  vars = slurm_vars(0);
  vars.erase("SLURM_STEP_NODELIST");
  read_engine_rank(lookup(vars), "", resolver.get());
  EXPECT_EQ(resolver.asked.back(), "gpu07");
  vars["SLURM_RESTART_COUNT"] = "1";  // a requeued job
  EXPECT_EQ(read(vars).restart, 1);
  vars = slurm_vars(0);
  vars["SLURM_JOB_ID"] = "123457";
  EXPECT_NE(read(vars).token, r.token);
}

TEST(EngineEnv, SrunRefusesALoopbackFirstHostAcrossNodes) {
  Vars vars = slurm_vars(0);
  vars["SLURM_STEP_NODELIST"] = "loop,other";
  expect_usage(vars, "loopback");
  vars["SLURM_STEP_NODELIST"] = "loop";  // one node: loopback is where everyone is
  EXPECT_EQ(read(vars).rendezvous.rfind("tcp://127.0.1.1:", 0), 0u);
}

TEST(EngineEnv, BatchScriptIsNotARank) {
  Vars vars = slurm_vars(0);
  vars.erase("SLURM_STEP_ID");
  EXPECT_EQ(read(vars).engine, Engine::none);
  EXPECT_EQ(read(vars).world_size, 1);
}

TEST(EngineEnv, MalformedVariablesAreNamed) {
  Vars vars = slurm_vars(0);
  vars["SLURM_PROCID"] = "x";
  expect_usage(vars, "SLURM_PROCID='x'");
  vars = slurm_vars(0);
  vars["SLURM_PROCID"] = "3";
  expect_usage(vars, "rank 3 is outside a world of size 3");
  vars = slurm_vars(0);
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(3)";
  expect_usage(vars, "SLURM_STEP_TASKS_PER_NODE='2(3)'");
  vars = slurm_vars(0);
  vars["SLURM_STEP_NODELIST"] = "gpu[07-08";
  expect_usage(vars, "SLURM_STEP_NODELIST='gpu[07-08'");
  Vars torch = torchrun_vars(0);
  torch["MASTER_PORT"] = "99999";
  expect_usage(torch, "MASTER_PORT=99999");
}

TEST(SlurmHostlist, ExpandsAsSlurmWritesThem) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_hostlist("vm", "L"), V{"vm"});
  EXPECT_EQ(expand_slurm_hostlist("node[01-03,07],gpu5", "L"),
            (V{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_slurm_hostlist("n[8-10]", "L"), (V{"n8", "n9", "n10"}));
  EXPECT_EQ(expand_slurm_hostlist("n[098-101]", "L"), (V{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_slurm_hostlist("n[0-1]", "L"), (V{"n0", "n1"}));
  EXPECT_EQ(expand_slurm_hostlist("rack[1-2]-n[01-02]", "L"),
            (V{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}));
  EXPECT_EQ(expand_slurm_hostlist("a,b[3],c[1-2]x", "L"), (V{"a", "b3", "c1x", "c2x"}));
  EXPECT_EQ(expand_slurm_hostlist("n[5,1-2]", "L"), (V{"n5", "n1", "n2"}));
  EXPECT_EQ(expand_slurm_hostlist("n[1-100000]", "L").size(), 100000u);
}

TEST(SlurmHostlist, RejectsWhatSlurmNeverWrites) {
  for (const std::string bad : {"", "n[1-2", "n1-2]", "n[]", "n[2-1]", "n[a-b]", "n[1,]", "a,,b",
                                "a,", "n[[1]]", "n[1-2-3]"}) {
    try {
      expand_slurm_hostlist(bad, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(expand_slurm_hostlist("n[1-3],m[1-3]", "L", 5), UsageError);
  EXPECT_THROW(expand_slurm_hostlist("n[1-999999999999]", "L"), UsageError);
  // Ranges whose sizes add up to 2^64 + 3 (18 of 10^18 names and one of 446744073709551619):
  // refused, not wrapped to a count of 3 and expanded without end.
  std::string wraps = "n[0-446744073709551618";
  for (int i = 0; i < 18; ++i) wraps += ",0-999999999999999999";
  EXPECT_THROW(expand_slurm_hostlist(wraps + "]", "L"), UsageError);
  EXPECT_EQ(expand_slurm_hostlist("n[1-3],m[1-2]", "L", 5).size(), 5u);
}

TEST(SlurmTasksPerNode, ExpandsRepeats) {
  EXPECT_EQ(expand_slurm_tasks_per_node("2", "T"), std::vector<int>{2});
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1", "T"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4,1(x2)", "T"), (std::vector<int>{4, 1, 1}));
  for (const std::string bad : {"", "x", "2(3)", "2(x)", "2(x0)", "2(x2", "-1", "2,"}) {
    EXPECT_THROW(expand_slurm_tasks_per_node(bad, "T"), UsageError) << bad;
  }
}

TEST(ResolveHost, AddressesPassAndLocalhostResolves) {
  EXPECT_EQ(resolve_host("10.0.0.1", "x"), "10.0.0.1");
  EXPECT_EQ(resolve_host("localhost", "x").rfind("127.", 0), 0u);
  EXPECT_THROW(resolve_host("no-such-host.invalid", "the host"), UsageError);
}

}  // namespace
}  // namespace partrain::cli
