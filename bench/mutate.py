"""Mutation testing: plant realistic bugs one at a time in a temporary copy of the tree and run only the tests that
concern each. Prints one JSON line per mutant (``killed``, by which test, seconds) and the score. ``make mutate``.

Why not mutmut or cosmic-ray: they mutate operators and constants everywhere and run a whole suite per mutant; the
bugs that matter here are *semantic* — a key enqueued before instead of after a loss, a momentum update moved to
the other side of an optimizer step, a state not restored on resume — which are statements moved or dropped, and
the suite's distributed tests take minutes, so each mutant must run just its own tests. Mutants are planted by AST
patterns (a statement inside a named function whose source contains a given text), never line numbers, so the
list survives edits; a pattern that no longer matches is an error, not a silently surviving mutant.

Usage::

    .venv/bin/python bench/mutate.py             # every mutant
    .venv/bin/python bench/mutate.py -k queue    # the mutants whose name contains "queue"
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- planting by AST
def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    """The function ``name``, or the method ``Class.name``."""
    cls, _, fn = name.rpartition(".")
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls] if cls else [tree]
    for scope in scopes:
        for n in scope.body if cls else ast.walk(scope):  # type: ignore[attr-defined]
            if isinstance(n, ast.FunctionDef) and n.name == fn:
                return n
    raise LookupError(f"no function {name}")


def _flat(text: str) -> str:
    """Source text without its layout (whitespace, and the trailing commas a formatter adds before a closing
    bracket): a pattern matches a statement however the formatter wrapped it."""
    return re.sub(r",([)\]}])", r"\1", re.sub(r"\s+", "", text))


def _stmt(src: str, func: str, contains: str) -> ast.stmt:
    """The innermost statement of ``func`` whose source contains ``contains`` (layout aside: :func:`_flat`)."""
    fn = _function(ast.parse(src), func)
    found = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.stmt)
        and n is not fn
        and _flat(contains) in _flat(ast.get_source_segment(src, n) or "")
    ]
    if not found:
        raise LookupError(f"no statement containing {contains!r} in {func}")
    return min(found, key=lambda n: (n.end_lineno or n.lineno) - n.lineno)


def _span(src: str, node: ast.stmt) -> tuple[list[str], int, int, str]:
    lines = src.splitlines(keepends=True)
    start, end = node.lineno - 1, node.end_lineno or node.lineno
    indent = re.match(r"\s*", lines[start]).group(0)  # type: ignore[union-attr]
    return lines, start, end, indent


def delete(func: str, contains: str) -> Callable[[str], str]:
    def plant(src: str) -> str:
        lines, start, end, indent = _span(src, _stmt(src, func, contains))
        return "".join([*lines[:start], f"{indent}pass  # MUTANT\n", *lines[end:]])

    return plant


def replace(func: str, contains: str, old: str, new: str) -> Callable[[str], str]:
    def plant(src: str) -> str:
        lines, start, end, _ = _span(src, _stmt(src, func, contains))
        text = "".join(lines[start:end])
        if old in text:
            return "".join([*lines[:start], text.replace(old, new, 1), *lines[end:]])
        found = re.search(r"\s*".join(map(re.escape, _flat(old))), text)  # ``old``, wrapped by a formatter
        if found is None:
            raise LookupError(f"{old!r} not in the statement of {func} containing {contains!r}")
        return "".join([*lines[:start], text[: found.start()], new.strip(), text[found.end() :], *lines[end:]])

    return plant


def insert_after(func: str, contains: str, code: str) -> Callable[[str], str]:
    def plant(src: str) -> str:
        lines, _, end, indent = _span(src, _stmt(src, func, contains))
        return "".join([*lines[:end], textwrap.indent(textwrap.dedent(code), indent), *lines[end:]])

    return plant


def move_after(func: str, what: str, after: str, *, to: str | None = None) -> Callable[[str], str]:
    """Cut the statement containing ``what``; put it after the one containing ``after`` (in ``to``, if given)."""

    def plant(src: str) -> str:
        lines, start, end, _ = _span(src, _stmt(src, func, what))
        moved = textwrap.dedent("".join(lines[start:end]))
        cut = delete(func, what)(src)
        return insert_after(to or func, after, moved)(cut)

    return plant


def rename(func: str, new: str) -> Callable[[str], str]:
    """``def func`` becomes ``def new``: the same code, run by another hook."""

    def plant(src: str) -> str:
        node = _function(ast.parse(src), func)
        lines = src.splitlines(keepends=True)
        old = func.rpartition(".")[2]
        lines[node.lineno - 1] = lines[node.lineno - 1].replace(f"def {old}(", f"def {new}(", 1)
        return "".join(lines)

    return plant


def chain(*plants: Callable[[str], str]) -> Callable[[str], str]:
    def plant(src: str) -> str:
        for p in plants:
            src = p(src)
        return src

    return plant


# ---------------------------------------------------------------------------------------------- the mutants
@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    plant: Callable[[str], str]
    tests: tuple[str, ...]


Q = "tests/test_queues.py::"
EQ = "tests/test_equivalence.py::"
MS = "tests/test_mine_sharded.py::"
MUTANTS = [
    Mutant(
        "sts_moco_keys_enqueued_before_the_loss",
        "raycl/recipes/sts/step.py",
        chain(
            delete("sts_loss", "moco.enqueue(keys)"),
            insert_after(
                "contrastive_loss", "keys, queue = moco.keys(", "moco.enqueue(keys)\nqueue = moco.queued()\n"
            ),
        ),
        (Q + "test_sts_moco_step_against_a_naive_ring",),
    ),
    Mutant(
        "coherence_negatives_enqueued_after_the_momentum_loss",
        "raycl/recipes/coherence/step.py",
        move_after("coherence_loss", "queue.enqueue(k_neg)", "momentum_contrastive_loss("),
        (Q + "test_coherence_momentum_step_against_a_naive_fifo",),
    ),
    Mutant(
        "resume_without_the_schedulers_state",
        "raycl/training/state.py",
        delete("restore", "for sched, state in zip"),
        ("tests/test_resume.py",),
    ),
    Mutant(
        "resume_without_the_rng_states",
        "raycl/training/state.py",
        chain(
            delete("restore_rng", "random.setstate("),
            delete("restore_rng", "np.random.set_state("),
            delete("restore_rng", "torch.set_rng_state("),
        ),
        ("tests/test_resume.py",),
    ),
    Mutant(
        "contrastive_margin_sign",
        "raycl/losses/contrastive_margin.py",
        replace("contrastive_margin_loss", "logits = torch.cat", "f_neg - margin", "f_neg + margin"),
        ("tests/test_coherence_losses.py",),
    ),
    Mutant(
        "gec_margin_sign",
        "raycl/losses/gec_margin.py",
        replace(
            "margin_loss",
            "hinge = torch.relu",
            "margin - s_pos.unsqueeze(1) + s_neg",
            "margin + s_pos.unsqueeze(1) - s_neg",
        ),
        ("tests/test_gec_loss.py",),
    ),
    Mutant(
        "coherence_queue_evicts_the_newest",
        "raycl/memory/negative_queue.py",
        delete("NegativeQueue.enqueue", "self.keys[: n - self.num_negs] = self.keys[self.num_negs : n]"),
        (Q + "test_coherence_momentum_step_against_a_naive_fifo", "tests/test_coherence_losses.py"),
    ),
    Mutant(
        "ema_decay_swapped",
        "raycl/memory/ema.py",
        replace("EMA.update", "momentum_(", "self.decay)", "1.0 - self.decay)"),
        ("tests/test_ema.py",),
    ),
    Mutant(
        "adversarial_embedding_not_restored",
        "raycl/adversarial/base.py",
        delete("AdversarialMethod.restoring", "self.weight.copy_(origin)"),
        ("tests/test_adversarial.py",),
    ),
    Mutant(
        "staleness_bound_off_by_one",
        "raycl/distributed/consumer.py",
        replace(
            "StreamConsumer.take",
            "floor = self.version - self.max_staleness",
            "self.max_staleness",
            "self.max_staleness - 1",
        ),
        ("tests/test_consumer.py", "tests/test_stream.py"),
    ),
    Mutant(
        "hard_negatives_ranked_easiest_first",
        "raycl/miners/permutation.py",
        replace("PermutationMiner._mine", "order = sorted(", "-item_scores[j]", "item_scores[j]"),
        ("tests/test_permutation_miner.py",),
    ),
    Mutant(
        "accumulation_divides_by_the_last_micro_batch",
        "raycl/training/task.py",
        replace("StepContext.backward", "self.weight += weight", "+=", "="),
        ("tests/test_loop.py::test_gec_update_freq_two_equals_one_batch_of_twice_the_size",),
    ),
    Mutant(
        "a_kept_shard_skipped_and_its_range_lost_on_resume",
        "raycl/distributed/corpus.py",
        replace(
            "_plan",
            "left = [r for r in every",
            "if shard_name(r.index) not in have]",
            "if shard_name(r.index) not in have and r.index != len(have)]",
        ),
        ("tests/test_mine_sharded.py",),
    ),
    Mutant(
        "momentum_encoder_moved_after_the_optimizer_step",
        "raycl/recipes/coherence/worker.py",
        rename("CoherenceTask.before_update", "after_update"),  # the loop runs it after the step
        (Q + "test_coherence_momentum_step_against_a_naive_fifo",),
    ),
    Mutant(
        "joined_rank_never_steps",
        "raycl/training/loop.py",
        insert_after("Loop.update", "if not average_gradients(", "if joined:\n    return True\n"),
        (EQ + "test_gec_token_budget_ranks_take_the_same_updates",),
    ),
    Mutant(
        "workers_never_sum_their_gradients",
        "raycl/collectives.py",
        replace(
            "sum_gradients", "dist.all_reduce(flat)", "dist.all_reduce(flat)", "flat.mul_(dist.get_world_size())"
        ),
        (EQ + "test_gec_two_workers_train_as_one",),
    ),
    # issue 18's defects, each planted back as it was before its fix
    Mutant(
        "fp16_gec_starts_at_pytorchs_loss_scale",
        "raycl/recipes/gec/worker.py",
        replace("GecTask.settings", "fp16_init_scale", "fp16_init_scale=2.0**7", "fp16_init_scale=2.0**16"),
        ("tests/test_gec_updates.py::test_fp16_gec_skips_no_update_after_the_first",),
    ),
    Mutant(
        "gec_schedule_counts_pools_not_token_batches",
        "raycl/recipes/gec/worker.py",
        replace(  # the token budget left out of the count: one update per pool, as if no budget cut it
            "GecTask._updates",
            "return plan.updates(",
            "plan.updates(epochs, uf, sizes=sizes, max_tokens=budget)",
            "plan.updates(epochs, uf)",
        ),
        ("tests/test_gec_updates.py::test_a_token_budget_schedule_decays_over_the_updates_the_run_makes",),
    ),
    Mutant(
        "idiom_schedule_total_rounds_down",
        "raycl/training/batching.py",
        replace(
            "BatchPlan.updates",
            "return updates_in(",
            "updates_in([len(self)] * epochs, update_freq)",
            "len(self) * epochs // update_freq",
        ),
        (EQ + "test_idiom_two_workers_train_as_one_with_fgm_and_an_uneven_last_batch",),
    ),
    Mutant(
        "reports_by_the_global_step",
        "raycl/training/loop.py",
        replace("Loop.update", "if every > 0 and", 'p["epoch_step"] % every', 'p["step"] % every'),
        (
            "tests/test_loop.py::test_reports_fall_every_n_updates_of_each_epoch_and_at_its_end",
            EQ + "test_sts_two_workers_train_as_one",
        ),
    ),
    Mutant(
        "unused_parameters_summed_as_zeros",
        "raycl/collectives.py",
        replace("sum_gradients", "if n > 0 and p.grad is None", "n > 0 and ", ""),
        ("tests/test_data_parallel.py::test_a_rank_out_of_batches_joins_the_others_updates",),
    ),
    Mutant(
        "local_mode_takes_the_gpu_ray_hands_out",
        "raycl/training/loop.py",
        replace("run", "device = session.device() if job.use_gpu", ' if job.use_gpu else torch.device("cpu")', ""),
        ("tests/test_loop.py::test_no_gpu_asked_stays_on_the_cpu_where_ray_would_hand_one_out",),
    ),
    Mutant(
        "checkpoint_holds_every_devices_cuda_rng",
        "raycl/training/state.py",
        replace(
            "rng_state",
            "torch.cuda.get_rng_state(device)",
            "torch.cuda.get_rng_state(device)",
            "torch.cuda.get_rng_state_all()",
        ),
        ("tests/test_loop.py::test_a_worker_restores_its_own_devices_rng_where_it_sees_fewer_devices",),
    ),
    Mutant(
        "a_collective_handed_a_tensor_off_the_backends_device",
        "raycl/collectives.py",
        replace("all_reduce_sum", "t = torch.tensor(", ", device=collective_device(str(dist.get_backend()))", ""),
        ("tests/test_loop.py::test_collectives_use_the_backends_device",),
    ),
    # issue 30: the joint GEC pass, prefetching, the step's outputs read once a report
    Mutant(
        "negative_scores_sum_the_padding",
        "raycl/recipes/gec/step.py",
        replace("_row_scores", "return tok.target", ".masked_fill(targets.eq(pad_id), 0.0)", ""),
        ("tests/test_gec_loss.py",),
    ),
    Mutant(
        "ntokens_counts_the_negatives",
        "raycl/recipes/gec/step.py",
        replace(
            "_assemble",
            "return GecBatch(",
            "ntokens=sum(len(t) for t in targets)",
            "ntokens=sum(len(r[2]) for r in rows)",
        ),
        ("tests/test_gec_loss.py",),
    ),
    Mutant(
        "token_scores_backward_sign",
        "raycl/losses/token_log_probs.py",
        replace("_TokenLogProbs.backward", "p.mul_(-coef", "p.mul_(-coef", "p.mul_(coef"),
        ("tests/test_token_log_probs.py",),
    ),
    Mutant(
        "prefetch_reads_past_a_call",
        "raycl/training/prefetch.py",
        delete("Prefetcher._fill", "pending.done.wait()"),
        ("tests/test_prefetch.py",),
    ),
    Mutant(
        "coherence_slices_drawn_ahead_are_checkpointed",
        "raycl/recipes/coherence/worker.py",
        delete("CoherenceTask.step", "st.rng.setstate(batch.rng_state)"),
        (EQ + "test_the_momentum_model_killed_mid_epoch_resumes_to_the_uninterrupted_end",),
    ),
    Mutant(
        "a_read_of_the_loss_in_the_step",
        "raycl/recipes/idiom/worker.py",
        replace("IdiomTask.step", 'return {"loss": loss.detach()', "loss.detach()", "loss.item()"),
        ("tests/test_steps.py",),
    ),
    Mutant(
        "a_queue_left_on_the_cpu",
        "raycl/recipes/coherence/worker.py",
        replace("CoherenceTask.build", "extras: dict[str, Any] = {", ").to(w.device)", ")"),
        ("tests/test_steps.py",),
    ),
    # compiled steps: a host read inside a compiled forward breaks its graph; a module of the step left eager
    Mutant(
        "a_host_read_in_a_compiled_forward",
        "raycl/models/coherence.py",
        insert_after(
            "CoherenceScorer.forward",
            "mask = attention_mask if self.mask_padding",
            "if float(input_ids.sum()) < 0:\n    mask = None\n",
        ),
        ("tests/test_steps.py::test_a_compiled_step_traces_whole_graphs",),
    ),
    Mutant(
        "the_momentum_encoder_left_eager",
        "raycl/recipes/coherence/worker.py",
        replace(
            "CoherenceTask.compiled_modules",
            "return [st.model",
            ", *([st.momentum] if st.momentum is not None else [])",
            "",
        ),
        ("tests/test_steps.py::test_a_compiled_step_traces_whole_graphs",),
    ),
    # issue 19's defects: a directory resumed with other settings, a second run on it, a range that stops the job
    Mutant(
        "a_resume_with_other_settings_mixes_the_directory",
        "raycl/distributed/corpus.py",
        replace("mine_corpus", "settings=mining_settings(", "mining_settings(model, options, engine)", "{}"),
        (MS + "test_a_resumed_directory_refuses_other_mining_settings_and_overwrite_starts_afresh",),
    ),
    Mutant(
        "data_known_by_name_and_size",
        "raycl/miners/corpus.py",
        replace("_scan", "key = {", '"blake2b": [h.hexdigest() for h in hashes]', '"blake2b": []'),
        (MS + "test_data_is_known_by_its_content_and_a_resume_does_not_read_it_again",),
    ),
    Mutant(
        "a_second_run_deletes_the_first_runs_temp_files",
        "raycl/miners/shards.py",
        replace("locked_out_dir", "fcntl.flock(f,", "fcntl.LOCK_EX | fcntl.LOCK_NB", "fcntl.LOCK_SH"),
        (MS + "test_a_second_run_on_one_out_is_refused_and_leaves_the_first_runs_files",),
    ),
    Mutant(
        "max_failed_ranges_never_stops_the_mining",
        "raycl/distributed/corpus.py",
        replace("_tally", "if len(failed) > max_failed", "len(failed) > max_failed", "False"),
        (MS + "test_a_failing_range_is_recorded_and_the_rerun_mines_only_it",),
    ),
]


# ---------------------------------------------------------------------------------------------- running them
def _copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())


def run_mutant(m: Mutant, tree: Path, *, timeout: float) -> dict[str, object]:
    path = tree / m.file
    original = path.read_text(encoding="utf-8")
    t0 = time.perf_counter()
    try:
        mutated = m.plant(original)
        if mutated == original:
            raise LookupError("the mutant changed nothing")
        compile(mutated, str(path), "exec")
        path.write_text(mutated, encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *m.tests],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            out, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            out, code = "", -1
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M)
        unknown = re.search(r"NameError: name '(\w+)' is not defined", out)
        if unknown:  # the planted code names what its module lacks: a test failing on that caught no bug
            raise LookupError(f"the mutant's code names {unknown[1]!r}, which {m.file} does not define")
        killed = code != 0
        by = failed[0] if failed else ("timeout" if code == -1 else None)
        return {
            "mutant": m.name,
            "file": m.file,
            "killed": killed,
            "by": by,
            "seconds": round(time.perf_counter() - t0, 1),
        }
    except (LookupError, SyntaxError) as e:
        return {
            "mutant": m.name,
            "file": m.file,
            "killed": False,
            "by": None,
            "error": str(e),
            "seconds": round(time.perf_counter() - t0, 1),
        }
    finally:
        path.write_text(original, encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-k", default="", help="only the mutants whose name contains this")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant (a hang counts as killed)")
    args = p.parse_args()
    chosen = [m for m in MUTANTS if args.k in m.name]
    if not chosen:
        sys.exit(f"mutate: no mutant's name contains {args.k!r}")
    results = []
    with tempfile.TemporaryDirectory(prefix="raycl-mutate-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        for m in chosen:
            print(f"[mutate] {m.name}: {' '.join(m.tests)}", file=sys.stderr, flush=True)
            row = run_mutant(m, tree, timeout=args.timeout)
            results.append(row)
            print(json.dumps(row), flush=True)
    killed = sum(bool(r["killed"]) for r in results)
    print(
        json.dumps(
            {
                "score": killed / max(len(results), 1),
                "killed": killed,
                "mutants": len(results),
                "seconds": round(sum(float(r["seconds"]) for r in results), 1),
            }
        )
    )  # type: ignore[arg-type]
    sys.exit(0 if killed == len(results) else 1)


if __name__ == "__main__":
    main()
