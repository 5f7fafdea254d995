"""Whole or sharded stages are one strategy, chosen once from the mesh (pipesched.runtime.strategy):
what runs a step asks the strategy and its stage parts, and tests no mode of its own.

Every other difference between the two (gathers, reductions, the gradient norm, clipping, tied
copies) is exercised by the runtime's equivalence and sharded-layout tests; these say where the
choice is made and that nothing downstream makes it again.
"""

from __future__ import annotations

import ast

import pytest
from conftest import SRC

torch = pytest.importorskip("torch")

from pipesched.runtime.comm.mesh import PipelineMesh  # noqa: E402
from pipesched.runtime.strategy import choose_strategy  # noqa: E402
from pipesched.runtime.strategy.whole import WholeStages  # noqa: E402

RUNTIME = SRC / "pipesched" / "runtime"
# what runs a step: the executor, the engine's loop, a stage's compute
STEPPERS = [RUNTIME / "executor.py", RUNTIME / "engine" / "engine.py", RUNTIME / "engine" / "stage_runner.py"]
MODE_NAMES = {"sharded", "sharding", "tied_sums"}  # the mode flags and optional parts they replaced


def _mode_tests(path) -> list[str]:
    """Where ``path`` reads a mode: a name or attribute in MODE_NAMES, or an ``isinstance`` of a mesh."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name in MODE_NAMES:
            found.append(f"{path.name}:{node.lineno} {name}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and "Mesh" in ast.unparse(node):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", STEPPERS, ids=lambda p: p.name)
def test_what_runs_a_step_tests_no_whole_or_sharded_mode(path):
    assert _mode_tests(path) == []


def test_a_pipeline_mesh_chooses_whole_stages_reduced_over_every_replica():
    mesh = PipelineMesh(pp=2, dp=3, pp_rank=1, dp_rank=2, pp_group=None, dp_group=None,
                        grid=((0, 1), (2, 3), (4, 5)))
    strategy = choose_strategy(mesh, timeout_s=1.0, device=torch.device("cpu"))
    assert isinstance(strategy, WholeStages)
    assert strategy.mesh is mesh
    assert strategy.replicas_reduced == 3  # one all-reduce over the replicas: their mean, as DDP's
    assert strategy.norm_in_agreement  # the loss agreement sums the squares: no second collective
    assert (strategy.layout.pp, strategy.layout.dp, strategy.tp_rank, strategy.shard_rank) == (2, 3, 0, 0)
