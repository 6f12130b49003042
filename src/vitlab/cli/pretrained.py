"""`vitlab pretrained`: the pre-trained checkpoints vitlab knows by name."""

from __future__ import annotations

import argparse
import json

from vitlab.cli.options import call_with_options

NAME = "pretrained"
HELP = (
    "list the pre-trained checkpoints vitlab knows by name (hf-hub:ORG/NAME, "
    "augreg:B/16, ...), with their data, ImageNet top-1, size and licence"
)
EPILOG = """names (anywhere a checkpoint is taken; a local path that exists always wins):
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from vitlab.checkpoint.families import model_families  # the table alone: no torch

    parser.add_argument("--family", help="only this family: " + ", ".join(family.name for family in model_families()))
    parser.add_argument("--json", action="store_true", help="print JSON, with where each figure comes from")


def run(args: argparse.Namespace) -> int:
    from vitlab.pretrained import format_pretrained_table, pretrained_table

    rows = call_with_options(pretrained_table, args)
    print(json.dumps(rows, indent=1) if args.json else format_pretrained_table(rows))
    return 0
