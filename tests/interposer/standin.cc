#include "tests/interposer/standin.h"

#include <dlfcn.h>

#include <exception>
#include <memory>
#include <thread>

namespace compcoll::testing {

std::string standin_nccl_path() { return COMPCOLL_TEST_STANDIN_NCCL; }
std::string standin_cuda_path() { return COMPCOLL_TEST_STANDIN_CUDA; }
std::string interposer_path() { return COMPCOLL_TEST_INTERPOSER; }
std::string app_path() { return COMPCOLL_TEST_APP; }

const nccl::NcclApi& standin_nccl() {
  static const nccl::NcclApi api = nccl::load_nccl(standin_nccl_path());
  return api;
}

const nccl::CudaDriverApi& standin_cuda() {
  static const nccl::CudaDriverApi api = nccl::load_cuda_driver(standin_cuda_path());
  return api;
}

std::vector<std::string> run_nccl_ranks(int ranks, std::chrono::milliseconds timeout,
                                        const std::function<void(nccl::NcclComm&)>& fn,
                                        const std::atomic<bool>* stop) {
  const nccl::NcclApi& api = standin_nccl();
  const nccl::CudaDriverApi& cuda = standin_cuda();
  using GetId = ncclResult_t (*)(ncclUniqueId*);
  const auto get_id = reinterpret_cast<GetId>(dlsym(api.handle, "ncclGetUniqueId"));
  ncclUniqueId id{};
  if (get_id == nullptr || get_id(&id) != ncclSuccess) return {std::string("no ncclGetUniqueId")};
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      ncclComm_t comm = nullptr;
      bool aborted = false;
      try {
        if (api.CommInitRank(&comm, ranks, id, r) != ncclSuccess) throw std::runtime_error("ncclCommInitRank failed");
        nccl::NcclCommOptions o;
        o.timeout = timeout;
        o.stop = stop;
        nccl::NcclComm nc(api, cuda, comm, o);
        try {
          fn(nc);
        } catch (...) {
          aborted = nc.aborted();
          throw;
        }
        aborted = nc.aborted();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      if (comm != nullptr && !aborted) api.CommDestroy(comm);
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace compcoll::testing
