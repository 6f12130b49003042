"""The checkpoint family tables (src/vitlab/checkpoint/families/): the sidecar's model_type decides before key
signatures, families vitlab does not build are refused by name, a new family is one module that registers itself
(the contract test, with tests/toy_family.py), and the lists that name the families are generated from the tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import toy_family
from conftest import FIXTURES
from vitlab import load_model, presets, read_checkpoint
from vitlab.checkpoint import families, formats
from vitlab.checkpoint.families import Family, family_of, hf_model_types, model_families, supported_families
from vitlab.checkpoint.formats import export_checkpoint
from vitlab.checkpoint.io import Weights
from vitlab.cli import main
from vitlab.config import ViTConfig
from vitlab.errors import CheckpointError, ConfigError
from vitlab.head_configs import DPTConfig, EoMTConfig
from vitlab.models.registry import create_model
from vitlab.pretrained import catalogue_families
from vitlab.variants import variant_config, variant_names

TINY = dict(image_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, mlp_dim=48, num_classes=0)
TINY_FAMILY_CONFIGS = {  # each family's arithmetic (its presets, vitlab/presets.py) at a tiny size
    "pe": ViTConfig(
        **TINY,
        family="pe",
        pre_norm=True,
        pos_embed="pe_rope",
        rope_theta=10000.0,
        classifier="map",
        pool_heads=2,
        layer_scale=0.1,
    ),
    "eomt": ViTConfig(
        **{**TINY, "num_classes": 3},
        family="eomt",
        register_tokens=4,
        layer_scale=1.0,
        prefix_positions=False,
        head=EoMTConfig(queries=5, blocks=1, upscale_blocks=1),
    ),
    "depth_anything": ViTConfig(  # four blocks for the neck's four maps; DINOv2's whole-number mlp_ratio
        **{**TINY, "depth": 4, "mlp_dim": 64},
        family="depth_anything",
        layer_scale=1.0,
        head=DPTConfig(layers=(0, 1, 2, 3), neck_sizes=(4, 8, 12, 16), fusion_dim=8, head_dim=4),
    ),
    "dinov2": ViTConfig(  # with registers (Dinov2WithRegistersModel) and SwiGLU, 48 = what mlp_ratio 2 builds
        **TINY, family="dinov2", layer_scale=1.0, register_tokens=2, prefix_positions=False, mlp="swiglu"
    ),
    "tipsv2": ViTConfig(  # one register, the class token's position folded in; 48 = mlp_ratio 1.5
        **TINY,
        family="tipsv2",
        layer_scale=1.0,
        register_tokens=1,
        prefix_positions=False,
        pos_resample="bilinear_antialias",
    ),
    **{
        name: ViTConfig(**{**fields, **TINY})
        for name, fields in (
            ("siglip2", presets.SIGLIP2),
            ("dinov3", presets.DINOV3),
            ("aimv2", presets.AIMV2),
            ("radio", {**presets.RADIO, "cpe_max_size": 32}),  # an 8x8 table, not C-RADIO's 512x512
        )
    },
}


def write_folder(folder: Path, tensors: dict[str, torch.Tensor], config: dict | None) -> Path:
    """A transformers-style folder: model.safetensors and, when given, config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def dinov3_tensors() -> dict[str, torch.Tensor]:
    """A few tensors as transformers' DINOv3ViTModel names them (its patch projection is a bare Conv2d)."""
    return {
        "embeddings.cls_token": torch.zeros(1, 1, 8),
        "embeddings.register_tokens": torch.zeros(1, 4, 8),
        "embeddings.patch_embeddings.weight": torch.zeros(8, 3, 4, 4),
        "layer.0.attention.q_proj.weight": torch.zeros(8, 8),
        "norm.weight": torch.ones(8),
    }


def siglip2_tensors() -> dict[str, torch.Tensor]:
    """A few tensors of a SigLIP 2 NaFlex image tower: a linear patch embedding, (D, P * P * C)."""
    return {
        "vision_model.embeddings.patch_embedding.weight": torch.zeros(8, 4 * 4 * 3),
        "vision_model.embeddings.position_embedding.weight": torch.zeros(16, 8),
        "vision_model.encoder.layers.0.self_attn.q_proj.weight": torch.zeros(8, 8),
        "vision_model.post_layernorm.weight": torch.ones(8),
    }


# ------------------------------------------------------------------------------ the 2025 families' rows
@pytest.mark.parametrize("with_config", [True, False], ids=["config.json", "tensors alone"])
def test_an_hf_dinov3_folder_is_told_as_dinov3_by_config_or_by_its_tensors(with_config):
    sidecar = {"model_type": "dinov3_vit"} if with_config else None
    assert family_of(Weights("d", "safetensors", dinov3_tensors(), sidecar=sidecar)).name == "hf-dinov3"


@pytest.mark.parametrize("with_config", [True, False], ids=["config.json", "tensors alone"])
def test_a_siglip2_naflex_tower_is_told_by_its_linear_patch_embedding_not_read_as_siglip(with_config):
    sidecar = {"model_type": "siglip2_vision_model", "patch_size": 4} if with_config else None
    assert family_of(Weights("s", "safetensors", siglip2_tensors(), sidecar=sidecar)).name == "hf-siglip2"


@pytest.mark.parametrize("model_type", ["ijepa", "swinv2", "vjepa2"])
def test_any_model_type_the_table_lacks_gets_the_same_one_message(tmp_path, model_type):
    state = load_file(FIXTURES / "hf_vit" / "model.safetensors")  # tensors vitlab could read: the config decides
    folder = write_folder(tmp_path / model_type, state, {"model_type": model_type})
    with pytest.raises(
        CheckpointError,
        match=f"its config.json says model_type '{model_type}': family {model_type} "
        r"is not supported \(supported: .*vit, deit, ",
    ):
        read_checkpoint(folder)


def test_a_timm_state_dict_with_query_key_norm_and_swiglu_loads_with_both(tmp_path):
    """Once refused as unbuilt (issue 34), now built (issue 35): the names decide the config fields."""
    config = ViTConfig(**{**TINY, "num_classes": 3}, qk_norm=True, mlp="swiglu")
    model = create_model(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    save_file(model.state_dict(), tmp_path / "w.safetensors")
    loaded = load_model(tmp_path / "w.safetensors", num_heads=4, image_size=16)
    assert loaded.config.qk_norm and loaded.config.mlp == "swiglu"
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model(images))


# ------------------------------------------------------------------------------ the sidecar decides first
def test_an_hf_vit_folder_whose_config_says_vit_loads_as_before():
    folder = FIXTURES / "hf_vit"
    assert json.loads((folder / "config.json").read_text())["model_type"] == "vit"
    config, state, kind = read_checkpoint(folder)
    assert kind == "hf" and config.num_heads == json.loads((folder / "config.json").read_text())["num_attention_heads"]
    assert set(state) == set(create_model(config).state_dict())


@pytest.mark.parametrize(
    "weights, model_type, says, looks_like",
    [
        (
            "hf_vit",
            "clip_vision_model",
            "Hugging Face CLIP or SigLIP image tower",
            "Hugging Face ViT / DeiT / MAE / DINO",
        ),
        ("hf_dinov2", "vit", "Hugging Face ViT / DeiT / MAE / DINO", "Hugging Face DINOv2"),
        ("hf_clip_vision", "dinov2", "Hugging Face DINOv2", "Hugging Face CLIP or SigLIP image tower"),
    ],
)
def test_a_folder_is_reported_as_what_its_config_says(tmp_path, weights, model_type, says, looks_like):
    folder = write_folder(
        tmp_path / weights, load_file(FIXTURES / weights / "model.safetensors"), {"model_type": model_type}
    )
    with pytest.raises(
        CheckpointError,
        match=f"config.json says model_type '{model_type}' \\({says}\\), but its "
        f"tensors are not that layout \\(they are a {looks_like} checkpoint's\\)",
    ):
        read_checkpoint(folder)


def test_the_sidecar_model_type_chooses_the_row_before_any_signature(monkeypatch):
    """A row whose signature would claim the file is passed over when the config names another row."""
    claims_everything = Family(
        "greedy",
        "greedy",
        kind="greedy",
        origin="nowhere",
        containers=("safetensors",),
        matches=lambda weights: True,
        read_config=families.family("hf-vit").read_config,
        to_vitlab=families.family("hf-vit").to_vitlab,
    )
    monkeypatch.setattr(families, "FAMILIES", (claims_everything,) + families.FAMILIES)
    tensors = load_file(FIXTURES / "hf_vit" / "model.safetensors")
    assert family_of(Weights("hf_vit", "safetensors", tensors, sidecar={"model_type": "vit"})).name == "hf-vit"
    assert family_of(Weights("hf_vit", "safetensors", tensors)).name == "greedy"  # no config: signatures in order


# ------------------------------------------------------------------------------ a new family is one module
@pytest.fixture
def toy_registered(monkeypatch):
    """tests/toy_family.py registered as a module of src/vitlab/checkpoint/families/ is, with its presets as rows of
    vitlab/presets.py's table, the tables restored after."""
    for table in ("MODULES", "FAMILIES", "MODEL_FAMILIES"):
        monkeypatch.setattr(families, table, getattr(families, table))
    monkeypatch.setattr(presets, "FAMILY_PRESETS", dict(presets.FAMILY_PRESETS))

    def register():
        families.register(toy_family)
        presets.register(toy_family.PRESETS)

    return register


def toy_folder(folder: Path, model: torch.nn.Module, config_json: dict | None) -> Path:
    """A toy family checkpoint: vitlab's names under "toy.", the marker, and config.json when given."""
    tensors = {"toy." + name: tensor for name, tensor in model.state_dict().items()}
    return write_folder(folder, {**tensors, "toy.marker": torch.zeros(1)}, config_json)


@pytest.mark.parametrize("config_json", [None, {"model_type": "toy_vit"}], ids=["signature", "model_type"])
def test_a_new_family_is_one_module_that_registers_itself(tmp_path, capsys, toy_registered, config_json):
    """The contract of the seam: a module declaring MODELS and LAYOUTS (tests/toy_family.py, which nothing in vitlab
    names) makes its family readable, convertible both ways, presettable, listed and benchable once registered."""
    model = create_model(variant_config("B/16").replace(**toy_family.ARCHITECTURE, image_size=8, patch_size=4)).eval()
    folder = toy_folder(tmp_path / "toy", model, config_json)
    with pytest.raises(CheckpointError, match="no checkpoint layout vitlab knows|family toy_vit is not supported"):
        load_model(folder)
    with pytest.raises(ConfigError, match="unknown model variant 'toy-Ti/4'"):
        variant_config("toy-Ti/4")

    toy_registered()  # what the package does for each of its own modules; its presets join presets.py's

    # readable, by its key signature or its config.json, with its processor defaults
    config, _, kind = read_checkpoint(folder)
    tensors = load_file(folder / "model.safetensors")
    assert kind == "hf" and family_of(Weights("toy", "safetensors", tensors, sidecar=config_json)).name == "hf-toy"
    assert (config.image_mean, config.preprocessing) == ((0.25,), toy_family.PROCESSOR["preprocessing"])
    loaded = load_model(folder)
    images = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model(images))
    # convertible back: `export --to hf` takes its row, and the folder written reads as the toy family again
    written = export_checkpoint(loaded, tmp_path / "exported", to="hf")
    assert "toy.marker" in load_file(written / "model.safetensors")
    assert json.loads((written / "config.json").read_text())["model_type"] == "toy_vit"
    with torch.no_grad():
        torch.testing.assert_close(load_model(written)(images), model(images))
    # presettable, listed, benchable
    assert variant_config("toy-Ti/4").family == "toy" and "toy-Ti/4" in variant_names()
    capsys.readouterr()
    assert main(["models", "--json"]) == 0 and "toy-Ti/4" in {
        row["name"] for row in json.loads(capsys.readouterr().out)
    }
    assert "toy_vit" in hf_model_types() and "Toy ViT" in supported_families()
    assert "toy" in [family.name for family in model_families()]
    assert families.reference_class(config) == "ToyVisionModel"
    order = [row.name for row in families.FAMILIES]
    assert order.index("hf-toy") < order.index("hf-vit")  # its checked_before


def test_a_family_module_that_clashes_with_the_table_is_refused_by_name(toy_registered):
    toy_registered()
    with pytest.raises(CheckpointError, match="two family modules declare the layout hf-toy"):
        families.register(toy_family)
    assert [row.name for row in families.FAMILIES].count("hf-toy") == 1  # the tables are as they were


def test_every_family_module_of_the_package_is_in_the_tables():
    modules = families.family_modules()
    assert {module.__name__.rsplit(".", 1)[1] for module in modules} >= {"dinov3", "aimv2", "siglip2", "pe"}
    assert [row.name for module in modules for row in module.LAYOUTS] != []
    assert {row.name for module in modules for row in module.LAYOUTS} == {row.name for row in families.FAMILIES}


# ------------------------------------------------------------------------------ lists generated from the table
def test_the_pretrained_family_choices_are_the_tables(capsys):
    with pytest.raises(SystemExit):
        main(["pretrained", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "only this family: " + ", ".join(family.name for family in model_families()) in help_text
    assert set(catalogue_families()) == {family.name for family in model_families()}


def test_the_supported_text_and_the_hf_types_come_from_the_rows():
    text = supported_families()
    for family in model_families():
        assert family.title in text
    for row in families.FAMILIES:
        assert row.origin in text
    assert hf_model_types() == [model_type for row in families.FAMILIES for model_type in row.model_types]
    assert len(set(hf_model_types())) == len(hf_model_types())  # a model_type names one row
    sibling_types = {model_type for sibling in families.SIBLINGS for model_type in sibling.model_types}
    assert not sibling_types & set(hf_model_types())


def test_every_row_states_its_processor_defaults_and_a_file_without_its_own_gets_them():
    for row in families.FAMILIES:  # vitlab's own files (models, LoRA adapters) carry theirs in the header
        assert row.preprocessing or row.header_format in ("vitlab", "vitlab-lora"), row.name
    for name in ("hf-vit", "hf-dinov2"):  # transformers' processors differ by model type
        assert set(families.family(name).model_types) == set(families.family(name).preprocessing)
    assert not (FIXTURES / "hf_vit" / "preprocessor_config.json").exists()
    config = read_checkpoint(FIXTURES / "hf_vit")[0]
    defaults = families.family("hf-vit").preprocessing["vit"]
    assert (config.preprocessing, config.image_mean, config.image_std) == (
        defaults["preprocessing"],
        defaults["image_mean"],
        defaults["image_std"],
    )


@pytest.mark.parametrize("name", [row.name for row in families.FAMILIES if row.from_vitlab is not None])
def test_every_row_that_writes_its_layout_converts_to_it_and_back(name):
    row = families.family(name)
    config, state, _ = read_checkpoint(FIXTURES / "hf_vit")
    if row.config_family is not None:  # a model in that family's arithmetic
        config = TINY_FAMILY_CONFIGS[row.config_family]
        state = create_model(config).state_dict()
    written = row.from_vitlab(state, config)
    if row.kind == "hf":
        assert set(written) != set(state)  # transformers' names, not vitlab's
    back = row.to_vitlab(written, config, "round trip")
    assert set(back) == set(state) and all(torch.equal(back[name], state[name]) for name in state)


def test_the_table_and_the_names_load_without_torch():
    code = (
        "import sys; from vitlab.checkpoint import families; from vitlab import pretrained; from vitlab.cli import build_parser; "
        "build_parser(); families.supported_families(); pretrained.parse_name('augreg:B/16'); "
        "print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_loading_builds_the_model_on_the_meta_device_through_the_registry(monkeypatch):
    devices = []

    def recording(config):
        model = create_model(config)
        devices.append(next(model.parameters()).device.type)
        return model

    monkeypatch.setattr(formats, "create_model", recording)
    load_model(FIXTURES / "timm_vit_token.safetensors")
    assert devices == ["meta"]
