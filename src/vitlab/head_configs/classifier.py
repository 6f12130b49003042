"""The image classifier's settings (models/vit.py builds it on the encoder): how the encoder's tokens become one
vector per image (timm's global_pool and attention pool, fc_norm, pre-logits), and the linear head on that vector.

What changes the token sequence (the class token, DeiT's distillation token, register tokens) is the encoder's; what
reads the sequence into logits is here, as timm's VisionTransformer splits `forward_features` from `forward_head`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, get_args

from vitlab.errors import ConfigError
from vitlab.head_configs.base import HeadConfig, ModelFields

# The pooling kinds (`ClassifierHeadConfig.classifier`); models/vit.py pools by each.
Classifier = Literal["token", "gap", "map", "probe", "gem", "max", "layer_weighted"]
CLASSIFIERS: tuple[str, ...] = get_args(Classifier)
# Upper bounds far above any real ViT, so a crafted config cannot make vitlab allocate a terabyte.
LIMITS = {"num_classes": 1 << 20, "representation_size": 1 << 16}


@dataclasses.dataclass(frozen=True)
class ClassifierHeadConfig(HeadConfig):
    """The "head" part of a classifier's or a bare encoder's saved config (num_classes 0: features only).

    The values live in `vitlab.config.ViTConfig`'s fields of the same names, which every caller sets and reads
    (`config.num_classes`, `--set classifier=gap`); `ViTConfig.classifier_head` gathers them into this part."""

    kind: ClassVar[str] = "classifier"

    num_classes: int = 1000  # K: size of the classification head; 0 means no head (features only)
    # How the encoder output becomes one vector for the head (paper Appendix D.3 and the heads of later work):
    # "token": the class token; "gap": mean of the patch tokens; "map": multi-head attention pooling with a learned
    # probe (SigLIP, big_vision); "gem": generalised mean of the patch tokens with a learned exponent p (Radenovic
    # et al. 2018); "max": per-channel maximum over the patch tokens; "layer_weighted": a learned softmax-weighted
    # mix of every block's output, each pooled by the class token if there is one, else by the mean; "probe":
    # AIMv2's head, a learned query (not projected) attending to every token, then a linear map.
    classifier: Classifier = "token"
    fc_norm: bool = False  # timm's placement: LayerNorm after pooling instead of on every token before it
    representation_size: int | None = None  # pre-logits Linear + tanh used in pre-training; None for none
    # DeiT (Touvron et al. 2021), with the encoder's distillation token: its own head, and the logits the mean of
    # the two heads' (as DeiT infers). False (HF's DeiTForImageClassification): only the class token feeds the head.
    distillation_head: bool = True
    # The MAP head's own head count and MLP width where they differ from the blocks' (Perception Encoder: 8 heads);
    # None: the blocks'.
    pool_heads: int | None = None
    pool_mlp_dim: int | None = None
    # CLIP image tower: the head is CLIP's bias-free output projection into the joint image-text space (num_classes
    # = its width), so the model gives embeddings, not class scores (classification refuses it: eval/classify.py).
    projection: bool = False
    # The tokens whose outputs, concatenated, are the pooled output of classifier "token" (C-RADIO's summary_idxs,
    # indices among the prefix tokens: a (B, len * D) summary); empty: the class token alone, the paper's.
    summary_tokens: tuple[int, ...] = ()

    @classmethod
    def headless(cls, class_token: bool) -> ClassifierHeadConfig:
        """What a dense model's encoder pools: its class token if it has one, else the mean, with no pooling layer
        of its own and no classes (models/dense.py `headless`)."""
        return cls(num_classes=0, classifier="token" if class_token else "gap")

    def check(self, encoder: ModelFields) -> None:
        if self.classifier not in CLASSIFIERS:
            raise ConfigError(f"classifier must be one of {', '.join(CLASSIFIERS)}, got {self.classifier!r}")
        if self.num_classes < 0:
            raise ConfigError(f"num_classes must be >= 0, got {self.num_classes}")
        for name, limit in LIMITS.items():
            value = getattr(self, name)
            if value is not None and value > limit:
                raise ConfigError(f"{name} {value} is beyond vitlab's limit of {limit}; is the config corrupt?")
        if self.pool_heads is not None and encoder.embed_dim % self.pool_heads:
            raise ConfigError(f"embed_dim {encoder.embed_dim} does not divide by pool_heads {self.pool_heads}")
        if self.classifier == "token" and not encoder.class_token:
            raise ConfigError("classifier='token' needs class_token=True; use classifier='gap' without one")
        if encoder.distilled and (self.classifier != "token" or self.representation_size or self.fc_norm):
            raise ConfigError(
                "a distilled (DeiT) model pools its class and distillation tokens: it needs "
                "classifier='token', and no representation layer or fc_norm"
            )
        if self.summary_tokens and (
            self.classifier != "token" or max(self.summary_tokens) >= encoder.num_prefix_tokens
        ):
            raise ConfigError(
                f"summary_tokens {list(self.summary_tokens)} must be indices among the {encoder.num_prefix_tokens} "
                f"prefix tokens of a classifier 'token' model, got classifier {self.classifier!r}"
            )
