"""Peak memory of loading a B-size checkpoint of each 2025 family, against the size of its weights (issue 35:
at most 1.3x, no second full copy).

    python benchmarks/load_memory.py [--out DIR]

Writes a random-weight B-size checkpoint of each family with transformers (DINOv3ViTModel B/16, Aimv2VisionModel
at B width, Siglip2VisionModel B/16 NaFlex), then loads each in a fresh process: the peak resident memory added
by `vitlab.load_model` (VmHWM reset after the imports, /proc/self/clear_refs) over the safetensors file's size.
transformers' own `from_pretrained` is measured the same way beside it. Linux only; never run by pytest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MEASURE = r"""
import json, sys
import torch, vitlab, transformers
from vitlab import load_model

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
base = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
folder, loader = sys.argv[1], sys.argv[2]
if loader == "vitlab":
    model = load_model(folder)
else:
    model = getattr(transformers, sys.argv[3]).from_pretrained(folder)
print(json.dumps({"added_peak": status("VmHWM") - base, "added_after": status("VmRSS") - base}))
"""


def write_checkpoints(root: Path) -> dict[str, tuple[Path, str]]:
    import torch
    import transformers

    models = {
        "DINOv3 B/16": (
            "DINOv3ViTModel",
            transformers.DINOv3ViTModel(
                transformers.DINOv3ViTConfig(
                    hidden_size=768,
                    num_hidden_layers=12,
                    num_attention_heads=12,
                    intermediate_size=3072,
                    num_register_tokens=4,
                )
            ),
        ),
        "AIMv2 at B width": (
            "Aimv2VisionModel",
            transformers.Aimv2VisionModel(
                transformers.Aimv2VisionConfig(
                    hidden_size=768, num_hidden_layers=12, num_attention_heads=6, intermediate_size=2048
                )
            ),
        ),
        "SigLIP 2 B/16 NaFlex": (
            "Siglip2VisionModel",
            transformers.Siglip2VisionModel(
                transformers.Siglip2VisionConfig(
                    hidden_size=768,
                    num_hidden_layers=12,
                    num_attention_heads=12,
                    intermediate_size=3072,
                    num_patches=256,
                )
            ),
        ),
    }
    out = {}
    for name, (class_name, model) in models.items():
        torch.manual_seed(0)
        folder = root / name.split()[0].lower()
        model.save_pretrained(folder)
        out[name] = (folder, class_name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="keep the checkpoints here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(args.out or temporary)
        checkpoints = write_checkpoints(root)
        print(
            f"{'checkpoint':<22} {'weights MiB':>11} {'vitlab peak':>12} {'ratio':>6} {'transformers peak':>18} {'ratio':>6}"
        )
        for name, (folder, class_name) in checkpoints.items():
            size = (folder / "model.safetensors").stat().st_size
            row = [f"{name:<22}", f"{size / 2**20:>11.0f}"]
            for loader in ("vitlab", "transformers"):
                result = subprocess.run(
                    [sys.executable, "-c", MEASURE, str(folder), loader, class_name],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                added = json.loads(result.stdout.strip().splitlines()[-1])["added_peak"]
                width = 12 if loader == "vitlab" else 18
                row += [f"{added / 2**20:>{width}.0f}", f"{added / size:>5.2f}x"]
            print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()
