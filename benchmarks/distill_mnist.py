"""Distillation on real MNIST (issue 60, items 5 and 6): what a student 5.7x cheaper than the MNIST recipe's model
learns from it without labels, against the same student pre-trained by MAE for the same wall time, by DINO, and
left at random initialisation; DeiT's distillation token with and without the teacher; and the deployment table.

    python benchmarks/distill_mnist.py --teacher runs/mnist [--data-dir ../shared/data/mnist] [--out runs/bench-distill]
      [--arms distill,mae,dino,random] [--seed 0] [--section distill_mnist]

Every step is the `vitlab` command a user would type (printed before it runs), so each figure is what that command
reports:
1. the teacher: --teacher (a run of `vitlab train --config configs/mnist.py`), else trained here with that recipe;
2. the students (configs/pretrain/mnist_distill.py's architecture: 4 blocks of width 64, 7x7 patches):
   distill   `vitlab pretrain --config configs/pretrain/mnist_distill.py --teacher TEACHER` (55,000 training images,
             labels unused; 5,000 held out choose the checkpoint by the distillation loss),
   mae       configs/pretrain/mnist_mae.py on the same student with `--set budget=` the distillation's wall time,
   dino      configs/pretrain/mnist_dino.py on the same student, the same budget,
   random    the student's initialisation (this seed), never trained;
3. for the teacher and each student: k-NN top-1 (`vitlab knn`, DINO's protocol: 60,000 training images vote for
   the 10,000 test images, k=20), a linear probe (`vitlab linear-probe`, closed form, its default L2), the dense
   probe on mnist-scenes (`vitlab dense-probe --dataset mnist-scenes`, segmentation mIoU; its learning rate chosen on
   the scenes' validation split), and for the students the test top-1 after fine-tuning on 1,000 labels (100 per
   class; 1,000 other training images choose the checkpoint; benchmarks/pretrain_mnist.py's fine-tuning recipe);
4. DeiT: the student trained by the MNIST recipe (all labels) without and with the teacher's hard labels through the
   distillation token (`--set distill.teacher=TEACHER --set distill.kind=hard`), same recipe, no time budget;
5. deployment: `vitlab bench` (batch 16) of the teacher and of the distilled student after its 1,000-label fine-tune,
   on the paths `--quick` picks on this machine, the two benched alternately --bench-rounds times (test accuracy
   in the first round): images/s (median over the rounds) and test accuracy of eager fp32 and of each one's
   fastest path, and the student's speed-up.
The test split is measured once per run, at its end; nothing is chosen on it. Runs are kept under --out and a
finished one is read instead of run again, so a stopped benchmark continues. The table is printed, written to
--out/table.md, and with --section into BENCHMARKS.md between that section's markers; every figure to
--out/results.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from pretrain_mnist import finetune_recipe, machine, run  # noqa: E402
from report import write_section  # noqa: E402

STUDENT = {"embed_dim": 64, "depth": 4, "num_heads": 4, "mlp_dim": 128}  # configs/pretrain/mnist_distill.py's
PRETRAIN_RECIPES = {"distill": "mnist_distill.py", "mae": "mnist_mae.py", "dino": "mnist_dino.py"}


def vitlab(*arguments: str, log: Path | None = None) -> str:
    """Run one vitlab command as a user types it; its standard output (also kept in `log`)."""
    command = [sys.executable, "-m", "vitlab", *arguments]
    print("$ vitlab " + shlex.join(arguments), flush=True)
    started = time.perf_counter()
    if log is None:
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        output, errors = result.stdout, result.stderr
    else:  # a long run: its progress goes to the log as it happens
        with log.open("w") as stream:
            result = subprocess.run(command, cwd=REPO, stdout=stream, stderr=subprocess.STDOUT, text=True)
        output = errors = log.read_text()
    if result.returncode != 0:
        raise SystemExit(f"vitlab {shlex.join(arguments)} failed ({result.returncode}):\n{errors[-3000:]}")
    print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    return output


def json_report(*arguments: str) -> dict:
    """A command's --json report: its output from the first line that opens an object."""
    lines = vitlab(*arguments, "--json").splitlines()
    start = next((index for index, line in enumerate(lines) if line.startswith("{")), None)
    if start is None:
        raise SystemExit(f"vitlab {shlex.join(arguments)} --json printed no JSON")
    return json.loads("\n".join(lines[start:]))


def summary_of(run_dir: Path) -> dict | None:
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("status") == "finished" else None


def pretrained_run(command: str, out: Path, name: str, *arguments: str) -> dict:
    """A finished run under out/name: read if there, else made by `vitlab COMMAND ... --set run_name=name`."""
    run_dir = out / name
    summary = summary_of(run_dir)
    if summary is None:
        vitlab(command, *arguments, "--out-dir", str(out), "--set", f"run_name={name}", log=out / f"{name}.log")
        summary = summary_of(run_dir)
        if summary is None:
            raise SystemExit(f"{run_dir} did not finish; see {out / f'{name}.log'}")
    return summary


def student_settings() -> list[str]:
    return [part for key, value in STUDENT.items() for part in ("--set", f"model_overrides.{key}={value}")]


def untrained_student(out: Path, seed: int) -> str:
    """The student at its initialisation (this seed), saved as a checkpoint every command loads."""
    import torch

    from vitlab.checkpoint.io import save_model
    from vitlab.models.vit import VisionTransformer
    from vitlab.variants import variant_config

    path = out / f"random-student-seed{seed}.safetensors"
    if not path.is_file():
        torch.manual_seed(seed)
        save_model(VisionTransformer(variant_config("mnist-28", num_classes=0, **STUDENT)), path)
    return str(path)


def probes(checkpoint: str, data_dir: str, seed: int, cache: Path) -> dict:
    """k-NN, linear probe and the mnist-scenes segmentation probe of one encoder (read from cache when done)."""
    if cache.is_file():
        return json.loads(cache.read_text())
    knn = json_report("knn", checkpoint, "--dataset", "mnist", "--data-dir", data_dir)
    linear = json_report("linear-probe", checkpoint, "--dataset", "mnist", "--data-dir", data_dir)
    dense = json_report(
        "dense-probe", checkpoint, "--dataset", "mnist-scenes", "--data-dir", data_dir, "--seed", str(seed)
    )
    figures = {"knn": knn, "linear_probe": linear, "dense_probe": dense}
    cache.write_text(json.dumps(figures, indent=1))
    return figures


# The paths `bench --quick` ran for both models on this machine: every round times the same ones.
BENCH_PATHS = "eager-fp32,eager-bf16,onnx-int8,pt2e-int8,openvino-int8,transformers"


def bench(checkpoint: str, data_dir: str, cache: Path, with_accuracy: bool) -> dict:
    """One `vitlab bench` of `checkpoint` at batch 16 on BENCH_PATHS (with each path's MNIST test accuracy in the
    first round), kept in `cache`."""
    if cache.is_file():
        return json.loads(cache.read_text())
    accuracy = ["--dataset", "mnist", "--data-dir", data_dir] if with_accuracy else []
    vitlab("bench", "--checkpoint", checkpoint, "--paths", BENCH_PATHS, "--repetitions", "5", *accuracy,
           "--json", str(cache))  # fmt: skip
    return json.loads(cache.read_text())


def bench_rounds(models: dict[str, str], data_dir: str, out: Path, rounds: int) -> dict:
    """{model: {"rounds": [report, ...]}}: the models benched one after the other, `rounds` times over, so that
    a machine's slow minute falls on both; the table reports each path's median over the rounds."""
    reports: dict = {name: {"rounds": []} for name in models}
    for index in range(rounds):
        for name, checkpoint in models.items():
            report = bench(checkpoint, data_dir, out / f"bench-{name}-{index + 1}.json", with_accuracy=index == 0)
            reports[name]["rounds"].append(report)
    return reports


def median_rates(reports: list[dict]) -> dict[str, float]:
    """{path: median images/s over the rounds} of the paths every round measured."""
    rates: dict[str, list[float]] = {}
    for report in reports:
        for row in report["paths"]:
            if row.get("images_per_second"):
                rates.setdefault(row["path"], []).append(row["images_per_second"])
    return {path: statistics.median(values) for path, values in rates.items() if len(values) == len(reports)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", help="a run of the MNIST recipe (default: trained here)")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--out", default=str(REPO / "runs" / "bench-distill"))
    parser.add_argument("--arms", default="distill,mae,dino,random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-deit", action="store_true")
    parser.add_argument("--skip-bench", action="store_true", help="leave out the deployment table (run it quiet)")
    parser.add_argument("--bench-rounds", type=int, default=3, help="teacher and student benched alternately")
    parser.add_argument(
        "--student", default="", help="changes to the student's architecture for every arm, e.g. depth=2"
    )
    parser.add_argument("--section", help="also write the table into BENCHMARKS.md between this section's markers")
    args = parser.parse_args()
    STUDENT.update({key: int(value) for key, value in (part.split("=") for part in args.student.split(",") if part)})
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data, seed, arms = args.data_dir, args.seed, args.arms.split(",")
    results: dict = {"machine": machine(), "seed": seed, "student": STUDENT, "pretrain": {}, "encoders": {}}

    teacher = args.teacher
    if teacher is None:
        pretrained_run("train", out, "teacher", "--config", "configs/mnist.py", "--data-dir", data, "--set",
                       "budget=none", "--set", f"seed={seed}")  # fmt: skip
        teacher = str(out / "teacher")
    teacher = str(Path(teacher).resolve())
    results["teacher"] = {"run": teacher, "test_top1": json.loads((Path(teacher) / "summary.json").read_text())[
        "test_top1"]}  # fmt: skip

    encoders = {"teacher": teacher}
    budget = None
    for arm in arms:
        if arm == "random":
            encoders[arm] = untrained_student(out, seed)
            continue
        # The other arms: the same student, the same 55,000 images and 5,000 held out, for the distillation's time.
        extra = ["--teacher", teacher] if arm == "distill" else ["--set", "epochs=1000"]
        extra += student_settings()  # the recipe's own student (distill), or the MAE/DINO recipes' model made it
        extra += ["--set", "max_train_images=none", "--set", "val_size=5000", "--set", "threads=2"]
        if arm != "distill":
            if budget is None:
                raise SystemExit("the distill arm comes first: its wall time is the others' budget")
            extra += ["--set", f"budget={budget:.0f}s"]
        recipe = REPO / "configs" / "pretrain" / PRETRAIN_RECIPES[arm]
        summary = pretrained_run("pretrain", out, f"pretrain-{arm}", "--config", str(recipe), "--data-dir", data,
                                 "--set", f"seed={seed}", *extra)  # fmt: skip
        if arm == "distill":
            budget = summary["wall_seconds"]
        results["pretrain"][arm] = {
            key: summary.get(key) for key in ("wall_seconds", "train_seconds", "epochs", "best_val_loss", "test_loss")
        }
        encoders[arm] = summary["run_dir"]

    for name, checkpoint in encoders.items():
        figures = probes(checkpoint, data, seed, out / f"probes-{name}.json")
        if name != "teacher":
            recipe = finetune_recipe(checkpoint if name != "random" else None, 1000, 1000, 100, 128, seed, data, out,
                                     f"finetune-1000-{name}")  # fmt: skip
            recipe.model_overrides = dict(STUDENT)
            tuned = run(recipe)
            figures["finetune_1000"] = {key: tuned[key] for key in ("test_top1", "best_val_top1", "wall_seconds")}
            figures["finetune_run"] = tuned["run_dir"]
        results["encoders"][name] = figures
        (out / "results.json").write_text(json.dumps(results, indent=1))

    if not args.skip_deit:
        for arm, extra in (("without", []), ("with", ["--set", f"distill.teacher={teacher}", "--set",
                                                        "distill.kind=hard"])):  # fmt: skip
            summary = pretrained_run("train", out, f"deit-{arm}-teacher", "--config", "configs/mnist.py",
                                     "--data-dir", data, "--set", "budget=none", "--set", f"seed={seed}",
                                     *student_settings(), *extra)  # fmt: skip
            results.setdefault("deit", {})[arm] = {
                key: summary.get(key) for key in ("test_top1", "best_val_top1", "wall_seconds", "epochs")
            }
        (out / "results.json").write_text(json.dumps(results, indent=1))

    if "distill" in encoders and not args.skip_bench:
        models = {"teacher": teacher, "student": results["encoders"]["distill"]["finetune_run"]}
        results["bench"] = bench_rounds(models, data, out, args.bench_rounds)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table = format_table(results)
    (out / "table.md").write_text(table)
    print(table)
    if args.section:
        write_section(args.section, "Distillation on MNIST", table)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def knn_top1(figures: dict) -> float:
    """k=20's top-1 of a `vitlab knn --json` report."""
    return figures["knn"]["k"]["20"]["top1"]


def format_table(results: dict) -> str:
    lines = [f"Machine: {results['machine']}. Seed {results['seed']}; student {results['student']}.", ""]
    if results["pretrain"]:
        lines += ["| pre-training | wall s | epochs | best val loss |", "|---|---|---|---|"]
        for arm, figures in results["pretrain"].items():
            lines.append(f"| {arm} | {figures['wall_seconds']:.0f} | {figures['epochs']} | "
                         f"{figures['best_val_loss']:.4f} |")  # fmt: skip
        lines.append("")
    lines += [
        "| encoder | k-NN top-1 (k=20) | linear probe | mnist-scenes mIoU | 1,000-label fine-tune test top-1 |",
        "|---|---|---|---|---|",
    ]
    for name, figures in results["encoders"].items():
        tuned = figures.get("finetune_1000", {}).get("test_top1")
        lines.append(
            f"| {name} | {percent(knn_top1(figures))} | {percent(figures['linear_probe']['test_top1'])} | "
            f"{percent(figures['dense_probe']['test']['mean_iou'])} | {percent(tuned)} |"
        )
    if "deit" in results:
        lines += ["", "| student trained on all labels (MNIST recipe) | test top-1 | wall s |", "|---|---|---|"]
        for arm, figures in results["deit"].items():
            lines.append(f"| {arm} the teacher's hard labels | {percent(figures['test_top1'])} | "
                         f"{figures['wall_seconds']:.0f} |")  # fmt: skip
    if "bench" in results:
        lines += ["", *deployment_table(results["bench"])]
    return "\n".join(lines) + "\n"


def deployment_table(bench: dict) -> list[str]:
    """Each model's eager fp32 and fastest path (median images/s over the rounds, test top-1 of the first round),
    and the student's speed-up: best path against best path, and path by path."""
    rates = {name: median_rates(runs["rounds"]) for name, runs in bench.items()}
    top1 = {name: {row["path"]: row.get("top1") for row in runs["rounds"][0]["paths"]} for name, runs in bench.items()}
    rounds = len(next(iter(bench.values()))["rounds"])
    lines = [f"| model | path | images/s (median of {rounds} rounds) | test top-1 |", "|---|---|---|---|"]
    for name, paths in rates.items():
        fastest = max(paths, key=paths.__getitem__)
        for path in dict.fromkeys(["eager-fp32", fastest]):
            lines.append(f"| {name} | {path} | {paths[path]:.0f} | {percent(top1[name].get(path))} |")
    teacher, student = rates["teacher"], rates["student"]
    same = ", ".join(f"{path} {student[path] / teacher[path]:.2f}x" for path in teacher if path in student)
    lines += ["", f"Student against teacher: best path against best path "
                  f"**{max(student.values()) / max(teacher.values()):.2f}x**; path by path: {same}."]  # fmt: skip
    return lines


if __name__ == "__main__":
    main()
