"""Nominal speeds per GPU type: the yardstick that calibration factors are relative to.

A calibration factor is measured / nominal: 1.0 means "as fast as the datasheet says", 0.8 means 20%
slower. The figures below are vendor datasheet peaks (dense, without structured sparsity; boost clocks),
per GPU as NVML sees it (a K80 board is two GPUs). fp16 is the tensor-core fp16 rate with fp32
accumulation where the GPU has tensor cores, None where fp16 has no fast path. Measured kernels rarely
reach a datasheet peak (a good fp32 matmul gets 60-90%), so healthy servers read below 1.0; the estimator
only ever uses ratios of factors between servers, so that offset cancels for servers calibrated the same way.

Sources (NVIDIA datasheets and architecture whitepapers):
  K80 (Tesla K80 datasheet): 8.73 TFLOP/s fp32 boost and 480 GB/s per board of two GPUs.
  P100 (Tesla P100 PCIe 16 GB datasheet): 9.3 fp32, 18.7 fp16, 732 GB/s (the SXM2 part: 10.6 / 21.2).
  V100 (Tesla V100 SXM2 datasheet): 15.7 fp32, 125 tensor, 900 GB/s. V100S PCIe: 16.4, 130, 1134 GB/s.
  T4 (Tesla T4 datasheet): 8.1 fp32, 65 fp16 tensor, 320 GB/s.
  GTX 1080 Ti: 11.3 fp32, 484 GB/s. TITAN Xp: 12.1 fp32, 547.7 GB/s (NVIDIA product pages).
  RTX 3090 (GA102 whitepaper): 35.6 fp32, 71 fp16 tensor with fp32 accumulate, 936 GB/s.
  RTX 4090 (Ada whitepaper): 82.6 fp32, 165.2 fp16 tensor with fp32 accumulate, 1008 GB/s.
  A10 (A10 datasheet): 31.2 fp32, 125 fp16 tensor, 600 GB/s. A40: 37.4, 149.7, 696 GB/s.
  A100 (A100 datasheet, SXM4 80 GB): 19.5 fp32, 312 fp16/bf16 tensor, 2039 GB/s (40 GB part: 1555 GB/s).
  L4 (L4 datasheet): 30.3 fp32, 121 fp16 tensor, 300 GB/s. L40S: 91.6, 362, 864 GB/s.
  H100 (H100 datasheet, SXM5): 67 fp32, 989 fp16/bf16 tensor, 3350 GB/s.
  H200 (H200 datasheet, SXM): 67 fp32, 989 fp16/bf16 tensor, 4800 GB/s.

The "cpu" type (devices = "cpu" nodes) is measured against a reference server CPU's theoretical peak,
computed the way GPU datasheets compute theirs: 16 cores x 2.0 GHz x 32 fp32 FLOP/cycle (two AVX-512 FMA
units) = 1.02 TFLOP/s, and four channels of DDR4-3200 = 102.4 GB/s.

Data loading has no datasheet: data_factor = measured samples/s per GPU / REFERENCE_DATA_PER_GPU, where the
reference is 8 CPU cores per GPU (a dual 32-core server with 8 GPUs), each core running the agent's
crop/flip/normalise kernel (hopsmgr_agent.kernels.data_loading_per_core) at 4,000 samples/s: one core of
the 2-vCPU Intel Xeon (Sapphire Rapids class) VM this agent was developed on measured 2,800-6,100 with
torch 2.13 (a shared VM, hence the spread), and 4,000 is the round figure fixed as the reference.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Nominal:
    fp32_tflops: float
    fp16_tflops: float | None
    memory_gbps: float


NOMINAL: dict[str, Nominal] = {
    "k80": Nominal(4.37, None, 240.0),
    "p100": Nominal(9.3, 18.7, 732.0),
    "v100": Nominal(15.7, 125.0, 900.0),
    "v100s": Nominal(16.4, 130.0, 1134.0),
    "t4": Nominal(8.1, 65.0, 320.0),
    "gtx1080ti": Nominal(11.3, None, 484.0),
    "titanxp": Nominal(12.1, None, 547.7),
    "rtx3090": Nominal(35.6, 71.0, 936.0),
    "rtx4090": Nominal(82.6, 165.2, 1008.0),
    "a10": Nominal(31.2, 125.0, 600.0),
    "a10g": Nominal(31.2, 125.0, 600.0),
    "a40": Nominal(37.4, 149.7, 696.0),
    "a100": Nominal(19.5, 312.0, 2039.0),
    "l4": Nominal(30.3, 121.0, 300.0),
    "l40s": Nominal(91.6, 362.0, 864.0),
    "h100": Nominal(67.0, 989.0, 3350.0),
    "h200": Nominal(67.0, 989.0, 4800.0),
    "cpu": Nominal(1.02, None, 102.4),
}

REFERENCE_CORE_SAMPLES_PER_S = 4000.0
REFERENCE_CORES_PER_GPU = 8
REFERENCE_DATA_PER_GPU = REFERENCE_CORE_SAMPLES_PER_S * REFERENCE_CORES_PER_GPU
DEFAULT_NET_GBPS = 12.5  # 100 Gbit/s, the scheduler's default when no peer could be probed


def nominal_for(gpu_type: str) -> Nominal | None:
    """The datasheet figures for a hopsmgr GPU type name (case-insensitive); None when unknown."""
    return NOMINAL.get(gpu_type.strip().lower())
