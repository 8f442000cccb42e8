// defines: describe_flight() (where a rank stood, in words), dump_flight()
// (OUTPUT/flight/rank-R.json when a run fails) and explain_flight() (`partrain explain
// OUTPUT/flight`: where each rank stood and who held the others up), over the flight recorder
// of comm_backends/flight_recorder.h — every collective of every communicator, recorded by
// CheckedCommunicator — whose names this header brings into partrain:: for the trainer, which
// marks the collectives it runs for a gradient bucket or the step exchange
// (flight_recorder().enter(FlightOp::kAllreduce, bucket, bytes) ... leave()). LibTorch-free.
//
// Every rank runs the same collectives on a communicator in the same order, so "#n of
// communicator c" is the same collective on every rank. A rank that stopped in #135 while
// another had entered #136 is the one the others waited for.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "comm_backends/flight_recorder.h"

namespace partrain {

using comm::flight_recorder;
using comm::FlightEntry;
using comm::FlightOp;
using comm::FlightRecorder;

// Where a rank stood at `now_s`: "in allreduce #136 (step 68, bucket 2, 1.1 MB) for 5.0 s" or
// "after step exchange #135 (step 67, 24 bytes), 0.2 s ago" (", communicator 2" inside the
// brackets for a collective of another communicator than the first); "no collective recorded"
// when empty.
std::string describe_flight(const std::vector<FlightEntry>& entries, double now_s);

// Writes OUTPUT/flight/rank-R.json atomically: {"schema": "partrain.flight/1", "rank",
// "world_size", "error", "written_s", "collectives": [{"seq", "comm", "op", "bucket", "bytes",
// "step", "algorithm", "start_s", "end_s" (null while in flight)}]}. Returns its path. Never
// throws: a failing rank must still report its own error, so a dump that cannot be written
// returns "".
std::string dump_flight(const std::string& output_dir, int rank, int world_size,
                        std::string_view error, const std::vector<FlightEntry>& entries);

// `partrain explain DIR` where DIR holds rank-*.json (an output folder's flight/): a line per
// rank saying where it stood, the ranks that left no dump, and which rank(s) the others waited
// for. Throws UsageError (one line) when DIR holds no readable dump.
std::string explain_flight(const std::string& dir);

}  // namespace partrain
