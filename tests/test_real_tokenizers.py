"""Real Qwen3 and Llama-3 tokenizers in download-shaped folders (tests/real_models.py): where their completions end.

Each folder is what a user's model.path holds: the family's real vocabulary and special tokens, its chat template,
its generation_config.json eos ids, a config.json of the family's shape at a tiny depth and width."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers
from omegaconf import OmegaConf

from ablate.checks import check_lengths, check_stops
from ablate.config import compose
from ablate.generators.engine import Engine, Sequence
from ablate.generators.pipelined import limits_for
from ablate.policy import build_policy, build_tokenizer, end_of_turn_id
from ablate.registry import build
from ablate.warm_start import warm_start
from real_models import save_model

IM_END, ENDOFTEXT, THINK_END = 151645, 151643, 151668
EOT, END_OF_TEXT, EOM = 128009, 128001, 128008


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """qwen3 (Qwen3-1.7B's tokenizer and generation config), qwen3-base (a Qwen base model's), llama3
    (Llama-3.1-8B-Instruct's); no weights but qwen3-base's (2 layers, width 64, tied, real vocabulary)."""
    root = tmp_path_factory.mktemp("models")
    return {family: save_model(family, root / family, weights=family == "qwen3-base")
            for family in ("qwen3", "qwen3-base", "llama3")}


def _cfg(folder, *overrides):
    return compose(["model=hf", f"model.path={folder}", "model.device=cpu", "model.dtype=float32",
                    "generator=hf", *overrides])


def _limits(cfg):
    return limits_for(cfg, build_tokenizer(cfg.model), build(cfg.length_control))


def test_the_folders_hold_the_real_vocabularies_at_their_known_ids(folders):
    qwen = transformers.AutoTokenizer.from_pretrained(folders["qwen3"])
    assert len(qwen) == 151669 and qwen.encode("Hello world") == [9707, 1879]
    assert qwen.convert_tokens_to_ids(["<|im_end|>", "</think>"]) == [IM_END, THINK_END]
    llama = transformers.AutoTokenizer.from_pretrained(folders["llama3"])
    assert len(llama) == 128256 and llama.encode("Hello world") == [128000, 9906, 1917]  # BOS, as Llama-3 wants
    assert llama.eos_token_id == EOT
    assert transformers.AutoConfig.from_pretrained(folders["qwen3"]).tie_word_embeddings


def test_the_end_of_a_turn_is_read_from_the_chat_template(folders):
    assert end_of_turn_id(build_tokenizer(OmegaConf.create({"path": str(folders["qwen3-base"])}))) == IM_END
    assert end_of_turn_id(build_tokenizer(OmegaConf.create({"path": str(folders["llama3"])}))) == EOT
    assert end_of_turn_id(build_tokenizer(OmegaConf.create({"path": None}))) is None  # the code's: no template


@pytest.mark.parametrize("family, stops", [
    ("qwen3", (IM_END, ENDOFTEXT)),  # the generation config's, the tokenizer's eos among them
    ("qwen3-base", (ENDOFTEXT, IM_END)),  # eos <|endoftext|>: its ChatML turn's end added (before: eos alone)
    ("llama3", (END_OF_TEXT, EOM, EOT)),  # the generation config's three (before: <|eot_id|> alone)
])
def test_completions_stop_at_the_models_eos_ids_and_the_end_of_its_turn(folders, family, stops):
    assert _limits(_cfg(folders[family])).stop_ids == stops


def test_the_stop_tokens_are_printed_before_any_run_with_their_tokens(folders):
    cfg = _cfg(folders["qwen3-base"])
    assert check_stops(cfg) == f"stop tokens ({folders['qwen3-base']}): <|endoftext|> 151643, <|im_end|> 151645"
    assert check_stops(compose(["generator=hf"])) is None  # the tokenizer made in code stops at its eos


def test_rows_longer_than_the_models_positions_fail_before_any_run_naming_the_lengths(tmp_path):
    """Qwen2.5-Math-1.5B has 4,096 positions; the paper's rows are 2,048 + 12,288 + 2,048: before, the dry run
    passed and vLLM refused to start on the node."""
    import json

    folder = save_model("qwen3-base", tmp_path / "qwen-math", weights=False)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    with pytest.raises(ValueError, match=r"^generation.max_prompt_tokens \+ max_think_tokens \+ the interruption's "
                                         r"phrase \+ max_answer_tokens = 2048 \+ 12288 \+ 19 \+ 2048 = 16403 tokens, "
                                         r"more than model.path=.* has positions for \(max_position_embeddings "
                                         r"4096\): lower them$"):
        check_lengths(compose(["experiment=paper_8b", f"model.path={folder}"]))
    # the phrase injected at the thinking budget is 19 of Qwen's tokens, and vLLM's max_model_len counts them: rows
    # of 1,024 + 2,048 + 1,024 tokens passed this check before and made vLLM ask for 4,115 positions of 4,096
    quarter = ["experiment=paper_8b", f"model.path={folder}", "generation.max_prompt_tokens=1024",
               "generation.max_think_tokens=2048"]
    with pytest.raises(ValueError, match=r"= 1024 \+ 2048 \+ 19 \+ 1024 = 4115 tokens, more than"):
        check_lengths(compose([*quarter, "generation.max_answer_tokens=1024"]))
    line = check_lengths(compose([*quarter, "generation.max_answer_tokens=1005"]))
    # what is printed before any run: 151,936 x 64 tied embeddings, 2 layers of 4 x 64^2 + 3 x 64 x 128, the norms
    params = 151936 * 64 + 2 * (4 * 64 * 64 - 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64
    assert line == (f"model ({folder}): {params / 1e6:.1f}M parameters, tied embeddings, 4,096 positions; rows of at "
                    f"most 4,096 tokens (the interruption's phrase 19 of them)")
    assert check_lengths(compose([*quarter, "generation.max_answer_tokens=1024", "length_control=truncation"])) \
        .endswith("rows of at most 4,096 tokens")  # no phrase
    check_lengths(compose(["experiment=paper_8b", "model=llama_1b"]))  # a model made here: no end to its positions


def test_a_folder_with_no_tokenizer_fails_before_any_run_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match=f"^model.path={tmp_path}: no tokenizer loads from it: ") as refused:
        check_stops(_cfg(tmp_path))
    assert "\n" not in str(refused.value)


def test_stop_token_ids_set_by_hand_replace_the_rule_and_a_bad_one_fails_naming_it(folders):
    assert _limits(_cfg(folders["qwen3"], "generation.stop_token_ids=[151645]")).stop_ids == (IM_END,)
    with pytest.raises(ValueError, match=r"generation.stop_token_ids=\[151645, 200000\]: \[200000\] not in the "
                                         r"tokenizer's 151669 ids"):
        _limits(_cfg(folders["qwen3"], "generation.stop_token_ids=[151645,200000]"))


@pytest.mark.e2e
def test_a_model_taught_to_end_its_turn_at_im_end_stops_there_not_at_the_limit(folders):
    """A Qwen base tokenizer (eos <|endoftext|>) with its ChatML template: the warm start ends each answer as a
    ChatML turn ends, at <|im_end|>, and the engine stops there. Before, the warm start ended answers at the eos and
    the engine stopped only at the eos: a model that ends its turns at <|im_end|>, as a Qwen chat model does, ran
    every row to the length limit."""
    cfg = _cfg(folders["qwen3-base"], "task=synthetic", "task.ops=[reverse]", "task.op_weights=[]", "task.min_digits=3",
               "task.max_digits=4", "task.teacher_accuracy=1.0", "generation.max_think_tokens=0",
               "generation.max_answer_tokens=24")
    tokenizer = build_tokenizer(cfg.model)
    task = build(cfg.task, tokenizer=tokenizer, seed=0)
    policy = build_policy(cfg.model)
    warm_start(policy, task, steps=30, lr=3e-3, batch_size=16)

    def decode(limits):
        engine = Engine(policy, limits, head_dtype=torch.float32, temperature=1.0, pad_id=tokenizer.pad_token_id,
                        seed=0)
        rows = [Sequence(i, 0, tokenizer.encode(task.problem("val", i).prompt, add_special_tokens=False))
                for i in range(16)]
        engine.start(rows)
        while engine.running:
            engine.step()
        return rows

    limits = _limits(cfg)
    rows = decode(limits)
    ended = [r.tokens[-1] for r in rows if not r.truncated]
    assert len(ended) >= 14 and set(ended) == {IM_END}, [tokenizer.decode(r.tokens) for r in rows]
    # the same model stopped at the tokenizer's eos alone (as before): rows run past their turn to the limit
    rows = decode(replace(limits, stop_ids=(tokenizer.eos_token_id,)))
    assert sum(r.truncated for r in rows) >= 14  # measured: 16 of 16


def test_think_end_as_text_of_several_tokens_ends_thinking_however_it_is_spelled(folders):
    """Llama-3 has no `</think>` token: it is '</', 'think', '>' or '.</', ' </', '>\n\n', ... Before, a row never
    left thinking but by the forced interruption; now thinking ends at the token that completes the text."""
    from ablate.generators.engine import append_token

    cfg = _cfg(folders["llama3"])
    tokenizer, limits = build_tokenizer(cfg.model), _limits(cfg)
    assert limits.think_end_id is None and len(limits.token_texts) == len(tokenizer)
    for text in ("so it is 12.</think>\n\nThe answer is 12", "ok\n</think>\n\n12", "x </think>12", "12</think>\n12"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        ends = next(i for i in range(len(ids)) if "</think>" in tokenizer.decode(ids[:i + 1]))
        row = Sequence(0, 1, [128000])
        for k, token in enumerate(ids):
            append_token(row, limits, 0, token, -1.0, True)
            assert row.thinking == (k < ends), (text, k, ends, tokenizer.convert_ids_to_tokens(ids))
        assert row.answer_tokens == len(ids) - 1 - ends > 0
    qwen = _limits(_cfg(folders["qwen3"]))  # one token: matched by id, as before
    assert qwen.think_end_id == THINK_END and qwen.token_texts is None


def test_a_prompt_goes_as_the_tokenizer_wants_it_raw_or_in_its_chat_template(folders):
    """Raw: the text as the tokenizer encodes it, its special tokens included (Llama-3's BOS: before, none).
    task.chat_template=true: the user's turn of the family's template, the assistant's turn opened, after a system
    turn when task.system_prompt is set; the template's own BOS, once."""
    llama = build(_cfg(folders["llama3"], "task=math").task, tokenizer=build_tokenizer(_cfg(folders["llama3"]).model))
    assert llama.encode_prompt("Hello world") == [128000, 9906, 1917]
    cfg = _cfg(folders["llama3"], "task=math", "task.chat_template=true", "task.system_prompt=Be brief.")
    chat = build(cfg.task, tokenizer=build_tokenizer(cfg.model))
    ids = chat.encode_prompt("What is 1 + 1?")
    assert ids.count(128000) == 1 and chat.tokenizer.decode(ids) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 1 + 1?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    cfg = _cfg(folders["qwen3-base"], "task=synthetic", "task.chat_template=true")
    qwen = build(cfg.task, tokenizer=build_tokenizer(cfg.model), seed=0)
    rendered = qwen.tokenizer.decode(qwen.encode_prompt("reverse 123:"))
    assert rendered == "<|im_start|>user\nreverse 123:<|im_end|>\n<|im_start|>assistant\n"
    # the pipeline prompts with it: every row of a problem starts from its encoded prompt
    generator = build(cfg.generator, cfg=cfg, task=qwen, sampler=None, policy=build_policy(cfg.model))
    (row,) = generator.pipeline.rows("val", 3, 0, 1, np.random.default_rng(0))
    assert row.prompt_ids == qwen.encode_prompt(qwen.problem("val", 3).prompt)
    generator.close()
    with pytest.raises(ValueError, match="task.chat_template=true: the tokenizer has no chat template"):
        build(compose(["task.chat_template=true"]).task, tokenizer=build_tokenizer(compose([]).model), seed=0)


@pytest.mark.e2e
def test_a_real_vocabulary_model_trains_end_to_end_and_its_rows_end_at_its_turns_end(folders, tmp_path, mlflow_uri):
    """The trainer, whole, on the Qwen base folder (generator=hf, the default suite's; the vLLM lane runs the same
    with generator=vllm): warm-started to end its answers at <|im_end|>, its rows stop there, few reach the length
    limit, and the run raises no alarm of rows cut at the limit."""
    from ablate import tracking
    from ablate.trainer import train

    cfg = _cfg(folders["qwen3-base"], "task=synthetic", "task.ops=[reverse]", "task.op_weights=[]",
               "task.min_digits=3", "task.max_digits=4", "task.teacher_accuracy=1.0", "task.warm_start_steps=30",
               "task.warm_start_lr=3e-3", "task.warm_start_batch=16", "generation.max_think_tokens=0",
               "generation.max_answer_tokens=24", "train.steps=3", "train.val_every=3", "task.n_val_prompts=8",
               "task.val_samples=1", "batch.prompts_per_step=4", "batch.samples_per_prompt=4",
               f"paths.outputs={tmp_path}")
    client = tracking.client(mlflow_uri)
    run_id = tracking.create_variant_run(client, tracking.experiment_id(client, "qwen"), "scalerl", {})
    seen = []
    train(cfg, run_id, mlflow_uri, progress=lambda step, total, metrics: seen.append(metrics))
    assert len(seen) == 3 and client.get_run(run_id).info.status == "FINISHED"
    assert max(m["train/truncation_rate"] for m in seen) < 0.2, [m["train/truncation_rate"] for m in seen]
    assert "ablate.alarm.truncated" not in client.get_run(run_id).data.tags  # (it answers wrong: no_reward may be)
