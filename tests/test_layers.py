"""The layers of the README's diagram are the real imports: no cycles, nothing imports upwards,
the pure-Python layers import no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import SRC, cli_env

PACKAGE = SRC / "pipesched"

# Lowest first. A module may import from its own layer and the layers below, never above.
LAYERS = [
    ("core", ["errors", "ops", "gather_plan", "parallel_layout", "expert_plans", "sharded_bytes", "layout_refusals", "actions", "placement", "pipelines", "costs", "dependencies", "lowering", "execution", "collector", "byte_units", "memory",
              "schedule", "ranking", "outfiles",
              "balance", "bounds", "jsontext", "units", "environment",
              # options declared once, without typer (the run's tree and the commands take them)
              "declared", "shared_options", "memory_limits"]),
    ("model", ["validate", "simulate", "planning"]),
    ("schedules", ["schedules"]),  # the family modules and the constructions they share
    ("registry", ["registry"]),
    ("zb-auto", ["auto"]),
    ("families", ["schedules.builtin"]),  # the registrations
    ("planning tools", ["compare", "render", "advise", "interop"]),
    # the runtime's sub-packages, lowest first (each __init__ says what it may import)
    ("runtime program", ["runtime.program"]),  # each rank's program: pure Python
    ("runtime metering", ["runtime.metering"]),
    ("runtime stages", ["runtime.stages"]),
    ("runtime comm", ["runtime.comm"]),
    ("runtime engine", ["runtime.engine"]),
    ("runtime sharding", ["runtime.sharding"]),
    ("runtime checkpoints", ["runtime.checkpoints"]),
    ("runtime launching", ["runtime.launching"]),
    ("runtime strategy", ["runtime.strategy"]),  # whole or sharded stages, chosen once
    ("runtime", ["runtime"]),  # PipelineRuntime and its options: a library that knows no application
    # the application's lowest part: what a model is to it and the checks before launch, which
    # pipesched.hf.pipeline calls as train does
    ("launch checks", ["training.model_def", "training.launch_checks", "training.checkpoint_checks"]),
    ("runtime users", ["hf", "data"]),  # Hugging Face models on the runtime; their token streams
    ("application", ["training"]),  # pipesched train's run: its declared tree, models, data, loop, metrics, profile
    ("run resolution", ["resolve", "zb_auto_plan", "schedule_files", "gather_placement"]),
    ("train job", ["training.job"]),  # a run assembled from its RunConfig, checked, its schedule resolved, launched
    ("cli", ["cli", "__main__"]),
]
TORCH_FREE = ["runtime.program.program", "runtime.program.program_check", "runtime.program.planned_gathers", "runtime.metering.timeline", "resolve",
              "zb_auto_plan", "schedule_files"]  # documented as importable without torch
# Typer's pattern: the CLI package holds the app, and registers the command modules that import
# it (pipesched.cli <-> pipesched.cli.*). The one cycle allowed, inside the top layer.
CYCLE_ALLOWED_WITHIN = "cli"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str) -> set[str]:
    """Internal modules ``name`` imports at run time (anywhere in the file; ``if TYPE_CHECKING:``
    blocks name types only and are left out)."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    tree = ast.parse(path.read_text())
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level > 1 else list(package)
                base = [p for p in base if p]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("pipesched"):
                target = node.module.removeprefix("pipesched").lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pipesched."):
                    found.add(alias.name.removeprefix("pipesched."))
    found.discard(name)
    return {m for m in found if m in MODULES}


GRAPH = {name: _imports(name) for name in MODULES if name}  # "" is the package facade


def _layer(name: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    assert best is not None, f"{name} is in no layer: add it to LAYERS (and to the README's diagram)"
    return best[0]


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
        for m, targets in GRAPH.items() for t in sorted(targets) if _layer(t) > _layer(m)
    ]
    assert upward == []


def test_the_imports_have_no_cycles():
    done: set[str] = set()
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(GRAPH.get(node, ())):
            if target in path:
                cycle = path[path.index(target):] + [target]
                if not all(m.split(".")[0] == CYCLE_ALLOWED_WITHIN for m in cycle):
                    cycles.append(" -> ".join(cycle))
            elif target not in done:
                visit(target, path + [target])
        done.add(node)

    for name in sorted(GRAPH):
        if name not in done:
            visit(name, [name])
    assert cycles == []


def test_planning_layers_import_inside_functions_only_optional_dependencies():
    """Below the runtime and the CLI, imports sit at the top of the module (the layering shows);
    only optional or heavy third-party packages (scipy's solver, torch) may load on first use."""
    lazy = []
    for name, path in MODULES.items():
        if not name or name.split(".")[0] == "interop" or _layer(name) >= _layer("runtime.program"):  # the runtime and above
            continue
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("pipesched")):
                    lazy.append(f"{name}.{func.name}")
    assert lazy == []


def test_the_pure_python_runtime_modules_import_without_torch():
    blocker = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked for this test')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        + "".join(f"import pipesched.{m}\n" for m in TORCH_FREE)
        + "import pipesched, pipesched.advise, pipesched.render.svg\n"
        "assert not any(k == 'torch' or k.startswith('torch.') for k in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_training_application_imports_no_command_line():
    """``pipesched.training`` (the run's declared tree, the job, the checks before launch) is the
    application, not the command line: no module of it imports typer or ``pipesched.cli``, so the
    job runs from a ``RunConfig`` built by any caller."""
    found = []
    for name, path in MODULES.items():
        if name.split(".")[0] != "training":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{name} imports {t}" for t in targets if t.split(".")[0] == "typer" or t.startswith("pipesched.cli")]
        found += [f"{name} imports {t}" for t in sorted(GRAPH[name]) if t.split(".")[0] in ("cli", "__main__")]
    assert found == []
