"""Published training runs as the advisor's inputs: model sizes, GPUs, network, layout, settings.

Every number here is an input the publication states (or its code's default at the published
commit, named below), an assumption stated as such, or one achievable share of peak per GPU
kind, calibrated on one named run and used for every other: nothing is fitted run by run. docs/layouts.md walks through them; ``benchmarks/published_layouts.py`` and
``tests/test_published_runs.py`` run them.

- torchtitan, ``docs/performance.md`` (added in commit d4c86e3, 2025-01-30; it names torchtitan 9dec370,
  2024-12-26, as the code benchmarked), tables 4 and 5: Llama 3.1
  70B on 256 H100 (FSDP 32 x TP 8, local batch 16) and 405B on 512 H100 (FSDP 8 x TP 8 x PP 8,
  local batch 32, global 256), sequence 8192, full activation checkpointing, nodes of 8 H100
  (NVLink within, 400 Gb/s RDMA per GPU between). The table names no microbatch count, so the
  405B settings are that commit's defaults (github.com/pytorch/torchtitan at 9dec370,
  ``torchtitan/parallelisms/pipelining_utils.py``): ``build_pipeline_schedule`` gave every
  schedule ``pipeline_parallel_degree`` microbatches (8, of 4 sequences each; the option's help
  said "the number of pipeline stages", the code did not, until commit 90567fc, PR #781, of
  2025-01-07), and ``generate_split_points`` gave a multi-stage schedule 2 stages per rank
  (126 layers as 7, 14 x 8, 7; one stage per rank: 15, 6 x 16, 15).
- Llama 3 405B, Dubey et al. 2024 ("The Llama 3 Herd of Models"), table 4: 16,384 H100 80 GB
  as TP 8 x PP 16 x DP 128 (FSDP), sequence 8192, 16 sequences per replica (batch 2,048), 400
  TFLOP/s per GPU; RoCE at 400 Gb/s per GPU. The paper's interleaved schedule's chunk count is
  not taken from it: 4 is assumed (the advisor's most by default), without recomputation (the
  fastest that fits the memory model at that layout), 1F1B priced beside it.
- Megatron-Bridge, its performance summary archive
  (docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary-archive.html), DGX-H100 rows,
  FP8: Llama 3 70B on 64 H100 as TP 4 x PP 8 with 5 virtual stages per rank, global batch 256,
  1,639-1,664 tokens/s per GPU over the archived releases (the midpoint compared); Llama 3.1 405B
  on 1,024 H100 as TP 8 x PP 8 x CP 2 with 8 virtual stages, microbatch 1, global batch 1,536,
  326-328 tokens/s per GPU. Sequence 8192, sequence parallelism, microbatches of 1 sequence
  (the recipes' ``micro_batch_size``). Megatron's distributed optimizer is priced as ZeRO-1
  over the data-parallel ranks (:data:`~pipesched.sharded_bytes.ZERO1`: bf16 weights and fp32
  gradients whole, the fp32 master weights and Adam's moments sharded; fp32 gradients assumed,
  Megatron's ``grad_reduce_in_fp32``). The advisor has no context parallelism: CP 2 is priced as two
  data-parallel ranks of half sequences (the same tokens, weights and activations per GPU; each
  token's attention counted over 4,096 keys rather than up to 8,192, about 4% of a layer's
  FLOPs less, and CP's exchange of keys and values left out). No recomputation (assumed: the
  recipes name none).
- DeepSeek-V3, DeepSeek-AI 2024 ("DeepSeek-V3 Technical Report"): 61 layers (the first 3 dense),
  hidden 7168, 128 heads, 256 routed experts of width 2048 and 1 shared, 8 routed per token,
  vocabulary 129,280, sequence 4096, batch 15,360 sequences (after its ramp); 2,048 H800 80 GB
  in nodes of 8 (NVLink 400 GB/s, InfiniBand 50 GB/s per GPU) as PP 16 x EP 64 x ZeRO-1 data
  parallelism, no TP, DualPipe; 180K H800 GPU hours per trillion tokens (its section 1: 1,543
  tokens/s per GPU). Priced as pipesched's ``dualpipev`` (DualPipe's one-copy V form) at
  microbatches of 1 sequence (assumed: the report names no microbatch size), ZeRO-1 as
  Megatron's (above), recomputing (the report recomputes only norms and up-projections and caches the
  experts' activations in FP8, which the BF16 model cannot say: storing them it holds 99.6 GiB), its
  latent attention as standard attention of ``12h^2``-style shapes, its node-limited routing
  (each token to at most 4 nodes) and FP8 dispatch left out: every routed copy priced on
  InfiniBand in BF16. The H800 computes as the H100 (the same dense BF16 peak): the H100's share.
- Megatron-LM, Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
  Clusters"), table 1: GPT models with vocabulary 51200, sequence 2048, on DGX A100 80 GB nodes
  of 8 (NVLink within, 8 x 200 Gb/s HDR InfiniBand per node between), activation recomputation,
  no sequence parallelism (it came in 2022), no sharded optimizer states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..parallel_layout import ParallelLayout
from ..sharded_bytes import MIXED, ZERO1, Precision
from .estimate import Hardware, TransformerCosts
from .fabric import Fabric, Link
from .transformer import TransformerSpec
from .transformer_experts import Experts

GIB = 2 ** 30
# One achievable share of the dense BF16 peak per GPU kind, each calibrated on one named run (the
# share at which that run's predicted tokens/s per GPU equals its published figure:
# ``benchmarks/published_layouts.py calibrate NAME PEAK``); every other run is predicted with it
A100_PEAK, H100_PEAK = 312.0, 989.0  # dense BF16 TFLOP/s
A100_SHARE = 0.565  # calibrated on megatron-145b (Narayanan et al. 2021, table 1)
H100_SHARE = 0.568  # calibrated on llama3-405b (Dubey et al. 2024, table 4)
A100_TFLOPS, H100_TFLOPS = A100_SHARE * A100_PEAK, H100_SHARE * H100_PEAK
H100_NVLINK, H100_NETWORK = 450.0, 50.0  # GB/s per GPU and direction: NVLink 4, 400 Gb/s RDMA
A100_NVLINK, A100_NETWORK = 300.0, 25.0  # NVLink 3; 8 x 200 Gb/s HDR per node of 8
WITHIN_LATENCY_MS, ACROSS_LATENCY_MS = 0.005, 0.02  # per ring step (assumption)


@dataclass(frozen=True)
class PublishedRun:
    """One published run: what the advisor is told, and the settings it ran."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    gpus: int
    global_batch: int
    layout: ParallelLayout
    settings: tuple[tuple[str, int, int], ...]  # (schedule, chunks, microbatches per replica) as published
    published: str  # what the publication measured
    tflops: float
    gpu_memory_gb: float
    within_gbps: float
    across_gbps: float
    gpus_per_node: int = 8
    recompute: bool = True
    sequence_parallel: bool = True
    tokens_per_gpu: float = 0.0  # tokens/s per GPU measured (derived where the paper gives TFLOP/s)
    measured_schedule: str = ""  # the setting the figure is of ("": not stated, the faster one priced)
    experts: Optional[Experts] = None  # a mixture of experts' (None: dense)
    ep: int = 1  # expert parallelism
    zero1: bool = False  # data parallelism by Megatron's distributed optimizer (ZeRO-1), not FSDP

    @property
    def precision(self) -> Precision:
        """How its data-parallel ranks keep the state: bf16 compute, fp32 gradients, as ZeRO-1 or FSDP."""
        return ZERO1 if self.zero1 else MIXED

    @property
    def microbatch_size(self) -> int:
        """Sequences per microbatch as published: a replica's batch over its microbatches (the
        size the advisor is told, so that the search prices the published microbatches)."""
        sizes = {self.global_batch // self.layout.dp // m for _, _, m in self.settings}
        if len(sizes) != 1:
            raise ValueError(f"{self.name}: its settings give microbatches of several sizes {sorted(sizes)}")
        return sizes.pop()

    def model(self) -> TransformerCosts:
        spec = TransformerSpec(self.layers, self.hidden, self.seq_len, self.microbatch_size, heads=self.heads,
                               vocab=self.vocab, experts=self.experts)
        return TransformerCosts(spec, self.layout.pp, Hardware(tflops=self.tflops, gpu_memory=self.gpu_memory_gb))

    def fabric(self) -> Fabric:
        return Fabric(self.gpus_per_node, Link.from_gbps(self.within_gbps, WITHIN_LATENCY_MS),
                      Link.from_gbps(self.across_gbps, ACROSS_LATENCY_MS))


_H100 = dict(tflops=H100_TFLOPS, gpu_memory_gb=95 * GIB / 1e9, within_gbps=H100_NVLINK, across_gbps=H100_NETWORK)
_H100_80GB = {**_H100, "gpu_memory_gb": 80 * GIB / 1e9}  # the DGX H100's part (torchtitan's had 95 GiB)
_A100 = dict(tflops=A100_TFLOPS, gpu_memory_gb=80 * GIB / 1e9, within_gbps=A100_NVLINK, across_gbps=A100_NETWORK,
             sequence_parallel=False)


def _megatron_settings(microbatches: int) -> tuple[tuple[str, int, int], ...]:
    """The paper's two schedules at its microbatch size of 1."""
    return ("1f1b", 1, microbatches), ("interleaved-1f1b", 2, microbatches)


def megatron_tokens(tflops: float, layers: int, hidden: int, seq_len: int, vocab: int) -> float:
    """Tokens/s per GPU from the paper's TFLOP/s per GPU and its FLOP count (its equation 3, per
    token: ``96 l h^2 (1 + s/6h + V/16lh)``, which counts the recomputed forward)."""
    per_token = 96 * layers * hidden ** 2 * (1 + seq_len / (6 * hidden) + vocab / (16 * layers * hidden))
    return tflops * 1e12 / per_token


def _megatron(name: str, heads: int, hidden: int, layers: int, pp: int, gpus: int, batch: int,
              tflops: float) -> PublishedRun:
    """One row of Narayanan et al. 2021's table 1 (TP 8, microbatches of 1)."""
    layout = ParallelLayout(pp=pp, dp_replicate=gpus // (8 * pp), tp=8)
    return PublishedRun(name, layers, hidden, heads, 51200, 2048, gpus, batch, layout,
                        _megatron_settings(batch // layout.dp), f"{tflops:g} TFLOP/s per GPU", **_A100,
                        tokens_per_gpu=megatron_tokens(tflops, layers, hidden, 2048, 51200))


TORCHTITAN_405B = PublishedRun(
    "torchtitan-405b", 126, 16384, 128, 128256, 8192, 512, 256, ParallelLayout(pp=8, dp_shard=8, tp=8),
    (("1f1b", 1, 8), ("interleaved-1f1b", 2, 8)),
    "1F1B 100 tokens/s/GPU, 82.5 GiB; interleaved 1F1B 128, 72.7 GiB", **_H100, tokens_per_gpu=128,
    measured_schedule="interleaved-1f1b")
TORCHTITAN_70B = PublishedRun(
    "torchtitan-70b", 80, 8192, 64, 128256, 8192, 256, 512, ParallelLayout(pp=1, dp_shard=32, tp=8),
    (("1f1b", 1, 1),), "829 tokens/s/GPU, 71.9 GiB", **_H100, tokens_per_gpu=829, measured_schedule="1f1b")
MEGATRON_39B = _megatron("megatron-39b", 64, 8192, 48, 2, 512, 1536, 138)
MEGATRON_76B = _megatron("megatron-76b", 80, 10240, 60, 4, 1024, 1792, 140)
MEGATRON_145B = _megatron("megatron-145b", 96, 12288, 80, 8, 1536, 2304, 148)
MEGATRON_310B = _megatron("megatron-310b", 128, 16384, 96, 16, 1920, 2160, 155)
MEGATRON_530B = _megatron("megatron-530b", 128, 20480, 105, 35, 2520, 2520, 163)
MEGATRON_1T = _megatron("megatron-1t", 160, 25600, 128, 64, 3072, 3072, 163)

def spec_tokens(tflops: float, layers: int, hidden: int, heads: int, vocab: int, seq_len: int) -> float:
    """Tokens/s per GPU from a paper's model TFLOP/s per GPU (no recomputation counted), with the
    advisor's own FLOP count for the model (:class:`TransformerSpec`), so that the figure and the
    prediction count alike."""
    spec = TransformerSpec(layers, hidden, seq_len, 1, heads=heads, vocab=vocab)
    per_sequence = layers * sum(spec.layer_flops(1)) + 3 * (spec.head_flops(1) + spec.embedding_flops(1))
    return tflops * 1e12 * seq_len / per_sequence


LLAMA3_TOKENS = spec_tokens(400, 126, 16384, 128, 128256, 8192)
LLAMA3_405B = PublishedRun(
    "llama3-405b", 126, 16384, 128, 128256, 8192, 16384, 2048, ParallelLayout(pp=16, dp_shard=128, tp=8),
    (("1f1b", 1, 16), ("interleaved-1f1b", 4, 16)), "400 TFLOP/s per GPU (41% of BF16 peak)",
    **_H100_80GB, recompute=False, tokens_per_gpu=LLAMA3_TOKENS,
    measured_schedule="interleaved-1f1b")

MBRIDGE_70B = PublishedRun(
    "megatron-bridge-70b", 80, 8192, 64, 128256, 8192, 64, 256, ParallelLayout(pp=8, dp_shard=2, tp=4),
    (("interleaved-1f1b", 5, 128),), "FP8: 1,639-1,664 tokens/s/GPU", **_H100_80GB, recompute=False,
    tokens_per_gpu=(1639 + 1664) / 2, measured_schedule="interleaved-1f1b", zero1=True)
MBRIDGE_405B = PublishedRun(  # CP 2 as two data-parallel ranks of half sequences (see the module doc)
    "megatron-bridge-405b", 126, 16384, 128, 128256, 8192 // 2, 1024, 1536 * 2, ParallelLayout(pp=8, dp_shard=16, tp=8),
    (("interleaved-1f1b", 8, 192),), "FP8: 326-328 tokens/s/GPU", **_H100_80GB, recompute=False,
    tokens_per_gpu=(326 + 328) / 2, measured_schedule="interleaved-1f1b", zero1=True)

DEEPSEEK_V3 = PublishedRun(
    "deepseek-v3", 61, 7168, 128, 129280, 4096, 2048, 15360, ParallelLayout(pp=16, dp_shard=128),
    (("dualpipev", 2, 120),), "FP8: 180K H800 GPU hours per trillion tokens", **{**_H100_80GB, "within_gbps": 400.0},
    recompute=True, tokens_per_gpu=1e12 / (180e3 * 3600), measured_schedule="dualpipev",
    experts=Experts(256, 8, 2048, shared=1, dense_layers=3), ep=64, zero1=True)

RUNS = (TORCHTITAN_405B, TORCHTITAN_70B, LLAMA3_405B, MBRIDGE_70B, MBRIDGE_405B, DEEPSEEK_V3, MEGATRON_39B, MEGATRON_76B, MEGATRON_145B, MEGATRON_310B,
        MEGATRON_530B, MEGATRON_1T)
