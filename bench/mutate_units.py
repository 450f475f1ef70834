"""Operator mutation of the pure modules (``make mutate-units``): mutmut 3 plants every operator, comparison,
constant and argument mutant of the functions in ``[tool.mutmut] only_mutate`` (pyproject.toml), runs each against
the fast unit tests that call its function, and this script writes the JSON report (``runs/mutate-units.json``:
killed, survived, equivalent, no tests, timeouts, seconds, counts per module, each survivor's diff) and prints one
summary line. Exit status 0 when no mutant survives but the equivalent ones.

Equivalent mutants (no test can tell them from the code) are listed in ``bench/mutate_units.toml`` with the line
the mutant writes and one line saying why; an entry whose line no longer matches its mutant (the code moved) is
reported as ``stale`` and its mutant counts as a survivor until the entry is updated.

Why mutmut 3: it imports the tests once in a fork server and forks a worker per mutant, so a mutant costs its
tests' run, not an import of torch and transformers (seconds); it records which tests call each function and runs
only those; it is maintained and runs on Python 3.11. Its limits, stated in the report: it mutates function bodies
only (not module-level constants) and leaves out functions with a decorator other than ``staticmethod`` /
``classmethod`` (``torch.no_grad()``, ``contextmanager``) — those are listed under ``not_mutated``.

Usage::

    .venv/bin/python bench/mutate_units.py                     # every module of only_mutate
    .venv/bin/python bench/mutate_units.py --modules optim,batching  # the files whose path contains a word
    .venv/bin/python bench/mutate_units.py --survivors            # only what the last run left alive
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parents[1]
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "type check",
}


def _files(patterns: list[str]) -> list[Path]:
    found = sorted({p for pat in patterns for p in ROOT.glob(pat) if p.suffix == ".py"})
    return [p.relative_to(ROOT) for p in found]


def _module(path: Path) -> str:
    return ".".join(path.with_suffix("").parts).removesuffix(".__init__")


def _globs(path: Path) -> list[str]:
    """mutmut's name globs for the mutants of ``path``: a package's ``__init__.py`` by its functions' and methods'
    own prefixes (``raycl.config.*`` would also name every module of the package)."""
    module = _module(path)
    return [f"{module}.x_*", f"{module}.x\u01c1*"] if path.name == "__init__.py" else [f"{module}.*"]


def _not_mutated(path: Path) -> list[str]:
    """The functions of ``path`` mutmut leaves alone: decorated by anything but staticmethod/classmethod."""
    out = []
    for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.decorator_list:
            names = [ast.unparse(d) for d in node.decorator_list]
            if names not in (["staticmethod"], ["classmethod"]):
                out.append(f"{node.name} (@{', @'.join(names)})")
    return out


def _diff(name: str, path: Path) -> str:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    lines = get_diff_for_mutant(name, path=path).splitlines()
    return "\n".join(ln for ln in lines[2:] if ln[:1] in "+-" and not ln.startswith(("+++", "---")))


def _added(diff: str) -> list[str]:
    return [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+")]


def _unkilled(files: list[Path]) -> list[str]:
    """The mutants of ``files`` that the last run left alive (survived or no tests), by name."""
    out = []
    for path in files:
        meta_path = ROOT / "mutants" / f"{path}.meta"
        if meta_path.exists():
            codes = json.loads(meta_path.read_text())["exit_code_by_key"]
            out += [n for n, c in codes.items() if STATUS.get(c) in ("survived", "no tests")]
    return out


def run_mutmut(names: list[str], max_children: int) -> int:
    """``names``: mutmut's mutant names or globs (module.function__mutmut_N, module.*)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names]
    # mutmut's progress line goes to stderr: stdout is this script's summary line
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=sys.stderr).returncode


def report(files: list[Path], cfg: dict[str, Any], seconds: float) -> dict[str, Any]:
    equivalent: dict[str, dict[str, str]] = cfg.get("equivalent", {})
    out_of_scope: dict[str, str] = cfg.get("out_of_scope", {})
    modules: dict[str, dict[str, Any]] = {}
    survivors, stale = [], []
    for path in files:
        meta_path = ROOT / "mutants" / f"{path}.meta"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"exit_code_by_key": {}}
        codes: dict[str, int | None] = meta["exit_code_by_key"]
        row: dict[str, Any] = {
            "mutants": len(codes),
            "killed": 0,
            "timeout": 0,
            "survived": 0,
            "no tests": 0,
            "equivalent": 0,
            "out of scope": 0,
            "other": 0,
            "not_mutated": _not_mutated(path),
        }
        for name, code in sorted(codes.items()):
            status = STATUS.get(code, "other") if code is not None else "other"
            if status in ("survived", "no tests") and _glob(name, out_of_scope):
                status = "out of scope"
            elif status in ("survived", "no tests"):
                diff = _diff(name, path)
                eq = equivalent.get(name)
                if eq is not None and eq["line"].strip() in _added(diff):
                    status = "equivalent"
                else:
                    if eq is not None:
                        stale.append({"mutant": name, "listed_line": eq["line"], "diff": diff})
                    survivors.append({"mutant": name, "status": status, "diff": diff})
                    status = "survived" if status == "survived" else "no tests"
            row[status if status in row else "other"] += 1
        modules[str(path)] = row
    keys = ("mutants", "killed", "timeout", "survived", "no tests", "equivalent", "out of scope", "other")
    totals = {k: sum(r[k] for r in modules.values()) for k in keys}
    reasons = {n: e["why"] for n, e in equivalent.items()}
    return {
        "totals": totals,
        "seconds": round(seconds, 1),
        "modules": modules,
        "survivors": survivors,
        "stale_equivalents": stale,
        "equivalent": reasons,
        "out_of_scope": out_of_scope,
    }


def _glob(name: str, patterns: dict[str, str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modules", default="", help="comma-separated words: only the files whose path contains one")
    p.add_argument("--max-children", type=int, default=os.cpu_count() or 2, help="mutants run at once")
    p.add_argument("--out", default="runs/mutate-units.json", help="the JSON report")
    p.add_argument("--report-only", action="store_true", help="report the last run's results, run nothing")
    p.add_argument(
        "--survivors",
        action="store_true",
        help="run again only the mutants the last run left alive (after adding tests)",
    )
    args = p.parse_args()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    files = _files(pyproject["tool"]["mutmut"]["only_mutate"])
    words = [w for w in args.modules.split(",") if w]
    if words:
        files = [f for f in files if any(w in str(f) for w in words)]
        if not files:
            sys.exit(f"mutate-units: no file of [tool.mutmut] only_mutate matches {args.modules!r}")
    cfg = tomllib.loads((ROOT / "bench" / "mutate_units.toml").read_text(encoding="utf-8"))
    t0 = time.perf_counter()
    if not args.report_only:
        names = _unkilled(files) if args.survivors else [n for f in files for n in _globs(f)]
        code = run_mutmut(names, args.max_children) if names else 0
        if code != 0:
            sys.exit(f"mutate-units: mutmut exited with {code} (run `python -m mutmut run` to see why)")
    out = report(files, cfg, time.perf_counter() - t0)
    dest = ROOT / args.out
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(dest)
    for s in out["survivors"]:
        print(f"[mutate-units] {s['status']}: {s['mutant']}\n{s['diff']}", file=sys.stderr)
    t = out["totals"]
    print(
        json.dumps(
            {
                "summary": "mutate-units",
                **t,
                "stale_equivalents": len(out["stale_equivalents"]),
                "seconds": out["seconds"],
                "report": args.out,
            }
        )
    )
    sys.exit(0 if t["survived"] == 0 and t["no tests"] == 0 and t["other"] == 0 else 1)


if __name__ == "__main__":
    main()
