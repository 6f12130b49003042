"""The settings of LoRA fine-tuning (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), a group
of the training recipe: `--set lora.rank=8 --set lora.alpha=16 --set lora.dropout=0.0 --set lora.targets=qkv,proj`.
Torch-free, so recipes are checked cheaply. What a run does with them: `vitlab.train.lora` (through `peft`).

Each targeted linear layer W of every encoder block becomes W + (alpha / rank) * B A, with A (rank x in) drawn at
random and B (out x rank) zero, so training starts from the base model exactly; only A, B and the head train."""

from __future__ import annotations

from dataclasses import dataclass

from vitlab.errors import ConfigError

# The linear layers of a block LoRA can adapt, by their timm names (blocks.N.attn.qkv, blocks.N.mlp.fc1, ...).
TARGETS = {
    "qkv": "attn.qkv",  # the fused query, key and value projection
    "proj": "attn.proj",  # attention's output projection
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
}


@dataclass
class LoraSettings:
    rank: int = 0  # the rank r of each adapter; 0: no LoRA (the whole model, or what `freeze` leaves, trains)
    alpha: float = 16.0  # the adapters' output is scaled by alpha / rank (peft's lora_alpha)
    dropout: float = 0.0  # dropout on the adapters' input (peft's lora_dropout)
    targets: str = "qkv,proj,fc1,fc2"  # comma-separated names of TARGETS

    def __post_init__(self) -> None:
        if isinstance(self.targets, (list, tuple)):  # a recipe file may write a list
            self.targets = ",".join(self.targets)
        unknown = [name for name in self.target_names() if name not in TARGETS]
        checks = [
            (
                isinstance(self.rank, int) and not isinstance(self.rank, bool) and self.rank >= 0,
                f"lora.rank must be a whole number >= 0 (0: no LoRA), got {self.rank!r}",
            ),
            (self.alpha > 0, f"lora.alpha must be positive, got {self.alpha}"),
            (0 <= self.dropout < 1, f"lora.dropout must be in [0, 1), got {self.dropout}"),
            (
                bool(self.target_names()) and not unknown,
                f"lora.targets must name some of {','.join(TARGETS)}, got {self.targets!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """What B A is multiplied by: alpha / rank."""
        return self.alpha / self.rank

    def target_names(self) -> list[str]:
        return [name.strip() for name in str(self.targets).split(",") if name.strip()]
