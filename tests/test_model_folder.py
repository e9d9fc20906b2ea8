"""How model.path is read (ablate/policy.py's hub_args, overrides, model_config): its revision, its own code
(trust_remote_code) and fields of its config.json replaced, the same for transformers and for vLLM."""

from __future__ import annotations

import json

import pytest
import transformers

from ablate.checks import check_lengths, check_model
from ablate.config import compose
from ablate.generators.vllm import model_args
from ablate.policy import build_policy, build_tokenizer, model_config
from real_models import save_model


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """Llama-3.1-8B-Instruct's tokenizer and config (131,072 positions), tiny and with random weights."""
    return save_model("llama3", tmp_path_factory.mktemp("Llama-3.1-8B-Instruct"), heads=2, kv_heads=1)


def _model(folder, *overrides):
    return compose(["model=hf", f"model.path={folder}", "model.device=cpu", *overrides]).model


def test_overrides_replace_the_config_for_the_trainer_the_length_check_and_vllm(llama):
    """Before, model.overrides did not exist: a model served at fewer positions than its config.json says (or with
    another rope) could not be told so."""
    assert model_config(_model(llama)).max_position_embeddings == 131072
    model = _model(llama, "+model.overrides.max_position_embeddings=4096")
    assert model_config(model).max_position_embeddings == 4096
    assert build_policy(model).config.max_position_embeddings == 4096  # the checkpoint read, then the override
    assert build_policy(model, read_weights=False).config.max_position_embeddings == 4096
    cfg = compose(["experiment=paper_8b", "model=hf", f"model.path={llama}",
                   "+model.overrides.max_position_embeddings=4096"])
    with pytest.raises(ValueError, match=r"= 16404 tokens, more than .* \(max_position_embeddings 4096\)"):
        check_lengths(cfg)
    assert model_args(cfg.model) == {"revision": None, "trust_remote_code": False,
                                     "hf_overrides": {"max_position_embeddings": 4096}}
    assert model_args(compose([]).model) == {}  # the tiny model: a folder written here, read as it is
    with pytest.raises(ValueError, match=r"^model\.overrides\.max_positions: LlamaConfig of model\.path=.* has no "
                                         r"field 'max_positions'"):
        check_model(_model(llama, "+model.overrides.max_positions=4096"))


def test_the_revision_goes_with_every_read_of_the_folder(llama, monkeypatch):
    """A local folder has one revision; on the hub each read must ask for the same one, so each gets it."""
    seen = []
    for kind in (transformers.AutoConfig, transformers.AutoTokenizer):
        real = kind.from_pretrained

        def spy(path, *args, _real=real, **kwargs):
            seen.append(kwargs.get("revision"))
            return _real(path, *args, **kwargs)
        monkeypatch.setattr(kind, "from_pretrained", spy)
    model = _model(llama, "model.revision=v1.0")
    model_config(model)
    build_tokenizer(model)
    assert len(seen) >= 2 and set(seen) == {"v1.0"}  # the tokenizer reads the config too, with its revision
    assert model_args(model)["revision"] == "v1.0"


def test_a_folder_with_its_own_code_is_read_only_with_trust_remote_code(tmp_path, llama):
    """A model type transformers does not know, whose config class ships in the folder (auto_map)."""
    folder = tmp_path / "custom"
    folder.mkdir()
    config = json.loads((llama / "config.json").read_text())
    config.update(model_type="custom-llama", auto_map={"AutoConfig": "configuration_custom.CustomConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_custom.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass CustomConfig(LlamaConfig):\n    model_type = 'custom-llama'\n")
    with pytest.raises(ValueError, match=r"model\.path=.*custom: its config\.json .*trust_remote_code"):
        check_model(_model(folder))
    trusted = _model(folder, "model.trust_remote_code=true")
    check_model(trusted)
    assert type(model_config(trusted)).__name__ == "CustomConfig"
    assert model_args(trusted)["trust_remote_code"] is True


def test_a_folder_under_home_is_read_as_the_check_reads_it(llama, monkeypatch):
    """model.path=~/...: the check before submit expands `~`, and so does every read of the folder (before, the
    check's own read of the config did not, and it failed on a folder it had just found)."""
    monkeypatch.setenv("HOME", str(llama.parent))
    model = _model(f"'~/{llama.name}'")  # quoted, as Hydra's grammar wants a ~
    check_model(model)
    assert model_config(model).max_position_embeddings == 131072
    assert build_tokenizer(model).eos_token_id == 128009  # Llama-3.1-Instruct's <|eot_id|>
