"""The `vitlab` command: one subcommand per job, each a thin call into a plain function of the package.

Usage errors exit with code 2 and one line saying what is wrong; other failures exit 1 with a message, and
`--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vitlab.config import CLASSIFIERS, MLPS, NORMS, PLACEMENTS, POSITION_EMBEDDINGS
from vitlab.errors import UsageError, VitlabError


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are a single line (argparse's usage dump buries the message)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        # An epilog may be a function, made only when help is shown: the --set key list imports the training
        # recipe (and with it torch), which no other command should pay for at start-up.
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def image_size_arg(text: str) -> int | tuple[int, int]:
    """'224' or '224x320' (height x width)."""
    from vitlab.config import parse_image_size

    try:
        return parse_image_size(text)
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def classes_arg(text: str) -> list[int]:
    """'5,6,7' or '5-9' -> class indices."""
    from vitlab.config import parse_classes

    try:
        return parse_classes(text)
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def port_arg(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be a whole number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535 (0: any free port), got {port}")
    return port


def run_exit_code(summary: dict) -> int:
    """0: finished, or stopped by SIGTERM with its state saved (how schedulers ask a job to checkpoint and leave);
    130: stopped by Ctrl-C (SIGINT), state saved; 1: failed."""
    import signal

    if summary["status"] == "finished":
        return 0
    if summary["status"] == "interrupted":
        return 130 if summary.get("signal") == signal.SIGINT else 0
    return 1


# ------------------------------------------------------------------------------------------------ commands
def cmd_models(args: argparse.Namespace) -> int:
    from vitlab.reports import format_models_table, models_table

    rows = models_table(image_size=args.image_size, num_classes=args.num_classes)
    print(
        json.dumps(rows, indent=1)
        if args.json
        else format_models_table(rows, args.image_size is not None, args.num_classes is not None)
    )
    return 0


def cmd_pretrained(args: argparse.Namespace) -> int:
    from vitlab.pretrained import format_pretrained_table, pretrained_table

    rows = pretrained_table(args.family)
    print(json.dumps(rows, indent=1) if args.json else format_pretrained_table(rows))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from vitlab.reports import convert, format_conversion

    summary = convert(
        args.input, args.output, to=args.to, image_size=args.image_size, num_heads=args.num_heads, force=args.force
    )
    print(format_conversion(summary, args.to))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from vitlab.reports import checkpoint_info, format_info

    if args.trace:
        from vitlab.reports import trace_model

        print(trace_model(args.checkpoint, args.image, image_size=args.image_size, num_heads=args.num_heads))
        return 0

    info = checkpoint_info(args.checkpoint, num_heads=args.num_heads, image_size=args.image_size)
    print(json.dumps(info, indent=1) if args.json else format_info(info))
    return 0


def shorthand_overrides(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """`--set` assignments for the shorthand flags given (train and finetune share them), then the --set ones."""
    assignments = []
    for name in names:
        value = getattr(args, name, None)
        if value is None or value is False:
            continue
        if name == "image_size":
            value = image_size_text(value)
        elif name == "classes":
            value = "[" + ",".join(map(str, value)) + "]"
        elif value is True:
            value = "true"
        assignments.append(f"{name}={value}")
    return assignments + (args.set or [])


TRAIN_SHORTHANDS = ("dataset", "data_dir", "image_size", "classes", "epochs", "model", "out_dir", "max_patches")


def refuse_use_previous_without_resume(args: argparse.Namespace) -> None:
    """--use-previous chooses the checkpoint a resume starts from; alone it would be ignored and a new run start."""
    if getattr(args, "use_previous", False) and not args.resume:
        raise UsageError(
            "--use-previous goes with --resume RUN_DIR (resume from the previous checkpoint when the last "
            "one is damaged); without --resume it would start a new run"
        )


def refuse_flags_resume_ignores(args: argparse.Namespace, shorthands: Sequence[str]) -> None:
    """--resume continues a run with its own recipe: any recipe flag given with it would be ignored, so it is
    refused; only --epochs may change (to extend the run)."""
    given = [
        "--from" if name == "init_from" else f"--{name.replace('_', '-')}"
        for name in (*shorthands, "config", "set")
        if name != "epochs" and getattr(args, name, None) not in (None, False, 0, [])
    ]
    if given:
        raise UsageError(
            f"--resume continues a run with its own recipe; drop {', '.join(given)} (only --epochs "
            "may change, to extend the run)"
        )


def cmd_train(args: argparse.Namespace) -> int:
    from vitlab.train.config import TrainConfig, apply_overrides, load_recipe
    from vitlab.train.loop import resume, train

    refuse_use_previous_without_resume(args)
    if args.resume:
        refuse_flags_resume_ignores(args, TRAIN_SHORTHANDS)
        summary = resume(args.resume, use_previous=args.use_previous, epochs=args.epochs)
    else:
        config = load_recipe(args.config) if args.config else TrainConfig()
        summary = train(apply_overrides(config, shorthand_overrides(args, TRAIN_SHORTHANDS)))
    return run_exit_code(summary)


def image_size_text(size: int | tuple[int, int]) -> str:
    """--set form of an image size: 224 or [48,32]."""
    return str(size) if isinstance(size, int) else f"[{size[0]},{size[1]}]"


CHECKPOINT_IMAGE_SIZE_HELP = (
    "N or HxW. A checkpoint whose position table is a square grid implies its own size, "
    "and this is the size to resample it to; one whose table is not square (e.g. 48x32 "
    "images) implies none, and this is the size it was made for"
)


def add_checkpoint_options(
    parser: argparse.ArgumentParser, image_size_help: str = CHECKPOINT_IMAGE_SIZE_HELP, num_heads: bool = True
) -> None:
    """--image-size (and --num-heads), the same for every command that loads a checkpoint."""
    parser.add_argument("--image-size", type=image_size_arg, default=None, help=image_size_help)
    if num_heads:
        parser.add_argument(
            "--num-heads", type=int, default=None, help="head count, for timm / HF weights with no config beside them"
        )


def shots_arg(text: str) -> list[int]:
    try:
        shots = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"shots must be like 1,5,10,25, got {text!r}") from None
    if not shots or min(shots) < 1:
        raise argparse.ArgumentTypeError(f"shots must be positive counts, got {text!r}")
    return shots


MAX_PATCHES_HELP = (
    "shorthand for --set max_patches=N: with --set input=naflex, each image at its own aspect ratio on at most N "
    "patches (default 256)"
)

FINETUNE_SHORTHANDS = (
    "init_from",
    "dataset",
    "data_dir",
    "image_size",
    "epochs",
    "classes",
    "out_dir",
    "linear_probe",
    "freeze_blocks",
    "optimizer",
    "max_patches",
)


def cmd_finetune(args: argparse.Namespace) -> int:
    from vitlab.train.config import apply_overrides, finetune_config, load_recipe
    from vitlab.train.loop import resume, train

    refuse_use_previous_without_resume(args)
    if args.resume:
        refuse_flags_resume_ignores(args, FINETUNE_SHORTHANDS)
        return run_exit_code(resume(args.resume, use_previous=args.use_previous, epochs=args.epochs))
    if not args.init_from or not args.dataset:
        raise UsageError("finetune needs --from CHECKPOINT and --dataset NAME (or --resume RUN_DIR)")
    config = load_recipe(args.config) if args.config else finetune_config()
    return run_exit_code(train(apply_overrides(config, shorthand_overrides(args, FINETUNE_SHORTHANDS))))


PRETRAIN_SHORTHANDS = ("dataset", "data_dir", "image_size", "epochs", "model", "out_dir", "init_from")


def cmd_pretrain(args: argparse.Namespace) -> int:
    from vitlab.objectives import pretraining_methods
    from vitlab.train.config import apply_overrides, load_recipe, pretrain_config
    from vitlab.train.loop import resume, train

    methods = pretraining_methods()
    refuse_use_previous_without_resume(args)
    if args.resume:
        refuse_flags_resume_ignores(args, PRETRAIN_SHORTHANDS + ("method",))
        return run_exit_code(resume(args.resume, use_previous=args.use_previous, epochs=args.epochs))
    if args.config:
        config = load_recipe(args.config)
        if args.method and config.objective != args.method:
            raise UsageError(
                f"{args.config} pre-trains by {config.objective!r}, not {args.method!r}; drop --method "
                f"or add --set objective={args.method}"
            )
    elif args.method:
        config = pretrain_config(args.method)
    else:
        raise UsageError(f"pretrain needs --method {'|'.join(methods)} (or a --config recipe, or --resume RUN_DIR)")
    if config.objective not in methods:
        raise UsageError(
            f"{args.config} is a supervised recipe; pretrain takes a recipe with objective "
            f"{' or '.join(methods)} (configs/pretrain/)"
        )
    return run_exit_code(train(apply_overrides(config, shorthand_overrides(args, PRETRAIN_SHORTHANDS))))


def cmd_ablate(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from vitlab.ablate.plan import Ablation, load_ablations, parse_vary
    from vitlab.ablate.results import format_results
    from vitlab.ablate.runner import run_ablations
    from vitlab.train.config import TrainConfig

    ablations = load_ablations(args.source) if args.source else []
    if ablations:
        if args.vary:
            raise UsageError(
                f"{args.source} is an ablation file and says what to vary; --vary is for a recipe "
                "(vitlab ablate configs/mnist.py --vary pos_embed=none,learned)"
            )
        if args.name:
            ablations = [a for a in ablations if a.name in args.name.split(",")] or ablations_missing(
                args.name, ablations
            )
    else:
        if not args.vary:
            raise UsageError(
                "say what to vary: --vary KEY=V1,V2 (e.g. --vary pos_embed=none,learned --vary "
                "lr=8e-4,3e-4), or give an ablation file from configs/ablations/"
            )
        ablations = [
            Ablation(name=args.name or "ablation", recipe=args.source or TrainConfig(), vary=parse_vary(args.vary))
        ]
    for ablation in ablations:
        if args.seeds is not None:
            ablation.seeds = args.seeds
        ablation.settings = list(ablation.settings) + list(args.set or [])
    source = Path(args.source).stem if args.source else "digits"
    out = args.out or str(Path("runs") / "ablations" / source)
    command = "vitlab " + " ".join(shlex.quote(a) for a in args.argv)  # argv starts with "ablate"
    outcome = run_ablations(ablations, out, args.jobs, dry_run=args.dry_run, command=command)
    if outcome.get("dry_run"):
        return 0
    print(format_results(outcome))
    if outcome["interrupted"]:
        import signal

        return 0 if outcome.get("signal") == signal.SIGTERM else 130  # as train: SIGTERM is "save and leave"
    return 1 if outcome["failed"] else 0


def ablations_missing(names: str, ablations) -> list:
    raise UsageError(f"--name {names}: the file's ablations are {', '.join(a.name for a in ablations)}")


def seeds_arg(text: str) -> list[int]:
    """'3' -> [0, 1, 2]; '0,1,2' or '5,7' -> those seeds."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be a count (3) or a list (0,1,2), got {text!r}") from None
    if not values or min(values) < 0 or (len(values) == 1 and "," not in text and values[0] < 1):
        raise argparse.ArgumentTypeError(f"seeds must be a positive count or non-negative seeds, got {text!r}")
    return list(range(values[0])) if len(values) == 1 and "," not in text else values


def jobs_arg(text: str) -> str | int:
    if text == "auto":
        return text
    return positive_int(text)


def embedding_files(args: argparse.Namespace) -> tuple[str, str] | None:
    """--train FILE --test FILE (embedding files), both or neither."""
    if args.train is None and args.test is None:
        return None
    from vitlab.eval.embeddings import both_files

    return both_files(args.train, args.test)


def cmd_fewshot(args: argparse.Namespace) -> int:
    from vitlab.eval.fewshot import format_fewshot, run_fewshot

    report = run_fewshot(
        args.checkpoint,
        args.dataset,
        shots=args.shots,
        seeds=args.seeds,
        l2=args.l2,
        data_dir=args.data_dir,
        classes=args.classes,
        image_size=args.image_size,
        num_heads=args.num_heads,
        files=embedding_files(args),
    )
    print(json.dumps(report, indent=1) if args.json else format_fewshot(report))
    return 0


def cmd_linear_probe(args: argparse.Namespace) -> int:
    from vitlab.eval.fewshot import format_linear_probe, run_linear_probe

    report = run_linear_probe(
        args.checkpoint,
        args.dataset,
        l2=args.l2,
        data_dir=args.data_dir,
        classes=args.classes,
        image_size=args.image_size,
        num_heads=args.num_heads,
        files=embedding_files(args),
    )
    print(json.dumps(report, indent=1) if args.json else format_linear_probe(report))
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    from vitlab.eval.retrieval import format_embed, run_embed

    report = run_embed(
        args.checkpoint,
        args.data,
        args.out,
        dataset=args.dataset,
        data_dir=args.data_dir,
        split=args.split,
        pool=args.pool,
        dtype=args.dtype,
        batch_size=args.batch_size,
        precision=args.precision,
        workers=args.workers,
    )
    print(json.dumps(report, indent=1) if args.json else format_embed(report))
    return 0


def cmd_knn(args: argparse.Namespace) -> int:
    from vitlab.eval.retrieval import format_knn, run_knn

    report = run_knn(
        args.checkpoint,
        args.dataset,
        args.data_dir,
        train_file=args.train,
        test_file=args.test,
        ks=tuple(args.k),
        temperature=args.temperature,
    )
    print(json.dumps(report, indent=1) if args.json else format_knn(report))
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from vitlab.eval.retrieval import format_duplicates, format_search, run_duplicates, run_search

    if args.duplicates is not None:
        pairs = run_duplicates(args.index, args.duplicates)
        print(json.dumps(pairs, indent=1) if args.json else format_duplicates(pairs, args.duplicates))
        return 0
    if not args.queries:
        raise UsageError("give query images (or an embedding file of queries), or --duplicates THRESHOLD")
    rows = run_search(args.index, args.queries, args.k)
    print(json.dumps(rows, indent=1) if args.json else format_search(rows))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from vitlab.eval.runner import format_evaluation, run_evaluation

    report = run_evaluation(
        args.checkpoint,
        args.dataset,
        data_dir=args.data_dir,
        split=args.split,
        out=args.out,
        batch_size=args.batch_size,
        classes=args.classes,
        image_size=args.image_size,
        num_heads=args.num_heads,
        backend=args.backend,
        precision=args.precision,
        device=args.device,
    )
    print(
        json.dumps({k: v for k, v in report.items() if k != "confusion"}, indent=1)
        if args.json
        else format_evaluation(report)
    )
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from vitlab.eval.predict import format_predictions, inference_precision, load_classifier, predict

    model = load_classifier(args.checkpoint, args.backend, args.image_size, args.num_heads, args.device)
    choice = inference_precision(model, args.precision)
    if args.precision == "auto" and choice.value != "fp32":  # said where auto leaves fp32; on stderr, so the
        how = "bf16 autocast" if choice.value == "bf16" else choice.value  # an ONNX or pt2e file is int8 as saved
        print(f"vitlab predict: {how} ({choice.reason})", file=sys.stderr)  # on stderr: the rows stay clean
    rows = predict(model, args.inputs, top_k=args.top_k, precision=choice.value)
    print(format_predictions(rows, args.format))
    failed = sum("error" in row for row in rows)
    if failed:
        print(
            f"vitlab predict: {failed} of {len(rows)} inputs could not be classified (their rows say why)",
            file=sys.stderr,
        )
    return 1 if failed else 0


def cmd_export(args: argparse.Namespace) -> int:
    from vitlab.bench.advice import fastest_format_line
    from vitlab.checkpoint import load_model
    from vitlab.counts import model_size
    from vitlab.export.checks import calibration_pixels, validation_pixels
    from vitlab.export.onnx import format_export, require_onnx, run_export
    from vitlab.runs import onnx_output

    if args.format in ("pt2e", "pt2"):
        return export_pt2e_command(args)
    if args.dynamic_batch and args.batch_size:
        raise UsageError(
            "--dynamic-batch and --batch-size contradict each other: give --batch-size N to fix the "
            "batch, nothing for any batch size"
        )
    if args.calibrate and not args.int8:
        raise UsageError("--calibrate is for static int8: add --int8 (vitlab export RUN --int8 --calibrate mnist)")
    if args.output and Path(args.output).suffix.lower() != ".onnx":
        raise UsageError(
            f"-o {args.output}: an ONNX model is written to a .onnx file; name it "
            f"{Path(args.output).with_suffix('.onnx')}"
        )
    require_onnx()
    model = load_model(args.checkpoint, image_size=args.image_size, num_heads=args.num_heads)
    calibration = None
    if args.calibrate:
        calibration = calibration_pixels(model.config, args.calibrate, args.data_dir, args.calibration_images)
    summary = run_export(
        model,
        args.output or onnx_output(args.checkpoint, args.int8),
        preprocess=args.preprocess,
        dynamic_batch=args.batch_size is None,
        dynamic_size=args.dynamic_size,
        int8=args.int8,
        batch_size=args.batch_size or 1,
        pixels=validation_pixels(model.config, args.images),
        calibration=calibration,
    )
    print(json.dumps(summary, indent=1) if args.json else format_export(summary, images_given=bool(args.images)))
    if not args.json:
        print(fastest_format_line("onnx --int8" if summary["int8"] else "onnx", model_size(model.config)[1]))
    return 0


def export_pt2e_command(args: argparse.Namespace) -> int:
    from vitlab.bench.advice import fastest_format_line
    from vitlab.checkpoint import load_model
    from vitlab.counts import model_size
    from vitlab.export.checks import validation_pixels
    from vitlab.export.pt2e import SUFFIX, calibration_for, format_pt2e_export, require_torchao, run_pt2e_export
    from vitlab.runs import pt2e_output

    for given, flag in (
        (args.preprocess, "--preprocess"),
        (args.dynamic_size, "--dynamic-size"),
        (args.batch_size, "--batch-size"),
        (args.dynamic_batch, "--dynamic-batch"),
    ):
        if given:
            raise UsageError(
                f"{flag} is for ONNX exports; a pt2e file takes normalised images of the model's size "
                "in batches of any size (drop it, or use --format onnx)"
            )
    if args.output and Path(args.output).suffix.lower() != SUFFIX:
        raise UsageError(
            f"-o {args.output}: a pt2e model is written to a {SUFFIX} file; name it "
            f"{Path(args.output).with_suffix(SUFFIX)}"
        )
    require_torchao()
    model = load_model(args.checkpoint, image_size=args.image_size, num_heads=args.num_heads)
    calibration, source = calibration_for(
        args.checkpoint, model.config, args.calibrate, args.data_dir, args.calibration_images
    )
    summary = run_pt2e_export(
        model,
        args.output or pt2e_output(args.checkpoint),
        calibration,
        source,
        pixels=validation_pixels(model.config, args.images),
    )
    print(json.dumps(summary, indent=1) if args.json else format_pt2e_export(summary, images_given=bool(args.images)))
    if not args.json:
        print(fastest_format_line("pt2e", model_size(model.config)[1]))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from vitlab.bench.runner import format_table, run_bench

    result = run_bench(
        args.model,
        checkpoint=args.checkpoint,
        image_size=args.image_size,
        batch_size=args.batch_size,
        paths=args.paths,
        repetitions=args.repetitions,
        warmup=args.warmup,
        threads=args.threads,
        train=args.train,
        dataset=args.dataset,
        data_dir=args.data_dir,
        show=True,
        device=args.device,
        budget_seconds=args.budget,
        quick=args.quick,
    )
    print(format_table(result))
    if args.json:
        from pathlib import Path

        from vitlab.files import atomic_write_bytes

        atomic_write_bytes(Path(args.json), json.dumps(result, indent=1).encode())
        print(f"wrote {args.json}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from vitlab.analysis.report import analyze, format_analysis

    summary = analyze(
        args.checkpoint,
        args.images,
        out=args.out,
        data_dir=args.data_dir,
        num_shown=args.num_images,
        num_distance_images=args.distance_images,
        image_size=args.image_size,
        num_heads=args.num_heads,
        device=args.device,
    )
    for item in summary["skipped"]:
        print(f"skipped {item['path']}: {item['error']}", file=sys.stderr)
    print(format_analysis(summary))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from vitlab.serve.server import serve

    return serve(
        args.checkpoint,
        host=args.host,
        port=args.port,
        backend=args.backend,
        precision=args.precision,
        device=args.device,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_body_mb=args.max_body_mb,
        threads=args.threads,
        top_k=args.top_k,
        access_log=args.access_log,
    )


# ------------------------------------------------------------------------------------------------ parser
EXIT_CODES = """exit codes:
  0    done (train: finished, or stopped by SIGTERM with its state saved; serve: stopped by SIGTERM after
       answering the requests in flight)
  1    failed (predict: at least one input could not be classified; the others are still reported)
  2    a usage error: a bad option, value, path or data set, said in one line
  130  stopped by Ctrl-C (train: state saved; resume with: vitlab train --resume RUN)
  141  the reader of the output left early (| head); the output was cut, nothing else went wrong"""
NAMES_HELP = """names (anywhere a checkpoint is taken; a local path that exists always wins):
  hf-hub:ORG/NAME[@REVISION]   a Hugging Face hub repository (transformers or timm layout)
  augreg:B/16                  the paper's recommended AugReg ImageNet-21k pre-training (also Ti/16 S/16 L/16
                               S/32 B/32 R26+S/32 R50+L/32); augreg:B/16-in1k-384 its ImageNet-1k fine-tune;
                               augreg:FILE an exact file of gs://vit_models/augreg
  imagenet21k:B/16             the original release (ViT-B_16.npz); imagenet21k:B/16-in1k-384 / -in1k-224
                               fine-tuned on ImageNet-1k
  gs://BUCKET/PATH, https://URL  one file
downloaded once into the cache and checked against the hash the server publishes. HF_HOME, HF_ENDPOINT,
HF_TOKEN and HF_HUB_OFFLINE=1 apply to hub names; VITLAB_CACHE, VITLAB_MIRROR (the bucket's paths below it) and
VITLAB_OFFLINE=1 to the others."""
CHECKPOINT_HELP = (
    "run folder, checkpoint file or folder of any kind vitlab loads, or a pre-trained name (vitlab pretrained)"
)
BACKEND_HELP = (
    "auto (default: onnx for a .onnx file, pt2e for a .pt2e file, else torch), torch, onnx (ONNX Runtime) or "
    "pt2e (int8, compiled for this CPU as it loads) on a file written by `vitlab export`; a run folder "
    "with onnx or pt2e uses its model.onnx or model-int8.pt2e"
)
DEVICE_HELP = "cpu, cuda or cuda:N (default auto: a GPU when PyTorch sees one, else the CPU)"
INFERENCE_PRECISION_HELP = (
    "auto (default: bf16 autocast where this machine's bf16 matmuls pay and the model is large "
    "enough, else fp32; never quantised), fp32 or bf16; an exported file runs as exported"
)


def recipe_keys_help(finetune: bool = False, pretrain: bool = False) -> str:
    """Every --set key with its default (the fine-tuning or pre-training defaults), for the help's epilog."""
    import dataclasses

    from vitlab.train.config import TrainConfig, finetune_config, pretrain_config

    config = finetune_config() if finetune else pretrain_config("mae") if pretrain else TrainConfig()
    purpose = " for fine-tuning" if finetune else " for pre-training (mae; mpp alike)" if pretrain else ""
    lines = [f"--set keys and their defaults{purpose} (nested ones as augment.KEY=VALUE):"]
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            for inner in dataclasses.fields(value):
                lines.append(f"  {field.name}.{inner.name:<24} {getattr(value, inner.name)!r}")
        else:
            lines.append(f"  {field.name:<32} {value!r}")
    return "\n".join(lines)


def choices_line(setting: str, values: tuple[str, ...]) -> str:
    """One line of a help text: a model setting and its values, the first (the default) marked."""
    return f"  {setting:<20} {values[0]} (default) | {' | '.join(values[1:])}\n"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="vitlab",
        description="Build, train, fine-tune, understand and ship ViTs.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    from vitlab import __version__
    from vitlab.objectives import OBJECTIVES, pretraining_methods  # the table alone: no torch

    parser.add_argument("--version", action="version", version=f"vitlab {__version__}")
    # --debug after the subcommand too; SUPPRESS keeps a subcommand's default from overwriting `vitlab --debug`.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    add_parser = sub.add_parser

    def subcommand(name: str, **kwargs) -> ArgumentParser:
        return add_parser(name, parents=[common], **kwargs)

    p = subcommand("models", help="list the model variants with parameter count and GFLOPs")
    p.add_argument("--image-size", type=image_size_arg, default=None, help="override every variant's image size")
    p.add_argument("--num-classes", type=int, default=None, help="override every variant's class count")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_models)

    p = subcommand(
        "pretrained",
        help="list the pre-trained checkpoints vitlab knows by name (hf-hub:ORG/NAME, "
        "augreg:B/16, ...), with their data, ImageNet top-1, size and licence",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=NAMES_HELP,
    )
    from vitlab.checkpoint.families import model_families

    p.add_argument("--family", help="only this family: " + ", ".join(family.name for family in model_families()))
    p.add_argument("--json", action="store_true", help="print JSON, with where each figure comes from")
    p.set_defaults(func=cmd_pretrained)

    p = subcommand("convert", help="convert an official .npz / timm / HF / vitlab checkpoint to another kind")
    p.add_argument(
        "input",
        help="checkpoint file or folder (kind detected from its content), or a pre-trained name such as augreg:B/16",
    )
    p.add_argument("output", help="a .safetensors file (--to vitlab, timm) or a folder (--to hf) to write")
    p.add_argument("--to", choices=("vitlab", "timm", "hf"), default="vitlab", help="kind to write (default vitlab)")
    p.add_argument("--force", action="store_true", help="replace an existing output file or folder")
    add_checkpoint_options(p)
    p.set_defaults(func=cmd_convert)

    p = subcommand(
        "train",
        help="train a ViT (default: the digits recipe); torchrun-ready",
        epilog=recipe_keys_help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        help="recipe: a file (configs/*.py) defining `config = TrainConfig(...)`, or a run's "
        "RUN/train_config.json to train it again in a new folder",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set lr=1e-3 --set augment.hflip=true (repeatable)",
    )
    p.add_argument(
        "--dataset",
        help="shorthand for --set dataset=NAME (digits, mnist, fashion-mnist, cifar10, "
        "cifar100, folder; streamed image files: manifest, shards, hf)",
    )
    p.add_argument("--data-dir", help="shorthand for --set data_dir=PATH: data files already on disk")
    p.add_argument(
        "--image-size",
        type=image_size_arg,
        help="shorthand for --set image_size=N or HxW (default: the variant's; images are resized)",
    )
    p.add_argument("--classes", type=classes_arg, help="shorthand for --set classes=5-9: only these classes")
    p.add_argument(
        "--epochs",
        type=positive_int,
        help="shorthand for --set epochs=N; with --resume, a new length for the run (extends a finished one)",
    )
    p.add_argument("--max-patches", type=positive_int, help=MAX_PATCHES_HELP)
    p.add_argument("--model", help="shorthand for --set model=VARIANT")
    p.add_argument("--out-dir", help="shorthand for --set out_dir=PATH (default runs/)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run exactly where it stopped")
    p.add_argument(
        "--use-previous",
        action="store_true",
        help="with --resume: fall back to the previous checkpoint if the last one is damaged",
    )
    p.set_defaults(func=cmd_train)

    p = subcommand(
        "finetune",
        help="fine-tune any checkpoint on a new data set (the paper's transfer recipe)",
        epilog=lambda: recipe_keys_help(finetune=True),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--from",
        dest="init_from",
        metavar="CHECKPOINT",
        help="vitlab, official .npz, timm or HF checkpoint, or a pre-trained name (augreg:B/16, "
        "hf-hub:ORG/NAME; vitlab pretrained lists them)",
    )
    p.add_argument(
        "--dataset",
        help="data set to fine-tune on (digits, mnist, fashion-mnist, cifar10, cifar100, "
        "folder; streamed image files: manifest, shards, hf)",
    )
    p.add_argument("--data-dir", help="where the data set's files are (default: downloaded into the cache)")
    add_checkpoint_options(
        p,
        "fine-tuning resolution, N or HxW: the position embedding is resampled to it (for a "
        "checkpoint whose position table is not square: the size it was made for)",
        num_heads=False,
    )
    p.add_argument("--classes", type=classes_arg, help="only these classes of the data set, e.g. 5-9 or 1,3,5")
    p.add_argument("--epochs", type=positive_int, help="default 20; with --resume, a new length for the run")
    p.add_argument("--max-patches", type=positive_int, help=MAX_PATCHES_HELP)
    p.add_argument("--optimizer", choices=("sgd", "adamw"), help="default sgd (momentum 0.9), as the paper")
    p.add_argument("--freeze-blocks", type=int, default=0, help="freeze the embeddings and the first K blocks")
    p.add_argument("--linear-probe", action="store_true", help="train only the new head")
    p.add_argument("--config", help="recipe file to start from instead of the fine-tuning defaults")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a recipe field (repeatable), e.g. --set layer_decay=0.75 --set lr=0.003",
    )
    p.add_argument("--out-dir", help="folder for the run folder (default runs/)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped fine-tuning run where it stopped")
    p.add_argument(
        "--use-previous",
        action="store_true",
        help="with --resume: fall back to the previous checkpoint if the last one is damaged",
    )
    p.set_defaults(func=cmd_finetune)

    p = subcommand(
        "pretrain",
        help="self-supervised pre-training on images without labels: the paper's masked patch prediction (mpp) or MAE",
        epilog=lambda: (
            "recipes: configs/pretrain/ (e.g. mnist_mae.py, mnist_mpp.py, digits_mae.py)\n\n"
            + recipe_keys_help(pretrain=True)
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--method",
        choices=pretraining_methods(),
        help="; ".join(f"{name}: {OBJECTIVES[name].help}" for name in pretraining_methods()),
    )
    p.add_argument("--config", help="a pre-training recipe (configs/pretrain/*.py) instead of the method's defaults")
    p.add_argument(
        "--dataset",
        help="images to learn from (labels, if any, are not used): digits, mnist, "
        "fashion-mnist, cifar10, cifar100, folder, manifest, shards, hf",
    )
    p.add_argument("--data-dir", help="where the data set's files are (default: downloaded into the cache)")
    p.add_argument("--model", help="shorthand for --set model=VARIANT (the encoder to pre-train)")
    p.add_argument(
        "--from",
        dest="init_from",
        metavar="CHECKPOINT",
        help="continue pre-training an encoder from a checkpoint of any kind vitlab loads",
    )
    p.add_argument("--image-size", type=image_size_arg, help="shorthand for --set image_size=N or HxW")
    p.add_argument("--epochs", type=positive_int, help="shorthand for --set epochs=N; with --resume, a new length")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set pretrain.mask_ratio=0.15 (repeatable)",
    )
    p.add_argument("--out-dir", help="folder for the run folder (default runs/)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped pre-training run exactly where it stopped")
    p.add_argument(
        "--use-previous",
        action="store_true",
        help="with --resume: fall back to the previous checkpoint if the last one is damaged",
    )
    p.set_defaults(func=cmd_pretrain)

    p = subcommand(
        "ablate",
        help="train a recipe over a grid of settings and seeds (the paper's ablations); resumable",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  vitlab ablate configs/ablations/digits.py              Table 8, Figure 9 and pooling "
        "on digits (under 10 min)\n"
        "  vitlab ablate configs/mnist.py --vary classifier=token,gap --vary lr=8e-4,3e-4 "
        "--seeds 3\n"
        "Run the same command again to continue a stopped ablation: finished runs are kept.\n\n"
        "the paper's ablations as model settings:\n"
        + choices_line("pos_embed", POSITION_EMBEDDINGS)
        + choices_line("pos_embed_placement", PLACEMENTS)
        + choices_line("classifier", CLASSIFIERS)
        + "and later blocks' parts:\n"
        + choices_line("norm", NORMS)
        + choices_line("mlp", MLPS),
    )
    p.add_argument(
        "source",
        nargs="?",
        help="an ablation file (configs/ablations/*.py) or a recipe to vary "
        "(configs/*.py, RUN/train_config.json; default: the digits recipe)",
    )
    p.add_argument(
        "--vary",
        action="append",
        metavar="KEY=V1,V2",
        help="an axis: a training setting (lr, epochs, ...) or a model setting (pos_embed, "
        "pos_embed_placement, classifier, ...) and its values; axes are crossed (repeatable)",
    )
    p.add_argument(
        "--seeds", type=seeds_arg, help="a count (3: seeds 0,1,2) or a list (0,1,2); default 3, or the ablation file's"
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe field in every cell")
    p.add_argument("--out", help="output root (default runs/ablations/<file name>); cells are shared under it")
    p.add_argument(
        "--name",
        help="with a recipe: the results folder's name (default 'ablation'); with an "
        "ablation file: run only these of its ablations (comma-separated)",
    )
    p.add_argument(
        "--jobs",
        type=jobs_arg,
        default="auto",
        help="runs at once, in processes of cores/jobs threads (default auto: one per core for small "
        "models, which train faster so, else one)",
    )
    p.add_argument("--dry-run", action="store_true", help="check the plan and say what would run, run nothing")
    p.set_defaults(func=cmd_ablate)

    for name, helptext in (
        ("fewshot", "few-shot linear accuracy of frozen features (closed-form least squares)"),
        ("linear-probe", "logistic regression on frozen features"),
    ):
        p = subcommand(name, help=helptext)
        p.add_argument("checkpoint", nargs="?", help=CHECKPOINT_HELP + " (or give --train and --test files)")
        p.add_argument("--dataset", help="data set whose train split fits and test split measures")
        p.add_argument("--train", help="instead of a model and data set: an embedding file (`vitlab embed`) to fit")
        p.add_argument("--test", help="and the embedding file of the images to measure")
        p.add_argument("--data-dir", help="where the data set's files are (default: downloaded into the cache)")
        p.add_argument("--classes", type=classes_arg, help="only these classes, e.g. 5-9")
        add_checkpoint_options(p)
        if name == "fewshot":
            p.add_argument("--shots", type=shots_arg, default=[1, 5, 10, 25], help="default 1,5,10,25")
            p.add_argument("--seeds", type=positive_int, default=3, help="draws per shot count (default 3)")
            p.add_argument("--l2", type=float, default=1.0, help="ridge penalty on standardised features (default 1)")
            p.set_defaults(func=cmd_fewshot)
        else:
            p.add_argument("--l2", type=float, default=1e-3, help="L2 penalty (default 1e-3)")
            p.set_defaults(func=cmd_linear_probe)
        p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = subcommand("embed", help="write a frozen feature of every image of a data set to a Parquet file")
    p.add_argument("checkpoint", help=CHECKPOINT_HELP)
    p.add_argument(
        "data",
        nargs="?",
        help="a folder (of class sub-folders, or of images), a .csv/.jsonl manifest, .tar shards, a .parquet or "
        "saved Hugging Face dataset, or hf:NAME; or leave it out and give --dataset",
    )
    p.add_argument("-o", "--out", required=True, help="the Parquet file to write (a killed run continues into it)")
    p.add_argument("--dataset", help="a data set by name instead of DATA (digits, mnist, cifar10, ...)")
    p.add_argument("--data-dir", help="with --dataset: where its files are")
    p.add_argument("--split", choices=("train", "val", "test"), default="train", help="with --dataset (default train)")
    p.add_argument(
        "--pool",
        choices=("model", "cls", "mean"),
        default="model",
        help="model: the input of the model's head (its own pooling; default); cls: the class token; mean: the "
        "mean of the patch tokens (both after the final norm)",
    )
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="stored vector type")
    p.add_argument("--batch-size", type=positive_int, default=256, help="images per forward pass (default 256)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help=INFERENCE_PRECISION_HELP)
    p.add_argument("--workers", type=int, help="decoding processes for streamed data (default: the cores)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_embed)

    p = subcommand("knn", help="k-NN accuracy of frozen features (DINO's weighted votes, k=10 and 20)")
    p.add_argument("checkpoint", nargs="?", help=CHECKPOINT_HELP + " (or give --train and --test files)")
    p.add_argument("--dataset", help="data set whose train split votes and test split is measured")
    p.add_argument("--data-dir", help="where the data set's files are (default: downloaded into the cache)")
    p.add_argument("--train", help="an embedding file (`vitlab embed`) of the training images")
    p.add_argument("--test", help="an embedding file of the test images")
    p.add_argument("-k", type=positive_int, nargs="+", default=[10, 20], help="neighbours (default 10 20)")
    p.add_argument("--temperature", type=float, default=0.07, help="vote weight exp(similarity / T) (default 0.07)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_knn)

    p = subcommand("search", help="the most similar images of an embedding file, or its near-duplicates")
    p.add_argument("index", help="an embedding file written by `vitlab embed`")
    p.add_argument("queries", nargs="*", help="query images or folders (embedded as the index was), or one .parquet")
    p.add_argument("-k", type=positive_int, default=5, help="matches per query (default 5)")
    p.add_argument(
        "--duplicates",
        type=float,
        metavar="THRESHOLD",
        help="list every pair of the index at this cosine similarity or more",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_search)

    p = subcommand("eval", help="evaluate a run, checkpoint or ONNX export on a data set")
    p.add_argument("checkpoint", help=CHECKPOINT_HELP + ", or a .onnx or .pt2e file written by `vitlab export`")
    p.add_argument("--dataset", help="data set name (default for a run folder: the one it trained on)")
    p.add_argument("--data-dir", help="where the data set's files are (default: a run's, or the download cache)")
    p.add_argument(
        "--split",
        choices=("train", "val", "test"),
        default="test",
        help="val: the data set's official validation split, or for a run folder the one it carved",
    )
    p.add_argument("--classes", type=classes_arg, help="only these classes, e.g. 5-9 (default for a run: its own)")
    p.add_argument("--out", help="folder for eval JSON and confusion matrix (default: beside the checkpoint)")
    p.add_argument("--batch-size", type=positive_int, default=256, help="images per forward pass (default 256)")
    p.add_argument("--backend", choices=("auto", "torch", "onnx", "pt2e"), help=BACKEND_HELP)
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help=INFERENCE_PRECISION_HELP)
    p.add_argument("--device", help=DEVICE_HELP)
    add_checkpoint_options(p)
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(func=cmd_eval)

    p = subcommand("predict", help="top-k labels for images or folders of images")
    p.add_argument("checkpoint", help=CHECKPOINT_HELP + ", or a .onnx or .pt2e file written by `vitlab export`")
    p.add_argument("inputs", nargs="+", metavar="IMAGE_OR_FOLDER", help="image files, or folders searched for images")
    p.add_argument("--top-k", type=positive_int, default=3, help="labels per image (default 3)")
    p.add_argument(
        "--format",
        choices=("table", "json", "csv"),
        default="table",
        help="every input gets a row, an unreadable one with its error; exit code 1 if any failed",
    )
    p.add_argument("--backend", choices=("auto", "torch", "onnx", "pt2e"), help=BACKEND_HELP)
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help=INFERENCE_PRECISION_HELP)
    p.add_argument("--device", help=DEVICE_HELP)
    add_checkpoint_options(p)
    p.set_defaults(func=cmd_predict)

    p = subcommand(
        "bench",
        help="images/s of every inference path (fp32, bf16, compiled, ONNX Runtime, int8) "
        "against a matmul peak and transformers",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", default="B/16", help="a variant or preset (random weights), default B/16")
    source.add_argument(
        "--checkpoint", help="a trained run folder, checkpoint or pre-trained name (needed for --dataset accuracy)"
    )
    p.add_argument(
        "--image-size",
        type=image_size_arg,
        help="a variant's input size; with --checkpoint as for every command that loads one: "
        + CHECKPOINT_IMAGE_SIZE_HELP,
    )
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per call (default 16)")
    p.add_argument(
        "--paths",
        type=lambda text: [t for t in text.split(",") if t],
        help="comma-separated subset, e.g. eager-fp32,onnx-int8 (default: all, less the bf16 ones on a "
        "CPU without bf16 units)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="eager fp32, transformers and the paths fastest on this machine, 3 rounds: a table in under "
        "3 minutes on a 2-core machine",
    )
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="each path's time to be prepared and timed; one over it is reported as such (default 180, "
        "45 with --quick)",
    )
    p.add_argument(
        "--device",
        help=DEVICE_HELP + "; on a GPU transformers runs there too, and the CPU-only paths "
        "(ONNX Runtime, int8) are skipped",
    )
    p.add_argument("--repetitions", type=int, default=5, help="timed rounds; the median is reported")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per path first")
    p.add_argument("--threads", type=int, help="intra-op threads for PyTorch and ONNX Runtime (default: PyTorch's)")
    p.add_argument("--train", action="store_true", help="time training steps (forward + backward + AdamW) instead")
    p.add_argument("--dataset", help="also measure each path's test accuracy and agreement (needs --checkpoint)")
    p.add_argument("--data-dir", help="where the data set's files are")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.set_defaults(func=cmd_bench)

    p = subcommand(
        "export",
        help="export a checkpoint for deployment (ONNX fp32 or int8, or pt2e int8), checked "
        "against PyTorch; the output names the fastest format on this CPU",
    )
    p.add_argument("checkpoint", help=CHECKPOINT_HELP)
    p.add_argument(
        "--format",
        choices=("onnx", "pt2e", "pt2"),
        default="onnx",
        help="onnx (default: ONNX Runtime, fp32 or --int8) or pt2e (pt2 is the same): static int8 by "
        "PyTorch 2 export quantization, compiled by Inductor for the machine that runs it, the "
        "fastest path on CPUs with VNNI or AMX; needs vitlab[int8]",
    )
    p.add_argument(
        "-o",
        "--output",
        help="the file to write (default: model.onnx, model-int8.onnx or "
        "model-int8.pt2e in a run folder, NAME.onnx, NAME-int8.onnx or NAME-int8.pt2e beside a "
        "checkpoint file)",
    )
    p.add_argument(
        "--int8",
        action="store_true",
        help="int8 weights (ONNX Runtime dynamic quantization; with "
        "--calibrate, static quantization of activations too)",
    )
    p.add_argument(
        "--calibrate",
        nargs="+",
        metavar="DATASET_OR_IMAGES",
        help="static int8: activation ranges measured on a data set's training split (e.g. mnist; never "
        "the test split) or on image files / folders; for --int8, and for pt2e (default there: a "
        "run folder's own training data)",
    )
    p.add_argument("--calibration-images", type=positive_int, default=256, help="images to calibrate on (default 256)")
    p.add_argument("--data-dir", help="where the --calibrate data set's files are (default: the download cache)")
    p.add_argument(
        "--batch-size", type=positive_int, default=None, help="fix the graph's batch size (default: any batch size)"
    )
    p.add_argument("--dynamic-batch", action="store_true", help="any batch size (the default; kept for old scripts)")
    p.add_argument(
        "--dynamic-size",
        action="store_true",
        help="any image size that is a multiple of the patch size (position embedding resampled in the graph)",
    )
    p.add_argument(
        "--preprocess",
        action="store_true",
        help="bake in the preprocessing: the graph takes uint8 pixels of any size, resizes and normalises",
    )
    p.add_argument(
        "--images",
        nargs="+",
        metavar="IMAGE_OR_FOLDER",
        help="real images to check the export on (default: 32 of the shipped digits)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_checkpoint_options(p)
    p.set_defaults(func=cmd_export)

    p = subcommand("analyze", help="the paper's attention and embedding analyses, as pictures and an HTML report")
    p.add_argument("checkpoint", help=CHECKPOINT_HELP)
    p.add_argument(
        "--images",
        nargs="+",
        required=True,
        metavar="PATH_OR_DATASET",
        help="image files / folders, or a data set name (its test split), e.g. --images digits",
    )
    p.add_argument("--data-dir", help="where the named data set's files are")
    p.add_argument("--out", help="output folder (default: RUN/analysis or analysis-<checkpoint name>)")
    p.add_argument("--num-images", type=int, default=8, help="images shown with their rollout (default 8)")
    p.add_argument(
        "--distance-images", type=int, default=256, help="images averaged for the attention distances (default 256)"
    )
    p.add_argument("--device", help=DEVICE_HELP + "; always fp32")
    add_checkpoint_options(p)
    p.set_defaults(func=cmd_analyze)

    p = subcommand("serve", help="an HTTP inference service with a web page (needs the extra: vitlab[serve])")
    p.add_argument("checkpoint", help=CHECKPOINT_HELP + ", or a .onnx or .pt2e file written by `vitlab export`")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for every interface)",
    )
    p.add_argument("--port", type=port_arg, default=8000, help="port (default 8000; 0 picks a free one and prints it)")
    p.add_argument("--backend", choices=("auto", "torch", "onnx", "pt2e"), help=BACKEND_HELP)
    p.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16", "int8"),
        default="auto",
        help="auto (default: bf16 weights where this machine's bf16 matmuls pay and the model is large "
        "enough, int8 weights on a CPU with int8 dot products but no bf16 units, else fp32; the start "
        "line says which and why); fp32; bf16 weights (torch); int8 weights (torch dynamic, or ONNX "
        "Runtime)",
    )
    p.add_argument("--device", help=DEVICE_HELP + "; the onnx backend runs on the CPU")
    p.add_argument(
        "--max-batch",
        type=positive_int,
        default=32,
        help="dynamic batching: most images per model call (default 32; 1 turns batching off)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        help="dynamic batching: longest wait for more requests after the first (default 5)",
    )
    p.add_argument("--max-body-mb", type=float, default=10.0, help="largest request body accepted (default 10 MB)")
    p.add_argument("--top-k", type=positive_int, default=5, help="labels per answer unless ?top_k= says (default 5)")
    p.add_argument("--threads", type=positive_int, help="intra-op threads for the model (default: PyTorch's)")
    p.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    p.set_defaults(func=cmd_serve)

    p = subcommand(
        "info", help="show what a checkpoint, ONNX export or variant (B/16) holds; --trace walks an image through it"
    )
    p.add_argument("checkpoint", help=CHECKPOINT_HELP + ", or a .onnx or .pt2e file written by `vitlab export`")
    add_checkpoint_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--trace",
        action="store_true",
        help="walk one image through the model: each step's equation, shape and parameters (and, for a "
        "checkpoint, statistics of its activations)",
    )
    p.add_argument("--image", help="with --trace: the image to walk (default: a shipped digit)")
    p.set_defaults(func=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    handler: Callable[[argparse.Namespace], int] = args.func
    from vitlab.hardware import keep_freed_memory

    keep_freed_memory()  # every step of a loop then reuses its memory instead of faulting fresh pages in
    try:
        code = handler(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader left early (`vitlab predict ... | head`): end quietly, as command-line tools do. Point stdout
        # at /dev/null so that Python's own flush at exit does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool ended by a closed pipe
    except VitlabError as error:
        if args.debug:
            raise
        print(f"vitlab {args.command}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # anything unforeseen: one line, the traceback only with --debug
        if args.debug:
            raise
        print(
            f"vitlab {args.command}: error: {type(error).__name__}: {error} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1
