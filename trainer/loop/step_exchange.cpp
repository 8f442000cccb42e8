#include "trainer/loop/step_exchange.h"

#include "trainer/parallel/tensor_buffer.h"

namespace partrain {

void exchange_step(StepSlots& slots, comm::Communicator* comm, const c10::Device& device) {
  sum_over_ranks(comm, slots.values(), device);
}

}  // namespace partrain
