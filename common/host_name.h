// defines: this_host_name() — the name of the machine this process runs on, as messages, lock
// files and TensorBoard's file names give it.
#pragma once

#include <string>

namespace partrain {

// The system's name for this machine; "unknown-host" where it cannot say.
std::string this_host_name();

}  // namespace partrain
