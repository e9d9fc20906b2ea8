"""The config tree: every option of every group composes and validates; bad input fails at compose time, clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from ablate import schema
from ablate.config import choice_of, compose, signature
from conftest import run_cli, run_main

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and not p.name.startswith("_"))
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]
AXES = ["loss", "aggregation", "normalization", "precision", "length_control", "off_policy", "filtering"]
NEEDS = {("model", "hf"): ["model.path=/models/some-8b"],  # options with a required (???) field
         ("experiment", "paper_8b"): ["model.path=/models/some-8b"],
         ("experiment", "smoke"): ["model.path=/models/some-8b"]}


def test_every_design_axis_is_a_group_with_the_designed_options():
    options = {g: {o for gg, o in OPTIONS if gg == g} for g in GROUPS}
    assert options["loss"] >= {"cispo", "dapo", "gspo", "grpo"}
    assert options["aggregation"] == {"prompt_mean", "sample_mean", "token_mean"}
    assert options["normalization"] == {"batch", "prompt", "none"}
    assert options["precision"] == {"fp32_head", "fp32_exact", "bf16"}
    assert options["length_control"] == {"interruption", "length_penalty", "truncation"}
    assert options["off_policy"] == {"pipeline_rl", "ppo_off_policy"}
    assert options["recipe"] == {"scalerl", "deepseek_grpo", "qwen_dapo", "magistral", "minimax_m1"}
    assert options["sweep"] >= {"none", "loo", "recipes"}
    assert options["launcher"] >= {"local", "debug", "slurm"}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_validates(group, option):
    cfg = compose([f"{group}={option}", *NEEDS.get((group, option), [])])
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # every value resolves, none missing
    if group in AXES:
        assert choice_of(cfg, group) == option  # an axis option names itself as its file does
        assert OmegaConf.get_type(cfg[group]) in schema.SCHEMAS[group].values()  # typed by its schema
        assert cfg[group]._target_.startswith("ablate.")


def test_pacing_the_mock_changes_how_long_a_run_takes_not_what_it_is():
    """generator.step_seconds (schema.NON_SEMANTIC_LEAVES) is out of the signature, so a paced run is the same run
    (and the mock draws the same numbers for it); a key beside it that changes what the run does is in."""
    mock = compose(["generator=mock"])
    assert signature(compose(["generator=mock", "generator.step_seconds=5"])) == signature(mock)
    assert signature(compose(["generator=mock", "generator.crash_at_step=3"])) != signature(mock)


def test_recipe_scalerl_is_the_default():
    assert signature(compose(["recipe=scalerl"])) == signature(compose([]))
    cfg = compose([])
    assert [choice_of(cfg, a) for a in AXES] == [
        "cispo", "prompt_mean", "batch", "fp32_head", "interruption", "pipeline_rl", "both"]


def test_a_recipe_choice_yields_to_the_command_line():
    cfg = compose(["recipe=qwen_dapo", "loss=cispo"])
    assert choice_of(cfg, "loss") == "cispo"
    assert choice_of(cfg, "off_policy") == "ppo_off_policy"  # the rest of the recipe stays
    assert cfg.batch.prompts_per_step == 24  # the experiment preset (tiny) applies after the recipe (qwen_dapo: 80)


def test_unknown_option_names_group_and_options():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["loss=nope"])
    message = str(err.value)
    assert "loss/nope" in message and "cispo" in message and "grpo" in message


@pytest.mark.parametrize("override,key", [
    ("loss.eps_max=abc", "eps_max"),
    ("seed=abc", "seed"),
    ("batch.prompts_per_step=1.5", "prompts_per_step"),
    ("filtering.npr_mode=sometimes", "npr_mode"),
    ("loss.eps_mx=3", "eps_mx"),
])
def test_wrong_type_or_unknown_key_fails_at_compose_naming_the_key(override, key):
    with pytest.raises(ConfigCompositionException) as err:
        compose([override])
    assert key in str(err.value) + str(err.value.__cause__)


def test_cli_rejects_an_unknown_option(tmp_path):
    out = run_cli("-m", "ablate", "loss=nope", cwd=tmp_path)
    assert out.returncode != 0
    assert "loss" in out.stderr and "nope" in out.stderr and "cispo" in out.stderr


def test_cli_rejects_a_wrongly_typed_value(tmp_path):
    out = run_main("-m", "ablate", "loss.eps_max=four", cwd=tmp_path)
    assert out.returncode != 0
    assert "loss.eps_max" in out.stderr and "four" in out.stderr


def test_cli_shows_the_resolved_config(tmp_path):
    out = run_main("-m", "ablate", "--cfg", "job", "loss=dapo", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.loss.name == "dapo" and cfg.loss.eps_high == 0.28


def test_the_mock_brings_its_own_short_schedule_and_experiment():
    """generator=mock is the mock run by itself: 50 steps, validation at every one, into <name>-mock (never beside real
    runs); the command line still decides; other generators keep the experiment's own."""
    mock, real = compose(["generator=mock"]), compose([])
    assert (mock.train.steps, mock.train.val_every, mock.tracking.experiment) == (50, 1, "tiny-mock")
    assert (mock.batch.prompts_per_step, real.batch.prompts_per_step) == (4, 24)
    assert (real.train.steps, real.tracking.experiment) == (350, "tiny")
    assert compose(["generator=mock", "train.steps=7"]).train.steps == 7
    paper = compose(["experiment=paper_8b", "model.path=/m", "generator=mock"])
    assert (paper.train.steps, paper.tracking.experiment) == (50, "paper_8b-mock")


@pytest.mark.e2e  # a process of its own (HF_HUB_OFFLINE is read at import): 13-21 s (docs/testing.md#markers)
def test_a_model_path_that_does_not_load_fails_in_one_line_before_any_run(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    cases = {str(tmp_path / "nowhere"): "no such folder",
             str(tmp_path / "empty"): f"the folder has no config.json (tried {tmp_path / 'empty' / 'config.json'})",
             str(tmp_path / "broken"): f"its config.json ({tmp_path / 'broken' / 'config.json'}): ",
             "no-such-org/no-such-model": "not a local folder, and the Hugging Face hub (or its cache) gave no model"}
    for path, says in cases.items():
        # a process of its own: huggingface_hub reads HF_HUB_OFFLINE as it is imported
        out = run_cli("-m", "ablate", "model=hf", f"model.path={path}", cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert lines[0].startswith(f"error: model.path={path}: {says}"), lines[0]
    assert not (tmp_path / "mlflow.db").exists()  # nothing was created, not even the database


def test_the_paper_preset_validates_and_rewards_as_the_paper():
    """experiment=paper_8b: mean@16 over 1,000 held-out prompts every 100 steps, reward +1 / -1 (the tiny presets
    keep 1 / 0 and their own validation)."""
    paper = compose(["experiment=paper_8b", "model.path=/m"])
    assert (paper.task.n_val_prompts, paper.task.val_samples, paper.train.val_every) == (1000, 16, 100)
    assert (paper.task.reward_correct, paper.task.reward_wrong) == (1.0, -1.0)
    assert (compose([]).task.reward_correct, compose([]).task.reward_wrong) == (1.0, 0.0)


def test_a_checkpoint_model_with_no_path_fails_naming_the_key_not_the_tiny_model_in_its_place(tmp_path):
    """model=hf (and experiment=paper_8b, which picks it) without model.path: before, the `???` was lost in the
    schema's merge and the tiny random model was planned, on the paper's 80 GPUs, with no word said."""
    from omegaconf import OmegaConf

    from ablate.run import run_sweep

    for overrides in (["model=hf"], ["experiment=paper_8b"]):
        assert OmegaConf.is_missing(compose(overrides).model, "path")
        args = [*overrides, "sweep=loo", "sweep.dry_run=true", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
        with pytest.raises(ValueError, match=r"^model=hf needs model.path: a local folder or a hub name"):
            run_sweep(compose(args), args)
    assert compose([]).model.path is None  # the tiny model's own option says null
    assert not list(tmp_path.glob("mlflow.db*"))


def test_float16_compute_is_refused_before_any_run_naming_bfloat16(tmp_path):
    """The trainer applies no loss scale: fp16 compute would flush small gradients (the LM head's first) to zero."""
    from ablate.run import run_sweep

    args = ["model.dtype=float16", "sweep=loo", "sweep.dry_run=true", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    with pytest.raises(ValueError, match=r"^model.dtype=float16: the trainer applies no loss scale.*bfloat16$"):
        run_sweep(compose(args), args)
    assert not list(tmp_path.glob("mlflow.db*"))


def test_a_reference_layout_the_clock_cannot_use_fails_in_one_line_before_any_run(tmp_path):
    cases = {("train.reference_layout=[1,1]", "train.reference_tflops=0"):
             "train.reference_layout=[1, 1] needs train.reference_tflops > 0",
             ("train.reference_layout=[0,1]",): "train.reference_layout must be [generator devices, trainer devices], "
                                                 "each >= 1, got [0, 1]"}
    for overrides, says in cases.items():
        for sweep in ("sweep=none", "sweep=loo"):
            out = run_main("-m", "ablate", sweep, *overrides, cwd=tmp_path)
            lines = out.stderr.strip().splitlines()
            assert out.returncode == 2 and len(lines) == 1, out.stderr
            assert lines[0].startswith(f"error: {says}"), lines[0]
    assert not (tmp_path / "mlflow.db").exists()


def test_a_model_folder_that_loads_passes_the_check(tmp_path):
    from ablate.checks import check_model
    from ablate.policy import build_policy, build_tokenizer

    cfg = compose([])
    build_policy(cfg.model, 0, build_tokenizer(cfg.model)).save_pretrained(tmp_path)
    check_model(OmegaConf.create({"path": str(tmp_path)}))


def test_the_warm_start_cache_is_the_studys_unless_ablate_cache_names_one(monkeypatch, tmp_path):
    monkeypatch.delenv("ABLATE_CACHE", raising=False)
    assert compose([]).paths.cache == "outputs/tiny/cache"
    assert compose(["name=other"]).paths.cache == "outputs/other/cache"
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path))
    assert compose([]).paths.cache == str(tmp_path)
    assert compose([f"paths.cache={tmp_path}/mine"]).paths.cache == f"{tmp_path}/mine"  # the command line decides


def test_the_paper_preset_is_the_papers_layout_and_the_job_holds_it():
    """experiment=paper_8b alone: 16 FSDP trainer ranks and 64 vLLM engine processes, 10 nodes of 8 GPUs on SLURM;
    the layout passes the checks made before submit (ranks, engines, nodes, GPUs)."""
    from ablate.checks import check_run

    cfg = compose(["experiment=paper_8b"])
    assert (cfg.run.name, cfg.run.trainer_gpus, cfg.run.generator_gpus) == ("fsdp", 16, 64)
    assert (cfg.generator.name, cfg.launcher.name, cfg.launcher.nodes, cfg.launcher.gpus_per_node) == \
        ("vllm", "slurm", 10, 8)
    check_run(cfg)


LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 131072}


@pytest.fixture
def llama_8b(tmp_path) -> Path:
    """A folder with an 8B Llama's config.json, Llama-3's real tokenizer and no weights: what the checks before
    submit read of model.path."""
    import json

    from real_models import save_tokenizer

    folder = tmp_path / "llama-8b"
    save_tokenizer("llama3", folder)
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    return folder


def test_the_paper_layout_fits_80_gb_gpus_by_the_memory_model(llama_8b):
    """experiment=paper_8b on an 8B Llama: every process within an "80 GB" H100's 85 GB as the device reports it
    (the check on SLURM's default, vLLM's unit), the 8B's parameters counted from its config, the trainer's biggest
    part its activations. vLLM's share, unset in the preset, is sized: an engine's 48 rows of 16,404 tokens (the
    interruption's phrase included) need 16.1 + 103.2 + 4 GB, more than the GPU has, so it takes all the room beside the staging copy (16.1 GB, and its
    fragmentation) and what lives outside vLLM (the CUDA context and NCCL's buffers: tests/test_memory.py): 67.1 GB,
    0.79 (0.5 left 25 GB of it idle)."""
    from ablate.checks import check_memory, gpu_memory_gb, model_shape, tokenizer_of

    cfg = compose(["experiment=paper_8b", f"model.path={llama_8b}"])
    assert model_shape(cfg.model).params == 8_030_261_248  # Llama-3.1-8B's count
    assert gpu_memory_gb(cfg, "slurm") == 85.0
    tokenizer = tokenizer_of(cfg.model)  # loaded once for both checks (the phrase's tokens)
    first, other, engine = check_memory(cfg, gpu_memory_gb(cfg, "slurm"), tokenizer)
    assert first.name == "trainer rank 0" and 60e9 < first.total < 85e9  # its margin in (tests/test_memory.py)
    assert other.bytes == {part: b for part, b in first.bytes.items() if "weights group" not in part}
    assert first.parts[0][0] == "activations" and engine.total == pytest.approx(85e9)
    beside = sum(b for part, b in engine.bytes.items() if part != "vLLM (gpu_memory_utilization)")
    assert engine.bytes["vLLM (gpu_memory_utilization)"] == pytest.approx(85e9 - beside)
    assert beside - 2 * 8_030_261_248 == pytest.approx(1.81e9, abs=0.005e9)  # the staging copy and 1.81 GB
    whole = check_memory(compose(["experiment=paper_8b", f"model.path={llama_8b}", "run.sharded_gradients=false"]),
                         200.0, tokenizer)[0]
    assert whole.total - first.total == pytest.approx(1.05 * 4 * 8_030_261_248)  # and its 5% of fragmentation


def test_where_the_memory_check_looks_for_the_gpus_memory():
    from ablate.checks import gpu_memory_gb

    assert gpu_memory_gb(compose(["launcher=slurm"]), "slurm") == 85.0  # the preset's, an "80 GB" H100 as reported
    assert gpu_memory_gb(compose(["launcher=slurm", "launcher.gpu_memory_gb=141"]), "slurm") == 141.0
    assert gpu_memory_gb(compose(["launcher=slurm", "launcher.gpus_per_node=0", "launcher.gpu_memory_gb=null"]),
                         "slurm") is None  # CPU jobs
    assert gpu_memory_gb(compose(["model.device=cpu", "launcher=slurm"]), "slurm") is None
    assert gpu_memory_gb(compose(["launcher=local", "model.device=cpu"]), "local") is None


def _problems(path: Path, n: int, keys=("problem", "answer")) -> Path:
    """A JSONL of n math problems, each with these keys (the paper's preset holds 1,000 out for validation)."""
    import json

    path.write_text("".join(json.dumps({keys[0]: f"What is {i} + {i}?", keys[1]: str(2 * i)}) + "\n"
                            for i in range(n)))
    return path


def test_a_data_file_that_is_missing_misshapen_or_short_fails_before_any_run_in_one_line(tmp_path, capsys):
    """Before, each of these passed the dry run and failed on the node, after the queue."""
    from ablate.run import run_sweep

    cases = {
        str(tmp_path / "nowhere.jsonl"): f"task.data_path={tmp_path / 'nowhere.jsonl'}: no such file or folder",
        str(_problems(tmp_path / "other.jsonl", 20, ("question", "solution"))):
            f"task=math: {tmp_path / 'other.jsonl'}:1: needs a non-empty string or a list of {{role, content}} turns "
            f"in `problem` (task.fields.problem; keys found: ['question', 'solution'])",
        str(_problems(tmp_path / "short.jsonl", 900)):
            f"task=math: {tmp_path / 'short.jsonl'} has 900 distinct problems; 1000 validation + the rest training "
            f"asked"}
    for path, says in cases.items():
        args = ["experiment=paper_8b", "model=llama_1b", "sweep=loo", "sweep.dry_run=true", f"task.data_path={path}",
                f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
        with pytest.raises(ValueError) as refused:
            run_sweep(compose(args), args)
        assert str(refused.value).startswith(says) and "\n" not in str(refused.value), str(refused.value)
    args = ["task=math", "generation.max_prompt_tokens=256", "sweep=loo", "sweep.dry_run=true",
            f"task.data_path={_problems(tmp_path / 'ok.jsonl', 30)}",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    assert run_sweep(compose(args), args) == 0
    assert f"data ({tmp_path / 'ok.jsonl'}): 20 training and 10 validation prompts" in capsys.readouterr().out
    assert not list(tmp_path.glob("mlflow.db*"))


@pytest.mark.e2e  # paper-preset dry runs on a real vocabulary: 14-18 s (docs/testing.md#markers)
def test_a_layout_that_does_not_fit_its_gpus_fails_in_the_dry_run_naming_the_gb(llama_8b, tmp_path, capsys):
    """The paper's 8B model in one process on one GPU (fp32 masters, AdamW and gradients: 128 GB) fails in
    sweep.dry_run, before anything is created, in one line: its parts summed against the memory, and the part that
    takes the room. The paper's layout passes and the dry run prints its estimate."""
    from ablate.run import run_sweep

    common = ["experiment=paper_8b", f"model.path={llama_8b}", "sweep=loo", "sweep.dry_run=true",
              f"task.data_path={_problems(tmp_path / 'math.jsonl', 1100)}", f"paths.outputs={tmp_path}",
              f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    one = [*common, "run=one_process", "run.trainer_gpus=1", "run.generator_gpus=1", "launcher.nodes=1"]
    with pytest.raises(ValueError) as refused:
        run_sweep(compose(one), one)
    assert str(refused.value).startswith("run.trainer_gpus=1 + run.generator_gpus=1 does not fit a GPU of 85 GB "
                                         "(launcher.gpu_memory_gb): trainer rank 0: weights, gradients and AdamW "
                                         "state 128.5 + activations 50.2 + ")
    assert "= 214.0 GB > 85 GB; the part that takes the room: weights, gradients and AdamW state, 128.5 GB; shard " \
           "them over more trainer ranks" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert run_sweep(compose(common), common) == 0
    printed = capsys.readouterr().out
    assert "9 variants (dry run: nothing submitted)" in printed and "  trainer rank 0: ~82.5 GB of 85 (" in printed
    assert f"model ({llama_8b}): 8.03B parameters, untied embeddings, 131,072 positions; rows of at most 16,404 " \
           "tokens (the interruption's phrase 20 of them)" in printed  # Llama-3.1-8B's 8,030,261,248; 2,048 + 12,288
    # + 2,048 + the phrase in Llama-3's tokens
    # the GPU-hours (tests/test_cost.py checks the model): PPO-off-policy's rounds wait for their weights, loo-batch
    # trains every row (the others half: cost.KEPT), the rest cost the same; raw vLLM's 26,000 tokens/s at 0.89B is
    # 2,882 at 8.03B; the learner at the estimated 0.22 MFU of 989 TFLOP/s, 4,516 tokens/s
    assert "GPU-hours (ablate/cost.py's estimate: 2,882 tokens/s a generator GPU (an upper bound: launcher.gen_" \
           "tokens_per_s), 4,516 a trainer GPU at 22% MFU (an estimate: launcher.train_mfu) of 989 TFLOP/s;" in printed
    costs = {line.split(":")[0].strip(): float(line.split(": ")[1].split(" GPU-hours")[0].replace(",", ""))
             for line in printed.splitlines() if " GPU-hours (" in line and line.startswith("  ")}
    assert set(costs) == {"scalerl, loo-dapo, loo-savg, loo-plan, loo-fp32, loo-lp, loo-npr", "loo-8op", "loo-batch",
                          "the sweep"}
    assert costs["loo-8op"] > 1.2 * costs[next(iter(costs))] and costs["loo-batch"] > 1.2 * costs[next(iter(costs))]
    assert costs["the sweep"] == pytest.approx(7 * costs[next(iter(costs))] + costs["loo-8op"] + costs["loo-batch"],
                                               abs=5)
    # the side that binds (tests/test_cost.py): learning, at the generator's upper-bound rate: a step generates 768 x
    # 7,168 tokens on 64 GPUs in 29.8 s and trains every row, 768 x 9,216 tokens on 16, in 98.0 s
    assert "  loo-batch: learning: 30 s generating, 98 s learning a step (100% of rows trained); a 2x learner saves " \
           in printed
    # SLURM's warning, sized (docs/training.md#time-limits): the update of 768 rows of 2,048 + 14,336 tokens at
    # 0.22 x 989 TFLOP/s / (6 x 8.03B) = 4,516 tokens/s on 16 GPUs, 174.1 s; a validation of 16,000 rows of 7,168
    # tokens at 2,882 tokens/s on 64 GPUs, 621.9 s; 12 B x 8.03B / 16 ranks at 1 GB/s, 6.0 s; the requeue's 30 s:
    # 832.0 s, x 1.5 in whole minutes, 1,260
    assert "SLURM's warning 1,260 s before the time limit (launcher.signal_delay_s, sized): checkpointing and " \
           "requeuing take ~832 s (learner step 174 s, validation 622 s, checkpoint 6 s, requeue 30 s;" in printed
    assert not list(tmp_path.glob("mlflow.db*"))
    short = [*common, "launcher.signal_delay_s=300"]  # set shorter than that: said, not refused
    assert run_sweep(compose(short), short) == 0
    said = capsys.readouterr()
    assert "SLURM's warning 300 s before the time limit (launcher.signal_delay_s):" in said.out
    assert "WARNING: launcher.signal_delay_s=300 is shorter than that" in said.err and "(sized: 1260)" in said.err


@pytest.mark.e2e  # paper-preset dry runs on a real vocabulary: 14-18 s (docs/testing.md#markers)
def test_validation_is_in_the_memory_check_where_our_engine_decodes_it(llama_8b, tmp_path, capsys):
    """loo-8op (PPO-off-policy-8) waits for a round's first step to validate on vLLM, but its last step cannot
    wait: at 1,604 steps it falls mid-round and is validated with our torch engine on each engine process's staging
    copy: its KV cache is 16,000 rows / 64 engines = 250 rows at once at 512 a wave, x 16,404 tokens (the
    interruption's phrase 20 of them: memory.longest_row) x 131,072 bytes a token (2 x 32 layers x 1,024 x bf16) =
    537.5 GB; the preset's 4 waves of 2 rows: 8 x 16,404 x 131,072 = 17.2 GB. Before, the check left validation out. At the preset's 1,600 steps (a round's end) and under PipelineRL
    validation decodes on vLLM itself: no such part."""
    from ablate.run import run_sweep

    preset = ["experiment=paper_8b", f"model.path={llama_8b}", "sweep=loo", "sweep.dry_run=true",
              f"task.data_path={_problems(tmp_path / 'math.jsonl', 1100)}", f"paths.outputs={tmp_path}",
              f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    assert run_sweep(compose(preset), preset) == 0
    assert "loo-8op: each engine process" not in capsys.readouterr().out
    common = [*preset, "train.steps=1604"]
    wide = [*common, "generator.val_wave_rows=512"]
    with pytest.raises(ValueError) as refused:
        run_sweep(compose(wide), wide)
    # vLLM's share at its least (no room left for it): its weights, one row's cache and its workspace, 22.2 GB
    assert "each engine process: validation's KV cache (our engine; generator.val_wave_rows) 537.5 + vLLM " \
           "(gpu_memory_utilization) 22.2 + " in str(refused.value)
    assert "= 577.6 GB > 85 GB; the part that takes the room: validation's KV cache (our engine; " \
           "generator.val_wave_rows), 537.5 GB; lower generator.val_wave_rows" in str(refused.value)
    assert run_sweep(compose(common), common) == 0
    printed = capsys.readouterr().out
    # vLLM's share sized around what else the GPU holds: 85 - 16.1 - 1.8 = 67.1 GB, and for loo-8op 17.2 less
    # (67,130,509,312 - 8 x 16,404 x 131,072 = 49,929,668,608 bytes: 49.9)
    outside = "CUDA context 1.0, NCCL's ring buffers (weights group) 0.4, NCCL's NVLS buffers (weights group) 0.3, " \
              "staging copy's fragmentation 0.1)"
    assert "  each engine process: ~85.0 GB of 85 (vLLM (gpu_memory_utilization) 67.1, staging copy of the weights " \
           f"16.1, {outside}" in printed
    assert "  loo-8op: each engine process: ~85.0 GB of 85 (vLLM (gpu_memory_utilization) 49.9, validation's KV " \
           f"cache (our engine; generator.val_wave_rows) 17.2, staging copy of the weights 16.1, {outside}" in printed


@pytest.mark.e2e  # paper-preset dry runs on a real vocabulary: 14-18 s (docs/testing.md#markers)
def test_a_warning_at_or_past_the_time_limit_is_refused_before_submit(llama_8b, tmp_path, capsys):
    """SLURM warns a job launcher.signal_delay_s before its time limit; at or past the limit it warns the job as it
    starts, and the job checkpoints and requeues itself with no step trained, for ever (submitit counts each stop as
    a preemption, which never uses up launcher.max_requeues). Before, that was a warning at half the limit. Refused
    in the dry run, before anything is created, naming both values: the paper's warning as sized (1,260 s, 21
    minutes: the test above) on a 10-minute limit, the same set by hand, and a warning of the limit itself; one
    second under it passes, warned. SLURM's own most, 65,535 s (sbatch refuses more), is refused too."""
    from ablate.run import run_sweep

    preset = ["experiment=paper_8b", f"model.path={llama_8b}", "sweep.dry_run=true",
              f"task.data_path={_problems(tmp_path / 'math.jsonl', 1100)}", f"paths.outputs={tmp_path}",
              f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    short = [*preset, "launcher.timeout_min=10"]
    refusals = {
        (): "launcher.signal_delay_s=1260 s (sized) is at or above the job's time limit launcher.timeout_min=10 "
            "(600 s): SLURM would warn each job as it starts",
        ("launcher.signal_delay_s=1200",): "launcher.signal_delay_s=1200 s is at or above the job's time limit "
                                           "launcher.timeout_min=10 (600 s): SLURM would warn each job as it starts",
        ("launcher.signal_delay_s=600",): "launcher.signal_delay_s=600 s is at or above the job's time limit "
                                          "launcher.timeout_min=10 (600 s)"}
    for extra, says in refusals.items():
        args = [*short, *extra]
        with pytest.raises(ValueError) as refused:
            run_sweep(compose(args), args)
        assert str(refused.value).startswith(says) and "\n" not in str(refused.value), str(refused.value)
    args = [*short, "launcher.signal_delay_s=599"]
    assert run_sweep(compose(args), args) == 0
    assert "WARNING: the warning takes 10 of the job's 10 minutes" in capsys.readouterr().err
    capped = [*preset, "launcher.signal_delay_s=65536"]  # under the preset's 48 hours, over SLURM's most
    with pytest.raises(ValueError) as refused:
        run_sweep(compose(capped), capped)
    assert str(refused.value).startswith("launcher.signal_delay_s=65536 s is over SLURM's most, 65,535 s"), \
        str(refused.value)
    most = [*preset, "launcher.signal_delay_s=65535"]
    assert run_sweep(compose(most), most) == 0
    assert not list(tmp_path.glob("mlflow.db*"))
