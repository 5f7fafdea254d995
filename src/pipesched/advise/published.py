"""Published training runs as the advisor's inputs: model sizes, GPUs, network, layout, settings.

Every number here is an input the publication states (or its code's default at the published
commit, named below), or an assumption about the GPU stated as such: nothing is fitted to the
published speeds. docs/layouts.md walks through them; ``benchmarks/published_layouts.py`` and
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
- Megatron-LM, Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
  Clusters"), table 1: GPT models with vocabulary 51200, sequence 2048, on DGX A100 80 GB nodes
  of 8 (NVLink within, 8 x 200 Gb/s HDR InfiniBand per node between), activation recomputation,
  no sequence parallelism (it came in 2022), no sharded optimizer states.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..parallel_layout import ParallelLayout
from .estimate import Hardware, TransformerCosts
from .fabric import Fabric, Link
from .transformer import TransformerSpec

GIB = 2 ** 30
H100_TFLOPS = 400.0  # assumption: 40% of an H100 SXM's 989 dense bf16 TFLOP/s, achieved
A100_TFLOPS = 150.0  # assumption: the advisor's default, about half of an A100's 312
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
                               vocab=self.vocab)
        return TransformerCosts(spec, self.layout.pp, Hardware(tflops=self.tflops, gpu_memory=self.gpu_memory_gb))

    def fabric(self) -> Fabric:
        return Fabric(self.gpus_per_node, Link.from_gbps(self.within_gbps, WITHIN_LATENCY_MS),
                      Link.from_gbps(self.across_gbps, ACROSS_LATENCY_MS))


_H100 = dict(tflops=H100_TFLOPS, gpu_memory_gb=95 * GIB / 1e9, within_gbps=H100_NVLINK, across_gbps=H100_NETWORK)
_A100 = dict(tflops=A100_TFLOPS, gpu_memory_gb=80 * GIB / 1e9, within_gbps=A100_NVLINK, across_gbps=A100_NETWORK,
             sequence_parallel=False)


def _megatron_settings(microbatches: int) -> tuple[tuple[str, int, int], ...]:
    """The paper's two schedules at its microbatch size of 1."""
    return ("1f1b", 1, microbatches), ("interleaved-1f1b", 2, microbatches)


TORCHTITAN_405B = PublishedRun(
    "torchtitan-405b", 126, 16384, 128, 128256, 8192, 512, 256, ParallelLayout(pp=8, dp_shard=8, tp=8),
    (("1f1b", 1, 8), ("interleaved-1f1b", 2, 8)),
    "1F1B 100 tokens/s/GPU, 82.5 GiB; interleaved 1F1B 128, 72.7 GiB", **_H100)
TORCHTITAN_70B = PublishedRun(
    "torchtitan-70b", 80, 8192, 64, 128256, 8192, 256, 512, ParallelLayout(pp=1, dp_shard=32, tp=8),
    (("1f1b", 1, 1),), "829 tokens/s/GPU, 71.9 GiB", **_H100)
MEGATRON_145B = PublishedRun(
    "megatron-145b", 80, 12288, 96, 51200, 2048, 1536, 2304, ParallelLayout(pp=8, dp_replicate=24, tp=8),
    _megatron_settings(96), "the layout of table 1", **_A100)
MEGATRON_310B = PublishedRun(
    "megatron-310b", 96, 16384, 128, 51200, 2048, 1920, 2160, ParallelLayout(pp=16, dp_replicate=15, tp=8),
    _megatron_settings(144), "the layout of table 1", **_A100)
MEGATRON_1T = PublishedRun(
    "megatron-1t", 128, 25600, 160, 51200, 2048, 3072, 3072, ParallelLayout(pp=64, dp_replicate=6, tp=8),
    _megatron_settings(512), "52% of peak FLOP/s", **_A100)

RUNS = (TORCHTITAN_405B, TORCHTITAN_70B, MEGATRON_145B, MEGATRON_310B, MEGATRON_1T)
