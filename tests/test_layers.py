"""raycl's modules stand on floors (docs/architecture.md): a module imports only from its own floor or the floors
below it — at the top of a file, inside a function, or for type checking alone — and no group of modules imports
each other in a circle. An import planted the other way round fails here, naming the file, the line and both
floors."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import raycl

ROOT = Path(raycl.__file__).parent

# bottom to top; a module's floor is the entry that names it or the nearest package above it (a dotted entry
# such as "a.b" puts the subpackage a.b on a floor of its own, above or below the rest of a)
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("errors", "files", "storage", "records", "progress", "report")),
    ("algebra", ("losses", "adversarial")),
    ("models", ("models",)),
    ("memory", ("memory",)),
    ("data", ("data",)),
    ("mining and scoring", ("miners", "scoring")),
    ("config", ("config",)),  # the sections name decoding's options (raycl.models.decoding)
    ("task configs", ("config.tasks",)),
    ("collectives", ("collectives",)),
    ("training loop", ("training",)),  # below Ray: it asks its session (raycl.training.session), Ray's in a run
    ("Ray", ("distributed",)),
    ("driver", ("driver", "run_folder")),
    ("recipes", ("recipes",)),
    ("entry points", ("cli", "tune", "train", "mine", "mine_dense", "eval", "convert", "__init__", "__main__")),
    ("test doubles", ("testing",)),  # tests' and benchmarks' alone: the product never imports them (test below)
]


def floor_of(module: str) -> int:
    """The floor of ``raycl.<module>`` (dotted, without ``raycl.``): its own entry's, or its nearest package's."""
    parts = (module or "__init__").split(".")
    for n in range(len(parts), 0, -1):
        for i, (_, names) in enumerate(FLOORS):
            if ".".join(parts[:n]) in names:
                return i
    raise AssertionError(f"raycl.{module} stands on no floor: add it to tests/test_layers.py and the architecture")


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, source: str | None = None) -> Iterator[tuple[str, int]]:
    """Every raycl module ``path`` (or ``source``, as if it stood there) imports, dotted without ``raycl.``, with
    its line — wherever the import stands. ``from raycl import x`` names the module ``x`` where there is one."""
    here = module_of(path)
    for node in ast.walk(ast.parse(source if source is not None else path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (
                (a.name.removeprefix("raycl.") if a.name != "raycl" else "", node.lineno)
                for a in node.names
                if a.name == "raycl" or a.name.startswith("raycl.")
            )
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package
                package = here.split(".")[: -node.level] if path.name != "__init__.py" else here.split(".")
                base = ".".join([*package, base] if base else package)
            elif base != "raycl" and not base.startswith("raycl."):
                continue
            base = base.removeprefix("raycl").removeprefix(".")
            for a in node.names:
                sub = f"{base}.{a.name}" if base else a.name
                is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").exists() or (
                    ROOT / sub.replace(".", "/") / "__init__.py"
                ).exists()
                yield (sub if is_module else base), node.lineno


def _sources() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_every_import_stays_on_its_floor_or_goes_down() -> None:
    up = []
    for path in _sources():
        mine = floor_of(module_of(path))
        for target, line in imports(path):
            theirs = floor_of(target)
            if theirs > mine:
                up.append(
                    f"{path.relative_to(ROOT.parent)}:{line} imports raycl.{target}: "
                    f"{FLOORS[mine][0]} -> {FLOORS[theirs][0]}"
                )
    assert up == [], "imports that run back up a floor:\n" + "\n".join(up)


def test_no_modules_import_each_other_in_a_circle() -> None:
    graph = {module_of(p): {t for t, _ in imports(p) if t != module_of(p)} for p in _sources()}
    graph = {m: {t for t in ts if t in graph} for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for t in graph[m]:
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            group = []
            while True:
                t = stack.pop()
                group.append(t)
                if t == m:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert circles == [], f"modules that import each other in a circle: {circles}"


def test_the_floors_cover_every_module_and_a_planted_import_up_is_seen() -> None:
    for path in _sources():
        floor_of(module_of(path))  # every module stands somewhere
    errors = ROOT / "errors.py"
    planted = errors.read_text(encoding="utf-8") + (
        "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from raycl.training.loop import run\n"
        "def f() -> None:\n    from raycl import driver\n"
    )
    seen = {t for t, _ in imports(errors, planted)}
    assert {"training.loop", "driver"} <= seen  # a type-only import and one inside a function are both seen
    assert all(floor_of(t) > floor_of("errors") for t in ("training.loop", "driver"))


def test_no_product_module_imports_the_test_doubles() -> None:
    """``raycl.testing`` (miner faults, echo and null miners) plugs into the product's typed seams from tests and
    benchmarks; a product module that imported it would ship the doubles in a run."""
    found = [
        f"{path.relative_to(ROOT.parent)}:{line} imports raycl.{target}"
        for path in _sources()
        if floor_of(module_of(path)) != floor_of("testing")
        for target, line in imports(path)
        if target.split(".")[0] == "testing"
    ]
    assert found == [], "product modules that import the test doubles:\n" + "\n".join(found)
    planted = (ROOT / "driver.py").read_text(encoding="utf-8") + "\nfrom raycl.testing.faults import Chaos\n"
    assert "testing.faults" in {t for t, _ in imports(ROOT / "driver.py", planted)}  # such an import is seen


def test_a_recipe_declares_its_phases_and_never_runs_miners_or_trainings_itself() -> None:
    """A recipe's driver side (``recipes/<task>/recipe.py``) declares its phases (``raycl.driver.Phase``, its
    ``Miners``); the driver builds the jobs, starts the miners and calls ``fit_job``. A recipe that imported
    ``raycl.distributed`` or called the driver's ``fit_job``, ``miners`` or ``run_phase`` would run them again."""
    paths = sorted((ROOT / "recipes").glob("*/recipe.py"))
    found = []
    for path in paths:
        rel = path.relative_to(ROOT.parent)
        found += [f"{rel}:{n} imports raycl.{t}" for t, n in imports(path) if t.split(".")[0] == "distributed"]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
            if name in ("fit_job", "miners", "run_phase"):
                found.append(f"{rel}:{getattr(node, 'lineno', '?')} uses the driver's {name}")
    assert len(paths) == 4
    assert found == [], "recipes that run what the driver runs:\n" + "\n".join(found)


def _imports_ray(source: str) -> list[int]:
    """The lines of ``source`` that import Ray (``import ray…``, ``from ray… import``), wherever they stand."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(n == "ray" or n.startswith("ray.") for n in names):
            lines.append(node.lineno)
    return lines


def test_only_rays_floor_and_the_entry_points_import_ray() -> None:
    """The loop and the recipes ask their session for what Ray gives them (``raycl.training.session``): below
    Ray's floor, and in the recipes, no module imports Ray — so the loop runs in one process without it."""
    ray_floor, entry = floor_of("distributed"), floor_of("cli")
    found = [
        f"{path.relative_to(ROOT.parent)}:{line}"
        for path in _sources()
        if floor_of(module_of(path)) not in (ray_floor, entry, floor_of("driver"), floor_of("testing"))
        for line in _imports_ray(path.read_text(encoding="utf-8"))
    ]
    assert found == []
    assert _imports_ray("import os\ndef f() -> None:\n    from ray.train import report\n") == [3]  # seen inside


def test_a_tune_trials_actor_imports_no_transformers() -> None:
    """A Tune trial's actor unpickles the trial function with its recipe (``raycl.driver.trial``): it imports the
    recipe's module and, through it, its task class's module, builds the phase and hands it to a ``TorchTrainer``;
    the model is loaded on the Ray Train workers, the base model by the CLI's driver. transformers' model stack
    there (``modeling_utils``, which pulls scipy and ``torch._dynamo``) cost every trial about 2 CPU-seconds
    (bench/trial_cost.py). A fresh interpreter imports all four recipes and their task classes without it."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom raycl.recipes import RECIPES, recipe_for\nfrom raycl.training.task import TaskBase\n"
        "heavy = ('transformers', 'transformers.modeling_utils', 'scipy', 'torch._dynamo')\n"
        "for task in RECIPES:\n"
        "    names = vars(sys.modules[type(recipe_for(task)).__module__]).values()\n"
        "    found = [v for v in names if isinstance(v, type) and issubclass(v, TaskBase) and v is not TaskBase]\n"
        "    tasks = {v.__module__ for v in found}\n"
        "    assert tasks and tasks <= sys.modules.keys(), tasks\n"
        "    print(task, sorted(tasks), sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["gec", "coherence", "idiom", "sts"], done.stdout
    assert all(line.endswith(" []") for line in lines), done.stdout
