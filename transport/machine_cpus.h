// Which machine this process runs on and which CPUs it may run on, for
// COMPCOLL_HIERARCHY=auto: the host hierarchy pays where a machine's ranks
// outnumber the cores they can use (docs/scaling.md, "When auto takes the
// hierarchy"), so every rank reports both.
#pragma once

#include <string>

namespace compcoll {

// "<boot id>|<CPU bitmap as hex, CPU 0 in the last digit>". The machine is
// the kernel (its boot id), whatever COMPCOLL_HOST_ID says: network
// namespaces and containers on one kernel share its cores. The bitmap is
// this process's affinity (sched_getaffinity), so a rank pinned to two CPUs
// counts two. Never throws: without /proc the machine is "unknown", and
// without an affinity mask every online CPU counts.
std::string describe_machine_cpus();

}  // namespace compcoll
