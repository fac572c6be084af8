// nvfp4_gemm._C_sm90: registers the SM90 BackendApi table with the core module (see backend_module.h),
// and the test hook _sm90_force_splits.
#include "common/backend_module.h"
#include "sm90/backend.h"

NVFP4_GEMM_BACKEND_MODULE(_C_sm90, sm90, nvfp4_gemm::sm90::backend_api())

// torch.ops.nvfp4_gemm._sm90_force_splits(n): the split count of every following sm90 call in this process
// (0: automatic); returns the previous one. For tests and benchmarks that compare split paths in one
// process, where an environment variable read once cannot change.
TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("_sm90_force_splits(int splits) -> int", [](int64_t splits) -> int64_t {
    TORCH_CHECK(splits >= 0 && splits <= (1 << 20), "nvfp4_gemm._sm90_force_splits: splits must be in [0, 2^20] "
                "(0: automatic), got ", splits);
    return nvfp4_gemm::sm90::set_forced_splits(static_cast<int>(splits));
  });
  // Experiment (benchmarks/bench_generate.py --prefetch-chain): the packed weights and blocked scales of a model's
  // K-sliced GEMMs in run order; each such call then prefetches the next one's first pipeline stage into L2. An
  // empty list clears it; the caller keeps the tensors alive until then.
  m.def("_sm90_prefetch_chain(Tensor[] weights, Tensor[] weight_scales) -> int",
        [](const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& sf) -> int64_t {
          TORCH_CHECK(w.size() == sf.size(), "nvfp4_gemm._sm90_prefetch_chain: ", w.size(), " weights but ",
                      sf.size(), " weight_scales");
          std::vector<const uint8_t*> b, s;
          std::vector<int64_t> ldb, n, k;
          for (size_t i = 0; i < w.size(); ++i) {
            TORCH_CHECK(w[i].is_cuda() && w[i].scalar_type() == at::kByte && w[i].dim() == 2 && w[i].stride(1) == 1 &&
                            sf[i].is_cuda() && sf[i].is_contiguous(),
                        "nvfp4_gemm._sm90_prefetch_chain: weight ", i, " must be a CUDA uint8 [N, K/2] tensor with unit "
                        "stride along K and its scales contiguous on CUDA");
            b.push_back(static_cast<const uint8_t*>(w[i].data_ptr()));
            s.push_back(static_cast<const uint8_t*>(sf[i].data_ptr()));
            ldb.push_back(w[i].size(0) > 1 ? w[i].stride(0) : w[i].size(1));
            n.push_back(w[i].size(0));
            k.push_back(w[i].size(1) * 2);
          }
          return nvfp4_gemm::sm90::set_prefetch_chain(b.data(), s.data(), ldb.data(), n.data(), k.data(),
                                                       static_cast<int>(w.size()));
        });
}
