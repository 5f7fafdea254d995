#!/usr/bin/env bash
# GPU check of the runtime: equivalence of every schedule and the benchmark, on NCCL.
#
#   bash benchmarks/gpu_check.sh [RESULTS_FILE]     (default: benchmarks/gpu_results.md)
#
# Needs torch with CUDA. With 2+ GPUs it runs torchrun on min(GPUs, 4) ranks (NCCL, one device
# per rank). NCCL cannot put two ranks on one device, so with a single GPU it runs the
# equivalence check on one rank and on two ranks sharing the GPU over gloo (messages through
# host memory), and the multi-rank NCCL part is not possible. Either way it then times split
# backward (I + W against B) on one transformer block of realistic size on the GPU, and checks
# memory: 2 and 4 ranks sharing the GPU over gloo run a GPT of width 1024 with 1f1b, zb-v,
# v-half and v-min, and print per rank the activation bytes measured against the prediction
# and what a step adds to max_memory_allocated (benchmarks/memory.py --device-check). Overlapped
# F&B pairs (dualpipev, dualpipe) with the forward half on a second CUDA stream are checked
# against the halves run one after the other: equivalence and step time (benchmarks/dualpipe.py --streams).
# With 4+ GPUs: sharded stages (FSDP2 x TP) against the unsharded model, and torch's pipelining
# with FSDP2 stages timed (benchmarks/sharded_vs_torch.py --check), a sharded checkpoint resumed
# at other layouts (benchmarks/checkpoint_layouts.py --check), and expert parallelism's all-to-all
# behind DualPipe's interleaved pairs (benchmarks/expert_overlap.py; not run on a GPU yet); with
# 8+, the eight-process layouts (benchmarks/sharded_layouts.py --check).
# Exits non-zero if a check fails. Dry run of the script's logic on a CPU-only machine:
# GPU_CHECK_ON_CPU=1 (gloo, CPU, small block; proves nothing about CUDA).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"
OUT="${1:-benchmarks/gpu_results.md}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if [[ "${GPU_CHECK_ON_CPU:-0}" == 1 ]]; then  # dry run of this script on a CPU-only machine
    gpus=1 device=cpu split_size=(--dim 128 --heads 4 --context 32 --batch 8)
    mem_size=(--dim 64 --layers 6 --context 32 --microbatch 2 --microbatches 8)
else
    gpus="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')"
    device=cuda split_size=(--dim 1024 --heads 16 --context 1024 --batch 8)
    mem_size=(--dim 1024 --layers 8 --context 1024 --microbatch 2 --microbatches 12)
fi
if [[ "$gpus" -lt 1 ]]; then
    echo "gpu_check: no CUDA device visible to torch; nothing to check (GPU_CHECK_ON_CPU=1: dry run)" >&2
    exit 2
fi
{
    echo "# pipesched runtime on $device ($(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    "$PY" -c 'import torch; print("torch", torch.__version__, "| devices:", ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "none (dry run)")'
    echo
} > "$OUT"

status=0
if [[ "$gpus" -ge 2 ]]; then
    ranks=$(( gpus < 4 ? gpus : 4 ))
    run() { "$PY" -m torch.distributed.run --standalone --nproc-per-node "$ranks" "$@"; }
    echo "## Equivalence, $ranks ranks, NCCL" >> "$OUT"
    run benchmarks/equivalence.py | tee -a "$OUT" || status=1
    if [[ "$ranks" -eq 2 ]]; then
        echo "## Benchmark, 2 ranks, NCCL" >> "$OUT"
        run benchmarks/runtime.py | tee -a "$OUT" || status=1
    fi
else
    echo "## One device, one rank" >> "$OUT"
    MASTER_ADDR=127.0.0.1 MASTER_PORT="${MASTER_PORT:-29533}" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
        "$PY" benchmarks/equivalence.py | tee -a "$OUT" || status=1
    # NCCL refuses two ranks on one device: share it over gloo, messages through host memory
    echo "## One device, 2 ranks sharing it (gloo, messages through host memory; no NCCL)" >> "$OUT"
    PIPESCHED_BACKEND=gloo "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/equivalence.py | tee -a "$OUT" || status=1
    echo "## One device, 4 ranks sharing it: 2 replicas x 2 pipeline ranks (gloo, 2D mesh)" >> "$OUT"
    PIPESCHED_BACKEND=gloo "$PY" -m torch.distributed.run --standalone --nproc-per-node 4 \
        benchmarks/equivalence.py --dp 2 | tee -a "$OUT" || status=1
fi
# sharded stages (FSDP2 x TP, tests/test_sharded_stages.py's cases) and torch's pipelining with
# FSDP2 stages at pp 2 x dp_shard 2: four ranks, one GPU each (NCCL's reduce-scatter and all-gather)
if [[ "$gpus" -ge 4 ]]; then
    echo "## Sharded stages and torch with FSDP2 stages, 4 ranks, NCCL" >> "$OUT"
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 4 benchmarks/sharded_vs_torch.py --check \
        | tee -a "$OUT" || status=1
    # a checkpoint of sharded stages (DTensors saved by DCP from the GPUs) resumed at other layouts
    echo "## Checkpoints across layouts: pp 2 x dp_shard 2 resumed at pp 2 x tp 2, pp 4, one process, 4 ranks, NCCL" >> "$OUT"
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 4 benchmarks/checkpoint_layouts.py --check \
        | tee -a "$OUT" || status=1
else
    echo "## Sharded stages: skipped (needs 4 GPUs for NCCL, $gpus here)" >> "$OUT"
fi
# eight-process sharded layouts (HSDP, FSDP2 x TP) under five schedules, gpt, Llama and GPT-2
if [[ "$gpus" -ge 8 ]]; then
    echo "## Sharded layouts, 8 ranks, NCCL" >> "$OUT"
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 8 benchmarks/sharded_layouts.py --check \
        | tee -a "$OUT" || status=1
else
    echo "## Sharded layouts: skipped (needs 8 GPUs for NCCL, $gpus here)" >> "$OUT"
fi
# expert parallelism under dualpipev: each overlapped pair's halves interleaved at their all-to-alls
# (NCCL's all-to-all on its own stream, the compute on the current one) against the halves in turn,
# step by step: exposed all-to-all and step time (benchmarks/expert_overlap.py). Not run on a GPU yet.
if [[ "$gpus" -ge 4 ]]; then
    echo "## Expert all-to-all behind interleaved F&B pairs, 4 ranks, NCCL" >> "$OUT"
    PYTHONPATH="$PYTHONPATH:$PWD/tests" "$PY" -m torch.distributed.run --standalone --nproc-per-node 4 \
        benchmarks/expert_overlap.py --steps 13 | tee -a "$OUT" || status=1
else
    echo "## Expert all-to-all overlap: skipped (needs 4 GPUs for NCCL, $gpus here)" >> "$OUT"
fi
# overlapped F&B pairs with the forward half on a CUDA stream of its own, against the halves one
# after the other: equivalence and step-time ratio (dualpipev on one rank needs no messages)
echo "## Overlapped F&B on two CUDA streams, one rank" >> "$OUT"
MASTER_ADDR=127.0.0.1 MASTER_PORT="${MASTER_PORT:-29533}" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
    "$PY" benchmarks/dualpipe.py --streams | tee -a "$OUT" || status=1
if [[ "$gpus" -ge 2 ]]; then
    echo "## Overlapped F&B on two CUDA streams, 2 ranks, NCCL" >> "$OUT"
    "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/dualpipe.py --streams | tee -a "$OUT" || status=1
fi
echo "## Split backward on one transformer block, $device" >> "$OUT"
"$PY" benchmarks/split_block.py --device "$device" "${split_size[@]}" | tee -a "$OUT" || status=1
for n in 2 4; do
    echo "## Memory, $n ranks sharing the device (gloo), GPT" >> "$OUT"
    PIPESCHED_BACKEND=gloo "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" \
        benchmarks/memory.py --device-check "${mem_size[@]}" | tee -a "$OUT" || status=1
done
! grep -q "equivalence: FAIL" "$OUT" && grep -q "equivalence: PASS" "$OUT" || status=1
! grep -q "memory: FAIL" "$OUT" && grep -q "memory: PASS" "$OUT" || status=1
! grep -q "overlap streams equivalence: FAIL" "$OUT" && grep -q "overlap streams equivalence: PASS" "$OUT" || status=1
echo "gpu_check: $([[ $status -eq 0 ]] && echo PASS || echo FAIL), figures in $OUT"
exit "$status"
