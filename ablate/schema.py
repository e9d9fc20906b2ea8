"""The structured schema of the config tree (conf/), registered in Hydra's ConfigStore.

Every YAML option names its schema in its defaults list (``- /schema/<group>/<option>@_here_``), so a key that does
not exist or a value of the wrong type fails when the config is composed, with the key's name in the message; an
unknown option (``loss=nope``) fails with the list of options Hydra finds in the group.

Each axis option carries ``name`` (its YAML file's name: tags, LOO derivation and the mock's effects use it) and
``_target_`` (the function or class the trainer calls). The schema's defaults are the paper's values
(docs/design.md#what-the-paper-says); the embedded ``experiment=tiny`` shrinks them for a laptop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from analysis.synthetic import MockNoise


# ----------------------------------------------------------------------------------------------------------- axes
@dataclass
class Option:
    name: str = MISSING  # the option's name, as its YAML file is named
    _target_: str = MISSING  # what the trainer calls (import path)


@dataclass
class Cispo(Option):
    eps_max: float = 4.0  # absolute cap on the importance ratio rho (paper: 4, 5, 8 alike)


@dataclass
class Dapo(Option):
    eps_low: float = 0.2  # clip(rho, 1 - eps_low, 1 + eps_high); no dual clip
    eps_high: float = 0.28


@dataclass
class Gspo(Option):
    eps_low: float = 3e-3  # sequence-level clip range (ScaleRL's tuned values)
    eps_high: float = 5e-3


@dataclass
class Grpo(Option):
    eps: float = 0.2  # symmetric PPO clip


@dataclass
class Aggregation(Option):
    pass


@dataclass
class Normalization(Option):
    eps: float = 1e-6  # added to the standard deviation before dividing


@dataclass
class Precision(Option):
    head_dtype: str = "float32"  # dtype of the LM head and the logits
    generator_side: bool = True  # the same head precision on the generator as on the trainer


@dataclass
class LengthControl(Option):
    pass


@dataclass
class Interruption(LengthControl):
    # The thinking budget of each rollout is drawn uniformly in [min_frac, max_frac] * generation.max_think_tokens
    # (paper: 10k-12k of 12,288); then `phrase` is injected and the model gets generation.max_answer_tokens more.
    think_budget_min_frac: float = 10240 / 12288
    think_budget_max_frac: float = 1.0
    phrase: str = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"


@dataclass
class LengthPenalty(LengthControl):
    # DAPO overlong penalty over the whole completion: L_max = max_think + max_answer tokens; the penalty ramps over
    # the last l_cache_frac * L_max tokens (paper: L_cache 2k of L_max 14k).
    l_cache_frac: float = 2048 / 14336


@dataclass
class OffPolicy(Option):
    k: int = 8  # in optimizer steps (docs/design.md#semantics-pinned)
    in_flight: bool = True  # weights reach the generator mid-generation (PipelineRL) or only between batches


class NprMode(str, Enum):
    last = "last"  # the pass rate of the prompt's last epoch
    cumulative = "cumulative"  # the pass rate over all its epochs so far


@dataclass
class Filtering(Option):
    zero_variance: bool = True  # drop prompts whose samples all got the same reward (not resampled)
    no_positive_resampling: bool = True  # drop prompts from later epochs once their pass rate >= npr_threshold
    npr_threshold: float = 0.9
    npr_mode: NprMode = NprMode.last


# ---------------------------------------------------------------------------------------- what is trained, on what
@dataclass
class Model:
    name: str = MISSING
    # local path or hub name; null builds the tiny model from the fields below. No default: an option that reads a
    # checkpoint (model=hf) leaves it `???`, and a default of null would win the merge over it (OmegaConf keeps a
    # value under `???`): the tiny random model planned in a real one's place
    path: Optional[str] = MISSING
    # how model.path is read (ablate/policy.py's hub_args and model_config), by transformers and by vLLM alike:
    # revision, a hub branch, tag or commit; trust_remote_code, run the folder's own modelling code (models not in
    # transformers); overrides, fields of its config.json replaced (max_position_embeddings, rope_scaling; vLLM's
    # hf_overrides)
    revision: Optional[str] = None
    trust_remote_code: bool = False
    overrides: Dict[str, Any] = field(default_factory=dict)
    vocab_size: int = 0  # the tiny model's vocabulary: 0 = the tokenizer's size
    hidden_size: int = 64
    intermediate_size: int = 0  # the MLP's width: 0 = 4 x hidden_size
    num_layers: int = 2
    num_heads: int = 4
    tie_embeddings: bool = False  # the tiny model's LM head is its embedding matrix (as Qwen3 0.6B-4B's is)
    dtype: str = "bfloat16"  # the compute dtype (autocast; the generator's weights); trainer weights stay fp32
    device: str = "auto"  # cuda when there is one, else cpu; or any torch device


@dataclass
class Task:
    name: str = MISSING
    _target_: str = MISSING
    n_train_prompts: int = 52000  # paper: Polaris-53K less 1,000 held out
    n_val_prompts: int = 1000  # held out
    val_samples: int = 16  # mean@k
    data_path: str | None = None
    warm_start_steps: int = 0  # supervised steps on the task's warm-start examples before RL (0: none)
    warm_start_lr: float = 1e-3
    warm_start_batch: int = 32
    # the reward of a checked answer, right and wrong (the paper's +1 / -1: experiment=paper_8b; 1 / 0 elsewhere:
    # the same advantages under group-normalized rewards, not under a length penalty, whose weight is against the gap)
    reward_correct: float = 1.0
    reward_wrong: float = 0.0
    # how a prompt reaches the model (ablate/tasks/base.py's encode_prompt): false, its text as the tokenizer encodes
    # it (its special tokens too: Llama-3's BOS); true, the user's turn of the tokenizer's chat template with the
    # assistant's opened, after a system turn when system_prompt is set; chat_kwargs go to the template
    # (enable_thinking: false for Qwen3)
    chat_template: bool = False
    system_prompt: Optional[str] = None
    chat_kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class SyntheticTask(Task):
    # keys of Task it does not read (its problems are made in code): set on the command line with this task, they are
    # refused, naming the task that reads them (ablate/config.py's check_overrides)
    unread: ClassVar[tuple[str, ...]] = ("data_path",)
    ops: list[str] = field(default_factory=lambda: ["reverse"])  # reverse | sort | sum | hash (tasks/synthetic.py)
    op_weights: list[float] = field(default_factory=list)  # how often each op is drawn (empty: equally)
    min_digits: int = 3
    max_digits: int = 8
    teacher_accuracy: float = 1.0  # the warm start's teacher answers right this often, else a near miss
    task_seed: int = 1234  # the problems: the same for every run whatever its seed


@dataclass
class MathTask(Task):
    # The prompt: {problem} is replaced; every other brace doubled. Ends in <think> so a reasoning model thinks first.
    prompt_template: str = ("Solve the following math problem. Think it through step by step, then write only the "
                            "final answer, as \\boxed{{answer}}.\n\nProblem: {problem}\n<think>\n")
    task_seed: int = 1234  # the held-out split
    # the data (ablate/tasks/records.py): data_path is a .jsonl, .json, .parquet or .csv file, a folder shaped like a
    # hub download, or a hub id (owner/name; data_split and data_revision apply to folders and ids); val_data_path, a
    # validation set of its own (then n_val_prompts come from it and none of its problems trains); fields, the
    # columns holding each record's problem, answer and solution (a dotted name reaches into nested records; a
    # problem may be a conversation, a list of {role, content} turns, rendered with task.chat_template)
    val_data_path: Optional[str] = None
    data_split: str = "train"
    data_revision: Optional[str] = None
    fields: Dict[str, str] = field(default_factory=lambda: {"problem": "problem", "answer": "answer",
                                                            "solution": "solution"})
    overlong_prompts: str = "drop"  # a prompt over generation.max_prompt_tokens: drop (counted, printed) | error


@dataclass
class Generator:
    name: str = MISSING
    _target_: str = MISSING
    simulated: bool = False  # a simulator playing the paper's scale (the mock): no axis is untestable for it
    # validation rows per wave where our torch engine decodes them (docs/distributed.md#validation); here, not in a
    # subclass, so that a preset may set it whatever the generator (a simulator's validation is drawn: unused)
    val_wave_rows: int = 512


@dataclass
class HFGenerator(Generator):
    max_waves: int = 2  # waves of B x G rows decoding at once (ablate/generators/engine.py)
    concurrent: bool = False  # generation in its own thread; false = the deterministic, reproducible schedule


@dataclass
class VLLMGenerator(HFGenerator):
    # vLLM's share of the GPU's memory as the device reports it (an "80 GB" H100: ~85 GB); unset: in engine processes
    # sized from the memory model, what an engine's rows need as far as the GPU has room (ablate/memory.py), and 0.5
    # beside trainer rank 0 (the trainer has the rest)
    gpu_memory_utilization: Optional[float] = None
    kv_cache_gib: float | None = None  # the KV cache's size, set directly (on a CPU: vLLM's share of memory)
    enforce_eager: bool = False  # no torch.compile nor CUDA graphs: starts in seconds, decodes slower on a GPU
    # GPUs (engine processes) per vLLM engine, tensor parallel: run.generator_gpus / this engines (data parallel)
    tensor_parallel_size: int = 1
    # how engine processes take each step's weights: "staged" (into a copy beside the engine, taken at the decode
    # step the off-policy rules choose; validation samples it) or "direct" (straight into vLLM as they arrive,
    # no second copy; PipelineRL's in-flight updates only; validation decodes on the engines)
    weight_transfer: str = "staged"


@dataclass
class Truth:
    A: float = 0.61  # the asymptote of the variant with every axis at ScaleRL's choice (paper Table 1)
    B: float = 1.92
    C_mid: float = 2542.0  # GPU-hours
    R0: float = 0.30  # pass rate before RL


@dataclass
class Effect:
    A: float = 0.0  # added to A
    B: float = 0.0  # added to B
    C_mid: float = 1.0  # multiplies C_mid


@dataclass
class MockGenerator(Generator):
    truth: Truth = field(default_factory=Truth)
    # "path=choice" (an override as typed on the command line) -> its effect on the truth, applied when it matches
    effects: dict[str, Effect] = field(default_factory=dict)
    # the noise and the clock: analysis/synthetic.py's MockNoise, written there once (the power bench's mock runs
    # and analysis's synthetic curves read the same); a run's config overrides them (generator.wobble_sd=...)
    gpu_hours: float = MockNoise.budget  # compute after train.steps steps at the reference length (paper: 16k)
    reference_length_frac: float = MockNoise.reference_length_frac  # mean length / max at which gpu_hours holds
    val_prompts: int = MockNoise.val_prompts  # the simulated validation set (paper: 1,000 held-out prompts, mean@16)
    val_samples: int = MockNoise.val_samples
    run_sd_A: float = MockNoise.run_sd_A  # run-to-run spread of A (paper: three runs gave A within +-0.015)
    wobble_sd: float = MockNoise.wobble_sd  # run-level slow noise on the validation pass rate (AR(1))
    wobble_gpu_hours: float = MockNoise.wobble_gpu_hours  # correlation length of the wobble
    prompt_spread: float = MockNoise.spread  # Beta concentration of per-prompt pass rates (lower = more spread)
    # A simulated crash, to see what a sweep does with a failed job: runs making the choice `crash_when` ("path=choice";
    # empty: every run) raise at step `crash_at_step` (0: never).
    crash_at_step: int = 0
    crash_when: str = ""
    # wall-clock seconds each batch() waits, as a real generator's decoding does (the trainer can be warned
    # meanwhile: the time-limit tests); how long a run takes, not what it computes: not in its signature
    step_seconds: float = 0.0


@dataclass
class Batch:
    prompts_per_step: int = 48
    samples_per_prompt: int = 16


@dataclass
class Generation:
    max_prompt_tokens: int = 2048
    max_think_tokens: int = 12288
    max_answer_tokens: int = 2048
    temperature: float = 1.0
    # where a completion ends; unset: the tokenizer's eos, the model's generation_config eos ids and the end of a
    # turn in its chat template (ablate/policy.py's stop_token_ids)
    stop_token_ids: Optional[List[int]] = None


@dataclass
class Optim:
    lr: float = 5e-7
    eps: float = 1e-15
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 100


@dataclass
class Train:
    steps: int = 1600  # paper: ~16k GPU-hours for a LOO run
    val_every: int = 100
    log_every: int = 1  # metric points are buffered and flushed in batches; this thins them
    # the learner's passes (forward/backward; gradients accumulate over a step's passes), planned by ablate/plan.py
    # in the form run.packed_rows picks. Padded (side by side): a pass holds at most micro_batch_size rows and about
    # micro_batch_tokens tokens counted padded, rows x the pass's longest (0: the row cap alone). Packed (one
    # sequence, the GPU default): no row cap; micro_batch_tokens is the pass's budget of real tokens, no padding
    # counted, and where it is 0 the budget is micro_batch_size x the step's longest row (the padded form's largest
    # pass, so one memory estimate bounds both). Either form: a row longer than its budget goes alone
    micro_batch_size: int = 8  # padded: rows a pass, at most; packed: rows of the step's longest in the default budget
    micro_batch_tokens: int = 0  # padded: padded tokens a pass, at most; packed: real tokens a pass, at most
    # recompute decoder layers in the backward, less memory for more time: true every layer, false none, a count the
    # first that many, auto the fewest that the memory model needs for the GPU (docs/design.md#the-memory-model)
    activation_checkpointing: bool | int | str = False
    checkpoint_every: int = 100  # steps; a killed or preempted run resumes from its last checkpoint
    # > 0: compute/gpu_hours counts each step's FLOPs at this many TFLOP/s per device (reproducible on a shared
    # machine); 0: every device the job holds x wall-clock time (the paper's GPU-hours)
    reference_tflops: float = 0.0
    # where those FLOPs run (ablate/compute.py): unset, one device generates and trains in turn; [generator devices,
    # trainer devices], each side on its own, overlapping as the off-policy rule allows, idle devices counted
    reference_layout: Optional[List[int]] = None


# ----------------------------------------------------------------------------- how it runs (not part of a run's identity)
class Cluster(str, Enum):
    auto = "auto"  # slurm when a SLURM controller answers, else local
    local = "local"
    debug = "debug"  # in this process, one job after the other (pdb works)
    slurm = "slurm"


@dataclass
class Run:
    """How a run's trainer spreads over processes (ablate/distributed/layouts.py): one process, or FSDP over trainer ranks."""

    name: str = MISSING
    _target_: str = MISSING
    trainer_gpus: int = 1  # trainer ranks: processes (and GPUs where there are any), each holding a shard
    # generator engines in processes (and on GPUs) of their own, fed by trainer rank 0's pipeline; 0: the engine
    # decodes in rank 0's process (ablate/generators/remote.py)
    generator_gpus: int = 0
    # FSDP: each pass's gradients reduce-scattered into the shards (4N/ranks bytes a rank); false: accumulated whole
    # on every rank (4N bytes: 32 GB at 8B) and reduce-scattered once a step, one collective instead of one a pass
    sharded_gradients: bool = True
    # a learner's pass: its rows packed into one sequence, attention within each row, no padding; false: side by
    # side, each padded to the pass's longest; unset: packed where torch's varlen attention runs (CUDA, bf16 compute),
    # per row elsewhere, where the packed form's attention is a loop over rows (docs/training.md#packed-rows)
    packed_rows: Optional[bool] = None
    # each decoder layer through torch.compile, dynamic shapes (ablate/policy.py: compile_layers); unset: on where
    # the weights are on CUDA, off on the CPU, where compiling every test's model would slow the suite (the tests
    # of it set it: tests/test_compile.py). Off until a lent GPU has run it with FSDP2 and varlen attention
    # (docs/training.md#a-compiled-decoder): true turns it on
    compile_layers: Optional[bool] = False
    # dense bf16 TFLOP/s of one trainer GPU (an H100's: 989); > 0 logs perf/trainer_mfu each step
    peak_tflops: float = 0.0
    # the control plane (gloo, whatever the device): how long a trainer rank or an engine process waits for rank 0's
    # next call, which may come after a model load, an engine start and a whole validation
    control_timeout_min: float = 720.0
    # the data plane (NCCL on GPUs): how long one collective of weights or gradients may take before the job fails
    data_timeout_min: float = 30.0


@dataclass
class Paths:
    outputs: str = "outputs/${name}"  # everything a study writes here: jobs, runs, reports
    runs: str = "${paths.outputs}/runs"  # one folder per MLflow run id: its checkpoint, metrics a dead store refused
    # shared by a study's runs: the warm-started weights (keyed by everything that makes them); $ABLATE_CACHE shares
    # them across studies (the tests share one per session)
    cache: str = "${oc.env:ABLATE_CACHE,${paths.outputs}/cache}"


@dataclass
class Launcher:
    name: str = MISSING
    cluster: Cluster = Cluster.auto
    folder: str = "${paths.outputs}/jobs"  # submitit logs and pickles, one sub-folder per sweep
    timeout_min: int = 60 * 24
    gpus_per_node: int = 0
    # a GPU's memory: each process's estimated peak (ablate/memory.py) is checked against it before submit; unset:
    # 80 on SLURM with GPUs, the device's here, no check on CPUs
    gpu_memory_gb: float | None = None
    # a GPU's speed, for the GPU-hours the pre-flight prints (ablate/cost.py): a trainer GPU's 6N model FLOPs
    # utilisation of run.peak_tflops (unset: this learner's, ablate.cost.TRAIN_MFU, an estimate stated and dated
    # there), a generator GPU's tokens/s (unset: raw vLLM's on an H100 scaled by FLOPs, an upper bound);
    # bench/bench_gpu.py measures both on yours
    train_mfu: Optional[float] = None
    gen_tokens_per_s: float | None = None
    cpus_per_task: int = 1
    mem_gb: int | None = None
    nodes: int = 1
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    array_parallelism: int = 64
    # SLURM sends USR2 this long before the time limit: checkpoint, then requeue. Unset: sized before submit from
    # the cost and memory models (a learner step, a validation, the checkpoint's write; ablate/cost.py), 120 s at
    # least; set: checked against them, with a warning. Either way refused at or above the time limit (timeout_min),
    # where every job would requeue itself with no step trained, and above SLURM's most, 65,535 s
    signal_delay_s: Optional[int] = None
    checkpoint_gb_per_s: float = 1.0  # a trainer rank's write speed to paths.runs, for that sizing
    # the network interface between a job's nodes (ib0, eth0, ...), for both planes: gloo's control messages and
    # NCCL's tensors (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); unset: each library picks one (docs/distributed.md)
    network_interface: Optional[str] = None
    max_requeues: int = 20  # time limits and preemptions a job may survive
    setup: list[str] = field(default_factory=list)  # shell lines run before the job (module load, conda activate)
    additional: dict[str, Any] = field(default_factory=dict)  # extra sbatch options
    # jobs in a container: python, the command that runs the job's Python (`apptainer exec --nv /img/ablate.sif
    # python`; unset: this interpreter); srun_args, srun's own options (pyxis: --container-image=..., its mounts)
    python: Optional[str] = None
    srun_args: list[str] = field(default_factory=list)
    max_parallel_local: int = 0  # local cluster: worker processes, each running its share of jobs (0 = cores)
    watch: bool = True  # local cluster: wait with a progress display, then make the report


@dataclass
class Tracking:
    name: str = MISSING
    uri: str = "${oc.env:MLFLOW_TRACKING_URI,sqlite:///mlflow.db}"
    experiment: str = "${name}"  # the MLflow experiment
    flush_every: int = 200  # metric points buffered before one log_batch call
    timeout_s: float = 5.0  # a tracking server that does not answer in this time is reported dead


@dataclass
class Sweep:
    name: str = MISSING  # none, loo, recipes
    emit: str = MISSING  # the function that emits the variants (ablate.sweeps)
    dry_run: bool = False  # print the variants and submit nothing
    force: bool = False  # run variants again even when a FINISHED run with the same signature exists
    recipes: list[str] = field(default_factory=list)  # for sweep=recipes
    report: bool = True  # a sweep ends by making the report (a SLURM one: the same command once its jobs are in)
    # the adaptive sweep (docs/design.md#the-adaptive-sweep): each variant is looked at at its rungs (fractions of
    # its train.steps) and stops at the first where every claim of its verdict is settled (docs/fitting.md)
    adaptive: bool = False
    rungs: list[float] = field(default_factory=lambda: [k / 8 for k in range(1, 9)])
    alpha: float = 0.02  # a claim's false-claim rate over all looks: the one-look verdict's, spent over the looks
    futility: float = 0.10  # a claim the full budget would make with less than this predictive chance: settled unmade
    margin_A: Optional[float] = None  # declared: moves of A smaller than this do not matter (an earlier "no change")
    # the question the sweep answers (docs/fitting.md#a-stated-question): the smallest moves of A (margin_A; unset:
    # the paper's 0.02) and of B that matter, at the level of the runs or of the recipes, within a budget
    # (GPU-hours; unset: none); the dry run prints the designs that answer it and marks the cheapest
    margin_B: Optional[float] = None
    level: str = "recipes"  # runs | recipes
    budget_gpu_hours: Optional[float] = None
    base_wait_min: float = 120.0  # how long a variant waits at a rung for the base recipe to reach its compute
    # continue, from their checkpoints, into the same runs: runs an adaptive sweep stopped (to their budget), and runs
    # of a smaller train.steps that kept their checkpoint (to this one)
    extend: bool = False
    keep_checkpoints: bool = False  # a finished run keeps its last checkpoint, to be extended later (8B: ~100 GB)
    # seeds (docs/fitting.md#seeds-where-they-pay): runs of each variant, and of the base recipe (its replicates
    # measure the spread between runs of one recipe); seeds seed, seed + 1, ...
    seeds: int = 1
    base_seeds: int = 1
    # with adaptive=true and seeds or base_seeds above 1, the adaptive sweep with seeds (docs/fitting.md#an-adaptive-
    # sweep-with-seeds): seeds added where the verdict about the recipes is open, at up to `looks` looks
    looks: int = 4
    # the prior of that spread, for the verdicts about recipes (docs/fitting.md#recipes-not-runs): the sd of A and of
    # B between runs of one recipe, and its weight in degrees of freedom (the paper's three runs: 2)
    run_sd_A: float = 0.015
    run_sd_B: float = 0.0
    run_sd_dof: float = 2.0
    runs: dict[str, str] = field(default_factory=dict)  # set by the sweep for its jobs: variant -> MLflow run id


@dataclass
class Axis:
    """One design axis for the LOO sweep: where ScaleRL's choice lives and what the base algorithm chooses."""

    path: str = MISSING  # a config group (loss) or a value (filtering.zero_variance)
    base: Any = MISSING  # the base algorithm's choice
    variant: str = MISSING  # the paper's name of the variant that reverts this axis


@dataclass
class AblateConfig:
    loss: Option = MISSING
    aggregation: Option = MISSING
    normalization: Option = MISSING
    precision: Option = MISSING
    length_control: Option = MISSING
    off_policy: Option = MISSING
    filtering: Option = MISSING

    model: Model = MISSING
    task: Task = MISSING
    generator: Generator = MISSING
    batch: Batch = field(default_factory=Batch)
    generation: Generation = field(default_factory=Generation)
    optim: Optim = field(default_factory=Optim)
    train: Train = field(default_factory=Train)
    seed: int = 0

    name: str = "default"  # the study: the MLflow experiment and the output folder
    paths: Paths = field(default_factory=Paths)
    run: Run = MISSING
    launcher: Launcher = MISSING
    tracking: Tracking = MISSING
    sweep: Sweep = MISSING
    axes: list[Axis] = field(default_factory=list)
    # Axes this study's scale cannot test, and why (axis path -> reason): their LOO variants still run, and the
    # report says "not testable at this scale" with the reason instead of a verdict.
    untestable: dict[str, str] = field(default_factory=dict)


# Keys that describe how and where a run happens, not what it computes: left out of the signature.
NON_SEMANTIC_KEYS = ("name", "paths", "run", "launcher", "tracking", "sweep", "axes", "untestable")
NON_SEMANTIC_LEAVES = ("generator.step_seconds",)  # keys inside semantic groups that only pace a run

SCHEMAS = {
    "loss": {"cispo": Cispo, "dapo": Dapo, "gspo": Gspo, "grpo": Grpo},
    "aggregation": {"option": Aggregation},
    "normalization": {"option": Normalization},
    "precision": {"option": Precision},
    "length_control": {"interruption": Interruption, "length_penalty": LengthPenalty, "option": LengthControl},
    "off_policy": {"option": OffPolicy},
    "filtering": {"option": Filtering},
    "model": {"option": Model},
    "task": {"synthetic": SyntheticTask, "math": MathTask, "option": Task},
    "generator": {"mock": MockGenerator, "hf": HFGenerator, "vllm": VLLMGenerator, "option": Generator},
    "run": {"option": Run},
    "launcher": {"option": Launcher},
    "tracking": {"option": Tracking},
    "sweep": {"option": Sweep},
}


def register() -> None:
    """Register the schema: the top level as `ablate_schema`, each group's as `schema/<group>/<name>`."""
    cs = ConfigStore.instance()
    cs.store(name="ablate_schema", node=AblateConfig)
    for group, nodes in SCHEMAS.items():
        for name, node in nodes.items():
            cs.store(group=f"schema/{group}", name=name, node=node)
