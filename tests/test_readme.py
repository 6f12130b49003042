"""The README's workflows run as printed: every `vitlab` command of its shell blocks (and the `$ vitlab` lines of
its output blocks), in order, in a fresh folder where `make demo` has just run, and its Python snippet.

A few commands cannot run here; each is listed with the reason. Training commands run one or two epochs instead
of the recipe's length on a subset of the training images (appended `--set epochs=N --set max_train_images=...`,
which override the recipe): the test is about paths, flags and exit codes, not accuracy.
"""

import os
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import FIXTURES
from fakehub import AUGREG_B16, FakeServer, folder_files, serve_names
from vitlab.cli import main

REPO = Path(__file__).resolve().parents[1]

NOT_RUN_HERE = {
    "make test": "the test suite itself",
    "configs/mnist.py": "downloads MNIST (tests/train/test_train.py trains on ../shared/data/mnist where it exists)",
    "--resume runs/digits-20261121-190000": "names an example run folder",
    "--image-size 384": "a ViT-B/16 at 384x384 takes minutes on a CPU (the stand-in fixture would need GBs)",
    "vitlab bench": "timings take minutes; tests/bench/test_bench.py runs every path of the command",
    "vitlab serve": "a server runs until it is stopped; tests/serve/test_serve.py runs it on an ephemeral port",
    "--dataset mnist-scenes": "needs MNIST's files; tests/dense/test_probe.py runs the command on VOC, manifest and "
    "depth folders",
    "--dataset mnist --data-dir ~/mnist": "needs MNIST's files (and a teacher trained on them); tests/train/"
    "test_distill.py runs distillation on digits",
    "vitlab ablate configs/ablations": "57 runs take 10 minutes (digits) or more; tests/ablate/test_ablate.py runs the "
    "command on short recipes",
}


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every ``` block, read fence by fence."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = (line[3:].strip(), [])
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current[1].append(line)
    return blocks


def readme_commands(text: str) -> list[str]:
    """`vitlab` / `make` commands of the shell blocks and `$ ` lines of the output blocks, in order."""
    commands = []
    for language, lines in fenced_blocks(text):
        for line in lines:
            if language == "sh":
                command = re.split(r"\s+#", line)[0].strip()
            elif line.startswith("$ "):
                command = line[2:].strip()
            else:
                continue
            if command.startswith(("vitlab ", "make ")) or command == "vitlab":
                commands.append(command)
    return commands


def make_sandbox(root: Path) -> None:
    """What the README's commands assume beside the clone: a digit saved as my_digit.png, a ~/photos folder of
    class folders (and the same photos as ~/photos.csv, tar shards in ~/shards and a saved Hugging Face dataset
    in ~/photos_hf), and ViT-B_16.npz (the tiny official-format fixture stands in for the real download)."""

    shutil.copy(REPO / "my_digit.png", root / "my_digit.png")  # shipped beside the README (test below)
    rng = np.random.default_rng(0)
    for name, colour in (("cats", (200, 120, 40)), ("dogs", (40, 90, 200))):
        (root / "photos" / name).mkdir(parents=True)
        for index in range(100):
            noise = rng.integers(-40, 40, (48, 40, 3))
            Image.fromarray(np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)).save(
                root / "photos" / name / f"{index}.png"
            )
    write_streamed_forms(root / "photos", root)
    shutil.copy(FIXTURES / "jax_vit_token.npz", root / "ViT-B_16.npz")
    shutil.copy(FIXTURES / "jax_vit_token.json", root / "ViT-B_16.json")
    Image.new("RGB", (64, 48), (200, 120, 40)).save(root / "cat.jpg")
    (root / "tests").symlink_to(REPO / "tests")
    (root / "configs").symlink_to(REPO / "configs")  # the README runs from the clone, where the recipes are


def serve_readme_names(server: FakeServer) -> None:
    """The pre-trained names the README uses, served by the local fake hub and bucket with tiny stand-ins of the
    same layouts (tests/fixtures); tests/test_pretrained.py covers the names themselves."""
    official = (FIXTURES / "jax_vit_token.npz").read_bytes()
    server.bucket[AUGREG_B16] = official
    server.bucket["vit_models/imagenet21k/ViT-B_16.npz"] = official
    server.repos["google/vit-base-patch16-224"] = folder_files(FIXTURES / "hf_vit")
    server.repos["facebook/dino-vits16"] = folder_files(FIXTURES / "hf_dino")
    server.repos["facebook/dinov2-small"] = folder_files(FIXTURES / "hf_dinov2")


def write_streamed_forms(photos: Path, root: Path) -> None:
    """The class folders as a manifest, WebDataset tar shards and a saved Hugging Face dataset."""
    import tarfile

    files = sorted(photos.rglob("*.png"))
    (root / "photos.csv").write_text(
        "path,label\n" + "".join(f"photos/{f.relative_to(photos)},{f.parent.name}\n" for f in files)
    )
    (root / "shards").mkdir()
    classes = sorted({f.parent.name for f in files})
    (root / "shards" / "classes.txt").write_text("\n".join(classes) + "\n")
    for shard in range(4):
        with tarfile.open(root / "shards" / f"photos-{shard:03d}.tar", "w") as archive:
            for index, path in list(enumerate(files))[shard::4]:
                archive.add(path, f"{index:05d}.png")
                label = root / "label.cls"
                label.write_text(str(classes.index(path.parent.name)))
                archive.add(label, f"{index:05d}.cls")
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict(
        {"image": [str(f) for f in files], "label": [classes.index(f.parent.name) for f in files]}
    )
    table = table.cast_column("image", datasets.Image()).cast_column("label", datasets.ClassLabel(names=classes))
    table.save_to_disk(str(root / "photos_hf"))


# Images a README training command other than the demo trains on here (digits' training split holds about 1,300,
# the photos 180): the test is about paths, flags and exit codes, which a quarter of a digits epoch exercises as a
# whole one does.
TRAIN_IMAGES = 320


def as_run_here(command: str) -> list[str] | None:
    """The argument list to run for a README command, or None for one listed in NOT_RUN_HERE."""
    if any(pattern in command for pattern in NOT_RUN_HERE):
        return None
    if command == "make demo":  # what the Makefile runs, shortened
        # Every image: the export commands calibrate int8 on this run, whose classes must mean something
        return ["train", "--set", "run_name=demo", "--set", "epochs=2"]
    args = [os.path.expanduser(arg) for arg in shlex.split(command)[1:]]
    if args and args[0] in ("train", "finetune", "ablate", "pretrain") and "--resume" not in args:
        # One epoch on a stratified subset: the command's path is what is tested (a resume keeps the run's own).
        args += ["--set", "epochs=1", "--set", f"max_train_images={TRAIN_IMAGES}"]
    if "--resume" in args and "--epochs" in args:  # extend the 2-epoch demo run by one epoch
        args[args.index("--epochs") + 1] = "3"
    if args[:1] == ["ablate"] and "--seeds" in args:  # one seed: the crossing of axes is what runs
        args[args.index("--seeds") + 1] = "1"
    if args[:1] == ["ablate"]:
        # Every axis after the first at its first value: the axes still cross (a grid of 2 x 1 runs, not 2 x 2);
        # each run is a process of its own (~3 CPU-s to start), and the two-axis grid is written all the same.
        axes = [index + 1 for index, arg in enumerate(args) if arg == "--vary"]
        for index in axes[1:]:
            key, values = args[index].split("=", 1)
            args[index] = f"{key}={values.split(',')[0]}"
    return args


# The README's commands run in two halves, side by side under pytest-xdist: the first trains, evaluates, analyses,
# fine-tunes and pre-trains; the second starts at the streamed photos and goes on to names, conversion and export.
# Each half runs in a sandbox of its own, the second after its own `make demo` (its export commands read runs/demo).
SECOND_HALF_STARTS_AT = "--set stream=true --set run_name=photos"


def readme_halves() -> dict[str, list[str]]:
    commands = readme_commands((REPO / "README.md").read_text())
    split = next(i for i, command in enumerate(commands) if SECOND_HALF_STARTS_AT in command)
    return {"train-to-pretrain": commands[:split], "data-names-export": ["make demo"] + commands[split:]}


def test_the_readme_commands_are_all_run_but_a_few_named_ones():
    commands = readme_commands((REPO / "README.md").read_text())
    assert "make demo" in commands and any(c.startswith("vitlab predict runs/demo") for c in commands)
    halves = readme_halves()
    assert [c for c in commands if c != "make demo"] == [
        c for half in halves.values() for c in half if c != "make demo"
    ]
    skipped = [command for command in commands if as_run_here(command) is None]
    ran = len(commands) - len(skipped)
    # Skips stay the exception (at most a third of the commands), and every reason above still names a command.
    assert ran >= 20 and ran >= 2 * len(skipped), skipped
    assert all(any(pattern in command for command in skipped) for pattern in NOT_RUN_HERE), skipped


@pytest.mark.slow
@pytest.mark.pictures  # every command as a user runs it, pictures and all
@pytest.mark.parametrize("half", ["train-to-pretrain", "data-names-export"])
def test_the_readme_commands_run_as_printed(half, tmp_path, monkeypatch, capsys, request):
    pytest.importorskip("onnxruntime")
    make_sandbox(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # ~/photos
    server = FakeServer()
    request.addfinalizer(server.close)
    serve_readme_names(server)
    serve_names(server, tmp_path, monkeypatch)
    ran: set[str] = set()
    for command in readme_halves()[half]:
        args = as_run_here(command)
        # A command printed again (an output block's `$ vitlab ...` line under its shell block, a recap) ran
        # already in this sandbox: once is what shows it runs as printed (the Depth Anything export twice: ~10 s).
        if args is None or command in ran:
            continue
        ran.add(command)
        code = main(args)
        captured = capsys.readouterr()
        assert code == 0, f"{command}\n{captured.err[-2000:]}"
    assert (tmp_path / "runs" / "demo" / "model.safetensors").is_file()


def test_the_readme_python_snippet_runs(tmp_path, monkeypatch):
    snippets = [
        "\n".join(lines) for language, lines in fenced_blocks((REPO / "README.md").read_text()) if language == "python"
    ]
    assert snippets
    (tmp_path / "tests").symlink_to(REPO / "tests")
    monkeypatch.chdir(tmp_path)
    for snippet in snippets:
        exec(compile(snippet, "README.md", "exec"), {})
    assert (tmp_path / "model.safetensors").is_file()


def test_the_readme_layout_lists_every_module():
    layout = next(
        "\n".join(lines)
        for language, lines in fenced_blocks((REPO / "README.md").read_text())
        if lines and lines[0] == "src/vitlab/"
    )
    package = REPO / "src" / "vitlab"
    missing = []
    for path in sorted(package.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        if path.parent == package / "checkpoint" / "families" and "families/: one module per family" in layout:
            continue  # a family is one module and touches nothing else (docs/adding_a_family.md): the folder is named
        relative = path.relative_to(package)
        folder = f"{relative.parts[0]}/" if len(relative.parts) > 1 else None
        if folder and folder not in layout or path.name not in layout:
            missing.append(str(relative))
    assert missing == []


def test_the_shipped_my_digit_png_is_the_first_test_seven_of_the_digits():
    """The README's my_digit.png ships in the clone; it is the digits test split's first 7, saved as a 64x64 PNG."""
    from vitlab.data.datasets import load_dataset

    digits = load_dataset("digits", "test")
    seven = int((digits.labels == 7).nonzero()[0])
    pixels = (digits.images[seven, 0].numpy() * (255 / digits.max_value)).astype(np.uint8)
    expected = np.asarray(Image.fromarray(pixels).resize((64, 64), Image.Resampling.NEAREST))
    assert np.array_equal(np.asarray(Image.open(REPO / "my_digit.png")), expected)
