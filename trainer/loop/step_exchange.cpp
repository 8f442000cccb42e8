#include "trainer/loop/step_exchange.h"

#include <cstdint>

#include "trainer/observe/flight_recorder.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {

void exchange_step(StepSlots& slots, comm::Communicator* comm, const c10::Device& device) {
  if (comm == nullptr) return sum_over_ranks(comm, slots.values(), device);
  const std::uint64_t seq =
      flight_recorder().enter(FlightOp::kStepExchange, -1, slots.values().size() * sizeof(double));
  sum_over_ranks(comm, slots.values(), device);
  flight_recorder().leave(seq);
}

}  // namespace partrain
