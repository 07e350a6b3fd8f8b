// C++ consumer of the header-only wrapper: errors arrive as exceptions.
#include <compcoll/compcoll.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  try {
    compcoll::Comm comm(argv[1], std::atoi(argv[2]), std::atoi(argv[3]));
    std::vector<float> g(50000, 1.0f);
    comm.allreduce(g.data(), g.size(), COMPCOLL_AVG, "layer0");
    std::printf("rank %d of %d: ok, compressed calls %llu, steady calls %llu\n", comm.rank(),
                comm.size(), static_cast<unsigned long long>(comm.stats().compressed_calls),
                static_cast<unsigned long long>(comm.steady_stats().steady_calls));
  } catch (const compcoll::Exception& e) {
    std::fprintf(stderr, "compcoll error (%d): %s\n", e.status(), e.what());
    return 1;
  }
  return 0;
}
