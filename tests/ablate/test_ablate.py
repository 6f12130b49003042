"""vitlab ablate: the plan (axes, values, cells), running and resuming, and the results it writes."""

import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vitlab.ablate.plan import Ablation, parse_vary, plan, planned_ablations
from vitlab.ablate.runner import choose_jobs
from vitlab.cli import main
from vitlab.errors import ConfigError, UsageError
from vitlab.train.config import TrainConfig

# Two short epochs on a stratified quarter of digits' training images: the runs' figures are what the tables show,
# whatever they are; the test is about planning, running, resuming and writing them.
QUICK = ["--set", "epochs=2", "--set", "warmup_epochs=1", "--set", "max_train_images=320"]


@pytest.mark.parametrize(
    "vary,message",
    [
        (["pos_embd=none,learned"], "unknown setting (did you mean pos_embed, pos_resample?)"),
        (["pos_embed=none,rotary3d"], "pos_embed=rotary3d is not valid with this recipe: pos_embed must be one of"),
        (["lr=1e-3,-1"], "lr=-1 is not valid with this recipe: lr must be positive"),
        (["depth=two"], "depth=two is not valid"),
        (["seed=1,2"], "use --seeds for seeds"),
        (["lr"], "--vary takes KEY=V1,V2"),
        (["lr=1e-3,1e-3"], "repeats a value"),
    ],
)
def test_bad_vary_is_one_message_before_anything_runs(vary, message, tmp_path, capsys):
    args = ["ablate", "--out", str(tmp_path / "out")]
    for axis in vary:
        args += ["--vary", axis]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_combinations_that_cannot_exist_are_left_out_and_listed():
    ablation = Ablation(
        "t", TrainConfig(), parse_vary(["pos_embed=none,learned", "pos_embed_placement=input,every_block"])
    )
    cells, skipped = plan(ablation)
    assert [c.name for c in cells] == [
        "pos_embed=none, pos_embed_placement=input",
        "pos_embed=learned, pos_embed_placement=input",
        "pos_embed=learned, pos_embed_placement=every_block",
    ]
    assert skipped == [
        (
            "pos_embed=none, pos_embed_placement=every_block",
            "pos_embed 'none' has no table to place; pos_embed_placement must be 'input', got 'every_block'",
        )
    ]
    # A value that no cell can use is an error, not a silently empty row.
    with pytest.raises(ConfigError, match="pos_embed_placement=every_block is not valid"):
        plan(Ablation("t", TrainConfig(), parse_vary(["pos_embed=none", "pos_embed_placement=input,every_block"])))


def test_a_pretraining_recipe_is_refused_with_what_to_do_instead():
    from vitlab.train.config import pretrain_config

    with pytest.raises(ConfigError, match="benchmarks/pretrain_mnist.py"):
        plan(Ablation("t", pretrain_config("mae"), parse_vary(["lr=1e-3,2e-3"])))


ABLATION_FILE = (
    "from vitlab.ablate.plan import Ablation\nfrom vitlab.train.config import TrainConfig\n"
    "ablations = [Ablation('heads', TrainConfig(epochs=1), {'classifier': ['token', 'max']}, seeds=[0]),\n"
    "             Ablation('pos', TrainConfig(epochs=1), {'pos_embed': ['learned', 'none']}, seeds=[0])]\n"
)


@pytest.mark.parametrize(
    "arguments,flags,message",
    [
        (dict(vary=["lr=1e-3"]), ["--vary", "lr=1e-3"], "is an ablation file and says what to vary"),
        (dict(name="depth"), ["--name", "depth"], "the file's ablations are heads, pos"),
        (dict(source=None), [], "say what to vary: --vary KEY=V1,V2"),
    ],
)
def test_planned_ablations_refuses_what_the_command_refuses(arguments, flags, message, tmp_path, capsys):
    """The plan's checks live in `planned_ablations`: a Python caller gets the command's messages."""
    path = tmp_path / "abl.py"
    path.write_text(ABLATION_FILE)
    arguments = {"source": str(path), **arguments}
    with pytest.raises(UsageError, match=message) as refused:
        planned_ablations(**arguments)
    source = [arguments["source"]] if arguments["source"] else []
    assert main(["ablate", *source, *flags, "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert capsys.readouterr().err == f"vitlab ablate: error: {refused.value}\n"


def test_planned_ablations_picks_by_name_and_applies_seeds_and_settings(tmp_path):
    path = tmp_path / "abl.py"
    path.write_text(ABLATION_FILE)
    (chosen,) = planned_ablations(str(path), name="pos", seeds=[4, 5], settings=["epochs=2"])
    assert (chosen.name, chosen.seeds, chosen.settings) == ("pos", [4, 5], ["epochs=2"])
    (made,) = planned_ablations(vary=["lr=1e-3,2e-3"], settings=["epochs=2"])
    assert (made.name, made.vary, made.seeds, made.settings) == (
        "ablation",
        {"lr": ["1e-3", "2e-3"]},
        [0, 1, 2],
        ["epochs=2"],
    )


def test_one_seed_shows_its_figure_without_a_spread():
    from vitlab.ablate.results import mean_std, percent

    assert percent(mean_std([0.975])) == "97.50"  # not "97.50 ± 0.00": one seed has no spread
    assert percent(mean_std([0.97, 0.98])) == "97.50 ± 0.71"


def test_cells_that_compute_the_same_run_share_one_key():
    by_pos = plan(Ablation("a", TrainConfig(), {"pos_embed": ["learned", "none"]}))[0]
    by_head = plan(Ablation("b", TrainConfig(), {"classifier": ["token", "gap"], "lr": [4e-3]}))[0]
    assert by_pos[0].key == by_head[0].key  # the recipe's own model, written two ways
    assert len({c.key for c in by_pos + by_head}) == 3
    typed = plan(Ablation("c", TrainConfig(), parse_vary(["lr=4e-3", "pos_embed=none"])))[0][0]
    assert typed.values == {"lr": 0.004, "pos_embed": "none"}  # text for text settings, numbers for numbers


def test_jobs_auto_runs_small_models_one_per_core_and_large_ones_alone():
    cores = len(os.sched_getaffinity(0))
    small = plan(Ablation("s", TrainConfig(), {"lr": [1e-3]}))[0]
    large = plan(Ablation("l", TrainConfig(model="B/16"), {"lr": [1e-3]}))[0]
    assert choose_jobs("auto", small) == cores and choose_jobs("auto", large) == 1 and choose_jobs(3, small) == 3


@pytest.mark.slow
def test_an_ablation_writes_tables_curves_and_a_page_and_a_rerun_redoes_nothing(tmp_path, capsys):
    out = tmp_path / "abl"
    first = ["ablate", "--vary", "classifier=token,gap", "--seeds", "1", "--out", str(out), "--jobs", "2", *QUICK]
    assert main(first) == 0
    assert "2 runs under" in (printed := capsys.readouterr().out) and "2 to run" in printed
    runs = [out / "cells" / cell / "seed0" for cell in sorted(p.name for p in (out / "cells").iterdir())]
    model_files = {run: (run / "model.safetensors").stat().st_mtime_ns for run in runs}
    assert main(first) == 0  # the same command again: nothing to run
    assert "2 done, 0 to run" in capsys.readouterr().out
    # More seeds later: only the new ones run, the finished ones are kept as they are.
    args = ["ablate", "--vary", "classifier=token,gap", "--seeds", "0,1", "--out", str(out), "--jobs", "2", *QUICK]
    assert main(args) == 0
    assert "4 runs under" in (printed := capsys.readouterr().out) and "2 done, 2 to run" in printed
    assert {run: (run / "model.safetensors").stat().st_mtime_ns for run in runs} == model_files
    folder = out / "ablation"
    rows = list(csv.DictReader((folder / "results.csv").open()))
    assert [(r["classifier"], r["seed"], r["status"]) for r in rows] == [
        ("token", "0", "finished"),
        ("token", "1", "finished"),
        ("gap", "0", "finished"),
        ("gap", "1", "finished"),
    ]
    # The table's mean +- std is the runs' own figures, validation and test side by side.
    summaries = [json.loads((Path(r["run_dir"]) / "summary.json").read_text()) for r in rows]
    gap_val = [100 * s["val_top1"] for s in summaries[2:]]
    table = (folder / "table.md").read_text()
    assert f"| gap | 2/2 | {statistics.fmean(gap_val):.2f} ± {statistics.stdev(gap_val):.2f} |" in table
    assert {s["seed"] for s in summaries} == {0, 1} and {s["epochs"] for s in summaries} == {2}
    token_val = [100 * s["val_top1"] for s in summaries[:2]]
    best = "gap" if statistics.fmean(gap_val) > statistics.fmean(token_val) else "token"
    assert f"Best on validation: classifier={best} (" in table
    page = (folder / "report.html").read_text()
    assert "data:image/png;base64," in page and 'src="http' not in page and "never used to choose" in page
    assert "<pre>vitlab ablate --vary classifier=token,gap --seeds 0,1" in page  # the command as typed
    assert (folder / "curves.png").stat().st_size > 0
    data = json.loads((folder / "results.json").read_text())
    assert [c["seeds"] for c in data["cells"]] == [2, 2] and len(data["runs"][0]["val_curve"]) == 2


@pytest.mark.slow
def test_a_stopped_ablation_resumes_only_what_is_missing(tmp_path):
    """Ctrl-C while the second run trains: the finished run is kept, the stopped one resumes from its state."""
    out = tmp_path / "abl"
    command = [
        sys.executable,
        "-m",
        "vitlab",
        "ablate",
        "--vary",
        "lr=4e-3",
        "--seeds",
        "2",
        "--jobs",
        "1",
        "--out",
        str(out),
        "--set",
        "epochs=8",  # seed 1 saves its first state after epoch 1 and runs ~4 s more: time enough to be stopped
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cell = next(iter((out / "cells").glob("*")), None)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # wait until seed 1 has saved a training state
        cells = list((out / "cells").glob("*")) if (out / "cells").exists() else []
        if cells and (cells[0] / "seed1" / "checkpoints" / "last.pt").exists():
            cell = cells[0]
            break
        time.sleep(0.1)
    else:
        process.kill()
        pytest.fail("the second run never started")
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "run the same command again" in stderr
    assert (cell / "seed0" / "summary.json").exists() and not (cell / "seed1" / "summary.json").exists()
    finished_model = (cell / "seed0" / "model.safetensors").stat().st_mtime_ns

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "1 done, 1 to run (1 resumed where they stopped)" in rerun.stdout
    assert (cell / "seed0" / "model.safetensors").stat().st_mtime_ns == finished_model
    log = (cell / "seed1.log").read_text()
    assert "--resume" in log and json.loads((cell / "seed1" / "summary.json").read_text())["epochs"] == 8


@pytest.mark.run_level
def test_an_ablation_file_runs_its_studies_and_refuses_vary(tmp_path, capsys):
    path = tmp_path / "abl.py"
    path.write_text(
        "from vitlab.ablate.plan import Ablation\nfrom vitlab.train.config import TrainConfig\n"
        "ablations = [Ablation('heads', TrainConfig(epochs=1), {'classifier': ['token', 'max']}, seeds=[0]),\n"
        "             Ablation('pos', TrainConfig(epochs=1), {'pos_embed': ['learned', 'none']}, seeds=[0])]\n"
    )
    assert main(["ablate", str(path), "--vary", "lr=1e-3"]) == 2
    assert "is an ablation file" in capsys.readouterr().err
    assert main(["ablate", str(path), "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "heads: 2 cells x 1 seeds" in printed and "3 runs under" in printed  # the recipe's own cell is shared
    assert not (tmp_path / "o").exists()


def test_help_lists_every_value_of_the_model_settings(capsys):
    from vitlab.config import CLASSIFIERS, PLACEMENTS, POSITION_EMBEDDINGS

    with pytest.raises(SystemExit):
        main(["ablate", "--help"])
    text = capsys.readouterr().out
    for name, values in (
        ("pos_embed ", POSITION_EMBEDDINGS),
        ("pos_embed_placement", PLACEMENTS),
        ("classifier ", CLASSIFIERS),
    ):
        line = next(line for line in text.splitlines() if line.strip().startswith(name.strip() + " "))
        assert all(value in line for value in values), line


def test_the_zoomed_panel_shows_the_second_half_with_the_legend_beside_it(tmp_path, monkeypatch):
    import matplotlib.axes

    from vitlab import plots

    assert plots.second_half(30) == (14.5, 30.5)
    limits, legends = [], []
    real_xlim, real_legend = matplotlib.axes.Axes.set_xlim, matplotlib.axes.Axes.legend
    monkeypatch.setattr(
        matplotlib.axes.Axes, "set_xlim", lambda self, *a, **k: (limits.append(a), real_xlim(self, *a, **k))[1]
    )
    monkeypatch.setattr(
        matplotlib.axes.Axes, "legend", lambda self, *a, **k: (legends.append(k), real_legend(self, *a, **k))[1]
    )
    plots.plot_ablation_curves(
        {"a": [[0.5 + e / 100 for e in range(30)]], "b": [[0.4 + e / 90 for e in range(30)]]}, tmp_path / "curves.png"
    )
    assert (14.5, 30.5) in limits and legends[-1]["bbox_to_anchor"][0] > 1  # outside the panel
    assert (tmp_path / "curves.png").stat().st_size > 1000
