"""pretrain/profiling.py: what the benchmarks and ``--profile-steps`` report from torch.profiler's
events, on kernel names an H200 profile of BERT-base showed (benchmarks/README.md, run C)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from biomed_lm.pretrain.profiling import category, kernel_totals, totals_line

RUN_C = {
    "nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN": "gemm",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_256x128_32x3_nt_align2>": "gemm",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>": "gemm",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64": "attention",
    "void fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)": "attention",
    "triton_poi_fused_gelu_gelu_backward_4": "fused elementwise (triton)",
    "triton_red_fused__log_softmax__to_copy_addmm_argmax_prepare_softmax_online_7": "fused elementwise (triton)",
    "void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>, FusedAdamMathFunctor>":
        "optimizer and gradient norms",
    "Memcpy HtoD (Pinned -> Device)": "memory",
    "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, sum_functor>>": "other",
}


@pytest.mark.parametrize("name", list(RUN_C))
def test_each_kernel_is_put_with_its_kind_of_work(name):
    assert category(name) == RUN_C[name]


def test_the_totals_give_the_busy_share_launches_and_each_kinds_share():
    def kernel(name, microseconds, count):
        return SimpleNamespace(key=name, device_type=DeviceType.CUDA, self_device_time_total=microseconds, count=count)

    launcher = SimpleNamespace(key="aten::mm", device_type=DeviceType.CPU, self_device_time_total=500.0, count=9)
    events = [kernel("nvjet_sm90_tst_x", 500.0, 6), kernel("triton_poi_fused_gelu_4", 200.0, 3),
              kernel("void pytorch_flash::flash_fwd_kernel<>", 100.0, 3), launcher]
    totals = kernel_totals(events, seconds=0.001, steps=3, on_device=True)  # 1,000 µs of wall time
    assert totals["busy_share"] == pytest.approx(0.8) and totals["kernels_per_step"] == 4
    assert totals["categories"] == pytest.approx({"gemm": 0.5, "fused elementwise (triton)": 0.2, "attention": 0.1})
    assert list(totals["categories"]) == ["gemm", "fused elementwise (triton)", "attention"]  # largest first
    assert totals_line(totals) == ("all kernels: 80.0% of the wall time busy, 4 launches a step (gemm 50.0%, "
                                   "fused elementwise (triton) 20.0%, attention 10.0%)")
