"""Model configuration and the variant table of Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words".

At the bottom of the package order: it imports only the torch-free modules beside it (errors, head_configs,
preprocessing, patch_grid, position_kinds), so `vitlab models` answers without torch.

Variant names follow the paper: ``"B/16"`` is ViT-Base with 16x16 patches, ``"R50+B/16"`` the hybrid whose
ResNet-50 stem (stages 3, 4, 9) feeds ViT-Base. Widths and depths are the paper's Table 1.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin, get_type_hints

from vitlab.errors import ConfigError
from vitlab.head_configs import HeadConfig, head_config_from_dict
from vitlab.head_configs.base import is_whole
from vitlab.head_configs.classifier import CLASSIFIERS as CLASSIFIERS  # the pooling names, the choices of ablations
from vitlab.head_configs.classifier import Classifier, ClassifierHeadConfig
from vitlab.patch_grid import patch_grid
from vitlab.position_kinds import POSITION_NAMES, POSITION_TRAITS, position_traits
from vitlab.preprocessing import Preprocessing


def stem_stride(resnet_layers: tuple[int, ...] | None) -> int:
    """Downsampling of the hybrid's ResNet stem: 4 from the root (conv /2, max-pool /2), 2 per stage after the
    first; 1 without a stem."""
    if resnet_layers is None:
        return 1
    return 4 * 2 ** max(len(resnet_layers) - 1, 0)


def checked_fields(cls: type, data: dict[str, Any], what: str) -> dict[str, Any]:
    """`data` if every key is a field of dataclass `cls`, else a ConfigError naming the unknown ones."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {what} keys {unknown}; known keys are {sorted(known)}")
    return data


def to_pair(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    """Turn ``16`` or ``(16, 24)`` into a (height, width) pair of positive ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        pair = (int(value[0]), int(value[1]))
    else:
        raise ConfigError(f"{name} must be an int or a pair of ints (height, width), got {value!r}")
    if min(pair) <= 0:
        raise ConfigError(f"{name} must be positive, got {value!r}")
    return pair


def parse_image_size(text: str) -> int | tuple[int, int]:
    """'224' -> 224, '224x320' -> (224, 320) (height x width); the one grammar for sizes on every command."""
    try:
        parts = [int(p) for p in str(text).lower().split("x")]
    except ValueError:
        raise ConfigError(f"image size must be N or HxW, e.g. 224 or 224x320, got {text!r}") from None
    if len(parts) not in (1, 2) or min(parts) <= 0:
        raise ConfigError(f"image size must be N or HxW with positive numbers, got {text!r}")
    return parts[0] if len(parts) == 1 else (parts[0], parts[1])


def parse_classes(text: str) -> list[int]:
    """'5-9' -> [5, 6, 7, 8, 9], '1,3,5' -> [1, 3, 5]: class indices, for --classes and --set classes=."""
    try:
        if "-" in text and "," not in text:
            low, high = (int(v) for v in text.split("-"))
            classes = list(range(low, high + 1))
        else:
            classes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"classes must be like 5,6,7 or 5-9, got {text!r}") from None
    if not classes or min(classes) < 0:
        raise ConfigError(f"classes must be non-negative indices like 5,6,7 or 5-9, got {text!r}")
    return classes


# The names each choice of the config takes; the implementations are tables keyed by the same names
# (models/positions.POSITION_KINDS, layers/norm.NORM_LAYERS, layers/mlp.MLP_LAYERS), kept equal by tests/test_config.py.
# A position kind's traits (has a table, rotary, ...) are declared once, in position_kinds.py.
# A field annotated with one of these Literal types takes exactly its values (`ViTConfig.check_types`); pos_embed
# takes the names of the position kinds' table instead, which a new kind extends.
POSITION_EMBEDDINGS = POSITION_NAMES
Placement = Literal["input", "every_block", "every_block_shared"]
NormName = Literal["layernorm", "rmsnorm"]
MlpName = Literal["mlp", "swiglu"]
MlpActivation = Literal["gelu", "gelu_tanh", "quick_gelu"]
SinCosOrder = Literal["rows_first", "columns_first"]
PositionResampling = Literal["bilinear", "bicubic", "bilinear_antialias"]
PLACEMENTS: tuple[str, ...] = get_args(Placement)
NORMS: tuple[str, ...] = get_args(NormName)
MLPS: tuple[str, ...] = get_args(MlpName)
MLP_ACTIVATIONS: tuple[str, ...] = get_args(MlpActivation)
POSITION_RESAMPLING: tuple[str, ...] = get_args(PositionResampling)


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_optional(check):
    return lambda value: value is None or check(value)


# A field's annotation -> (check of a JSON value, what the message says it must be). `ViTConfig.check_types` looks
# every field up here, so a new field of an existing type needs no other edit. Sizes (int or pair) are checked
# by `to_pair`, which names the field in its own message.
FIELD_CHECKS: dict[str, tuple[Any, str]] = {
    "int": (is_whole, "a whole number"),
    "float": (is_number, "a finite number"),
    "bool": (lambda value: isinstance(value, bool), "true or false"),
    "str": (lambda value: isinstance(value, str), "a string"),
    "str | None": (is_optional(lambda value: isinstance(value, str)), "a string or null"),
    "bool | None": (is_optional(lambda value: isinstance(value, bool)), "true, false or null"),
    "float | None": (is_optional(is_number), "a number or null"),
    "int | None": (is_optional(lambda value: is_whole(value) and value > 0), "a positive whole number or null"),
    "tuple[int, int]": (lambda value: True, "an int or a pair of ints"),
    "tuple[int, ...] | None": (
        is_optional(lambda value: isinstance(value, (list, tuple)) and all(is_whole(n) and n > 0 for n in value)),
        "a list of positive whole numbers or null",
    ),
    "tuple[int, ...]": (
        lambda value: isinstance(value, (list, tuple)) and all(is_whole(n) and n >= 0 for n in value),
        "a list of whole numbers >= 0",
    ),
    "tuple[float, ...]": (
        lambda value: (
            is_number(value)
            or (isinstance(value, (list, tuple)) and len(value) > 0 and all(is_number(v) for v in value))
        ),
        "a number or a list of numbers",
    ),
    "list[str] | None": (
        is_optional(lambda value: isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value)),
        "a list of strings or null",
    ),
    "HeadConfig | None": (
        is_optional(lambda value: isinstance(value, (HeadConfig, dict))),
        'an object such as {"kind": "eomt", "queries": 100} or null',
    ),
    "Preprocessing | None": (
        is_optional(lambda value: isinstance(value, (Preprocessing, dict))),
        "an object such as " + json.dumps(Preprocessing().to_dict()) + " or null",
    ),
}


@functools.cache
def literal_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    """The fields of a dataclass annotated with a Literal type, and the values each takes (resolved once: reading
    the annotations costs milliseconds)."""
    return {name: get_args(hint) for name, hint in get_type_hints(cls).items() if get_origin(hint) is Literal}


# The classifier head's defaults, declared once by its config and taken by ViTConfig's fields of the same names.
CLASSIFIER_DEFAULTS = ClassifierHeadConfig()

# The saved config's parts besides the encoder (whose fields are all the others: `ENCODER_FIELDS`), each a field of
# ViTConfig. The head part: the classifier's settings, or a dense head's and the classes it predicts.
CLASSIFIER_FIELDS = tuple(spec.name for spec in dataclasses.fields(ClassifierHeadConfig))
PREPROCESSING_FIELDS = ("image_mean", "image_std")  # with the contract's own fields (`Preprocessing`) beside them
CONTRACT_FIELDS = tuple(spec.name for spec in dataclasses.fields(Preprocessing))
PROVENANCE_FIELDS = ("class_names", "family", "name")
PARTS = ("encoder", "head", "preprocessing", "provenance")


def json_value(value: Any) -> Any:
    """A field's value as JSON writes it: tuples as lists."""
    return list(value) if isinstance(value, tuple) else value


@dataclass
class ViTConfig:
    """Everything needed to build a model and feed it; serialised as JSON inside every vitlab checkpoint.

    Four parts, each checked on its own (`check_architecture` with `check_positions`, `check_head`,
    `check_preprocessing`, `check_provenance`) and saved as a part of its own (`to_dict`): the encoder's
    architecture; the head, whose config and check are its kind's (vitlab/head_configs/): the classifier's settings
    (`classifier_head`, gathered from the fields of the head section below, which every caller sets and reads as
    `config.num_classes`, `--set classifier=gap`) or a dense head (`head`); the preprocessing its weights expect;
    and where it came from. Choices are Literal types, checked from the annotation; the JSON form carries
    `SCHEMA_VERSION`, and configs written by earlier versions read through `upgraded`."""

    # ------------------------------------------------------------------------------------ the architecture
    image_size: tuple[int, int] = (224, 224)  # (height, width) of the input in pixels
    patch_size: tuple[int, int] = (16, 16)  # P: side of a patch; on the hybrid, side of a patch of the feature map
    in_chans: int = 3  # C: channels of the input image
    embed_dim: int = 768  # D: width of the residual stream
    depth: int = 12  # L: number of Transformer blocks
    num_heads: int = 12  # heads of multi-head self-attention; embed_dim must divide by it
    mlp_dim: int = 3072  # hidden width of each block's MLP
    qkv_bias: bool = True
    class_token: bool | None = None  # prepend a class token; None means "only if classifier == 'token'"
    # DeiT (Touvron et al. 2021): a distillation token after the class token (its head: distillation_head).
    distilled: bool = False
    # DINOv2 style. register_tokens: extra learned tokens after the class token (Darcet et al. 2024), read by no
    # head. prefix_positions: whether the class / register tokens get position embeddings too (the paper's and
    # most checkpoints'), or only the patch tokens do (timm's no_embed_class). layer_scale: LayerScale on both
    # residual branches, with this initial value for a fresh model (None: none, as in the paper).
    register_tokens: int = 0
    prefix_positions: bool = True
    layer_scale: float | None = None
    # CLIP image tower: a LayerNorm on the embedded tokens before the first block (CLIP's ln_pre; its patch
    # projection then has no bias, as in CLIP and timm). Its output projection is the head's (`projection`).
    pre_norm: bool = False
    # Position information (paper Appendix D.4, Table 8): "learned" (the paper's 1-D table, one row per token),
    # "none", "learned_2d" (learned row and column tables of D/2 each, concatenated per patch), "relative" (a
    # learned key per 1-D token offset in every block's attention: the query against it gives a logit bias) or
    # "sincos2d" (fixed 2-D sine-cosine), "rope" (2-D rotary positions of the patch tokens' queries and keys in
    # every block, from each patch's coordinates; DINOv3's), or "pe_rope" (Perception Encoder's: a learned table and
    # rotary positions of each patch's integer (column, row) + 1 (+ 0 without a class token), rescaled to the
    # model's own grid at other sizes, in interleaved channel pairs; rope_theta is then 10000).
    # What each kind is (has a table, rotary, ...): position_kinds.py.
    pos_embed: str = "learned"
    # Where a table is added (Table 8's columns): "input" once after the stem (the paper's default);
    # "every_block" before every block, each with its own table; "every_block_shared" before every block, one table.
    pos_embed_placement: Placement = "input"
    # The parts of every block (layers/block.py takes them as factories). norm: "layernorm" (the paper's) or
    # "rmsnorm" (no centring, no bias: AIMv2's). mlp: "mlp", the paper's Linear - activation - Linear, or "swiglu",
    # the gated MLP (SiLU(x W_g) * x W_x) W_2 of DINOv3 and AIMv2, whose gate is SiLU by definition.
    norm: NormName = "layernorm"
    mlp: MlpName = "mlp"
    # The plain MLP's activation: "gelu" (exact; timm, HF), "gelu_tanh" (Flax's default; official JAX code) or
    # "quick_gelu" (CLIP's OpenAI weights).
    mlp_activation: MlpActivation = "gelu"
    qk_norm: bool = False  # normalise queries and keys per head (with the `norm` kind) before their dot product
    # The biases of the projections, each on its own (the paper's block has them all). key_bias: the keys' part of
    # the fused qkv projection (DINOv3 has none: its slice is held at zero and never trained; without rotary
    # positions or qk_norm a key bias changes nothing anyway, softmax being blind to a per-query constant);
    # proj_bias: the attention's output projection; mlp_bias: the MLP's linear layers (AIMv2 has none of them).
    key_bias: bool = True
    proj_bias: bool = True
    mlp_bias: bool = True
    patch_norm: bool = False  # a norm of the `norm` kind on the embedded patches, before positions (AIMv2's)
    layer_norm_eps: float = 1e-6  # 1e-6 in the official code and timm, 1e-12 in Hugging Face
    rope_theta: float = 100.0  # pos_embed "rope": the base of the rotary frequencies (DINOv3's 100)
    # pos_embed "rope", training only: DINOv3's augmentations of the patch coordinates, one draw per batch. Shift
    # both axes by U(-s, s); jitter each axis by a factor exp(U(-log j, log j)); rescale both by exp(U(-log r,
    # log r)). None: off. DINOv3's released models train with rescale 2 and the others off (transformers'
    # DINOv3ViTConfig defaults); an evaluating model never augments.
    rope_shift: float | None = None
    rope_jitter: float | None = None
    rope_rescale: float | None = None
    final_norm: bool = True  # the norm after the last block (Perception Encoder's lang and spatial models have none)
    # The fixed sin-cos table's layout: "rows_first" [sin y, cos y, sin x, cos x] (MoCo v3, big_vision, MAE as
    # transformers has it) or "columns_first" [sin x, cos x, sin y, cos y] (AIMv2's native-resolution models).
    sincos_order: SinCosOrder = "rows_first"
    # How a learned table is resampled to another grid (fine-tuning at a new size, a dynamic size, each image's own
    # grid of a NaFlex batch): "bilinear", "bicubic", or "bilinear_antialias" (SigLIP 2's, which shrinks a table
    # by averaging rather than sampling).
    pos_resample: PositionResampling = "bilinear"
    # pos_embed "cpe" (C-RADIO's cropped position embedding): the side in pixels of the largest image its table
    # covers (RADIO's max_img_size); the table holds (cpe_max_size / patch)^2 rows whatever the image size.
    cpe_max_size: int | None = None
    dropout: float = 0.0  # after the position embedding, the attention projection and in the MLP
    attention_dropout: float = 0.0  # on the attention weights
    drop_path: float = 0.0  # stochastic depth: the rate of the last block, rising linearly from 0 at the first
    # Hybrid only: ResNet stages of the stem (bottleneck units per stage) and its width multiplier.
    resnet_layers: tuple[int, ...] | None = None
    resnet_width_factor: float = 1.0
    # ------------------------------------------------------------------------------------ the head
    # The classes the head predicts, for every kind of head: K logits per image, per pixel or per query.
    num_classes: int = CLASSIFIER_DEFAULTS.num_classes  # 0: no head (features only)
    # The classifier's settings: what head_configs/classifier.py's ClassifierHeadConfig holds and documents, whose
    # defaults these are; `classifier_head` gathers them into that part. A dense model's encoder has no classifier:
    # they then take `ClassifierHeadConfig.headless`'s values, the only ones its config accepts.
    classifier: Classifier = CLASSIFIER_DEFAULTS.classifier  # the pooling: "token", "gap", "map", ...
    fc_norm: bool = CLASSIFIER_DEFAULTS.fc_norm
    representation_size: int | None = CLASSIFIER_DEFAULTS.representation_size
    distillation_head: bool = CLASSIFIER_DEFAULTS.distillation_head
    pool_heads: int | None = CLASSIFIER_DEFAULTS.pool_heads
    pool_mlp_dim: int | None = CLASSIFIER_DEFAULTS.pool_mlp_dim
    projection: bool = CLASSIFIER_DEFAULTS.projection
    summary_tokens: tuple[int, ...] = CLASSIFIER_DEFAULTS.summary_tokens
    # The head of a dense model, which predicts per pixel rather than one vector per image: its own part of the
    # config, one class per kind (head_configs/: EoMT's queries, DPT's depth head, the plain segmentation heads),
    # checked against the encoder above; the model holds an encoder built from the fields above and this head
    # (models/registry.py). None: a classifier or a bare encoder.
    head: HeadConfig | None = None
    # ------------------------------------------------------------------------------------ the preprocessing
    # Preprocessing the weights expect: pixels scaled to [0, 1], then (x - mean) / std per channel (one value
    # for all channels, or one per channel). The official code and the paper use 0.5 / 0.5, i.e. [-1, 1].
    image_mean: tuple[float, ...] = (0.5,)
    image_std: tuple[float, ...] = (0.5,)
    # How an image becomes the input before the statistics above apply: resize kernel, stretch or centre crop
    # (with timm's crop fraction), grey conversion (vitlab.preprocessing). None: not recorded (configs written
    # before vitlab recorded it); stored arrays then get Preprocessing.in_memory() and image files
    # Preprocessing.image_files(), what vitlab did to each before.
    preprocessing: Preprocessing | None = None
    # ------------------------------------------------------------------------------------ where it came from
    # Optional metadata: names of the classes, in head order, so predictions can print labels.
    class_names: list[str] | None = None
    # The checkpoint family whose arithmetic the model follows, where it is one vitlab reads and writes back in
    # that family's own layout ("dinov3", "siglip2", "aimv2"); None: the paper's ViT and the families whose layout
    # the other fields tell (checkpoint/families.py).
    family: str | None = None
    name: str | None = field(default=None, compare=False)  # variant the config came from, for display only

    def check_types(self) -> None:
        """Every field of the type its annotation declares, so a bad JSON config fails here with its name, not deep
        in torch: a Literal field one of its values, any other the check FIELD_CHECKS holds for its annotation. A new
        field needs no edit here: its annotation chooses the check."""
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            choices = literal_fields(ViTConfig).get(spec.name)
            if choices is not None:
                if value not in choices:
                    raise ConfigError(f"{spec.name} must be one of {', '.join(choices)}, got {value!r}")
                continue
            check, expected = FIELD_CHECKS[spec.type]
            if not check(value):
                raise ConfigError(f"model config field {spec.name} must be {expected}, got {value!r}")

    def __post_init__(self) -> None:
        """Check the parts of a config: the architecture (with its positions and the head on it), the preprocessing
        its weights expect, and where it came from; each value in one canonical form, so equal configs compare
        equal."""
        self.check_types()
        self.canonicalise()
        self.check_architecture()
        self.check_positions()
        self.check_head()
        self.check_preprocessing()
        self.check_provenance()

    def canonicalise(self) -> None:
        """Sizes as (height, width) pairs, sequences as tuples, the contract as an object, and the defaults that
        depend on other fields filled in."""
        self.image_size = to_pair(self.image_size, "image_size")
        self.patch_size = to_pair(self.patch_size, "patch_size")
        if self.resnet_layers is not None:
            self.resnet_layers = tuple(int(n) for n in self.resnet_layers)
        if isinstance(self.head, dict):  # as from_json hands it over
            self.head = head_config_from_dict(self.head)
        if isinstance(self.head, ClassifierHeadConfig):
            raise ConfigError(
                "a classifier's settings are the config's own fields (num_classes, classifier, fc_norm, ...); "
                "head takes a dense model's head (EoMTConfig, DPTConfig, ...) or None"
            )
        self.summary_tokens = tuple(int(n) for n in self.summary_tokens)
        if isinstance(self.preprocessing, dict):  # as from_json hands it over
            self.preprocessing = Preprocessing.from_dict(self.preprocessing)
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            setattr(self, name, (float(value),) if isinstance(value, (int, float)) else tuple(float(v) for v in value))
        if self.class_token is None:
            self.class_token = self.classifier == "token"
        if not self.distilled:
            self.distillation_head = True  # meaningless without the token; one canonical value for equality
        if self.head is not None:
            # A dense model pools nothing: which tokens a summary would concatenate, and whether a distillation
            # head would exist, mean nothing there (and vitlab up to d434df3 kept a backbone's).
            self.summary_tokens = ()
            self.distillation_head = True

    def check_architecture(self) -> None:
        """The network's sizes, heads and tokens (the positions: `check_positions`)."""
        for name in ("dropout", "attention_dropout", "drop_path"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"model config field {name} must be in [0, 1), got {getattr(self, name)!r}")
        for name in ("layer_norm_eps", "resnet_width_factor", "rope_theta"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model config field {name} must be positive, got {getattr(self, name)!r}")
        for name in ("embed_dim", "depth", "num_heads", "mlp_dim", "in_chans"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        # Upper bounds far above any real ViT (H/14: width 1280, depth 32), so a crafted config or checkpoint
        # header cannot make vitlab build a billion blocks or allocate a terabyte.
        for name, limit in (
            ("embed_dim", 1 << 16),
            ("depth", 1024),
            ("mlp_dim", 1 << 18),
            ("in_chans", 1024),
        ):
            value = getattr(self, name)
            if value is not None and value > limit:
                raise ConfigError(f"{name} {value} is beyond vitlab's limit of {limit}; is the config corrupt?")
        if max(self.image_size) > 1 << 15 or (
            self.resnet_layers and (len(self.resnet_layers) > 8 or max(self.resnet_layers) > 256)
        ):
            raise ConfigError(
                f"image size {self.image_size} or ResNet stages {self.resnet_layers} beyond vitlab's "
                "limits (32768 pixels, 8 stages of 256 units); is the config corrupt?"
            )
        if self.embed_dim % self.num_heads:
            raise ConfigError(
                f"embed_dim {self.embed_dim} does not divide by num_heads {self.num_heads}; "
                f"pick a head count that divides it (e.g. {self.embed_dim // 64 or 1})"
            )
        if self.register_tokens < 0 or self.register_tokens > 256:
            raise ConfigError(f"register_tokens must be in 0..256, got {self.register_tokens}")
        if self.distilled and self.register_tokens:
            raise ConfigError("a model has a distillation token or register tokens, not both")
        patch_grid(self.image_size, self.patch_size, stem_stride(self.resnet_layers))  # the patch divides the image

    def check_head(self) -> None:
        """The head against the encoder it reads: the classifier's settings (`ClassifierHeadConfig.check`), or a
        dense head's; a dense model's encoder then has no classifier settings of its own."""
        self.classifier_head.check(self)  # the classes' count and the pooling, on a dense model too
        if self.head is None:
            return
        headless = ClassifierHeadConfig.headless(bool(self.class_token)).replace(num_classes=self.num_classes)
        if self.classifier_head != headless:
            changed = {
                name: getattr(self.classifier_head, name)
                for name in CLASSIFIER_FIELDS
                if getattr(self.classifier_head, name) != getattr(headless, name)
            }
            raise ConfigError(
                f"a {self.head.kind!r} model's encoder has no classifier, but its config sets {changed}; build it "
                "from the backbone's headless config (vitlab.models.dense.headless)"
            )
        self.head.check(self)

    def check_preprocessing(self) -> None:
        """The statistics and the contract against the architecture that reads their output."""
        for name in ("image_mean", "image_std"):
            if len(getattr(self, name)) not in (1, self.in_chans):
                raise ConfigError(
                    f"{name} needs 1 or {self.in_chans} values (one per channel), got {len(getattr(self, name))}"
                )
        if min(self.image_std) <= 0:
            raise ConfigError(f"image_std must be positive, got {self.image_std}")
        contract = self.preprocessing
        if contract is None or contract.mode != "naflex":
            return
        if self.patch_size != (contract.patch, contract.patch):
            raise ConfigError(
                f"preprocessing cuts {contract.patch}-pixel patches (naflex) but the model's are "
                f"{self.patch_size[0]}x{self.patch_size[1]}; give the contract the model's patch size"
            )
        if self.resnet_layers is not None:
            raise ConfigError(
                "the ResNet hybrid cuts its patches from the stem's feature map, which NaFlex's grid of image "
                "patches does not describe; give it a crop or stretch contract"
            )

    def check_provenance(self) -> None:
        """What the config says of where it came from, against what it builds."""
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise ConfigError(f"{len(self.class_names)} class names given for {self.num_classes} classes")

    def check_positions(self) -> None:
        """The position kind against the rest of the config, by what the kind is (position_kinds.py)."""
        if self.pos_embed not in POSITION_TRAITS:
            raise ConfigError(f"pos_embed must be one of {', '.join(POSITION_TRAITS)}, got {self.pos_embed!r}")
        if self.rope_shift is not None and self.rope_shift < 0:
            raise ConfigError(f"rope_shift is the half-width of a uniform shift: >= 0, got {self.rope_shift!r}")
        for name in ("rope_jitter", "rope_rescale"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(
                    f"{name} is the largest factor of a log-uniform draw: >= 1 (1: off), got {getattr(self, name)!r}"
                )
        traits = position_traits(self.pos_embed)
        if self.pos_embed_placement != "input" and not traits.table:
            # Table 8 has no such cells: relative attention (and rotation) already act in every block, and "none"
            # adds nothing.
            raise ConfigError(
                f"pos_embed {self.pos_embed!r} has no table to place; pos_embed_placement must be "
                f"'input', got {self.pos_embed_placement!r}"
            )
        if self.pos_embed_placement == "every_block" and not traits.trained:
            raise ConfigError(
                f"a fixed table ({self.pos_embed!r}) is the same in every block; use "
                "pos_embed_placement='every_block_shared'"
            )
        if self.embed_dim % traits.width_multiple:
            raise ConfigError(
                f"pos_embed {self.pos_embed!r} ({traits.summary}) needs embed_dim divisible by "
                f"{traits.width_multiple}, got {self.embed_dim}"
            )
        if (self.pos_embed == "cpe") != (self.cpe_max_size is not None):
            raise ConfigError(
                f"cpe_max_size (the largest image a cropped position table covers) goes with pos_embed 'cpe' and "
                f"only with it; got pos_embed {self.pos_embed!r} and cpe_max_size {self.cpe_max_size!r}"
            )
        head_dim = self.embed_dim // max(self.num_heads, 1)
        if head_dim % traits.head_multiple:
            raise ConfigError(
                f"2-D rotary positions turn pairs of channels per axis: the head width {head_dim} must be a "
                f"multiple of {traits.head_multiple}; change embed_dim or num_heads"
            )

    @property
    def grid_size(self) -> tuple[int, int]:
        """(rows, columns) of the patch grid: the image, through the stem, cut into P x P patches."""
        return patch_grid(self.image_size, self.patch_size, stem_stride(self.resnet_layers))

    @property
    def pixel_patch_size(self) -> tuple[int, int]:
        """The input pixels one patch covers: the patch size, times the ResNet stem's stride on a hybrid (so also
        the step between image sizes the model takes)."""
        stride = stem_stride(self.resnet_layers)
        return self.patch_size[0] * stride, self.patch_size[1] * stride

    @property
    def naflex_contract(self) -> Preprocessing | None:
        """The contract when it reads each image at its own grid of patches (NaFlex), else None."""
        contract = self.preprocessing
        return contract if contract is not None and contract.mode == "naflex" else None

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patch tokens: the class token if any, then DeiT's distillation token or the
        register tokens if any."""
        return int(bool(self.class_token)) + int(self.distilled) + self.register_tokens

    @property
    def pooled_dim(self) -> int:
        """Width of the pooled output, before any pre-logits layer: D, or D per summary token (C-RADIO)."""
        return self.embed_dim * max(len(self.summary_tokens), 1)

    @property
    def num_tokens(self) -> int:
        """Length of the sequence the encoder sees: prefix tokens plus patch tokens."""
        return self.num_prefix_tokens + self.num_patches

    @property
    def num_position_prefix(self) -> int:
        """Rows of the position table before the patch rows: one per prefix token, or none when only the patch
        tokens get positions (prefix_positions False)."""
        return self.num_prefix_tokens if self.prefix_positions else 0

    @property
    def num_position_tables(self) -> int:
        """Tables of absolute positions the model holds: one per block with placement "every_block", else one
        (none at all for a kind without a table: "none", "relative", "rope")."""
        if not position_traits(self.pos_embed).table:
            return 0
        return self.depth if self.pos_embed_placement == "every_block" else 1

    @property
    def has_distillation_head(self) -> bool:
        return self.distilled and self.distillation_head and self.num_classes > 0

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def replace(self, **changes: Any) -> ViTConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def dense_head(self) -> str:
        """The kind of the dense head ("eomt", "dpt", "linear", "upsampling"), or "none" for a classifier or a bare
        encoder: the key of the tables of what each kind predicts, counts and builds."""
        return self.head.kind if self.head is not None else "none"

    @property
    def classifier_head(self) -> ClassifierHeadConfig:
        """The classifier's settings gathered into their part (a copy: the values live in this config's fields).
        On a dense model: what its encoder pools, with no layer of its own (`ClassifierHeadConfig.headless`)."""
        return ClassifierHeadConfig(**{name: getattr(self, name) for name in CLASSIFIER_FIELDS})

    @property
    def head_config(self) -> HeadConfig:
        """The config of the model's head, whatever its kind: the dense head, else the classifier's settings."""
        return self.head if self.head is not None else self.classifier_head

    @property
    def encoder_config(self) -> ViTConfig:
        """The config of the encoder a dense model holds: this one without the head and the classes it predicts
        (the encoder has no classifier of its own)."""
        return self.replace(head=None, num_classes=0, class_names=None)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, `SCHEMA_VERSION` of it, in four parts: {"encoder": the architecture's fields, "head":
        {"kind": ..., "num_classes": ..., the head's settings}, "preprocessing": the statistics and the contract's
        fields, "provenance": ...}. Every field is written, defaults too, so that a default changed by a later
        vitlab never changes what an old file builds."""
        head = self.head_config.to_dict()
        contract = self.preprocessing.to_dict() if self.preprocessing is not None else {}
        return {
            "schema_version": SCHEMA_VERSION,
            "encoder": {name: json_value(getattr(self, name)) for name in ENCODER_FIELDS},
            "head": {"kind": head.pop("kind"), "num_classes": self.num_classes, **head},
            "preprocessing": {name: json_value(getattr(self, name)) for name in PREPROCESSING_FIELDS} | contract,
            "provenance": {name: json_value(getattr(self, name)) for name in PROVENANCE_FIELDS},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ViTConfig:
        """A config from its JSON form, as written by this or any earlier version of vitlab (`upgraded`)."""
        try:
            return cls(**checked_fields(cls, upgraded(data), "model config"))
        except TypeError as error:  # a wrong type inside a field, e.g. a string where an int belongs
            raise ConfigError(f"invalid model config: {error}") from None

    @classmethod
    def from_json(cls, text: str) -> ViTConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"model config is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"model config must be a JSON object, got {type(data).__name__}")
        return cls.from_dict(data)


# The encoder's fields: every field of the config that is in no other part.
ENCODER_FIELDS = tuple(
    spec.name
    for spec in dataclasses.fields(ViTConfig)
    if spec.name not in {*CLASSIFIER_FIELDS, "head", *PREPROCESSING_FIELDS, "preprocessing", *PROVENANCE_FIELDS}
)

# The version of a config's JSON form (`ViTConfig.to_dict`). 1 (no "schema_version" key): every field flat, a dense
# head's settings among them (`dense_head`, `eomt_queries`, `dpt_layers`, ...), as vitlab wrote up to d434df3. 2: the
# fields flat but a dense head's settings, in a "head" part of their own. 3: four parts (`PARTS`), the classifier's
# settings in the head part of a classifier, none of them in a dense model's.
SCHEMA_VERSION = 3

# Version 1's flat head fields, by head kind: today's name of each in the head's part.
FLAT_HEAD_FIELDS: dict[str, dict[str, str]] = {
    "eomt": dict(
        eomt_queries="queries", eomt_blocks="blocks", eomt_upscale_blocks="upscale_blocks", eomt_crops="crops"
    ),
    "dpt": dict(
        dpt_layers="layers",
        dpt_neck_sizes="neck_sizes",
        dpt_fusion_dim="fusion_dim",
        dpt_head_dim="head_dim",
        depth_range="depth_range",
        max_depth="max_depth",
    ),
    "linear": {},
    "upsampling": dict(upsampling_dim="channels"),
}


def upgraded(data: dict[str, Any]) -> dict[str, Any]:
    """A config's JSON form, of any version, as ViTConfig's keyword arguments (a copy): today's parts flattened
    (`flat_fields`); version 1's flat head fields become the "head" part (`FLAT_HEAD_FIELDS`), and Perception
    Encoder's `rotary: "pe"` beside a learned table is the position kind "pe_rope"."""
    data = dict(data)
    version = data.pop("schema_version", 1)
    if not is_whole(version) or not 1 <= version <= SCHEMA_VERSION:
        raise ConfigError(
            f"model config schema_version {version!r}: this vitlab reads versions 1 to {SCHEMA_VERSION}; a newer "
            "version was written by a newer vitlab, which reads it (pip install -U vitlab)"
        )
    if version == 3:
        return flat_fields(data)
    if version == 1:
        kind = data.pop("dense_head", "none")
        flat = {name for fields in FLAT_HEAD_FIELDS.values() for name in fields}
        settings = {name: data.pop(name) for name in sorted(flat) if name in data}
        if kind != "none":
            if kind not in FLAT_HEAD_FIELDS:
                raise ConfigError(f"dense_head {kind!r} of a version 1 config; it had {', '.join(FLAT_HEAD_FIELDS)}")
            renamed = FLAT_HEAD_FIELDS[kind]
            data["head"] = {"kind": kind, **{renamed[name]: settings[name] for name in renamed if name in settings}}
    rotary = data.pop("rotary", None)
    if rotary is not None:
        if rotary != "pe" or data.get("pos_embed", "learned") != "learned":
            raise ConfigError(
                f"rotary {rotary!r} with pos_embed {data.get('pos_embed')!r}: the only rotary written by earlier "
                "vitlab versions is Perception Encoder's 'pe' beside a learned table (now pos_embed 'pe_rope')"
            )
        data["pos_embed"] = "pe_rope"
    return data


def part_keys(part: Any, name: str, known: tuple[str, ...]) -> dict[str, Any]:
    """Part `name` of a saved config (a copy), checked to be an object of only `known` keys."""
    if not isinstance(part, dict):
        raise ConfigError(f"model config part {name!r} must be an object, got {part!r}")
    unknown = sorted(set(part) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown keys {unknown} in the {name} part of a model config; known keys are {sorted(known)}"
        )
    return dict(part)


def flat_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A version 3 config's parts (`PARTS`) as ViTConfig's keyword arguments. A part left out takes its defaults;
    a dense model's encoder pools as `ClassifierHeadConfig.headless` says (its config accepts nothing else)."""
    unknown = sorted(set(data) - set(PARTS))
    if unknown:
        raise ConfigError(f"unknown parts {unknown} of a model config; its parts are {', '.join(PARTS)}")
    values = part_keys(data.get("encoder", {}), "encoder", ENCODER_FIELDS)
    head = data.get("head", {"kind": ClassifierHeadConfig.kind})
    if not isinstance(head, dict) or not isinstance(head.get("kind"), str):
        raise ConfigError(f'a model config\'s head part must be an object with its "kind", got {head!r}')
    settings = dict(head)
    if settings.pop("kind") == ClassifierHeadConfig.kind:
        values |= part_keys(settings, "head", CLASSIFIER_FIELDS)
    else:  # a dense head: its kind and settings, and the classes it predicts
        if "num_classes" in settings:
            values["num_classes"] = settings.pop("num_classes")
        values["head"] = {"kind": head["kind"], **settings}
        values["classifier"] = ClassifierHeadConfig.headless(values.get("class_token") is not False).classifier
    contract = part_keys(data.get("preprocessing", {}), "preprocessing", (*PREPROCESSING_FIELDS, *CONTRACT_FIELDS))
    values |= {name: contract.pop(name) for name in PREPROCESSING_FIELDS if name in contract}
    if contract:
        values["preprocessing"] = contract
    return values | part_keys(data.get("provenance", {}), "provenance", PROVENANCE_FIELDS)


# The paper's Table 1 (and the "Ti" and "S" widths of DeiT / the AugReg follow-up): width, depth, MLP, heads.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "Ti": dict(embed_dim=192, depth=12, mlp_dim=768, num_heads=3),
    "S": dict(embed_dim=384, depth=12, mlp_dim=1536, num_heads=6),
    "B": dict(embed_dim=768, depth=12, mlp_dim=3072, num_heads=12),
    "L": dict(embed_dim=1024, depth=24, mlp_dim=4096, num_heads=16),
    "H": dict(embed_dim=1280, depth=32, mlp_dim=5120, num_heads=16),
}
PATCH_SIZES = (8, 14, 16, 32)
# The head count of the paper's model of each width: what a state dict cannot say (weights carry no head count)
# is read from this table when no config beside the weights states it.
HEADS_BY_WIDTH = {size["embed_dim"]: size["num_heads"] for size in MODEL_SIZES.values()}

# Hybrids: ResNet stages of the stem. The stem's stride (16 for three stages, 32 for four) times P is the
# effective patch size, hence "/16" and "/32".
HYBRIDS: dict[str, dict[str, Any]] = {
    "R50+B/16": dict(MODEL_SIZES["B"], resnet_layers=(3, 4, 9)),
    "R26+S/32": dict(MODEL_SIZES["S"], resnet_layers=(2, 2, 2, 2)),
    "R50+L/32": dict(MODEL_SIZES["L"], resnet_layers=(3, 4, 6, 3)),
}

# Small-image presets for training from scratch on a CPU: names say the input size they are made for.
SMALL_PRESETS: dict[str, dict[str, Any]] = {
    # 8x8 grey digits: 2x2 patches give a 4x4 grid of 16 tokens.
    "digits-8": dict(
        image_size=8, patch_size=2, embed_dim=64, depth=4, num_heads=4, mlp_dim=128, num_classes=10, in_chans=1
    ),  # grey, as the digits recipe trains it
    # 28x28 grey MNIST / Fashion-MNIST: 7x7 patches give a 4x4 grid, 16 tokens + the class token. Chosen on
    # MNIST validation accuracy per CPU-second over 4x4 patches (49 tokens, 3.3x the cost per image at the same
    # width; configs/mnist.py).
    "mnist-28": dict(
        image_size=28, patch_size=7, embed_dim=128, depth=6, num_heads=4, mlp_dim=256, num_classes=10, in_chans=1
    ),
    # 32x32 CIFAR: 4x4 patches give an 8x8 grid; the shape of the from-scratch ViT-CIFAR recipe
    # (omihub777/ViT-CIFAR: 7 layers, width 384, MLP 384, 12 heads, 6.3M parameters, 91.01% on CIFAR-10).
    "cifar-32": dict(
        image_size=32, patch_size=4, embed_dim=384, depth=7, num_heads=12, mlp_dim=384, num_classes=10, in_chans=3
    ),
}
