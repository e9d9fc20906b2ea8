"""Checks made before any run is created or job submitted, each failing in one line that names the key: a model
that does not load, stop tokens it does not have, rows longer than its positions, a data file that is not there or
not as the task reads it, a chat template that does not render, a package a chosen option's jobs import that is not
installed, a reference layout the clock cannot use, a trainer layout its option or the job cannot hold, a layout whose
processes would not fit their GPUs' memory, a SLURM warning at or past the job's time limit. And what is allowed but
likely a mistake, warned in one line: a prompt template opening the thinking the chat template opens, a training set
drawn over and over."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig


def check_model(model: DictConfig) -> None:
    """Fail at once, in one line, when model.path names no model that loads (before any run is created): a local
    folder needs a config.json that transformers reads; any other name is looked up on the Hugging Face hub (or in
    its local cache). A model option with no default path (model=hf) and none given fails naming the key."""
    from omegaconf import OmegaConf

    if str(model.get("dtype")) == "float16":  # the trainer applies no loss scale (docs/training.md#precision)
        raise ValueError("model.dtype=float16: the trainer applies no loss scale, so fp16 gradients (the LM head's "
                         "first) would flush small values to zero; use model.dtype=bfloat16")
    if OmegaConf.is_missing(model, "path"):
        raise ValueError(f"model={model.name} needs model.path: a local folder or a hub name "
                         f"(model.path=/models/Qwen3-1.7B); without one it would train the tiny random model")
    if not model.path:
        return
    from ablate.policy import model_config

    path = Path(str(model.path)).expanduser()
    looks_local = path.is_absolute() or str(model.path).startswith((".", "~")) or path.exists()
    if looks_local and not path.is_dir():
        raise ValueError(f"model.path={model.path}: no such folder")
    if looks_local and not (path / "config.json").is_file():
        raise ValueError(f"model.path={model.path}: the folder has no config.json (tried {path / 'config.json'})")
    try:
        model_config(model)  # with its revision, trust_remote_code and overrides, as the jobs will read it
    except Exception as why:  # noqa: BLE001 - whatever transformers raises, said in one line
        if str(why).startswith("model.overrides."):
            raise
        where = f"its config.json ({path / 'config.json'})" if looks_local else \
            "not a local folder, and the Hugging Face hub (or its cache) gave no model of that name"
        reason = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
        if "trust_remote_code" in str(why) and not model.get("trust_remote_code"):
            reason += " Set model.trust_remote_code=true to run the folder's own code."
        raise ValueError(f"model.path={model.path}: {where}: {reason}") from None


def check_imports(cfg: DictConfig, dry_run: bool = False) -> list[str]:
    """Fail at once, in one line naming the option and how to install what it lacks, when a module a chosen option's
    jobs import is not installed here (before any run is created or job submitted): an option's class lists them in
    `requires`, (module, how to install it) pairs (generator=vllm's vLLM); importing the class itself checks our
    own module. Looked up (importlib.util.find_spec), not imported: the jobs run in this environment, on machines
    whose GPUs the submitting one may lack (docs/training.md#what-a-job-imports). A dry run, which may be made where
    the jobs would not run (a laptop planning a sweep), is not refused: the lines are returned as warnings."""
    import importlib.util

    from hydra.utils import get_object

    said = []
    for group in cfg:
        node = cfg.get(group)
        if not isinstance(node, DictConfig) or not node.get("_target_"):
            continue
        for module, install in getattr(get_object(str(node._target_)), "requires", ()):
            if importlib.util.find_spec(module) is None:
                line = (f"{group}={node.get('name', node._target_)} needs {module}, which is not installed here (its "
                        f"jobs would fail as they start): {install}")
                if not dry_run:
                    raise ValueError(line)
                said.append(f"WARNING: {line}; a dry run goes on, a submit would stop here")
    return said


def preflight(cfg: DictConfig, tokenizer=None) -> list[str]:
    """What a run is made of, checked before any run (each check fails in one line) and printed, a line each: the
    stop tokens, the model's size and positions, the data's splits, the first prompt; and the warnings, each a line
    starting `WARNING: ` (for stderr). The tokenizer (`tokenizer_of`) loaded once for all of them."""
    tokenizer = tokenizer if tokenizer is not None else tokenizer_of(cfg.model)
    found = (check_stops(cfg, tokenizer), check_lengths(cfg, tokenizer), check_task(cfg, tokenizer))
    return [line for text in found if text for line in text.split("\n")]


def tokenizer_of(model: DictConfig):
    """The policy's tokenizer, as the jobs load it (ablate.policy.build_tokenizer); a folder with none fails in one
    line."""
    from ablate.policy import build_tokenizer

    try:
        return build_tokenizer(model)
    except Exception as why:  # noqa: BLE001 - whatever transformers raises, said in one line
        reason = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
        raise ValueError(f"model.path={model.path}: no tokenizer loads from it: {reason}") from None


def check_stops(cfg: DictConfig, tokenizer=None) -> str | None:
    """Where a completion of a model from model.path ends, as the line printed before any run: its tokenizer's
    stop ids (ablate/policy.py's stop_token_ids), each with its token. A bad generation.stop_token_ids, or a folder
    with no tokenizer, fails in one line. None for the tokenizer made in code (it stops at its eos)."""
    if not cfg.model.path:
        return None
    from ablate.policy import describe_stops, stop_token_ids

    tokenizer = tokenizer if tokenizer is not None else tokenizer_of(cfg.model)
    ids = stop_token_ids(cfg.model, cfg.generation, tokenizer)
    return f"stop tokens ({cfg.model.path}): {describe_stops(ids, tokenizer)}"


def check_lengths(cfg: DictConfig, tokenizer=None) -> str | None:
    """Fail at once, in one line, when a row at its longest (memory.longest_row: generation.max_prompt_tokens +
    max_think_tokens + the interruption's phrase, in this tokenizer's tokens + max_answer_tokens) would pass the
    positions of a model from model.path (max_position_embeddings): vLLM refuses to start, and our engine would run
    past what the model was trained on. The tiny models made here are not held to it (their rotary positions have no
    end). Returns the line printed before any run: the model's size, tying and positions beside the longest row; None
    for a model made here."""
    if not cfg.model.path:
        return None
    from ablate.memory import Shape, longest_row
    from ablate.policy import model_config

    config = model_config(cfg.model)  # model.overrides included (max_position_embeddings, rope_scaling)
    positions = getattr(config, "max_position_embeddings", None)
    gen = cfg.generation
    injected = phrase_tokens(cfg, tokenizer)
    longest = longest_row(gen, phrase_tokens=injected)
    if positions is not None and longest > positions:
        parts = f"{gen.max_prompt_tokens} + {gen.max_think_tokens} + " + (f"{injected} + " if injected else "")
        raise ValueError("generation.max_prompt_tokens + max_think_tokens + "
                         + ("the interruption's phrase + " if injected else "")
                         + f"max_answer_tokens = {parts}{gen.max_answer_tokens} = {longest} tokens, more than "
                         f"model.path={cfg.model.path} has positions for (max_position_embeddings {positions}): "
                         f"lower them")
    shape = Shape.of(config)
    size = f"{shape.params / 1e9:.2f}B" if shape.params >= 1e9 else f"{shape.params / 1e6:.1f}M"
    return (f"model ({cfg.model.path}): {size} parameters, {'tied' if shape.tied else 'untied'} embeddings, "
            f"{f'{positions:,}' if positions else 'unbounded'} positions; rows of at most {longest:,} tokens"
            + (f" (the interruption's phrase {injected} of them)" if injected else ""))


def phrase_tokens(cfg: DictConfig, tokenizer=None) -> int:
    """The tokens of the phrase the length control injects at the thinking budget (the interruption's; 0 for the
    others), as the generator encodes it (generators/pipelined.py's `limits_for`) in the policy's tokenizer
    (`tokenizer`, else `tokenizer_of` loads it): a row's tokens too (memory.longest_row)."""
    from ablate.registry import build

    phrase = build(cfg.length_control).phrase
    if not phrase:
        return 0
    tokenizer = tokenizer if tokenizer is not None else tokenizer_of(cfg.model)
    return len(tokenizer.encode(phrase, add_special_tokens=False))


def _template_errors() -> tuple[type[Exception], ...]:
    """What a chat template raises as it renders (jinja2's errors, its raise_exception's among them)."""
    try:
        from jinja2 import TemplateError
    except ImportError:  # no jinja2: transformers renders no chat template either
        return ()
    return (TemplateError,)


TEMPLATE_ERRORS = _template_errors()


def _first_line(why: Exception) -> str:
    return str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__


PROMPT_SHOWN = 600  # characters of the rendered prompt the pre-flight prints


def check_task(cfg: DictConfig, tokenizer=None) -> str | None:
    """The task built as its jobs will build it, before any run: its data there (task.data_path, val_data_path),
    each record with its fields, prompts over generation.max_prompt_tokens dropped or refused, enough problems for
    the splits asked; one line naming what is wrong. Returns the lines printed before any run for a task read from
    data (its splits, what was dropped and why) or prompting a model from model.path (its first training prompt as
    the model will see it, with its token count); None for a task made in code for a model made here."""
    from ablate.registry import build

    tokenizer = tokenizer if tokenizer is not None else tokenizer_of(cfg.model)
    try:
        task = build(cfg.task, tokenizer=tokenizer, seed=cfg.seed,
                     max_prompt_tokens=cfg.generation.max_prompt_tokens)
        first = task.render(task.problem("train", 0).prompt)
    except TEMPLATE_ERRORS as why:  # the tokenizer's chat template, rendering a prompt (the task encodes them all)
        raise ValueError(f"task.chat_template=true: the chat template of model.path={cfg.model.path} does not render "
                         f"a prompt: {_first_line(why)}") from None
    except (OSError, TypeError, ValueError) as why:
        raise ValueError(str(why).strip().splitlines()[0]) from None
    lines = []
    path, val_path = getattr(task, "path", None), getattr(task, "val_path", None)
    if path:
        dropped = getattr(task, "dropped", {})
        lines.append(f"data ({path}{f', validation {val_path}' if val_path else ''}): {task.size('train'):,} "
                     f"training and {task.size('val'):,} validation prompts"
                     + (f"; dropped {', '.join(f'{n:,} {why}' for why, n in dropped.items())}" if dropped else ""))
    if path or cfg.model.path:
        prompt, text = task.problem("train", 0).prompt, first
        shown = text if len(text) <= PROMPT_SHOWN else text[:PROMPT_SHOWN] + f"... ({len(text) - PROMPT_SHOWN} more)"
        lines.append(f"prompt (the first training one, {len(task.encode_prompt(prompt)):,} tokens): {shown!r}")
    lines += [line for line in (check_thinking(cfg, task), check_passes(cfg, task)) if line]
    return "\n".join(lines) or None


THINK = "<think>"


def check_thinking(cfg: DictConfig, task) -> str | None:
    """A warning (one line) when the prompt opens the thinking inside the user's turn while the chat template opens it
    in the assistant's: task.chat_template=true with a task.prompt_template holding `<think>` (task=math's default,
    made for raw prompts), and a chat template that handles thinking itself, opening `<think>` in the assistant's
    turn (QwQ's, DeepSeek-R1's) or leaving it to the model, or closing it empty (Qwen3's, enable_thinking).
    Why: docs/training.md#prompts. None otherwise."""
    template = str(getattr(task, "template", "") or "")
    if not task.chat_template or THINK not in template:
        return None
    opens = thinking_of(task.tokenizer, task.chat_kwargs)
    if opens is None:
        return None
    return (f"WARNING: task.prompt_template holds {THINK}, which task.chat_template=true puts inside the user's turn, "
            f"while the chat template of model.path={cfg.model.path} {opens}. Give a task.prompt_template without "
            f"{THINK} (a YAML file: docs/first-run.md)")


def thinking_of(tokenizer, chat_kwargs: dict) -> str | None:
    """How a tokenizer's chat template (with task.chat_kwargs) handles the thinking, in words, or None where it knows
    nothing of it (no `<think>` nor enable_thinking in it, nothing opened): from what it renders after a user's
    turn with the assistant's opened, and from the template's own text."""
    turns = [{"role": "user", "content": "?"}]
    try:
        opened, closed = (tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=add,
                                                        **chat_kwargs) for add in (True, False))
    except TEMPLATE_ERRORS:  # a template that takes no such turn alone: nothing to say (the prompts rendered)
        return None
    after = opened[len(closed):] if opened.startswith(closed) else opened
    if THINK in after:
        how = "closes it empty" if "</think>" in after.split(THINK, 1)[1] else "leaves it open for the model"
        return f"opens {THINK} in the assistant's turn itself (and {how}; task.chat_kwargs={dict(chat_kwargs)})"
    source = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else str(tokenizer.chat_template)
    if THINK in source or "enable_thinking" in source:
        return (f"leaves the thinking to the model, which opens {THINK} in the assistant's turn (the template's "
                "thinking mode: Qwen3's enable_thinking)")
    return None


PASSES_WARNED = 10  # a run's draws of each training prompt, warned past (docs/training.md#passes-over-the-data)


def check_passes(cfg: DictConfig, task) -> str | None:
    """A warning (one line) when a run would draw each training prompt more than PASSES_WARNED times on average:
    train.steps x batch.prompts_per_step draws over the task's training prompts, saying where their number comes
    from (the task's `train_origin`: a file's problems less those held out, a cap) and what gives more. Why the
    bound: docs/training.md#passes-over-the-data. None under it."""
    steps, per_step, prompts = int(cfg.train.steps), int(cfg.batch.prompts_per_step), task.size("train")
    passes = steps * per_step / max(prompts, 1)
    if passes <= PASSES_WARNED:
        return None
    return (f"WARNING: each training prompt would be drawn ~{passes:,.{0 if passes >= 100 else 1}f} times "
            f"(train.steps={steps} x batch.prompts_per_step={per_step} / {prompts:,} training prompts), more than "
            f"{PASSES_WARNED}: "
            f"{task.train_origin()}. Give more problems, hold fewer out, or train fewer steps "
            "(docs/training.md#passes-over-the-data)")


def check_compute(train: DictConfig) -> None:
    """Fail at once, in one line, on a reference layout the clock cannot use (before any run is created)."""
    from ablate.compute import check_layout

    layout = train.get("reference_layout")
    check_layout(layout)
    if layout is not None and not train.reference_tflops > 0:
        raise ValueError(f"train.reference_layout={list(layout)} needs train.reference_tflops > 0 (the layout places "
                         f"FLOPs counted at that throughput; with 0, compute is wall-clock time and has no layout)")


SLURM_MAX_SIGNAL_DELAY_S = 65_535  # sbatch --signal's time before the limit: SLURM refuses more


def check_signal_delay(delay: int, timeout_min: int, sized: bool = False) -> None:
    """Fail at once, in one line naming both values, when SLURM's warning (launcher.signal_delay_s, `sized` before
    submit or set) comes at or before the job's start (at or above launcher.timeout_min), where every job would be
    warned as it starts and requeue itself with no step trained, for ever; or is more than SLURM takes
    (docs/training.md#time-limits)."""
    key = f"launcher.signal_delay_s={delay} s{' (sized)' if sized else ''}"
    limit = 60 * int(timeout_min)
    if delay > SLURM_MAX_SIGNAL_DELAY_S:
        raise ValueError(f"{key} is over SLURM's most, {SLURM_MAX_SIGNAL_DELAY_S:,} s (sbatch --signal refuses "
                         f"more): set launcher.signal_delay_s={SLURM_MAX_SIGNAL_DELAY_S} or less")
    if delay >= limit:
        raise ValueError(f"{key} is at or above the job's time limit launcher.timeout_min={timeout_min} "
                         f"({limit:,} s): SLURM would warn each job as it starts, and it would checkpoint and requeue "
                         f"itself with no step trained, for ever. Set launcher.timeout_min={-(-2 * delay // 60)} or "
                         f"more (the warning then takes at most half of each job), or launcher.signal_delay_s below "
                         f"{limit}")


def check_run(cfg: DictConfig) -> None:
    """Fail at once, in one line naming the numbers, on a trainer layout (`run`) its own option or the launcher's
    allocation cannot hold (before any run is created or job submitted)."""
    from hydra.utils import get_object

    from ablate.generators.base import capabilities
    from ablate.rl.checks import warn_on_pairing

    warn_on_pairing(cfg.loss, cfg.aggregation)  # GSPO x a length-weighted aggregation: a warning, once
    run, launcher = cfg.run, cfg.launcher
    n, g = int(run.trainer_gpus), int(run.get("generator_gpus", 0))
    least, most = getattr(get_object(run._target_), "ranks", (1, None))
    if n < least or (most is not None and n > most):
        holds = f"exactly {least}" if least == most else f"at least {least}"
        raise ValueError(f"run={run.name} with run.trainer_gpus={n}: this layout takes {holds} trainer rank"
                         f"{'s' if least > 1 else ''}" + (" (one rank is run=one_process)" if least > 1 else
                                                           " (more are run=fsdp)"))
    if g < 0:
        raise ValueError(f"run.generator_gpus={g}: 0 (the engine in trainer rank 0's process) or more (engine "
                         "processes of their own)")
    able = capabilities(cfg.generator)
    if n > 1 and g == 0 and not able.beside_trainer_ranks:
        raise ValueError(f"generator={cfg.generator.name} with run.trainer_gpus={n} and run.generator_gpus=0: its engine "
                         "cannot share trainer rank 0's process with other trainer ranks (it would make its process "
                         "groups over theirs and wait for them): give it engine processes, run.generator_gpus >= 1")
    if g and not able.engine_processes:
        raise ValueError(f"run.generator_gpus={g}: generator={cfg.generator.name} has no engine that runs in a "
                         "process of its own (generator=hf and generator=vllm have)")
    tp = int(cfg.generator.get("tensor_parallel_size", 1))
    if tp < 1:
        raise ValueError(f"generator.tensor_parallel_size={tp}: 1 or more GPUs per engine")
    if tp > 1 and (g == 0 or g % tp):
        raise ValueError(f"generator.tensor_parallel_size={tp} with run.generator_gpus={g}: each engine takes {tp} "
                         f"GPUs in processes of their own, so run.generator_gpus must be a multiple of {tp}")
    transfer = cfg.generator.get("weight_transfer", "staged")
    if transfer not in ("staged", "direct"):
        raise ValueError(f"generator.weight_transfer={transfer}: staged or direct")
    if transfer == "direct":
        from ablate.registry import build

        if g == 0:
            raise ValueError("generator.weight_transfer=direct sends the weights to engine processes, and "
                             "run.generator_gpus=0 has none (the engine shares the trainer's process)")
        if not build(cfg.off_policy).loads_on_arrival:
            raise ValueError(f"generator.weight_transfer=direct takes each step's weights as they arrive, "
                             f"mid-generation; off_policy={cfg.off_policy.name} (in_flight="
                             f"{cfg.off_policy.get('in_flight')}) holds them back: use "
                             "generator.weight_transfer=staged")
    from ablate.distributed.topology import layout_name

    layout, nodes = layout_name(n, g), int(launcher.nodes)
    if launcher.gpus_per_node > 0:
        held = nodes * int(launcher.gpus_per_node)
        if n + g > held:
            raise ValueError(f"{layout} does not fit the job: launcher.nodes={launcher.nodes} x "
                             f"launcher.gpus_per_node={launcher.gpus_per_node} = {held} GPUs")
    if (n + g) % nodes:  # each node starts the same number of processes (ablate/processes.py: launch)
        raise ValueError(f"{layout} = {n + g} processes do not spread evenly over launcher.nodes={nodes}")
    per_node = (n + g) // nodes
    if tp > 1 and nodes > 1 and (n % tp or per_node % tp):  # engine k: processes n + k tp .. on one node
        raise ValueError(f"generator.tensor_parallel_size={tp}: an engine's GPUs must share a node, so "
                         f"run.trainer_gpus={n} and the {per_node} processes a node must be multiples of {tp}")
    cluster = getattr(launcher.cluster, "value", launcher.cluster)  # an enum in a composed config, a str in a plain one
    if nodes > 1 and cluster in ("local", "debug"):
        raise ValueError(f"launcher.nodes={nodes} needs SLURM (launcher=slurm): launcher={cluster} runs on this "
                         "machine alone")


def model_shape(model: DictConfig):
    """The decoder's shape (ablate.memory.Shape) from the config the policy is built from (model.path's, or the
    tiny Llama's): no weights are read."""
    from ablate.memory import Shape
    from ablate.policy import model_config

    return Shape.of(model_config(model))


def largest_pass(cfg: DictConfig, tokenizer=None) -> tuple[int, int, bool]:
    """The trainer's largest pass as its learner plans it on a GPU, every row at its longest (memory.longest_row, the
    interruption's phrase in `tokenizer`'s tokens): its tokens, a row's longest, and whether it is packed
    (policy.packs_rows: then up to its token budget, `memory.packed_pass_tokens`; else padded,
    `memory.largest_micro_batch`)."""
    import torch

    from ablate import memory
    from ablate.policy import compute_dtype, packs_rows

    row_tokens = memory.longest_row(cfg.generation, phrase_tokens=phrase_tokens(cfg, tokenizer))
    rows, cap = int(cfg.train.micro_batch_size), int(cfg.train.micro_batch_tokens or 0)
    packed = packs_rows(cfg.run.get("packed_rows"), torch.device("cuda"), compute_dtype(cfg.model))
    return (memory.packed_pass_tokens if packed else memory.largest_micro_batch)(rows, cap, row_tokens), row_tokens, \
        packed


def layout_memory(cfg: DictConfig, gpu_gb: float, tokenizer=None) -> list:
    """Each kind of process of the run's layout on its GPU at its peak (ablate.memory.Process, in bytes): trainer
    rank 0 (with the generator's engine when it has no process of its own), another trainer rank, an engine
    process; a trainer at its largest pass (`largest_pass`; packed in bf16 or fp16, with FlashAttention's varlen
    backward) with its `memory.margin`. Why these parts: docs/design.md#the-memory-model."""
    import torch
    from hydra.utils import get_object

    from ablate import memory

    shape = model_shape(cfg.model)
    compute, head = (getattr(torch, str(name)).itemsize for name in (cfg.model.dtype, cfg.precision.head_dtype))
    n, g = int(cfg.run.trainer_gpus), int(cfg.run.get("generator_gpus", 0))
    tokens, row_tokens, packed = largest_pass(cfg, tokenizer)
    # varlen's scratch grows by 128 rows of padding a row: counted for a pass of rows at their longest (the fewest)
    varlen_rows = -(-tokens // row_tokens) if packed and compute < 4 else 0
    rank = dict(ranks=n, micro_tokens=tokens, compute=compute, head=head, varlen_rows=varlen_rows,
                sharded_gradients=bool(cfg.run.get("sharded_gradients", True)))
    generator = get_object(str(cfg.generator._target_))
    beside = {}  # trainer rank 0's engine, where it has no process of its own
    if not g:
        if n > 1:  # FSDP's rank 0 keeps the policy whole for the engine beside it and validation (layouts.FSDP)
            beside["whole copy of the policy (fp32)"] = 4 * shape.params
        beside.update(generator.engine_memory(cfg, shape, gpu_gb * memory.GB, processes=0, row_tokens=row_tokens))
    fsdp = (memory.FSDP_GROUP,) if n > 1 else ()

    def trainers(checkpointed: int) -> list:
        first = memory.trainer(shape, **rank, checkpointing=checkpointed, name="trainer rank 0")
        first.bytes.update(beside)
        first.bytes.update(memory.margin(first.bytes, groups=fsdp + ((memory.WEIGHTS_GROUP,) if g else ())))
        if n == 1:
            return [first]
        other = memory.trainer(shape, **rank, checkpointing=checkpointed, name="each other trainer rank")
        other.bytes.update(memory.margin(other.bytes, groups=fsdp))
        return [first, other]

    setting = cfg.train.activation_checkpointing
    if setting == "auto":  # the fewest layers recomputed for the trainers to fit, their margin included
        checkpointed, fits = memory.fewest_checkpointed(
            shape.layers, lambda k: max(p.total for p in trainers(k)), gpu_gb * memory.GB)
        why = (f"auto: the fewest that fit {gpu_gb:g} GB with the margin" if fits else
               f"auto: the least memory, and no count fits {gpu_gb:g} GB with the margin")
    else:
        checkpointed = memory.checkpointed_layers(setting, shape.layers)
        why = f"train.activation_checkpointing={str(setting).lower()}"
    processes = trainers(checkpointed)
    for process in processes:
        if setting is not False:
            process.note = f"activation checkpointing: {checkpointed} of {shape.layers} layers ({why})"
    if g:  # vLLM's share, unset, is sized to the room the rest leaves (at its least when even that is too little)
        sized = (memory.VLLM_SHARE,) if cfg.generator.get("gpu_memory_utilization", 0) is None else ()
        processes.append(memory.Process("each engine process",
                                        generator.engine_memory(cfg, shape, gpu_gb * memory.GB, processes=g,
                                                                row_tokens=row_tokens), sized))
    return processes


H100_GB = 85.0  # an "80 GB" H100's memory as the device reports it (81,559 MiB = 85.5 GB), a little under


def gpu_memory_gb(cfg: DictConfig, cluster: str) -> float | None:
    """A GPU's memory for the check before submit, as the device reports it (vLLM's unit for its share):
    launcher.gpu_memory_gb when set; on SLURM with GPUs, 85 (an "80 GB" H100: 81,559 MiB); here, the smallest
    visible CUDA device's; None when the run is on CPUs (nothing to check)."""
    import torch

    from ablate.policy import device_of

    device = str(cfg.model.get("device", "auto"))
    if device != "auto" and not device.startswith("cuda"):
        return None
    if cluster == "slurm" and not int(cfg.launcher.gpus_per_node) > 0:  # a job of CPUs
        return None
    if cfg.launcher.get("gpu_memory_gb"):
        return float(cfg.launcher.gpu_memory_gb)
    if cluster == "slurm":
        return H100_GB
    if device_of(cfg.model).type == "cuda" and torch.cuda.is_available() and torch.cuda.device_count():
        return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())) / 1e9
    return None  # no device to read (a layout that wants one fails on its GPU count)


def check_memory(cfg: DictConfig, gpu_gb: float | None, tokenizer=None) -> list:
    """Fail at once, in one line, when a process of the layout would not fit a GPU of `gpu_gb` GB by the memory
    model, its margin included, summing its parts and naming the one that takes the room and the setting that gives
    it back (memory.Process.overflow; a trainer's activations: the train.micro_batch_tokens that fits,
    `fitting_micro_batch_tokens`). `tokenizer`: the policy's, where the caller has it (`layout_memory` counts the
    interruption's phrase in it). Returns the estimate (nothing to check: [])."""
    if not gpu_gb:
        return []
    from ablate.distributed.topology import layout_name

    processes = layout_memory(cfg, gpu_gb, tokenizer)
    for process in processes:
        if process.total > gpu_gb * 1e9:
            fix = None
            if process.takes_the_room()[0] == "activations":  # the settings that free a trainer's room, sized
                most = fitting_micro_batch_tokens(cfg, gpu_gb, tokenizer)
                fixes = [(f"set train.micro_batch_tokens={most} or less (the most that fits, in steps of "
                          f"{MICRO_BATCH_STEP:,})")] if most else []
                if cfg.train.activation_checkpointing != "auto" and process.checkpointed != \
                        model_shape(cfg.model).layers - 1:  # every layer but the last: the least memory
                    fixes.append("set train.activation_checkpointing=auto (the fewest layers recomputed that fit, "
                                 "or the least memory)")
                fixes.append("shard the state over more trainer GPUs (run.trainer_gpus)")
                fix = ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1]
            layout = layout_name(int(cfg.run.trainer_gpus), int(cfg.run.get("generator_gpus", 0)))
            raise ValueError(f"{layout} does not fit a GPU of {gpu_gb:g} GB (launcher.gpu_memory_gb): "
                             f"{process.overflow(gpu_gb * 1e9, fix)}"
                             + (f"; {process.note}" if process.note else "")
                             + "; by the memory model, docs/design.md#the-memory-model")
    return processes


MICRO_BATCH_STEP = 1024  # train.micro_batch_tokens as the refusal sizes it: a multiple of this


def fitting_micro_batch_tokens(cfg: DictConfig, gpu_gb: float, tokenizer=None) -> int:
    """The largest train.micro_batch_tokens, a multiple of `MICRO_BATCH_STEP` below the pass the layout holds now,
    at which every trainer process (those with activations) fits a GPU of `gpu_gb` GB by the memory model
    (`layout_memory`; the engines' processes do not depend on it); 0 where none does (a pass of one row at its
    longest, the least a cap leaves, does not fit). Bisection: a trainer's peak grows with the cap."""
    from omegaconf import OmegaConf

    def fits(steps: int) -> bool:
        capped = OmegaConf.merge(cfg, {"train": {"micro_batch_tokens": steps * MICRO_BATCH_STEP}})
        processes = layout_memory(capped, gpu_gb, tokenizer)
        return all(p.total <= gpu_gb * 1e9 for p in processes if "activations" in p.bytes)

    fitting, over = 0, -(-largest_pass(cfg, tokenizer)[0] // MICRO_BATCH_STEP)  # a cap at or over the pass: no less
    while over - fitting > 1:
        middle = (fitting + over) // 2
        fitting, over = (middle, over) if fits(middle) else (fitting, middle)
    return fitting * MICRO_BATCH_STEP


def auto_checkpointed(cfg: DictConfig, gpu_gb: float | None, tokenizer=None) -> int:
    """The decoder layers the learner recomputes in the backward under train.activation_checkpointing=auto: the
    fewest the memory model needs on a GPU of `gpu_gb` GB (`layout_memory`, as the check before submit says it);
    none with no GPU to fit."""
    return layout_memory(cfg, gpu_gb, tokenizer)[0].checkpointed if gpu_gb else 0
