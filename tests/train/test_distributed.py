"""Two processes through torchrun on the CPU (gloo): every rank ends with the same weights, and they match a
single-process run with the same global batch."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from runfiles import MICRO, SPARE, two_processes

ARGS = [
    "--set",
    "epochs=2",
    "--set",
    f"model_overrides={MICRO}",
    "--set",
    "drop_path=0.0",
    "--set",
    "augment.affine_degrees=10",
    "--set",
    "augment.random_erasing=0.25",
    "--set",
    "progress=false",
]


def one_and_two_processes(
    tmp_path, args: list[str], command: str = "train"
) -> tuple[dict, dict, subprocess.CompletedProcess]:
    """The same recipe (of `vitlab COMMAND`) as one process that accumulates two micro-batches per step and as two
    torchrun processes, each on one thread: both final weights, and the two-process run (its output).

    The one process is this one (`vitlab.cli.main`): a process of its own would add only its start-up (~3 CPU-s:
    torch, torch._dynamo), as the run's arithmetic is the same wherever it runs: one thread, the fp32 kernel the
    suite pins (tests/conftest.py, in the environment both sides read), the recipe's seeds."""
    from vitlab.cli import main

    one_thread = ["--set", "threads=1"]  # a kernel may split its sums by the thread count: the same on both sides
    threads = torch.get_num_threads()
    try:
        code = main(
            [
                command,
                "--out-dir",
                str(tmp_path),
                "--set",
                "run_name=single",
                "--set",
                "grad_accum=2",
                *one_thread,
                *args,
            ]
        )
    finally:
        torch.set_num_threads(threads)  # the run's one thread, not the next test's
    assert code == 0
    double = subprocess.run(
        [
            *two_processes(SPARE),
            command,
            "--out-dir",
            str(tmp_path),
            "--set",
            "run_name=double",
            *one_thread,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert double.returncode == 0, double.stderr[-3000:]
    return (
        load_file(tmp_path / "single" / "model.safetensors"),
        load_file(tmp_path / "double" / "model.safetensors"),
        double,
    )


def assert_equal_weights(one: dict, two: dict) -> None:
    """Bit for bit, naming the first tensor that differs and by how much."""
    for name in one:
        assert torch.equal(one[name], two[name]), f"{name}: {(one[name] - two[name]).abs().max().item():.3g} apart"


# What a 2-process run can differ by from a 1-process run, and so the bound. Under DDP each rank runs forward, loss
# (the mean over its half of the global batch) and backward on its half; DDP halves every gradient (exact: a power of
# two) and sums the two ranks' over gloo: one rounding, and a + b == b + a in IEEE arithmetic, so the order of the
# all-reduce cannot matter. A 1-process run with grad_accum=2 does the same arithmetic: the same half-batch shapes
# through the same kernels (the suite pins the fp32 kernel, tests/conftest.py) on one thread each, each half's loss
# halved before its backward (exact), the two halves' gradients summed (the same one rounding). Nothing is left to
# differ, on any CPU kind (AVX2, AVX-512, AMX) and with either fp32 kernel, whatever order its kernels sum in: the
# bound is zero, the weights equal bit for bit (2794 of 2794 on a 2-core Intel Xeon with AMX, lscpu family 6 model
# 167, both optimizers, both kernels).
#
# The whole batch in one step (grad_accum=1) is not such a reference: its products reduce over all B rows in one
# kernel call, blocked as that CPU's kernel blocks them, so its gradients round otherwise (a last bit), and AdamW
# divides each update by sqrt(v): where a gradient is near zero that rounding can turn the update's sign, up to
# 2 lr in a step, carried by the steps after. On that Xeon it left 99% of the weights within 2.3e-7 of the 2-process
# run's but 16 beyond 1e-5, the worst 4.2e-4 (0.1 lr), for SGD all within 1.4e-9; other CPUs' kernels turn other
# weights, so no tolerance measured on one CPU holds on all. That spread is the batch split's, and it is the same
# between grad_accum=1 and 2 in one process (measured: identical figures): DDP adds nothing to it.
#
# A broken DDP fails at once (measured on that Xeon, with a DDP communication hook put in): gradients summed instead
# of averaged moved every AdamW weight (median 2.4e-4) and 1500 of the SGD weights beyond 1e-5; rank 1's half of
# each batch dropped (rank 0's gradient broadcast) moved every AdamW weight (median 1e-2) and SGD's up to 4.4e-3.
@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_two_processes_match_one(all_cores, tmp_path, optimizer):
    """Two processes train the weights one does. Flips are asked for, and digits refuse them: they are turned off
    on every rank, not only on rank 0 (where the note is printed), or the ranks would draw other augmentations."""
    one, two, double = one_and_two_processes(
        tmp_path, ARGS + ["--set", f"optimizer={optimizer}", "--set", "augment.hflip=true"]
    )
    assert double.stdout.count("flips are off") == 1  # said once, by rank 0
    summary = json.loads((tmp_path / "double" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["replica_max_abs_diff"] == 0.0  # identical on every rank
    assert_equal_weights(one, two)
    single_rows = [json.loads(r) for r in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()]
    double_rows = [json.loads(r) for r in (tmp_path / "double" / "metrics.jsonl").read_text().splitlines()]
    assert len(single_rows) == len(double_rows) == 2
    for a, b in zip(single_rows, double_rows):  # metrics are reduced over ranks: whole-data figures
        assert abs(a["val_top1"] - b["val_top1"]) <= 1 / 144 and abs(a["train_loss"] - b["train_loss"]) < 1e-3


@pytest.mark.slow
def test_a_stopped_two_process_run_resumes_exactly(all_cores, tmp_path):
    """SIGTERM to both workers mid-run, then `torchrun ... train --resume`: the weights equal those of an
    uninterrupted 2-process run bit for bit, with stochastic depth drawing from every rank's RNG."""
    import signal
    import time

    args = [
        "--set",
        # The first state is saved after epoch 1 (step 10): four more (40 steps, a second or more) leave time to
        # stop both workers mid-run, where the poll below takes 0.05 s and pgrep and the signals a few ms.
        "epochs=5",
        "--set",
        f"model_overrides={dict(MICRO, depth=2)}",
        "--set",
        "drop_path=0.2",
        "--set",
        "progress=false",
        "--out-dir",
        str(tmp_path),
    ]
    torchrun = [*two_processes(SPARE), "train"]
    straight = subprocess.run(
        torchrun + args + ["--set", "run_name=straight"], capture_output=True, text=True, timeout=300
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    agent = subprocess.Popen(
        torchrun + args + ["--set", "run_name=stopped"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    last = tmp_path / "stopped" / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while not last.exists() and time.time() < deadline:
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(int(pid), signal.SIGTERM)
    out, err = agent.communicate(timeout=120)
    assert agent.returncode == 0, err[-3000:]
    assert "Resume with" in out
    state = torch.load(last, weights_only=True)
    assert state["rank_rng_states"].shape[0] == 2 and state["global_step"] < 5 * 10
    resumed = subprocess.run(  # a restart of this `train --resume` after it finished the run exits 0 as well
        [*two_processes(SPARE), "train", "--resume", str(tmp_path / "stopped")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "stopped" / "model.safetensors")
    for name in a:
        assert torch.equal(a[name], b[name]), name


def segmentation_pairs(folder, counts: dict[str, int]) -> Path:
    """16-pixel grey images and their masks, each with all three classes (background 0 and one box of class 1 and
    of class 2, of random size and place, apart), listed with their split in a manifest; returns the manifest."""
    import numpy as np
    from PIL import Image

    generator = np.random.default_rng(0)
    folder.mkdir()
    rows = ["image,mask,split"]
    for split, count in counts.items():
        for index in range(count):
            mask = np.zeros((16, 16), np.uint8)
            for label, columns in ((1, (0, 8)), (2, (8, 16))):  # boxes of 4-6 px: a 0.75 zoom keeps every class
                height, width = generator.integers(4, 7, 2)
                top, left = generator.integers(0, 16 - height), generator.integers(columns[0], columns[1] - width + 1)
                mask[top : top + height, left : left + width] = label
            pixels = np.array([40, 150, 250], np.uint8)[mask] + generator.integers(0, 5, mask.shape).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{split}{index}.png")
            Image.fromarray(mask).save(folder / f"{split}{index}-mask.png")
            rows.append(f"{split}{index}.png,{split}{index}-mask.png,{split}")
    (folder / "pairs.csv").write_text("\n".join(rows) + "\n")
    return folder / "pairs.csv"


# What can differ, and so the bound: what `test_two_processes_match_one` gives, nothing, if the segmentation loss
# does the same arithmetic on a rank's half of the batch as on the same half as a micro-batch. It does, where:
# - the random draws are the same. Which queries a masked block masks, the matching's points and the importance-
#   sampled points are drawn from a generator per micro-batch, seeded by its first image's seed, which
#   `training_inputs` draws for the global batch (`Draws`): rank 1's half draws what the second micro-batch draws.
#   (The run's global generator, seeded by rank, is not drawn from; drop_path, which draws from it, is 0 here.)
# - the mask terms are divided alike. Under DDP `MaskClassificationLoss(env=...)` divides by the mean over the ranks
#   of their halves' segment counts, one process accumulating by each micro-batch's own count: the same number only
#   where the halves count the same segments. Here every image holds three after augmentation (a zoom of 0.75-1
#   drops no box: it shrinks, padding with ignored pixels), so both divide by 3 x 4 = 12, exactly.
# - Hungarian matching (scipy) on equal costs picks equal pairs.
# The bound is zero: bit for bit, weights and both ranks alike. Mask annealing runs over epochs 0.5-1.5 (steps 2-6
# of 8, two query blocks): steps 3 and 5 mask with probabilities strictly between 0 and 1, and so draw.
@pytest.mark.slow
def test_two_processes_fine_tune_eomt_segmentation_as_one(all_cores, tmp_path):
    from vitlab.checkpoint.formats import export_checkpoint
    from vitlab.models.registry import create_model

    manifest = segmentation_pairs(tmp_path / "pairs", {"train": 32, "val": 8, "test": 8})
    torch.manual_seed(0)
    backbone = export_checkpoint(create_model("digits-8", image_size=16, depth=3), tmp_path / "backbone.safetensors")
    args = ["--from", str(backbone), "--dataset", "segmentation", "--data-dir", str(manifest)]
    recipe = {
        "objective": "segmentation",
        "optimizer": "adamw",
        "lr": 3e-3,
        "epochs": 2,
        "batch_size": 8,
        "warmup_epochs": 0.5,
        "augment.crop_padding": 0,  # segmentation moves image and mask together, by its own zoom
        "segmentation.head": "eomt",
        "segmentation.queries": 8,
        "segmentation.blocks": 2,
        "segmentation.num_points": 64,
        "segmentation.scale_range": "[0.75,1.0]",
        "progress": "false",
    }
    for key, value in recipe.items():
        args += ["--set", f"{key}={value}"]
    one, two, double = one_and_two_processes(tmp_path, args, command="finetune")
    summary = json.loads((tmp_path / "double" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["replica_max_abs_diff"] == 0.0  # identical on every rank
    assert one.keys() == two.keys() and "q.weight" in one
    assert_equal_weights(one, two)
    single_rows = [json.loads(r) for r in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()]
    double_rows = [json.loads(r) for r in (tmp_path / "double" / "metrics.jsonl").read_text().splitlines()]
    assert len(single_rows) == len(double_rows) == 2
    for a, b in zip(single_rows, double_rows):  # the same weights, measured over every rank's share
        assert a["val_miou"] == b["val_miou"] and abs(a["train_loss"] - b["train_loss"]) < 1e-6


def test_fetch_once_runs_on_one_process_per_machine_before_the_others(monkeypatch):
    """Ranks simulated in turn: each records when it fetches and when it meets the others (the collective)."""
    from vitlab import distributed
    from vitlab.distributed import DistEnv, fetch_once

    events = []
    # The waits are patient (through the store): a first process may download for hours, beyond the collective
    # timeout; and the first processes wait for the others' reading too.
    monkeypatch.setattr(distributed, "patient_any_rank", lambda flag, env: events.append(("barrier", env.rank)) or flag)
    for rank, local_rank in [(0, 0), (1, 1)]:
        env = DistEnv(rank=rank, world_size=2, local_rank=local_rank)
        assert fetch_once(lambda: events.append(("fetch", rank)) or "data", env) == "data"  # noqa: B023 - called now
    assert events == [("fetch", 0), ("barrier", 0), ("barrier", 0), ("barrier", 1), ("fetch", 1), ("barrier", 1)]
    assert fetch_once(lambda: "alone", DistEnv()) == "alone"  # one process: just the call


def test_fetch_once_fails_on_every_process_when_the_first_one_fails(monkeypatch):
    from vitlab import distributed
    from vitlab.distributed import DistEnv, fetch_once
    from vitlab.errors import DataError, VitlabError

    monkeypatch.setattr(distributed, "patient_any_rank", lambda flag, env: True)  # the first's failure, shared

    def unreachable():
        raise DataError("could not download x.bin")

    with pytest.raises(DataError, match="could not download"):
        fetch_once(unreachable, DistEnv(rank=0, world_size=2))
    called = []
    with pytest.raises(VitlabError, match="another process failed to fetch"):
        fetch_once(lambda: called.append(1), DistEnv(rank=1, world_size=2, local_rank=1))
    assert called == []  # it did not start a download of its own


@pytest.mark.slow
def test_two_processes_streaming_a_folder_match_one(all_cores, tmp_path):
    """Streamed image files under torchrun: the choice is made once, each rank decodes only its share of every
    batch in its own workers, and the weights match a single-process run."""
    import numpy as np
    from PIL import Image

    generator = np.random.default_rng(0)
    for name in ("cats", "dogs"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for index in range(40):
            pixels = generator.integers(0, 256, (30, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "photos" / name / f"{index:03d}.jpg")
    args = [
        "--dataset",
        "folder",
        "--data-dir",
        str(tmp_path / "photos"),
        "--set",
        "stream=true",
        "--set",
        "workers=1",
        "--set",
        "epochs=2",
        "--set",
        "batch_size=16",
        "--set",
        "optimizer=sgd",
        "--set",
        f"model_overrides={dict(MICRO, image_size=16, patch_size=4)}",
        "--set",
        "drop_path=0.0",
        "--set",
        "progress=false",
    ]
    one, two, double = one_and_two_processes(tmp_path, args)
    assert double.stdout.count("note: streaming folder") == 1
    assert_equal_weights(one, two)  # each rank's share of a batch is the half one process accumulates


@pytest.mark.slow
def test_unreadable_files_are_counted_over_every_rank_and_the_limit_stops_them_together(all_cores, tmp_path):
    """Issue 38: under torchrun the 10% limit and `skipped_files` counted rank 0's share only, and a rank that
    stopped on them raised while the others waited. Now every rank's count is summed each step and all decide
    together; the summary lists every rank's files."""
    import numpy as np
    from PIL import Image

    def folder(root, bad):
        generator = np.random.default_rng(0)
        for name in ("cats", "dogs"):
            (root / name).mkdir(parents=True)
            for index in range(50):
                path = root / name / f"{index:03d}.jpg"
                if index < bad:
                    path.write_bytes(b"")  # empty: unreadable
                else:
                    Image.fromarray(generator.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(path)

    def run(root, name, spare=()):
        args = ["--dataset", "folder", "--data-dir", str(root), "--set", "stream=true", "--set", "workers=0"]
        args += ["--set", "epochs=2", "--set", "batch_size=16", "--set", "progress=false", "--set", f"run_name={name}"]
        args += ["--set", f"model_overrides={dict(MICRO, image_size=16, patch_size=4)}", "--out-dir", str(tmp_path)]
        command = two_processes(*spare)
        return subprocess.run([*command, "train", *args], capture_output=True, text=True, timeout=300)

    folder(tmp_path / "few", bad=3)  # 6 of 100: under the limit
    finished = run(tmp_path / "few", "few", [SPARE])
    assert finished.returncode == 0, finished.stderr[-3000:]
    listed = (tmp_path / "few" / "skipped.txt").read_text().splitlines()
    assert len(listed) == 6 and all("empty file (0 bytes)" in line for line in listed)  # both ranks' shares
    folder(tmp_path / "many", bad=12)  # 24 of 100: over it
    stopped = run(tmp_path / "many", "many")
    assert stopped.returncode != 0
    assert stopped.stderr.count("are unreadable, more than 10%") == 2, stopped.stderr[-3000:]  # each rank, one line


@pytest.mark.slow
def test_unreadable_files_all_in_one_ranks_shards_stop_every_rank_or_none(all_cores, tmp_path):
    """Issue 39's row: tar shards read whole per rank, every unreadable file in one shard, so in one rank's share
    each epoch. Under the limit both ranks go on and the summary lists that rank's files; over it, the rank that
    met none stops too, with the same one line, rather than wait in a collective for the other."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    def shards(root, bad):
        root.mkdir()
        generator = np.random.default_rng(0)
        for shard in range(2):
            with tarfile.open(root / f"train-{shard:03d}.tar", "w") as archive:
                for index in range(50):
                    image = io.BytesIO()
                    Image.fromarray(generator.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(image, "JPEG")
                    unreadable = shard == 1 and index < bad
                    for suffix, data in (
                        ("jpg", b"" if unreadable else image.getvalue()),
                        ("cls", b"%d" % (index % 2)),
                    ):
                        member = tarfile.TarInfo(f"s{shard}-{index:03d}.{suffix}")
                        member.size = len(data)
                        archive.addfile(member, io.BytesIO(data))
        (root / "classes.txt").write_text("cats\ndogs\n")

    def run(root, name, spare=()):
        shards = str(root / "train-{000..001}.tar")
        args = ["--dataset", "shards", "--data-dir", shards, "--set", "workers=0", "--set", "val_size=0"]
        args += ["--set", "shard_order=sequential", "--set", "epochs=1", "--set", "batch_size=16"]
        args += ["--set", "sync_every=3"]  # as on a GPU: the count and the stop agreed at the reads only
        args += ["--set", "progress=false", "--set", f"run_name={name}", "--out-dir", str(tmp_path)]
        args += ["--set", f"model_overrides={dict(MICRO, image_size=16, patch_size=4)}"]
        command = two_processes(*spare)
        return subprocess.run([*command, "train", *args], capture_output=True, text=True, timeout=300)

    shards(tmp_path / "few", bad=6)  # 6 of 100: under the 10% limit
    finished = run(tmp_path / "few", "few", [SPARE])
    assert finished.returncode == 0, finished.stderr[-3000:]
    listed = (tmp_path / "few" / "skipped.txt").read_text().splitlines()
    # Some of the 6 fall in the test split or the epoch's last, partial batch: each one read is listed.
    assert 0 < len(listed) <= 6 and all("train-001.tar:s1-00" in line for line in listed)
    shards(tmp_path / "many", bad=20)  # 20 of 100: over it
    stopped = run(tmp_path / "many", "many")
    assert stopped.returncode != 0
    assert stopped.stderr.count("are unreadable, more than 10%") == 2, stopped.stderr[-3000:]  # each rank, one line
