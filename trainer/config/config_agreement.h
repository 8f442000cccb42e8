// defines: agreement_json(), config_differences(), agree_on_config() and
// tell_ranks_this_one_stopped() — the keys of a config that every rank of a run must hold alike,
// where two ranks' configs differ in them, the check of every rank's against rank 0's through
// the store, and the word a rank that stopped before that check leaves there for the others.
//
// Ranks started by an engine (torchrun, Slurm, mpirun) each read a config of their own: a file
// edited on one host, or a --set given to one rank, would train ranks that disagree (another
// learning rate on one rank: its parameters drift from the others' without a word) or wait on
// collectives the others never call. Keys that say where a host keeps or finds things, or what
// it spends on a rank, may differ: launch.bind, comm.host, comm.interface, comm.timeout_s,
// data.root, data.download, data.num_workers, train.threads, output.dir and reference; and
// data.batch_size where data.global_batch_size splits the batch (each rank's own share).
// model.torchscript is compared by the file's bytes, not its path, and checkpoint.resume by its
// kind (never, auto, a path), not the path. Every other key must be the same. The nodes of a
// multi-node `partrain run` derive their run token from the same text (run_identity() in
// cli/run_command.cpp).
#pragma once

#include <chrono>
#include <string>

#include "common/rank_place.h"
#include "trainer/config/config.h"

namespace partrain {

namespace comm {
class Store;
}

// The keys of `config` that every rank must hold alike, as JSON text.
std::string agreement_json(const Config& config);

// Where agreement_json() texts `mine` (rank `me`'s) and `theirs` (rank `other`'s) differ:
// "train.optimizer.lr is 0.1 on rank 3 and 0.05 on rank 0", up to three keys and then how many
// more; empty where they agree.
std::string config_differences(const std::string& mine, int me, const std::string& theirs,
                               int other);

// Holds `agreement` (this rank's agreement_json()) against rank 0's, on every rank of a world of
// `size` before anything else is set up: rank 0 publishes its text and a hash of it, each other
// rank reads the hash (and the text only where the hashes differ), one that differs publishes
// where, and after a barrier every rank throws that one line as a UsageError (exit 2), naming
// the rank and the keys, or goes on. About 5 store requests a rank, whatever the world; waits
// are bounded by the store's timeout and `timeout` (the barrier's, which names missing ranks).
void agree_on_config(comm::Store& store, const std::string& agreement, int rank, int size,
                     std::chrono::milliseconds timeout);

// The most a rank that stopped spends telling the others (tell_ranks_this_one_stopped()), and
// of that the most it waits to reach the store.
inline constexpr std::chrono::milliseconds kTellBound{std::chrono::seconds(30)};
inline constexpr std::chrono::milliseconds kTellReachBound{std::chrono::seconds(10)};
// One still telling after this long says so (the line it exits with comes after).
inline constexpr std::chrono::seconds kTellNoteAfter{3};

// A rank that stops before it meets the others (its config unreadable or refused, its output
// folder held by another run, an address only its host cannot choose) would leave them waiting
// in agree_on_config() for comm.timeout_s. Instead it opens the store at `place` (rank 0 serves
// it), publishes "rank R (HOST) stopped before meeting the others: WHY" where a differing rank
// publishes its line, and takes part in the check's barriers: every other rank throws that line
// (exit 2) as soon as all have arrived. Rank 0 also publishes an empty hash, which the others
// take as "nothing to compare". Best effort: it takes at most min(timeout, kTellBound) in all,
// kTellReachBound of it to reach the store, and where the store cannot be reached the caller
// goes on to report its own error as before.
void tell_ranks_this_one_stopped(const RankPlace& place, const std::string& why,
                                 std::chrono::milliseconds timeout);

}  // namespace partrain
