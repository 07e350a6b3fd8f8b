// `compcoll-bench codec`: one process, one thread, one codec at a time, timed
// against memcpy of the same buffer in the same run.
#pragma once

namespace compcoll::bench {

int codec_main(int argc, char** argv, int first);

}  // namespace compcoll::bench
